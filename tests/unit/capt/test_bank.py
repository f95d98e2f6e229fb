"""CapsuleBank: one batch mixes tasks, and each row equals its capsule alone."""

from __future__ import annotations

import pytest
import torch
from tiny_models import BUILDERS, random_batch

import capt
from capt.capsule import read_capsule

CONFIGS = {
    "rte": capt.CapsuleConfig(init="normal", init_std=0.5),
    "cb": capt.CapsuleConfig(init="normal", init_std=0.5, layers="odd"),
    "copa": capt.CapsuleConfig(init="normal", init_std=0.5, fusion="project"),
}


@pytest.fixture
def capsule_dirs(kind, tmp_path):
    dirs = {}
    for seed, (name, config) in enumerate(CONFIGS.items()):
        torch.manual_seed(100 + seed)
        model = capt.attach(BUILDERS[kind](), config)
        if config.fusion == "project":
            with torch.no_grad():
                model.capsules[0].projection_up.normal_(0.0, 0.1)
        dirs[name] = capt.save_capsule(model, tmp_path / name)
        model.detach()
    return dirs


def test_mixed_batch_equals_each_capsule_alone(kind, capsule_dirs):
    base = BUILDERS[kind]()
    inputs = random_batch(kind, batch=5)
    choice = ["rte", "cb", "copa", "cb", "rte"]
    bank = capt.CapsuleBank(base, capsule_dirs)
    with torch.no_grad():
        mixed = bank(**inputs, capsule=choice).logits
    bank.detach()
    for name, directory in capsule_dirs.items():
        single = capt.load_capsule(base, directory)
        with torch.no_grad():
            alone = single(**inputs).logits
        single.detach()
        for row, chosen in enumerate(choice):
            if chosen == name:
                torch.testing.assert_close(mixed[row], alone[row], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_mixed_generate_equals_each_capsule_alone(kind, capsule_dirs):
    base = BUILDERS[kind]()
    ids = torch.tensor([[5, 9, 13, 17], [6, 10, 14, 18], [7, 11, 15, 19]])
    settings = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    bank = capt.CapsuleBank(base, capsule_dirs)
    mixed = bank.generate(input_ids=ids, capsule=[2, 0, 1], **settings)
    bank.detach()
    for row, name in enumerate(["copa", "rte", "cb"]):
        single = capt.load_capsule(base, capsule_dirs[name])
        assert single.generate(input_ids=ids[row : row + 1], **settings)[0].tolist() == mixed[row].tolist()
        single.detach()


@pytest.mark.parametrize("kind", ["llama"])
def test_bank_selection_errors_are_clear(kind, capsule_dirs):
    bank = capt.CapsuleBank(BUILDERS["llama"](), capsule_dirs)
    inputs = random_batch("llama", batch=2)
    with pytest.raises(capt.CaptError, match="pass capsule="):
        bank(**inputs)
    with pytest.raises(capt.CaptError, match=r"Unknown capsule 'wic'.*\['rte', 'cb', 'copa'\]"):
        bank(**inputs, capsule=["rte", "wic"])
    with pytest.raises(capt.CaptError, match="one capsule per row"):
        bank(**inputs, capsule=["rte"] * 3)
    assert bank.names == ["rte", "cb", "copa"]


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_replace_swaps_one_capsule_in_place_and_refuses_another_slot_count(kind, capsule_dirs, tmp_path):
    """A capsule on other layers (odd only) replaces an all-layer one: its rows answer as that capsule alone,
    the other rows as before; a capsule of two slots cannot join a bank of one-slot capsules."""
    base = BUILDERS[kind]()
    inputs = random_batch(kind, batch=3)
    choice = ["rte", "copa", "rte"]
    bank = capt.CapsuleBank(base, {"rte": capsule_dirs["rte"], "copa": capsule_dirs["copa"]})
    with torch.no_grad():
        before = bank(**inputs, capsule=choice).logits
    bank.replace("rte", read_capsule(base, capsule_dirs["cb"])[0])
    with torch.no_grad():
        after = bank(**inputs, capsule=choice).logits
    bank.detach()
    single = capt.load_capsule(base, capsule_dirs["cb"])
    with torch.no_grad():
        alone = single(**inputs).logits
    single.detach()
    torch.testing.assert_close(after[[0, 2]], alone[[0, 2]], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(after[1], before[1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(after[0], before[0], atol=1e-4)

    wide = capt.attach(BUILDERS[kind](), capt.CapsuleConfig(length=2))
    capt.save_capsule(wide, tmp_path / "wide")
    wide.detach()
    bank = capt.CapsuleBank(base, {"rte": capsule_dirs["rte"]})
    with pytest.raises(capt.CapsuleArtifactError, match="occupies 2 slots; this bank's capsules occupy 1"):
        bank.replace("rte", read_capsule(base, tmp_path / "wide")[0])
    with pytest.raises(capt.CapsuleArtifactError, match="holds no capsule 'boolq'"):
        bank.replace("boolq", read_capsule(base, capsule_dirs["cb"])[0])


@pytest.mark.parametrize("kind", ["t5", "llama"])
def test_add_holds_one_more_capsule_and_leaves_the_others_as_they_answered(kind, capsule_dirs, tmp_path):
    """A capsule added to a running bank answers its rows as a bank built with it; the others are untouched; a
    name held already or a capsule of another slot count is refused before anything changes."""
    base = BUILDERS[kind]()
    inputs = random_batch(kind, batch=3)
    choice = ["rte", "cb", "copa"]
    built = capt.CapsuleBank(base, {name: capsule_dirs[name] for name in ("rte", "copa", "cb")})
    with torch.no_grad():
        expected = built(**inputs, capsule=choice).logits
    built.detach()
    bank = capt.CapsuleBank(base, {"rte": capsule_dirs["rte"], "copa": capsule_dirs["copa"]})
    bank.add("cb", read_capsule(base, capsule_dirs["cb"])[0])
    assert bank.names == ["rte", "copa", "cb"] and len(bank.capsules) == 3
    with torch.no_grad():
        got = bank(**inputs, capsule=choice).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

    wide = capt.attach(BUILDERS[kind](), capt.CapsuleConfig(length=2))
    capt.save_capsule(wide, tmp_path / "wide")
    wide.detach()
    with pytest.raises(capt.CapsuleArtifactError, match="holds a capsule 'cb' already"):
        bank.add("cb", read_capsule(base, capsule_dirs["cb"])[0])
    with pytest.raises(capt.CapsuleArtifactError, match="occupies 2 slots; this bank's capsules occupy 1"):
        bank.add("wic", read_capsule(base, tmp_path / "wide")[0])
    assert bank.names == ["rte", "copa", "cb"] and len(bank.capsules) == 3
