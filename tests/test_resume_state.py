"""Resume-state files: names in training order, atomic writes, damage found by checksum (pure files, no Ray)."""

from __future__ import annotations

import numpy as np

from rayparallel.checkpoint import resume_state as rs

ARRAYS = {"w0": np.arange(6.0).reshape(2, 3), "o0": np.array(3)}
COUNTS = {"weights": 1, "optimizer": 1}


def test_folder_names_sort_in_training_order_and_are_never_reused(tmp_path):
    in_order = [
        rs.position_name(2),  # after epoch 2
        "epoch-0002-2",  # the same position trained again after a resume past a damaged point
        rs.position_name(2, 40),  # 40 steps into epoch 3
        rs.position_name(2, 41),
        rs.position_name(3),
    ]
    assert in_order == ["epoch-0002", "epoch-0002-2", "epoch-0002-step-000040", "epoch-0002-step-000041", "epoch-0003"]
    assert sorted(in_order) == in_order
    (tmp_path / "epoch-0002").mkdir()
    (tmp_path / "epoch-0002-2").mkdir()
    assert rs.unused_name(tmp_path, "epoch-0002") == "epoch-0002-3"
    assert rs.unused_name(tmp_path, "epoch-0004") == "epoch-0004"


def test_a_written_point_reads_back_and_the_newest_damaged_one_is_skipped(tmp_path):
    older = rs.write_state_atomically(tmp_path, rs.position_name(1, 20), ARRAYS, dict(COUNTS, epoch=1, step=20))
    newer = rs.write_state_atomically(tmp_path, rs.position_name(2), ARRAYS, dict(COUNTS, epoch=2))
    assert not list(tmp_path.glob(".partial-*"))  # written beside, then renamed into place
    arrays, meta = rs.read_state(older)
    assert np.array_equal(arrays["w0"], ARRAYS["w0"]) and (meta["epoch"], meta["step"]) == (1, 20)
    assert rs.describe_position(meta) == "epoch 1 and 20 steps of epoch 2"
    assert rs.newest_intact(rs.points(tmp_path)) == (newer, [])

    (newer / rs.STATE).write_bytes((newer / rs.STATE).read_bytes()[:-10])  # truncated, as a full disk leaves it
    found, skipped = rs.newest_intact(rs.points(tmp_path))
    assert found == older
    assert skipped == ["epoch-0002: state.npz does not match its checksum (truncated or overwritten)"]

    (older / rs.META).write_text("{not json")
    assert rs.newest_intact(rs.points(tmp_path)) == (
        None,
        [
            "epoch-0002: state.npz does not match its checksum (truncated or overwritten)",
            "epoch-0001-step-000020: meta.json unreadable (JSONDecodeError)",
        ],
    )
