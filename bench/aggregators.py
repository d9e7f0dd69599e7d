"""Robust-aggregation baselines and the attacks they face, on named float32 pseudo-gradients.

These are what a network WITHOUT replay verification can do: combine every submitted Δ with a
rule that tolerates some outliers. The benchmark (`bench.attack`) compares them with our
protocol, which drops unverified Δs and averages only the accepted ones. Statistics are
coordinate-wise over hosts; centered clipping measures distances over the whole flattened Δ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from statistics import NormalDist

import torch
from torch import Tensor

Delta = Mapping[str, Tensor]
Aggregator = Callable[[Sequence[Delta], int], dict[str, Tensor]]
"""(Δs of all hosts, assumed number of adversaries f) -> one aggregated Δ."""


def _stack(deltas: Sequence[Delta], name: str) -> Tensor:
    return torch.stack([d[name] for d in deltas])


def mean(deltas: Sequence[Delta], f: int = 0) -> dict[str, Tensor]:
    """Plain average: what an unverified DiLoCo does."""
    return {n: _stack(deltas, n).mean(0) for n in deltas[0]}


def median(deltas: Sequence[Delta], f: int = 0) -> dict[str, Tensor]:
    """Coordinate-wise median; for an even count the mean of the two middle values."""
    out = {}
    for n in deltas[0]:
        s = _stack(deltas, n).sort(0).values
        k = s.shape[0]
        out[n] = s[k // 2] if k % 2 else (s[k // 2 - 1] + s[k // 2]) / 2
    return out


def trimmed_mean(deltas: Sequence[Delta], f: int) -> dict[str, Tensor]:
    """Per coordinate, drop the f largest and f smallest values and average the rest."""
    if len(deltas) <= 2 * f:
        raise ValueError(f"trimmed mean needs more than 2f = {2 * f} inputs, got {len(deltas)}")
    return {n: _stack(deltas, n).sort(0).values[f : len(deltas) - f].mean(0) for n in deltas[0]}


def _norm(d: Delta) -> float:
    return math.sqrt(sum(float(t.double().square().sum()) for t in d.values()))


def centered_clipping(
    deltas: Sequence[Delta], f: int = 0, *, tau: float | None = None, iters: int = 3
) -> dict[str, Tensor]:
    """Karimireddy et al. 2021: v ← v + mean_i (x_i − v)·min(1, τ/‖x_i − v‖), from the median.

    τ defaults to the median distance of the inputs from the start point: a scale-free choice
    (a fixed τ would have to be tuned to the size of Δ, which changes during training).
    """
    v = median(deltas)
    if tau is None:
        dists = sorted(_norm({n: d[n] - v[n] for n in v}) for d in deltas)
        tau = dists[len(dists) // 2]
    for _ in range(iters):
        step = {n: torch.zeros_like(t) for n, t in v.items()}
        for d in deltas:
            diff = {n: d[n] - v[n] for n in v}
            dist = _norm(diff)
            scale = 1.0 if dist <= tau or dist == 0 else tau / dist
            for n in v:
                step[n] += diff[n] * scale
        v = {n: v[n] + step[n] / len(deltas) for n in v}
    return v


AGGREGATORS: dict[str, Aggregator] = {
    "mean": mean,
    "median": median,
    "trimmed_mean": trimmed_mean,
    "centered_clipping": centered_clipping,
}

# ---------------------------------------------------------------- attacks

Attack = Callable[[Delta, Sequence[Delta], int, torch.Generator], dict[str, Tensor]]
"""(adversary's own honest Δ, the honest hosts' Δs, f, rng) -> the Δ the adversary submits."""


def _rms(t: Tensor) -> float:
    return float(t.double().square().mean().sqrt()) if t.numel() else 0.0


def noise(own: Delta, honest: Sequence[Delta], f: int, g: torch.Generator) -> dict[str, Tensor]:
    """Gaussian noise with the per-tensor RMS of an honest Δ: plausible in size, useless in content."""
    return {n: torch.randn(t.shape, generator=g) * _rms(t) for n, t in own.items()}


def scaled(own: Delta, honest: Sequence[Delta], f: int, g: torch.Generator) -> dict[str, Tensor]:
    """Its own honest Δ times 10."""
    return {n: t * 10 for n, t in own.items()}


def sign_flip(own: Delta, honest: Sequence[Delta], f: int, g: torch.Generator) -> dict[str, Tensor]:
    """Its own honest Δ, negated: pushes the model uphill."""
    return {n: -t for n, t in own.items()}


def alie_z(n: int, f: int) -> float:
    """'A little is enough' (Baruch et al. 2019): the largest z that stays inside the majority."""
    s = n // 2 + 1 - f
    return NormalDist().inv_cdf((n - s) / n)


def a_little_is_enough(own: Delta, honest: Sequence[Delta], f: int, g: torch.Generator) -> dict[str, Tensor]:
    """All adversaries send μ − z·σ of the honest Δs (coordinate-wise), with the paper's z_max."""
    z = alie_z(len(honest) + f, f)
    out = {}
    for n in own:
        s = _stack(honest, n)
        out[n] = s.mean(0) - z * s.std(0, unbiased=False)
    return out


ATTACKS: dict[str, Attack] = {
    "noise": noise,
    "scaled_x10": scaled,
    "sign_flip": sign_flip,
    "alie": a_little_is_enough,
}
