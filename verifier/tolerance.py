"""Tolerance mode's distances (specs §6): how far a claimed end state is from the verifier's
replay, group by group (relative norms), in update space (`verifier.update_space`), and summed
over sets of the replayed segments of one contribution (`Cumulative`), each against its threshold.
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
"""Tolerance mode's checks over the replayed segments of one contribution together (`Cumulative`),
each with its own threshold (`RunConfig.cumulative_tolerances`)."""
SUMMED_SETS = ("drawn", "all")
"""The sets of replayed segments whose residuals `Cumulative` sums, in the order they are checked:
the segments drawn at random (sampling segments: all but the always-opened last one), and all. A
set of one segment is not summed: its distance is that segment's own (`tolerance_mismatch`)."""


class Cumulative:
    """The signed residuals of a contribution's replayed segments, summed (specs §6.4).

    Each segment is replayed from the host's claimed start, so a per-segment bound lets a host move
    every boundary a little the same way and the moves add up in θ_H, while honest reduction-order
    noise does not align from one segment to the next. So the residuals of a set S of segments are
    summed, in segment order, and compared with the segments' own movements:

    - `cumulative` = ‖Σ_S (θ_c,i − θ_r,i)‖ / √(Σ_S ‖θ_c,i − θ_s,i‖²);
    - `cumulative_update` = ‖Σ_S (û_c,i − û_r,i)‖ / √(Σ_S ‖û_r,i‖²) with û = m/(bc1·(√(v/bc2) + ε)) the
      next AdamW update of a state (claimed c, replayed r, each with its own moments).

    Dividing by the root of the summed squares keeps the honest value from growing with the number
    of segments summed (independent noise adds in quadrature), so one threshold serves every set; a
    host that moves m boundaries the same way reaches √m times its per-boundary ratio.

    The sets (`SUMMED_SETS`), each of at least two segments: all segments added; and, where one was
    `forced` in (the always-opened last segment of sampling segments, added last), the others (the
    drawn ones). The host knows the forced segment is in every challenge, so in a sum with it the
    forced residual could cancel what the drawn ones add up to in every challenge at once, while
    the unopened boundaries keep their moves; the drawn ones summed alone cannot be cancelled that
    way. A set of one is the segment's own per-segment check, and is left to it.

    Sums are per coordinate, each residual formed in float64 and added into a float32 accumulator in
    segment order (elementwise IEEE: the same bits on every verifier); norms in float64. Memory: two
    float32 vectors of the parameters' size (8 B/param) beside the verification's states, built
    tensor by tensor in pieces of `PIECE` elements."""

    def __init__(self) -> None:
        self.param: dict[str, Tensor] = {}
        self.update: dict[str, Tensor] = {}
        self.moved2 = 0.0  # Σ_i ‖θ_c,i − θ_s,i‖²
        self.steps2 = 0.0  # Σ_i ‖û_r,i‖²
        self.segments = 0
        self.forced = False
        self.drawn: dict[str, float] | None = None  # the drawn set's distances, once a forced one is added
        self.latest: dict[str, float] = {}  # the last added segment's own ratios (one boundary's move)

    @staticmethod
    def _add(acc: dict[str, Tensor], name: str, piece: Tensor, a: int, numel: int) -> float:
        """Adds `piece` at [a, a + len); returns ‖acc piece‖² before the add (float64)."""
        t = acc.get(name)
        if t is None:
            t = acc[name] = torch.zeros(numel, dtype=torch.float32)
        before = t[a : a + piece.numel()].double()
        t[a : a + piece.numel()] = (before + piece).float()
        return float(before.square().sum())

    def add(
        self, replay: State, claim: State, start: State, inner: InnerOptim, *, forced: bool = False
    ) -> None:
        """One replayed segment whose claim passed `tolerance_mismatch` (same names, shapes, step).
        `forced`: the segment every challenge opens (sampling segments' last); it must come last."""
        if self.forced:
            raise ValueError("the forced segment is added after every other")
        moved2 = steps2 = 0.0
        before = {"cumulative": 0.0, "cumulative_update": 0.0}  # ‖Σ‖² of the segments before this one
        own = {"cumulative": 0.0, "cumulative_update": 0.0}  # ‖this residual‖²
        for k in sorted(k for k in claim if k.startswith(PARAM)):
            c, r, s0 = (x[k].reshape(-1) for x in (claim, replay, start))
            n = c.numel()
            for a in range(0, n, PIECE):
                c64, r64, s64 = (x[a : a + PIECE].double() for x in (c, r, s0))
                e = c64 - r64
                before["cumulative"] += self._add(self.param, k, e, a, n)
                own["cumulative"] += float(e.square().sum())
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
                before["cumulative_update"] += self._add(self.update, name, uc - ur, a, n)
                own["cumulative_update"] += float((uc - ur).square().sum())
                steps2 += float(ur.square().sum())
        mine = {"cumulative": moved2, "cumulative_update": steps2}
        self.latest = {c: _ratio(own[c], mine[c]) for c in CUMULATIVE_CHECKS}
        if forced:
            self.forced = True
            if self.segments >= 2:  # the drawn segments: every one added before this one
                dens = {"cumulative": self.moved2, "cumulative_update": self.steps2}
                self.drawn = {c: _ratio(before[c], dens[c]) for c in CUMULATIVE_CHECKS}
        self.moved2 += moved2
        self.steps2 += steps2
        self.segments += 1

    def sets(self) -> dict[str, dict[str, float]]:
        """Every summed set's distances, in `SUMMED_SETS` order: "drawn" (once a forced segment
        followed at least two others) and "all" (at least two segments added)."""
        out = {}
        if self.drawn is not None:
            out["drawn"] = self.drawn
        if self.segments >= 2:
            out["all"] = {}
            for check, acc, den2 in (("cumulative", self.param, self.moved2),
                                     ("cumulative_update", self.update, self.steps2)):  # fmt: skip
                num2 = sum(float(acc[k].double().square().sum()) for k in sorted(acc))
                out["all"][check] = _ratio(num2, den2)
        return out

    def distances(self) -> dict[str, float]:
        """{"cumulative": …, "cumulative_update": …}: the largest over the summed sets (`sets`; 0
        when there are none)."""
        sets = self.sets()
        return {c: max((d[c] for d in sets.values()), default=0.0) for c in CUMULATIVE_CHECKS}


def _ratio(num2: float, den2: float) -> float:
    """√num2 / √den2: 0 when the numerator is 0, ∞ when only the denominator is (or either is not finite)."""
    if not math.isfinite(num2) or not math.isfinite(den2):
        return math.inf
    if num2 == 0.0:
        return 0.0
    return math.inf if den2 == 0.0 else math.sqrt(num2) / math.sqrt(den2)


SET_WORDS = {"drawn": "drawn", "all": "replayed"}


def cumulative_mismatch(total: Cumulative, thresholds: Mapping[str, float]) -> str | None:
    """None if every summed set's residuals are within their thresholds, else the first that is not
    (check by check, each over the sets in `SUMMED_SETS` order)."""
    sets = total.sets()
    for c in CUMULATIVE_CHECKS:
        for name, d in sets.items():
            if not d[c] < thresholds[c]:
                count = total.segments - 1 if name == "drawn" else total.segments
                return (f"{c} distance {d[c]:.3e} >= tolerance {thresholds[c]:.3e} over the {count} "
                        f"{SET_WORDS[name]} segments: their residuals add up")  # fmt: skip
    return None
