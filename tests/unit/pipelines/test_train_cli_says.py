"""What `python -m pipelines.train` says before it trains: where it writes, and that it is not tracked."""

from __future__ import annotations

import pytest

from pipelines import train


def test_help_says_a_single_job_is_not_tracked_and_how_to_track_it(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert "Not tracked in MLflow: a single job logs no run" in " ".join(capsys.readouterr().out.split())


def test_a_job_names_its_folder_as_resolved_and_says_it_is_not_tracked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").write_text("a file where the job would write")
    assert train.main(["model.name=tiny-t5", "task.source=generated", "output_dir=taken"]) == 2
    assert "output_dir='taken' (resolved: " in capsys.readouterr().err
    code = train.main(["model.name=tiny-t5", "task.source=generated", "task.generated_size=24", "train.max_steps=2",
                       "train.eval_every_steps=2", "train.max_epochs=1", "output_dir=job"])
    err = capsys.readouterr().err
    assert code == 0 and f"Output folder: {tmp_path / 'job'} (output_dir 'job' taken against the current" in err
    assert train.NOT_TRACKED in err
