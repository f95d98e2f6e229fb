"""Registry, config and package import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from capt import tasks
from capt.tasks import FAMILIES, DataConfig, UnknownTaskError, get, names


def test_names_and_specs():
    assert names() == ("boolq", "cb", "copa", "multirc", "rte", "wic", "csqa")
    for name in names():
        spec = get(name)
        assert spec.name == name
        assert len(spec.label_names) == len(spec.verbalizers) == spec.num_labels
        assert spec.metrics
        for family in FAMILIES:
            assert spec.template(family)
    assert get("rte").verbalizers == ("entailment", "not_entailment")
    assert get("boolq").verbalizers == ("no", "yes") and get("boolq").label_names == ("False", "True")
    assert get("cb").metrics == ("accuracy", "macro_f1")
    assert get("multirc").metrics == ("f1a", "em")
    assert get("csqa").choice_based and get("copa").choice_based


def test_unknown_task_lists_valid_names():
    with pytest.raises(UnknownTaskError) as err:
        get("superglue")
    assert "superglue" in str(err.value) and "boolq, cb, copa, multirc, rte, wic, csqa" in str(err.value)
    assert isinstance(err.value, KeyError)


def test_unknown_family():
    with pytest.raises(ValueError, match="t5, decoder, encoder"):
        get("rte").template("gpt")


def test_data_config_defaults_and_errors(monkeypatch):
    monkeypatch.setenv("CAPT_DATA_DIR", "/somewhere")
    config = DataConfig()
    assert config.data_dir == "/somewhere" and config.source == "local" and config.validation_fraction == 0.1
    monkeypatch.delenv("CAPT_DATA_DIR")
    assert DataConfig().data_dir is None
    with pytest.raises(ValueError, match=r"source='web' \(allowed: hub, local, generated\)"):
        DataConfig(source="web")
    with pytest.raises(ValueError, match="validation_fraction"):
        DataConfig(validation_fraction=1.5)
    with pytest.raises(ValueError, match="max_train_examples"):
        DataConfig(max_train_examples=0)


def test_import_is_light():
    """`capt.tasks` alone (the `capt` package body stubbed out) pulls in no heavy library."""
    import capt.tasks as package

    capt_dir = str(Path(package.__file__).resolve().parents[1])
    heavy = ("datasets", "ray", "mlflow", "accelerate", "torch", "transformers", "capt.tasks.collate")
    code = (f"import sys, types; m = types.ModuleType('capt'); m.__path__ = [{capt_dir!r}]; "
            f"sys.modules['capt'] = m; import capt.tasks as t; t.get('rte'); "
            f"print(sorted(n for n in {heavy!r} if n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_lazy_attributes():
    assert tasks.Collator.__name__ == "Collator"
    with pytest.raises(AttributeError):
        tasks.does_not_exist  # noqa: B018
