"""A packed member registers its capsule as its trial would (#34, "In the sweep"): two members trained in one pack on a
real MLflow server, each with its own FINISHED run and its own registered version, which downloads, verifies against
the digests the server recorded, and holds the member's own capsule files byte for byte.

tests/integration/test_sweep_pack.py runs a whole packed sweep with registration off (three versions cost ~40 s of
CI there); this one registers through `tracked_pack`, the call a pack trial makes."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
EXPERIMENT = "capt-it-pack-registry"


def test_each_packed_member_registers_its_own_verified_version(mlflow_server, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from pipelines.config.load import validate_job_config
    from pipelines.sweeps.config import load_sweep_config, trials
    from pipelines.tracking.jobs import RunPlan, tracked_pack
    from pipelines.tracking.registry import download_verified_version
    from pipelines.training.packed import train_unfinished_members

    sweep = load_sweep_config(None, [f"storage_path={tmp_path / 'sweeps'}", "data_source=generated", "tasks=[rte]",
                                     "seeds=[0, 1]", "pack.max_members=2", "job.train.max_steps=2",
                                     "job.task.generated_size=16", "job.task.max_eval_examples=4",
                                     "job.train.score_untrained=false"])
    configs = [validate_job_config(trial.job) for trial in trials(sweep)]
    plans = [RunPlan(mlflow_server.uri, experiment=EXPERIMENT, run_name=f"member-s{config.seed}", retry_s=5.0,
                     register=True) for config in configs]
    done = tracked_pack(configs, plans, train_unfinished_members, pack_info={"name": "pack-registry"})

    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    (tmp_path / "dl").mkdir()
    versions = []
    for config, member in zip(configs, done, strict=True):
        assert not member.reused and member.run_id
        run = client.get_run(member.run_id)
        assert run.info.status == "FINISHED" and run.info.experiment_id == experiment
        [version] = client.search_model_versions(f"run_id='{member.run_id}'")
        assert version.name == "capt-tiny-t5-rte" and version.tags["config_hash"] == member.result["config_hash"]
        assert version.tags["artifact_digest"] == member.result["artifact_digest"]
        found = download_verified_version(mlflow_server.uri, version.name, int(version.version), tmp_path / "dl")
        trained = Path(member.result["artifact_dir"])
        for name in ("capsule.safetensors", "capsule.json"):
            assert (found.capsule_dir / name).read_bytes() == (trained / name).read_bytes(), (config.seed, name)
        versions.append(int(version.version))
    assert len(set(versions)) == 2, "one version per member"
    assert done[0].result["artifact_digest"] != done[1].result["artifact_digest"], "two seeds, two capsules"
