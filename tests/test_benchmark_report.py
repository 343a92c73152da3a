"""The benchmark's arithmetic and report (pure logic; the measurements are `python -m benchmarks.run`)."""

from __future__ import annotations

import pytest

from benchmarks.run import RATIOS, plot, ratios, spread, table


def synthetic_figures() -> dict:
    raw = {
        "keras_fit_1t": [1000.0, 900.0, 1100.0],
        "keras_fit_2t": [1500.0, 1400.0, 1600.0],
        "bare_1w": [1010.0, 880.0, 1000.0],
        "bare_2w": [1800.0, 1700.0, 1900.0],
        "nosync_2w": [1900.0, 1800.0, 2000.0],
        "rp_1w": [1000.0, 800.0, 1000.0],
        "rp_2w": [1700.0, 1500.0, 1800.0],
        "rp_2w_fp16": [1800.0, 1600.0, 1900.0],
    }
    sync = [
        {
            "filters": f,
            "tensors": 16,
            "bytes": 2**20 * f // 8,
            "raw_allreduce_s": 1e-3 * f,
            "gradient_sync_s": 1.1e-3 * f,
            "gradient_sync_fp16_s": 0.7e-3 * f,
            "gradient_sync_bf16_s": 0.7e-3 * f,
        }
        for f in (8, 16, 32, 64)
    ]
    figures = {
        "machine": "test",
        "samples_per_s": {k: spread(v) for k, v in raw.items()},
        "sync": sync,
        "sync_vs_raw_allreduce": 1.1,
        "checkpoint_stall_vs_sync_save": 0.001,
        "sync_fp16_vs_none": 0.636,
        "time_to_first_step_s": 30.0,
        "time_to_first_step_first_run_s": 34.0,
        "time_to_first_step_joined_s": 20.0,
        "tune_trial_startup_s": 12.0,
        "startup": {"spec_checked": 4.0, "ray_ready": 9.5, "first_step_done": 30.0},
        "startup_phases": {"joined": {"ray_ready": 1.0, "first_step_done": 20.0}},
        "checkpoint": {"parameters": 5e7, "actor_blocked_s": 1e-3, "sync_save_weights_s": 0.6, "full_save_s": 0.5},
    }
    figures.update(ratios(raw))
    return figures


def test_ratios_are_taken_within_each_round_then_the_median():
    figures = synthetic_figures()
    assert figures["overhead_vs_bare_ray_rounds"] == pytest.approx([1.01, 1.1, 1.0])
    assert figures["overhead_vs_bare_ray"] == pytest.approx(1.01)  # not 1000/1000 from the medians
    assert figures["scaling_efficiency_2w_rounds"] == pytest.approx([0.85, 0.9375, 0.9])
    assert figures["scaling_efficiency_2w"] == pytest.approx(0.9)
    assert figures["efficiency_vs_no_sync_2w_rounds"] == pytest.approx([1700 / 1900, 1500 / 1800, 0.9])
    assert figures["efficiency_vs_no_sync_2w_fp16_rounds"] == pytest.approx([1800 / 1900, 1600 / 1800, 0.95])
    assert {name for name, *_ in RATIOS} <= set(figures)


def test_table_names_every_figure_and_plot_writes_a_png(tmp_path):
    figures = synthetic_figures()
    text = table(figures)
    for line in (
        "overhead vs Keras fit",
        "scaling efficiency",
        "sync time vs raw all_reduce",
        "checkpoint stall",
        "time to first step, warm CLI, own local Ray (s, target <= 12)",
        "time to first step, CLI joining a running Ray (s)",
        "Tune trial start to its first step (s, target <= 8)",
        "fp16 sync (target >= 0.85)",
        "start-up phases of the fastest warm run (s since the command started): spec_checked 4.0, ray_ready 9.5",
        "  joined: ray_ready 1.0, first_step_done 20.0",
        "1.010  [1.000-1.100]",
    ):
        assert line in text
    plot(figures, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
