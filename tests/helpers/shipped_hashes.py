"""The config hash of every trial of every shipped YAML, as pipelines/configs resolve them offline.

`tests/data/shipped_config_hashes.json` records them; `test_shipped_config_hashes.py` checks that the code
still resolves every shipped config to the same values. A deliberate change of a default (which changes
the hash of exactly the jobs it changes) rewrites the record:

    CAPT_DATA_DIR=/capt-data HF_HUB_OFFLINE=1 python tests/helpers/shipped_hashes.py --write
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "pipelines" / "configs"
RECORD = ROOT / "tests" / "data" / "shipped_config_hashes.json"
DATA_DIR = "/capt-data"
"""CAPT_DATA_DIR while hashing: local-data jobs hash the folder they read, so the record fixes one."""


def shipped_hashes() -> dict[str, dict[str, str]]:
    """{config path under pipelines/configs: {trial folder name (or "job"): config hash}}."""
    from pipelines.config import load_job_config, validate_job_config
    from pipelines.sweeps.config import load_sweep_config, trials
    from pipelines.training.outputs import config_hash

    hashes: dict[str, dict[str, str]] = {}
    for path in sorted(CONFIGS.rglob("*.yaml")):
        name = str(path.relative_to(CONFIGS))
        if path.parent.name == "job":
            hashes[name] = {"job": config_hash(load_job_config(path))}
            continue
        hashes[name] = {Path(t.job["output_dir"]).name: config_hash(validate_job_config(t.job))
                        for t in trials(load_sweep_config(path))}
    return hashes


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from helpers.hub_cache import write_hub_cache

    hub = write_hub_cache(Path(tempfile.mkdtemp()) / "hub")
    os.environ.update(HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1", CAPT_DATA_DIR=DATA_DIR)
    if "--write" in sys.argv:
        RECORD.write_text(json.dumps(shipped_hashes(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {RECORD}")
    else:
        print(json.dumps({k: len(v) for k, v in shipped_hashes().items()}))
