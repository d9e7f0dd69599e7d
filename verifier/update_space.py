"""Tolerance mode's checks of the AdamW moments where they matter: in update space, coordinate by
coordinate (specs/protocol.md §6, REPLAY_MISMATCH).

A norm of a moment over a whole group weighs every coordinate by its size, but AdamW does not: the
next step moves coordinate i by lr·m̂_i/(√v̂_i + ε). Where v̂_i ≈ 0 (an embedding row no batch
uses) a nudge of m_i far below any group threshold becomes a step of lr·m_i/ε, and the next
replayed segment, which starts from the claimed state, reproduces it (`budget_steer`). So the
moments are compared in the units AdamW applies them in, with the replay's own denominator
d_i = √(v_r,i/bc2) + ε (bc1 = 1 − β1^t, bc2 = 1 − β2^t, t the step counter) as the yardstick:

- update: a_i = (m_c,i − m_r,i)/(bc1·d_i), the change the claimed exp_avg makes to the next
  update; ‖a‖ / ‖u‖ with u_i = m_r,i/(bc1·d_i), the replay's own update;
- denominator: b_i = (√(v_c,i/bc2) − √(v_r,i/bc2))/d_i, the relative change of the denominator
  every later step divides by; its root mean square over all coordinates.

Both are effect-weighted, so a budget concentrated on the coordinates a size-weighted norm
neglects buys no more movement than one spread evenly. A third check needs no threshold: what a
genuine AdamW state can look like coordinate by coordinate. For any gradient sequence,
|m̂_i| ≤ C(t)·√v̂_i with C(t) from Cauchy–Schwarz (`genuine_bound`), so |m̂_i| ≤ (1 + κ)·C(t)·
(√v̂_i + ε) (κ = `GENUINE_SLACK` covers float32 rounding): in particular m_i ≈ 0 where v_i = 0.

Everything is computed in float64, tensor by tensor in sorted name order and in flat pieces of
`PIECE` elements, so memory stays O(piece) beside the states whatever the model's size.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor

from protocol import moments as qm
from protocol.config import InnerOptim, Moments

UPDATE_CHECKS = ("update", "denominator")
"""Tolerance mode's update-space distances, each with its own threshold (`RunConfig.tolerances`)."""
GENUINE_SLACK = 1e-3
"""κ: relative slack of the genuine-state bound; float32 AdamW stays within ~1e-6 of it."""
GENUINE_SLACK_INT8 = 1.0
"""κ for int8 moments (specs §6.2.1): each step rounds m and v by up to 1/18 of themselves (half a
grid step), so the bound of float32 AdamW does not hold exactly; honest runs measured stay far
inside (1 + κ)·C(t) = 2·C(t) (`bench.statecode`, `tests/test_moments.py`), and a forged state
still cannot take steps beyond 2·C(t)·lr per coordinate (no lr·m/ε)."""
PIECE = 1 << 20
"""Elements per float64 piece: the working memory of every check here."""

_M, _V = "exp_avg/", "exp_avg_sq/"


def bias_corrections(step: float, inner: InnerOptim) -> tuple[float, float]:
    """(1 − β1^t, 1 − β2^t): AdamW's bias corrections after t steps, as torch computes them."""
    return 1.0 - inner.beta1**step, 1.0 - inner.beta2**step


def genuine_bound(step: int, beta1: float, beta2: float) -> float:
    """C(t): the largest |m̂|/√v̂ any gradient sequence gives AdamW after t ≥ 1 steps.

    m_t = (1−β1) Σ β1^(t−i) g_i and v_t = (1−β2) Σ β2^(t−i) g_i², so by Cauchy–Schwarz
    |m_t| ≤ (1−β1) √(S_t/(1−β2)) √v_t with S_t = Σ_{j<t} (β1²/β2)^j; bias-corrected,
    C(t) = (1−β1)/(1−β1^t) · √((1−β2^t) S_t/(1−β2)). C(1) = 1; it grows to
    (1−β1)/√((1−β2)(1−β1²/β2)) (1.1645 at 0.9/0.95). Infinite where no bound exists (β2 = 0 < β1,
    or S_t overflowing)."""
    if step < 1:
        raise ValueError("the bound needs t >= 1")
    if beta2 == 0.0:
        return 1.0 if beta1 == 0.0 else math.inf
    r = beta1 * beta1 / beta2
    try:
        s = float(step) if r == 1.0 else (1.0 - r**step) / (1.0 - r)
    except OverflowError:
        return math.inf
    c = (1.0 - beta1) / (1.0 - beta1**step) * math.sqrt((1.0 - beta2**step) * s / (1.0 - beta2))
    return c if math.isfinite(c) else math.inf


def _names(state: Mapping[str, Tensor]) -> list[str]:
    return sorted(k[len(_M) :] for k in state if k.startswith(_M))


def _pieces(*tensors: Tensor) -> Iterator[tuple[Tensor, ...]]:
    """The same flat range of every tensor, `PIECE` elements at a time, as float64."""
    flat = [t.reshape(-1) for t in tensors]
    n = flat[0].numel()
    for a in range(0, n, PIECE):
        yield tuple(f[a : a + PIECE].double() for f in flat)


