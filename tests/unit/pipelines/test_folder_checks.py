"""Folders the pipeline writes into are checked before anything is written, with the path as resolved."""

from __future__ import annotations

import os

import pytest

from pipelines.services.folder_lock import folder_problem, job_folder_problem


def test_a_new_folder_under_a_writable_one_and_an_empty_folder_pass(tmp_path):
    assert folder_problem("output_dir", tmp_path / "a" / "b") is None
    assert job_folder_problem("output_dir", tmp_path) is None


def test_a_relative_path_is_shown_as_resolved_against_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("x")
    assert folder_problem("output_dir", "taken") == (f"output_dir='taken' (resolved: {tmp_path / 'taken'}) is a "
                                                     "file, not a folder")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_folder_that_cannot_be_written_is_named(tmp_path):
    (tmp_path / "locked").mkdir(mode=0o500)
    assert "is not writable by this user" in folder_problem("output_dir", tmp_path / "locked")
    assert f"cannot be created: {tmp_path / 'locked'} is not writable" in folder_problem("k", tmp_path / "locked/x")


@pytest.mark.parametrize("path", ["/proc/capt", "/sys/x", "/proc"])
def test_kernel_file_systems_are_refused(path):
    assert "is on a kernel file system" in folder_problem("tracking.local_dir", path)


def test_a_job_folder_is_one_holding_a_job_and_a_folder_of_other_files_is_not(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "job.lock").write_text("{}")  # a job killed between its lock and its claim
    assert job_folder_problem("output_dir", tmp_path / "job") is None
    (tmp_path / "job" / "checkpoints").mkdir()
    assert job_folder_problem("output_dir", tmp_path / "job") is None, "its config is judged by the claim check"
    for index in range(7):
        (tmp_path / "mine" / f"photo{index}.jpg").parent.mkdir(exist_ok=True)
        (tmp_path / "mine" / f"photo{index}.jpg").write_text("x")
    problem = job_folder_problem("output_dir", tmp_path / "mine")
    assert problem.endswith("holds no job but other files (photo0.jpg, photo1.jpg, photo2.jpg, photo3.jpg, "
                            "photo4.jpg and 2 more); a job writes only into a new or empty folder, or its own")
