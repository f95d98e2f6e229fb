"""VFPT on text models: the first floor(fraction x n) prompt tokens are Re(FFT2) of themselves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from capt.baselines import apply
from capt.baselines.vfpt.model import fourier_count

from . import soft_prompt_checks as checks
from .baselines_helpers import GENERATIVE, build, random_batch, small_config


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_trains_only_its_prompt(kind: str) -> None:
    config = small_config("vfpt", fft_norm="ortho")
    checks.trains_only_its_parameters(kind, config, config.num_tokens * 32)


@pytest.mark.parametrize("norm", ["backward", "ortho"])
def test_fourier_tokens_are_the_real_part_of_the_2d_fft(norm: str) -> None:
    adapted = apply(build("t5"), small_config("vfpt", num_tokens=6, fft_norm=norm))
    prompt = adapted.prompt.detach().double().numpy()
    assert adapted.num_fourier == 3
    expected = np.fft.fft2(prompt[:3], norm=norm).real  # independent of torch.fft: numpy's 2-D transform
    produced = adapted.current_prompt().detach()
    np.testing.assert_allclose(produced[:3].numpy(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(produced[3:], adapted.prompt[3:], rtol=0, atol=0)


def test_fraction_is_floored_and_zero_is_plain_prompt_tuning() -> None:
    # floor(f x n), the authors' int(): 5 tokens at 0.5 give 2 Fourier tokens, 10 at 0.25 give 2, 3 at 0.99 give 2.
    counts = [fourier_count(small_config("vfpt", num_tokens=n, fourier_fraction=f))
              for n, f in [(4, 0.5), (5, 0.5), (3, 0.5), (4, 0.0), (4, 1.0), (10, 0.25), (3, 0.99), (100, 0.5)]]
    assert counts == [2, 2, 1, 0, 4, 2, 2, 50]
    plain = apply(build("bert"), small_config("prompt_tuning"))
    vfpt = apply(build("bert"), small_config("vfpt", fourier_fraction=0.0))
    with torch.no_grad():
        vfpt.prompt.copy_(plain.prompt)
        batch = random_batch("bert")
        torch.testing.assert_close(vfpt(**batch).logits, plain(**batch).logits, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["t5", "llama", "bert"])
def test_round_trip_gives_identical_outputs(kind: str, tmp_path: Path) -> None:
    checks.round_trip(kind, small_config("vfpt"), tmp_path / "artifact")


def test_wrong_base_and_corrupt_files_are_refused(tmp_path: Path) -> None:
    checks.refuses_wrong_base_and_corrupt_files(small_config("vfpt"), tmp_path)


@pytest.mark.parametrize("kind", GENERATIVE)
def test_cached_generate_equals_uncached_greedy(kind: str) -> None:
    checks.cached_generate_is_greedy(kind, small_config("vfpt"))


def test_detach_restores_the_base_model() -> None:
    checks.detach_restores_base("llama", small_config("vfpt"))


def test_prompt_starts_xavier_uniform_over_the_token_width() -> None:
    # Xavier-uniform with fan-in = fan-out = d = 32: U(-b, b), b = sqrt(6 / 64); 200 x 32 draws fill the interval
    # (max within 3 % of b) with the uniform's variance b^2 / 3 (std within 5 %).
    from capt.baselines.vfpt.config import VfptConfig

    assert VfptConfig().init == "xavier"
    adapted = apply(build("t5"), VfptConfig(num_tokens=200))
    bound = (6 / 64) ** 0.5
    values = adapted.prompt.detach()
    assert values.abs().max().item() <= bound and values.abs().max().item() > 0.97 * bound
    assert abs(values.std().item() / (bound / 3**0.5) - 1) < 0.05
    normal = apply(build("t5"), VfptConfig(num_tokens=200, init="normal", init_std=0.02))
    assert normal.prompt.detach().abs().max().item() < 0.2  # one option away: prompt tuning's normal init


def test_config_errors_name_the_key_and_the_allowed_values() -> None:
    from capt.baselines.vfpt.config import VfptConfig

    assert (VfptConfig().fourier_fraction, VfptConfig().fft_norm) == (0.5, "backward")
    with pytest.raises(ValueError, match=r"fourier_fraction.*\[0, 1\]") as error:
        VfptConfig(fourier_fraction=1.5, fft_norm="forward")
    assert "fft_norm" in str(error.value) and "ortho" in str(error.value)