def update_distances(
    replay: Mapping[str, Tensor], claim: Mapping[str, Tensor], inner: InnerOptim
) -> dict[str, float]:
    """{"update": ‖a‖/‖u‖, "denominator": rms(b)} (module docstring) between the replayed and the
    claimed end state; inf where a tensor is missing, misshapen or not finite, or v_c < 0.
    Both states must have the same step counter t ≥ 1 (`tolerance_mismatch` checks it first)."""
    inf = {c: math.inf for c in UPDATE_CHECKS}
    step = float(replay["step"])
    if not step >= 1:
        return inf
    bc1, bc2 = bias_corrections(step, inner)
    eps = inner.eps
    a2 = u2 = b2 = 0.0
    n = 0
    for name in _names(replay):
        ts = [s.get(p + name) for s in (replay, claim) for p in (_M, _V)]
        if any(t is None or t.shape != ts[0].shape for t in ts):  # type: ignore[union-attr]
            return inf
        for mr, vr, mc, vc in _pieces(*ts):  # type: ignore[arg-type]
            sr = (vr / bc2).sqrt()
            d = (sr + eps) * bc1
            a2 += float(((mc - mr) / d).square().sum())
            u2 += float((mr / d).square().sum())
            b2 += float((((vc / bc2).sqrt() - sr) / (sr + eps)).square().sum())
            n += mr.numel()
    if not all(math.isfinite(x) for x in (a2, u2, b2)) or n == 0:
        return inf
    update = 0.0 if a2 == 0.0 else (math.inf if u2 == 0.0 else math.sqrt(a2) / math.sqrt(u2))
    return {"update": update, "denominator": math.sqrt(b2 / n)}


def _moment_pairs(state: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor, Tensor] | str]:
    """(name, exp_avg, exp_avg_sq) as float32 per parameter (int8 codes decoded), or a string
    saying what does not fit."""
    if qm.moments_of_state(state) is Moments.INT8:
        for name in qm.int8_names(state):
            try:
                m, v = qm.dequantized(state, name)
            except qm.MomentCodeError as e:
                yield f"{name}: {e}"
                return
            yield name, m, v
        return
    for name in _names(state):
        mf, vf = state[_M + name], state.get(_V + name)
        if vf is None or vf.shape != mf.shape:
            yield f"{_V}{name} does not fit {_M}{name}"
            return
        yield name, mf, vf


def genuine_mismatch(state: Mapping[str, Tensor], inner: InnerOptim) -> str | None:
    """None if every coordinate of the state's moments is one AdamW can produce, else what is not:
    finite moments, v ≥ 0, a whole non-negative step counter, all moments zero at t = 0, and
    |m̂_i| ≤ (1 + κ)·C(t)·(√v̂_i + ε) at t ≥ 1 (no check of that bound where C(t) is infinite).
    Int8 moments (`InnerOptim.moments`) are checked as they decode, with κ = `GENUINE_SLACK_INT8`,
    and must be valid codes."""
    step_t = state.get("step")
    if step_t is None or step_t.numel() != 1:
        return "no step counter"
    step = float(step_t)
    if not math.isfinite(step) or step < 0 or step != math.floor(step):
        return f"step counter {step} is not a whole non-negative number"
    bound = math.inf if step == 0 else genuine_bound(int(step), inner.beta1, inner.beta2)
    bc1, bc2 = bias_corrections(step, inner)
    slack = GENUINE_SLACK if qm.moments_of_state(state) is Moments.FP32 else GENUINE_SLACK_INT8
    limit = (1.0 + slack) * bound
    for item in _moment_pairs(state):
        if isinstance(item, str):
            return item
        name, m, v = item
        worst = 0.0
        for mp, vp in _pieces(m, v):
            if not (bool(torch.isfinite(mp).all()) and bool(torch.isfinite(vp).all())):
                return f"{name}: moments not finite"
            if bool((vp < 0).any()):
                return f"{_V}{name} is negative"
            if step == 0:
                if bool((mp != 0).any()) or bool((vp != 0).any()):
                    return f"{name}: moments not zero at step 0"
                continue
            if math.isfinite(limit):
                ratio = (mp.abs() / bc1) / ((vp / bc2).sqrt() + inner.eps)
                worst = max(worst, float(ratio.max()))
        if worst > limit:
            return (f"{name}: |m̂|/(√v̂+ε) = {worst:.4g} > (1+κ)·C(t) = {limit:.4g} at t = {step:g}: "
                    "no AdamW run gives these moments")  # fmt: skip
    return None


def genuine_ratio(state: Mapping[str, Tensor], inner: InnerOptim) -> float:
    """max over coordinates of |m̂|/((√v̂ + ε)·C(t)): how close a state sits to the genuine bound
    (1 for the worst gradient sequence of float32 AdamW); what `GENUINE_SLACK_INT8` was set from."""
    step = float(state["step"])
    if step < 1:
        return 0.0
    bound = genuine_bound(int(step), inner.beta1, inner.beta2)
    bc1, bc2 = bias_corrections(step, inner)
    worst = 0.0
    for item in _moment_pairs(state):
        if isinstance(item, str):
            raise ValueError(item)
        _, m, v = item
        for mp, vp in _pieces(m, v):
            worst = max(worst, float(((mp.abs() / bc1) / ((vp / bc2).sqrt() + inner.eps)).max()))
    return worst / bound
