"""The benchmark's robust aggregators and attacks on tiny tensors, against hand-computed values.

The attack benchmark's conclusions rest on these rules being the textbook ones, so their math is
checked here (the benchmark itself is not a test).
"""

from __future__ import annotations

import pytest
import torch

from bench.aggregators import (
    a_little_is_enough,
    alie_z,
    centered_clipping,
    mean,
    median,
    scaled,
    sign_flip,
    trimmed_mean,
)


def deltas(*values: float) -> list[dict[str, torch.Tensor]]:
    return [{"w": torch.tensor([float(v)])} for v in values]


def test_mean_and_median() -> None:
    assert mean(deltas(1, 5, 3, 3))["w"].item() == 3.0
    assert median(deltas(1, 5, 3))["w"].item() == 3.0
    assert median(deltas(1, 5, 3, 2))["w"].item() == 2.5  # even count: mean of the middle two
    two_coords = [{"w": torch.tensor(v)} for v in ([1.0, 9.0], [4.0, 0.0], [2.0, 7.0])]
    assert median(two_coords)["w"].tolist() == [2.0, 7.0]  # coordinate-wise, not per host


def test_trimmed_mean() -> None:
    assert trimmed_mean(deltas(1, 2, 3, 100), 1)["w"].item() == 2.5
    assert trimmed_mean(deltas(-50, 1, 2, 3, 4, 100), 2)["w"].item() == 2.5
    with pytest.raises(ValueError):
        trimmed_mean(deltas(1, 2), 1)


def test_centered_clipping_by_hand() -> None:
    # v0 = median = 1.5; diffs -1.5 -0.5 0.5 10.5, the last clipped to τ = 2 → v1 = 1.5 + 0.5/4 = 1.625;
    # diffs -1.625 -0.625 0.375 10.375 → -1.625 -0.625 0.375 2 → v2 = 1.625 + 0.125/4 = 1.65625.
    d = deltas(0, 1, 2, 12)
    assert centered_clipping(d, tau=2.0, iters=1)["w"].item() == pytest.approx(1.625)
    assert centered_clipping(d, tau=2.0, iters=2)["w"].item() == pytest.approx(1.65625)


def test_centered_clipping_measures_the_whole_delta() -> None:
    # One outlier (3, 4) of norm 5 across two tensors, τ = 1: it moves v by (3, 4)/5/4.
    d = [{"a": torch.tensor([0.0]), "b": torch.tensor([0.0])} for _ in range(3)]
    d.append({"a": torch.tensor([3.0]), "b": torch.tensor([4.0])})
    v = centered_clipping(d, tau=1.0, iters=1)
    assert v["a"].item() == pytest.approx(0.15)
    assert v["b"].item() == pytest.approx(0.2)


def test_attacks() -> None:
    g = torch.Generator().manual_seed(0)
    own = {"w": torch.tensor([1.0, -2.0])}
    honest = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([3.0, 2.0])}]
    assert sign_flip(own, honest, 1, g)["w"].tolist() == [-1.0, 2.0]
    assert scaled(own, honest, 1, g)["w"].tolist() == [10.0, -20.0]
    assert alie_z(8, 2) == pytest.approx(0.3186, abs=1e-4)  # Φ⁻¹(5/8): s = 8/2 + 1 − 2 = 3
    z = alie_z(3, 1)  # n = 3, f = 1: s = 1, Φ⁻¹(2/3)
    # μ = (2, 1), σ (population) = (1, 1)
    assert a_little_is_enough(own, honest, 1, g)["w"].tolist() == pytest.approx([2 - z, 1 - z])
