"""Tolerance mode's distances (specs §6): how far a claimed end state is from the verifier's
replay, group by group (relative norms), in update space (`verifier.update_space`), and summed
over all the opened segments of one contribution (`Cumulative`), each against its threshold.
Pure float64 arithmetic in fixed order: every honest verifier computes the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from protocol.config import InnerOptim
from protocol.inner import STATE_GROUPS
from replay.step import (
    State,
)
from verifier.update_space import PIECE, UPDATE_CHECKS, bias_corrections, genuine_mismatch, update_distances

PARAM = "param/"
"""The prefix of a training state's parameter tensors."""


TOLERANCE_GROUPS = STATE_GROUPS
"""The tensor groups of a training state that tolerance mode compares, each with its own
threshold (`RunConfig.tolerances`); the `step` counter is compared exactly."""


def group_distance(replay: State, claim: State, start: State, group: str) -> float:
    """‖x_replay − x_claim‖ / ‖x_claim − x_start‖ over the tensors `<group>/*`, in float64: how far
    the claimed end is from our replay, relative to how far the segment moved that group."""
    prefix = group + "/"
    num = 0.0
    den = 0.0
    for k, c in claim.items():
        if not k.startswith(prefix):
            continue
        r, s0 = replay.get(k), start.get(k)
        if r is None or s0 is None or r.shape != c.shape or s0.shape != c.shape:
            return math.inf
        c64 = c.double()
        num += float((r.double() - c64).square().sum())
        den += float((c64 - s0.double()).square().sum())
    if not math.isfinite(num) or not math.isfinite(den):
        return math.inf
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num) / math.sqrt(den)


def param_distance(replay: State, claim: State, start: State) -> float:
    """`group_distance` over the parameters."""
    return group_distance(replay, claim, start, "param")


def state_distances(replay: State, claim: State, start: State) -> dict[str, float]:
    """`group_distance` of every tolerance group."""
    return {g: group_distance(replay, claim, start, g) for g in TOLERANCE_GROUPS}


TOLERANCE_CHECKS = (*TOLERANCE_GROUPS, *UPDATE_CHECKS)
"""Every thresholded distance of tolerance mode, in the order it is checked: the three group norms,
then the moments in update space (`verifier.update_space`)."""


def tolerance_distances(replay: State, claim: State, start: State, inner: InnerOptim) -> dict[str, float]:
    """Every distance of `TOLERANCE_CHECKS` between a replayed and a claimed end state."""
    return {**state_distances(replay, claim, start), **update_distances(replay, claim, inner)}


def group_mismatch(replay: State, claim: State, start: State, thresholds: Mapping[str, float]) -> str | None:
    """The group-norm part of `tolerance_mismatch` alone: names, step counter, untracked tensors
    exactly, and each group below its threshold. Not enough on its own (`budget_steer`)."""
    if set(replay) != set(claim):
        return f"claimed state has tensors {sorted(set(claim) ^ set(replay))[:3]} the replay does not"
    if not torch.equal(replay["step"], claim["step"]):
        return f"step counter {claim['step'].tolist()} != replayed {replay['step'].tolist()}"
    grouped = {k for k in claim if k.split("/", 1)[0] in TOLERANCE_GROUPS}
    for k in sorted(set(claim) - grouped - {"step"}):
        if not torch.equal(replay[k], claim[k]):
            return f"{k} differs"
    distances = state_distances(replay, claim, start)
    for g in TOLERANCE_GROUPS:
        if not distances[g] < thresholds[g]:
            return f"{g} distance {distances[g]:.3e} >= tolerance {thresholds[g]:.3e}"
    return None


def tolerance_mismatch(
    replay: State, claim: State, start: State, thresholds: Mapping[str, float], inner: InnerOptim
) -> str | None:
    """None if the claimed end state is within tolerance of the replay, else what is not.

    The whole state is compared (specs §6, REPLAY_MISMATCH): the same tensor names and shapes, the
    step counter exactly, the claim a genuine AdamW state coordinate by coordinate, every group
    (parameters and both AdamW moments) below its own threshold, and the moments in update space
    (`verifier.update_space`) below theirs. Parameters alone are not enough (moments rewritten at a
    boundary seed the next segment and the carried optimizer), and norms over whole groups are not
    either (a nudge of exp_avg where exp_avg_sq ≈ 0 is a step of lr·m/ε).
    """
    if set(replay) != set(claim):
        return f"claimed state has tensors {sorted(set(claim) ^ set(replay))[:3]} the replay does not"
    if not torch.equal(replay["step"], claim["step"]):
        return f"step counter {claim['step'].tolist()} != replayed {replay['step'].tolist()}"
    bad = genuine_mismatch(claim, inner)
    if bad is not None:
        return f"claimed state is not a genuine AdamW state: {bad}"
    why = group_mismatch(replay, claim, start, thresholds)
    if why is not None:
        return why
    distances = update_distances(replay, claim, inner)
    for c in UPDATE_CHECKS:
        if not distances[c] < thresholds[c]:
            return f"{c} distance {distances[c]:.3e} >= tolerance {thresholds[c]:.3e}"
    return None


