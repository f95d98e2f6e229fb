"""`bash benchmarks/device_check.sh --check-imports`: every module the device check's parts load imports here, and a
module that does not is reported with its part and error, all at once, exit 2, without touching a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level folder, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks import device_check  # noqa: E402


def test_every_part_has_its_modules_listed():
    assert set(device_check.PART_MODULES) == set(device_check.PARTS)


@pytest.mark.slow  # imports ray, mlflow's server and every benchmark module: seconds
def test_the_script_checks_every_parts_imports_in_one_process():
    proc = subprocess.run(["bash", "benchmarks/device_check.sh", "--check-imports"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"Every module of {', '.join(device_check.PARTS)} imports."


def test_every_failing_import_is_named_in_one_paragraph(monkeypatch, capsys):
    monkeypatch.setitem(device_check.PART_MODULES, "device_sweep", ("json", "capt_no_such_module_a"))
    monkeypatch.setitem(device_check.PART_MODULES, "device_serving", ("capt_no_such_module_b",))
    assert device_check.main(["--check-imports", "--only", "device_serving", "device_sweep"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 2 import(s) of the device check fail here: ") and err.count("\n") == 1
    assert "device_serving: import capt_no_such_module_b failed: ModuleNotFoundError" in err
    assert "device_sweep: import capt_no_such_module_a failed: ModuleNotFoundError" in err and "json" not in err


def test_an_out_folder_that_cannot_be_written_is_refused_before_any_part(capsys):
    with pytest.raises(SystemExit) as exit_info:
        device_check.main(["--cpu-smoke", "--out", "/proc/capt-device-check", "--only", "device_packing"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--out='/proc/capt-device-check' is on a kernel file system" in err, err
