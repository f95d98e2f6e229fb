"""What `python -m pipelines.train` says: where it writes, and (untracked) how to track it."""

from __future__ import annotations

import pytest

from pipelines import train
from pipelines.tracking.job_cli import NOT_TRACKED


def test_help_documents_the_tracking_flags_and_the_environment_variable(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--tracking-uri URI" in shown and "--experiment NAME" in shown and "MLFLOW_TRACKING_URI" in shown
    assert "default: capt-jobs" in shown


def test_a_job_names_its_folder_as_resolved_and_ends_saying_how_to_track_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "taken").write_text("a file where the job would write")
    assert train.main(["model.name=tiny-t5", "task.source=generated", "output_dir=taken"]) == 2
    assert "output_dir='taken' (resolved: " in capsys.readouterr().err
    code = train.main(["model.name=tiny-t5", "task.source=generated", "task.generated_size=24", "train.max_steps=2",
                       "train.eval_every_steps=2", "train.max_epochs=1", "output_dir=job"])
    err = capsys.readouterr().err
    assert code == 0 and f"Output folder: {tmp_path / 'job'} (output_dir 'job' taken against the current" in err
    assert err.rstrip().splitlines()[-1] == NOT_TRACKED, "the job's last line says how to track it"
