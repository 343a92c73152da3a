"""The recorder's journal (pure file logic): written when what it holds changes, read back as written."""

from __future__ import annotations

from rayparallel.recorder.journal import RecorderJournal


def test_the_journal_is_written_when_its_state_changes_and_only_then(tmp_path):
    journal = RecorderJournal(tmp_path / "recorder.json")
    assert journal.read() is None
    assert journal.write({"history": [{"loss": 1.0}]})
    written = (tmp_path / "recorder.json").stat().st_mtime_ns
    (tmp_path / "recorder.json").write_text("{}")  # what is on disk now differs from the state: not rewritten
    assert journal.write({"history": [{"loss": 1.0}]}) and journal.read() == {}
    assert journal.write({"history": [{"loss": 1.0}, {"loss": 0.5}]})
    assert journal.read() == {"history": [{"loss": 1.0}, {"loss": 0.5}]}
    assert (tmp_path / "recorder.json").stat().st_mtime_ns >= written
