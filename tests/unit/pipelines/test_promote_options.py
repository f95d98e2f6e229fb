"""`promote`'s numeric options must be finite: NaN or infinity is bad input (exit 2, one error line), checked
before any server is asked."""

from __future__ import annotations

import pytest

from pipelines import promote
from pipelines.services import free_port


@pytest.mark.parametrize("given", [["--min", "nan"], ["--min", "inf"], ["--min=-inf"], ["--min", "Infinity"]])
def test_a_min_that_is_not_a_finite_number_exits_2_with_one_error_line(
        given: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    closed, value = f"http://127.0.0.1:{free_port()}", given[-1].removeprefix("--min=")
    argv = ["--model", "tiny-t5", "--task", "rte", *given, "--tracking-uri", closed]
    assert promote.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: --min {float(value)}: not a finite number")
    assert "Cannot reach" not in errors[0], "refused before any server is asked"


def test_a_finite_min_goes_on_to_the_server_and_the_library_refuses_nan_too(
        capsys: pytest.CaptureFixture[str]) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    assert promote.main(["--model", "tiny-t5", "--task", "rte", "--min", "70", "--tracking-uri", closed]) == 2
    assert "Cannot reach" in capsys.readouterr().err
    with pytest.raises(promote.PromotionError, match="--min nan: not a finite number"):
        promote.promote("tiny-t5", "rte", min_value=float("nan"), tracking_uri=closed)


def test_every_bad_argument_is_named_at_once_before_a_store_is_looked_for(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # no local store here: looking for one would be the first error
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert promote.main(["--model", "tiny-t5", "--task", "rtx", "--min", "nan", "--metric", "accuracy"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    for problem in ("--min nan: not a finite number", "Unknown task 'rtx'", "'accuracy': its direction is unknown"):
        assert problem in errors[0], problem
    assert "No tracking store" not in errors[0]
