"""Every shipped config resolves to the values it resolved to when the record was written: same config hash for
every trial of every YAML in pipelines/configs (tests/helpers/shipped_hashes.py says how to rewrite the record)."""

from __future__ import annotations

import json

import pytest
from helpers.hub_cache import use_hub_cache
from helpers.shipped_hashes import DATA_DIR, RECORD, shipped_hashes


@pytest.mark.slow
def test_every_shipped_config_resolves_to_its_recorded_hash(tmp_path, monkeypatch):
    use_hub_cache(tmp_path / "hub", monkeypatch)
    monkeypatch.setenv("CAPT_DATA_DIR", DATA_DIR)
    recorded = json.loads(RECORD.read_text())
    now = shipped_hashes()
    assert sorted(now) == sorted(recorded), "a shipped config was added or removed: rewrite the record"
    for name, trials in recorded.items():
        changed = sorted(t for t in trials if now[name].get(t) != trials[t])
        assert not changed and len(now[name]) == len(trials), (
            f"{name}: {len(changed)} trial(s) resolve differently, e.g. {changed[:3]}")
