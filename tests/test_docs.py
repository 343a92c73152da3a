"""Every code block of README and the docs site is accounted for: run as written by a named test, a
verbatim excerpt of a file the tests run, a job-spec YAML that the spec parser accepts (checked here), an
output (`text`), or marked as not runnable here with the reason, and those are listed here, so that a new
block cannot go untested silently. Fast: no Ray, no training (the named tests do that)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import pytest
import yaml

from .helpers import REPO

MARKER = re.compile(r"<!-- (run|not run|excerpt): (.+?) -->\s*$")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PAGES = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]

# The blocks that cannot run here as written, by page and first line: each says why in its marker
NOT_RUN = {
    (
        "README.md",
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && rayparallel train jobs/stateful_lstm.yaml",
    ),
    ("README.md", "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && pytest"),
    (
        "docs/clusters.md",
        "ray job submit --address http://HEAD:8265 --working-dir . -- rayparallel train jobs/stateful_lstm.yaml",
    ),
    ("docs/speed.md", "ray start --head --num-cpus 3          # once; `ray stop` ends it"),
}


@dataclass(frozen=True)
class Block:
    page: str
    language: str
    body: str
    marker: tuple[str, str] | None  # (run | not run | excerpt, what follows)

    @property
    def first_line(self) -> str:
        return self.body.strip().splitlines()[0]


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = (REPO / page).read_text()
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marked = MARKER.match(before)
            found.append(Block(page, match[1], match[2], marked.groups() if marked else None))
    return found


def block_id(block: Block) -> str:
    return f"{block.page}:{block.first_line[:40]}"


@pytest.mark.parametrize("block", [b for b in blocks() if b.language not in ("text", "yaml")], ids=block_id)
def test_every_command_and_code_block_is_run_or_marked(block: Block):
    assert block.marker, f"{block.page}: expected a run/excerpt/not run marker before the block, received none"
    kind, what = block.marker
    if kind == "excerpt":  # the block is the file's own text, which the default job runs
        assert block.body.strip() in (REPO / what).read_text(), f"{block.page}: not verbatim in {what}"
    elif kind == "run":  # tests/test_x.py::test_name reads this page (`doc_section`) and runs the block as written
        for target in what.split(", "):
            path, name = target.split("::")
            source = (REPO / path).read_text()
            tests = {node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)}
            assert name in tests, f"{block.page}: {target} is not a test"
            reads = f'"{block.page}"' if block.page != "README.md" else "doc_section("
            assert reads in source, f"{block.page}: {path} does not read the page ({reads})"
    else:
        assert (block.page, block.first_line) in NOT_RUN, f"{block.page}: not run ({what}) and not listed in NOT_RUN"


def test_the_blocks_not_run_here_are_the_listed_ones():
    marked = {(b.page, b.first_line): b.marker[1] for b in blocks() if b.marker and b.marker[0] == "not run"}
    for (page, line), why in sorted(marked.items()):
        print(f"not run here: {page}: {line[:60]} ({why})")
    assert set(marked) == NOT_RUN


@pytest.mark.parametrize("block", [b for b in blocks() if b.language == "yaml"], ids=block_id)
def test_every_yaml_block_is_a_job_spec_the_parser_accepts(block: Block):
    """A whole job is loaded as it is; a section is loaded in the default job, in place of its own."""
    from rayparallel.spec import load_spec

    if block.marker and block.marker[0] == "excerpt":
        assert block.body.strip() in (REPO / block.marker[1]).read_text(), f"{block.page}: not verbatim"
    default = yaml.safe_load((REPO / "jobs/stateful_lstm.yaml").read_text())
    for document in yaml.safe_load_all(block.body):
        spec = document if "model" in document else {**default, **document}
        load_spec(spec, [])


def python_block(page: str, marked_by: str) -> str:
    """The Python block of `page` whose run marker names the test `marked_by`."""
    (block,) = [b for b in blocks() if b.page == page and b.language == "python" and marked_by in b.marker[1]]
    return block.body


def test_the_data_and_compile_examples_make_a_job_that_validates(tmp_path, monkeypatch, capsys):
    """docs/data.md's tf.data loader and docs/from-fit.md's compiling builder, as written, are the `mymodule`
    their comments name: a job of the two passes the driver's checks (the loader's batches, the replica
    built at the worker's batch, its compile settings taken as the job's)."""
    import rayparallel

    test = "test_the_data_and_compile_examples_make_a_job_that_validates"
    module = python_block("docs/data.md", test) + "\n\n" + python_block("docs/from-fit.md", test)
    (tmp_path / "mymodule.py").write_text(module)
    monkeypatch.chdir(tmp_path)  # where a user types it: the job's modules resolve from the working directory
    job = {
        "name": "docs-examples",
        "model": {"builder": "mymodule:build"},
        "data": {"loader": "mymodule:load"},
        "train": {"global_batch_size": 8},
        "scaling": {"num_workers": 2},
    }
    checked = rayparallel.validate(job)
    assert checked.per_worker_batch_size == 4 and checked.data.loader == "mymodule:load"
    assert "mymodule" in __import__("sys").modules  # imported from the working directory, as train imports it
    with pytest.raises(rayparallel.RayParallelError, match="train.optimizer"):  # the builder's own, not another
        rayparallel.validate(job, overrides=["train.optimizer=adam"])
