"""Credentials stay where they were given: masking, what `submit` sends, the held-back console (fast)."""

from __future__ import annotations

import json

from rayparallel.cluster.submit import runtime_env, withheld_credentials
from rayparallel.secrets import mask, mask_text, without_credentials

URI = "https://ann:hunter2@mlflow.example:5000"


def test_mask_hides_url_passwords_tokens_and_secret_keys():
    assert mask_text(URI + "/x") == "https://ann:***@mlflow.example:5000/x"
    assert mask_text("s3://bucket/data?token=abc123&region=eu") == "s3://bucket/data?token=***&region=eu"
    assert mask_text("http://127.0.0.1:5000") == "http://127.0.0.1:5000"  # nothing to hide
    tree = {"mlflow": {"tracking_uri": URI, "tags": {"team": "a", "API_KEY": "k-1", "db_password": "pw"}}, "n": 3}
    masked = json.dumps(mask(tree))
    assert "hunter2" not in masked and "k-1" not in masked and '"pw"' not in masked
    assert mask(tree)["mlflow"]["tags"]["team"] == "a" and mask(tree)["n"] == 3
    assert without_credentials(URI + "/#/runs") == "https://mlflow.example:5000/#/runs"


def test_submit_sends_the_tracking_address_but_no_credential(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", URI)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ann")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter2")
    env = runtime_env(tmp_path / "job.yaml", tmp_path, ["scipy"])
    assert env["env_vars"] == {"MLFLOW_TRACKING_URI": "https://mlflow.example:5000"}
    assert "hunter2" not in json.dumps(env) and env["pip"] == ["scipy"]
    withheld = withheld_credentials(["mlflow.tracking_uri=http://bo:pw@host:5000", "train.epochs=2"])
    assert withheld == [
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
        "the user and password in MLFLOW_TRACKING_URI",
        "the user and password in --set mlflow.tracking_uri",
    ]


def test_worker_output_is_held_back_during_a_run_and_restored_after():
    """A notebook's ray.init() streams every worker's output; a run without worker_logs holds it back."""
    from ray._private import ray_logging

    from rayparallel.cluster.connect import worker_output_shown

    dispatcher = ray_logging.global_worker_stdstream_dispatcher
    printed = []
    dispatcher.add_handler("ray_print_logs", printed.append)
    try:
        with worker_output_shown(False):
            dispatcher.emit({"lines": ["I0000 oneDNN custom operations are on"]})
        assert printed == []
        dispatcher.emit({"lines": ["after the run"]})
        with worker_output_shown(True):
            dispatcher.emit({"lines": ["with worker_logs"]})
        assert [batch["lines"][0] for batch in printed] == ["after the run", "with worker_logs"]
    finally:
        dispatcher.remove_handler("ray_print_logs")