_M, _V = "exp_avg/", "exp_avg_sq/"
CUMULATIVE_CHECKS = ("cumulative", "cumulative_update")
"""Tolerance mode's checks over all opened segments of one contribution together (`Cumulative`),
each with its own threshold (`RunConfig.cumulative_tolerances`)."""


class Cumulative:
    """The signed residuals of a contribution's opened segments, summed (specs §6.4).

    Each opened segment i is replayed from the host's claimed start, so a per-segment bound lets a
    host move every boundary a little the same way and the moves add up over the segments, while
    honest reduction-order noise does not align from one segment to the next. So, besides each
    segment's own distances, the residuals of all opened segments are summed, in segment order:

    - `cumulative` = ‖Σ_i (θ_c,i − θ_r,i)‖ / Σ_i ‖θ_c,i − θ_s,i‖ (the parameters' residuals against
      the segments' own movements);
    - `cumulative_update` = ‖Σ_i (û_c,i − û_r,i)‖ / Σ_i ‖û_r,i‖ with û = m/(bc1·(√(v/bc2) + ε)) the next
      AdamW update of a state (claimed c, replayed r, each with its own moments: exp_avg and
      exp_avg_sq together, what the next segment's steps reproduce).

    Both are at most the largest per-segment ratio (triangle inequality), reached only when the
    residuals point the same way. Sums are per coordinate, each residual formed in float64 and added
    into a float32 accumulator in segment order (elementwise IEEE: the same bits on every verifier);
    norms in float64. Memory: two float32 vectors of the parameters' size (8 B/param) beside the
    verification's states, built tensor by tensor in pieces of `PIECE` elements."""

    def __init__(self) -> None:
        self.param: dict[str, Tensor] = {}
        self.update: dict[str, Tensor] = {}
        self.moved = 0.0  # Σ_i ‖θ_c,i − θ_s,i‖
        self.steps = 0.0  # Σ_i ‖û_r,i‖
        self.segments = 0

    @staticmethod
    def _add(acc: dict[str, Tensor], name: str, piece: Tensor, a: int, numel: int) -> None:
        t = acc.get(name)
        if t is None:
            t = acc[name] = torch.zeros(numel, dtype=torch.float32)
        t[a : a + piece.numel()] = (t[a : a + piece.numel()].double() + piece).float()

    def add(self, replay: State, claim: State, start: State, inner: InnerOptim) -> None:
        """One opened segment whose claim passed `tolerance_mismatch` (same names, shapes, step)."""
        moved2 = steps2 = 0.0
        for k in sorted(k for k in claim if k.startswith(PARAM)):
            c, r, s0 = (x[k].reshape(-1) for x in (claim, replay, start))
            n = c.numel()
            for a in range(0, n, PIECE):
                c64, r64, s64 = (x[a : a + PIECE].double() for x in (c, r, s0))
                self._add(self.param, k, c64 - r64, a, n)
                moved2 += float((c64 - s64).square().sum())
        bc1, bc2 = bias_corrections(float(replay["step"]), inner)
        for k in sorted(k for k in claim if k.startswith(_M)):
            name = k[len(_M) :]
            mc, vc, mr, vr = (x[p + name].reshape(-1) for x in (claim, replay) for p in (_M, _V))
            n = mc.numel()
            for a in range(0, n, PIECE):
                mc64, vc64, mr64, vr64 = (x[a : a + PIECE].double() for x in (mc, vc, mr, vr))
                ur = mr64 / (bc1 * ((vr64 / bc2).sqrt() + inner.eps))
                uc = mc64 / (bc1 * ((vc64 / bc2).sqrt() + inner.eps))
                self._add(self.update, name, uc - ur, a, n)
                steps2 += float(ur.square().sum())
        self.moved += math.sqrt(moved2)
        self.steps += math.sqrt(steps2)
        self.segments += 1

    def distances(self) -> dict[str, float]:
        """{"cumulative": …, "cumulative_update": …} over the segments added (0 when none)."""
        out = {}
        sums = (("cumulative", self.param, self.moved), ("cumulative_update", self.update, self.steps))
        for check, acc, den in sums:
            num2 = sum(float(acc[k].double().square().sum()) for k in sorted(acc))
            if not math.isfinite(num2) or not math.isfinite(den):
                out[check] = math.inf
            elif num2 == 0.0:
                out[check] = 0.0
            else:
                out[check] = math.inf if den == 0.0 else math.sqrt(num2) / den
        return out


def cumulative_mismatch(total: Cumulative, thresholds: Mapping[str, float]) -> str | None:
    """None if the opened segments' summed residuals are within their thresholds, else which is not."""
    d = total.distances()
    for c in CUMULATIVE_CHECKS:
        if not d[c] < thresholds[c]:
            return (f"{c} distance {d[c]:.3e} >= tolerance {thresholds[c]:.3e} over {total.segments} "
                    "opened segments: their residuals add up")  # fmt: skip
    return None
