"""The shared error wrapper of the entry points: expected failures become one paragraph and exit 2;
anything else keeps its traceback."""

from __future__ import annotations

import pytest

from capt.tasks import TaskDataError
from pipelines.cli_errors import EXIT_BAD_INPUT, run_cli
from pipelines.config.sources import PipelineConfigError
from pipelines.services import ServiceError


def _raise(err: BaseException):
    def body() -> int:
        raise err
    return body


@pytest.mark.parametrize("err", [PipelineConfigError("bad key"), TaskDataError("bad row", path="f.jsonl", row=3),
                                 ServiceError("server down")], ids=["config", "data", "service"])
def test_an_expected_error_is_one_paragraph_and_exit_2(err, capsys):
    assert run_cli(_raise(err), debug=False) == EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert captured.err == f"error: {err}\n" and captured.out == ""


def test_debug_prints_the_traceback_before_the_same_paragraph(capsys):
    assert run_cli(_raise(PipelineConfigError("bad key")), debug=True) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and err.endswith("error: bad key\n")


def test_a_plain_value_error_gets_the_debug_hint_and_blank_lines_are_dropped(capsys):
    assert run_cli(_raise(ValueError("first\n\nsecond")), debug=False) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "error: first\nsecond (run again with --debug for the traceback)\n"


def test_an_entry_points_own_error_type_counts_as_expected(capsys):
    class Refused(RuntimeError):
        pass

    assert run_cli(_raise(Refused("no")), debug=False, expected=(Refused,)) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "error: no\n"


def test_anything_else_keeps_its_traceback():
    with pytest.raises(RuntimeError, match="a bug"):
        run_cli(_raise(RuntimeError("a bug")), debug=False)
    with pytest.raises(KeyboardInterrupt):
        run_cli(_raise(KeyboardInterrupt()), debug=False)
    assert run_cli(lambda: 0, debug=False) == 0


def test_every_entry_point_main_is_the_one_skeleton(capsys):
    """train, sweep, promote, report and tracking share `cli_main`: --debug, one paragraph, exit 2."""
    import argparse
    import inspect

    from pipelines import promote, report, sweep, train
    from pipelines.cli_errors import cli_main
    from pipelines.tracking import __main__ as cli

    for module in (train, sweep, promote, report, cli):
        assert "cli_main(" in inspect.getsource(module.main), module.__name__

    def parser() -> argparse.ArgumentParser:
        made = argparse.ArgumentParser(prog="tool")
        made.add_argument("--size", type=int, default=1)
        return made

    assert cli_main(parser(), ["--size", "3"], lambda args: args.size) == 3
    assert cli_main(parser(), ["--debug"], _raise_with(PipelineConfigError("size=0 (allowed: an int >= 1)"))) == 2
    assert capsys.readouterr().err.endswith("error: size=0 (allowed: an int >= 1)\n")
    with pytest.raises(SystemExit) as exit_info:
        cli_main(parser(), ["--size", "big"], lambda args: 0)
    assert exit_info.value.code == EXIT_BAD_INPUT


def _raise_with(err: BaseException):
    def body(args) -> int:
        raise err
    return body
