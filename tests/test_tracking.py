"""The MLflow run's pure parts: no server, no Ray."""

from __future__ import annotations

import os
import shutil

from rayparallel.tracking.mlflow_run import enter_working_directory


def test_a_replaced_working_directory_is_entered_again(tmp_path):
    """A runtime_env working_dir unpacked anew under a running actor: MLflow's `Path.cwd()` must work again."""
    folder, before = tmp_path / "working_dir", os.getcwd()
    folder.mkdir()
    os.chdir(folder)
    try:
        shutil.rmtree(folder)
        folder.mkdir()  # the same path, a new folder: the process is still in the deleted one
        enter_working_directory(str(folder))
        assert os.getcwd() == str(folder)
        enter_working_directory(str(tmp_path))  # a directory that exists is left as it is
        assert os.getcwd() == str(folder)
    finally:
        os.chdir(before)
