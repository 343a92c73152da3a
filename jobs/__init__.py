"""Example jobs: builders and loaders referenced from the YAML files beside them."""
