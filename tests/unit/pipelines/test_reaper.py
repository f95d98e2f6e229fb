"""No orphans: a killed entry point's processes (children, grandchildren, new sessions) die within seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[3]
DRIVER = """
import json, subprocess, sys, time
sys.path.insert(0, {root!r})
from pipelines.services.reaper import reap_on_death
before = subprocess.Popen(["sleep", "300"])
with reap_on_death():
    child = subprocess.Popen(["sleep", "300"])
    session = subprocess.Popen(["bash", "-c", "sleep 300 & echo $!; wait"], start_new_session=True,
                               stdout=subprocess.PIPE, text=True)
    grandchild = int(session.stdout.readline())
    print(json.dumps({{"before": before.pid, "ours": [child.pid, session.pid, grandchild]}}), flush=True)
    if sys.argv[1] == "die":
        time.sleep(300)
    print(json.dumps({{"left": [child.pid, session.pid, grandchild]}}), flush=True)
"""


def _start(mode: str) -> tuple[subprocess.Popen, dict]:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(root=str(ROOT)), mode], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    return driver, json.loads(driver.stdout.readline())


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


def _stop(pids: list[int]) -> None:
    for pid in _alive(pids):
        os.kill(pid, signal.SIGKILL)


def test_a_killed_driver_leaves_no_process_it_started_after_ten_seconds():
    driver, pids = _start("die")
    try:
        assert len(_alive(pids["ours"])) == 3
        os.killpg(driver.pid, signal.SIGKILL)  # as a terminal's kill of the job does: the session child survives it
        driver.wait(10)
        deadline = time.monotonic() + 10
        while _alive(pids["ours"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(pids["ours"]) == [], "every process started in the block is gone within 10 s"
        assert _alive([pids["before"]]) == [], "the group kill took the one started before the block"
    finally:
        _stop([pids["before"], *pids["ours"]])


def test_a_driver_that_ends_its_block_normally_keeps_what_it_chose_to_leave_running():
    driver, pids = _start("live")
    try:
        left = json.loads(driver.stdout.readline())["left"]
        driver.wait(20)
        time.sleep(1.5)
        assert len(_alive(left)) == 3, "the watcher does nothing after a normal end: stopping is the block's job"
    finally:
        _stop([pids["before"], *pids["ours"]])
