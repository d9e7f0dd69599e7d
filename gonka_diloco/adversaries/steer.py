"""Bounded-budget steering of tolerance mode (`budget_steer`): how far a host can move its claimed
boundary states while every opened segment still replays to within the run's thresholds.

At a boundary the host has R, the end its own (honest) training of the segment reached, and S, the
segment's start. It claims R moved by `fraction` of every threshold of specs §6, the same way at
every boundary of every outer step (a seeded direction σ fixed for the run), so the moves add up;
the next segment trains from the claim, so its replay reproduces whatever the moved moments do.
Every move is measured with the verifier's own functions on the float32 claim and rescaled until it
spends exactly `fraction` of its budget, so rounding never pushes it over.

Two targets:

- "group": the per-group norms alone (what tolerance mode checked before issue 23): the params
  along σ; exp_avg on the coordinates where exp_avg_sq is 0 (embedding rows no batch uses), which
  AdamW turns into steps of lr·m/ε; exp_avg_sq shrunk. Within every group threshold, rejected by
  the update-space check.
- "update": the strongest steering known within EVERY check (groups, update space, the genuine-
  state bound). The effect-weighted checks leave no coordinate cheaper per unit of movement, so
  the budget goes where a move persists: the params along σ on `where` coordinates ("free": those
  with exp_avg_sq = 0, where no gradient pulls a move back and weight decay alone shrinks it;
  "all": every coordinate); exp_avg moved by the update-space budget so that the next steps move
  the params along σ too (capped by the exp_avg group norm and by |m̂| ≤ C(t)·(√v̂ + ε));
  AdamW's denominator shrunk where the honest update already moves along σ and grown where it
  moves against it (steps along σ larger), capped by the denominator RMS and exp_avg_sq norm.
  `where="along"` instead moves with the training itself: the params a step farther along the
  segment's own movement, exp_avg scaled up, every denominator shrunk (Δ made larger).

The summed-residual checks (specs §6.4) sum the residuals of a set of segments; "update" spends
`fraction` of them at every boundary the same way, divided by √m for the m segments one check sums
(`summed_segments`), so that every sum passes. `cancel_plan` is the other way to meet them (issue
36): moves that cancel in whatever one check sums, each within its per-segment budget.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from protocol.config import InnerOptim, RunConfig
from replay.step import State
from verifier.calibrate import FLOOR
from verifier.tolerance import Cumulative, group_distance
from verifier.update_space import bias_corrections, genuine_bound, update_distances

TARGETS = ("group", "update")
WHERE = ("free", "all", "along")
_P, _M, _V = "param/", "exp_avg/", "exp_avg_sq/"


def direction(seed: int, name: str, shape: torch.Size) -> Tensor:
    """σ for one tensor: fixed random signs, the same at every boundary and outer step."""
    key = int.from_bytes(hashlib.sha256(f"budget_steer:{seed}:{name}".encode()).digest()[:8], "big") >> 1
    g = torch.Generator().manual_seed(key)
    return torch.randint(0, 2, shape, generator=g).to(torch.float64) * 2 - 1


def summed_segments(cfg: RunConfig) -> int:
    """The most segments one check sums when nobody disputes (specs §6.4): a checker's window, or
    a challenge's s. (Sets of one are not summed; m = 1 then asks nothing more of a boundary.)"""
    return cfg.window_len if cfg.windowed else cfg.sampled_segments


def budgets(
    cfg: RunConfig, fraction: float, cumulative: bool = True, segment: int | None = None
) -> dict[str, float]:
    """`fraction` of every threshold; a bitwise run (thresholds 0) is given the smallest one
    calibration ever proposes (any move is then caught by the hash). With `cumulative`, also of the
    thresholds over summed segments, per boundary: m boundaries moved the same way by ratio ρ each
    sum to at most √m·ρ (specs §6.4), so ρ = fraction·τ/√m for the m of `summed_segments` (∞ where
    the run sets none; `False`: ignored). `segment` (windows): the boundary at its end; a block of
    L ≥ 2 segments sums L, and a lone last segment (`RunConfig.lone_last`), summed in tolerance
    mode with the w before it, keeps τ·(√(w + 1) − √w) beside their τ/√w each, what holds the
    run of w + 1 within τ·√(w + 1)."""
    out = {g: fraction * max(t, FLOOR) for g, t in cfg.tolerances.items()}
    share = 1 / math.sqrt(summed_segments(cfg))
    if segment is not None and cfg.windowed:
        n, w = cfg.n_segments, cfg.window_len
        length = min(w, n - segment // w * w)
        if segment == n - 1 and cfg.lone_last:
            share = math.sqrt(w + 1) - math.sqrt(w)
        elif length >= 2:
            share = 1 / math.sqrt(length)
    for g, t in cfg.cumulative_tolerances.items():
        out[g] = fraction * t * share if cumulative else math.inf
    return out


def boundary_cumulative(end: State, claim: State, start: State, inner: InnerOptim) -> dict[str, float]:
    """The summed checks' ratios of one boundary alone: its per-boundary ratio ρ. Boundaries that keep
    theirs within τ/√m keep every sum of m of them within τ, and aligned boundaries reach it: the
    most a host can spend on the cumulative checks."""
    total = Cumulative()
    total.add(end, claim, start, inner)
    return total.latest


def cancel_plan(cfg: RunConfig, how: str) -> list[int]:
    """The multiple of the move δ the host claims at the end of each segment 0 … n−1 (issue 36).

    "last": δ at the end of every segment but the last, −(s−1)·δ at θ_H. Under sampling segments
    every challenge opens the last segment and s − 1 others, so every challenge's residuals sum to
    ≈ 0, while the n − 1 moves stay in θ_H: (n − s)·δ of steering.
    "window": inside each aligned block of w segments, δ at the end of every segment but its last
    and −(w'−1)·δ at that one (w' the block's length): every window sums to 0, and so does the move
    the block leaves behind (a contiguous run's residuals are the drift its moves cause)."""
    n = cfg.n_segments
    if how == "last":
        return [1] * (n - 1) + [-(cfg.sampled_segments - 1)]
    if how == "window":
        w = cfg.window_len
        out: list[int] = []
        for a in range(0, n, w):
            size = min(w, n - a)
            out += [1] * (size - 1) + [-(size - 1)]
        return out
    raise ValueError(f"cancel must be one of {CANCELS}")


CANCELS = ("last", "window")


def cancel_move(ends: list[State], starts: list[State], plan: list[int], cfg: RunConfig, fraction: float,
                seed: int = 0) -> dict[str, Tensor]:  # fmt: skip
    """δ for `cancel_plan`: one parameter move along σ on the coordinates no gradient has reached by
    the end of segment 0 (exp_avg_sq = 0; all of them if none), as large as every boundary's
    per-segment parameter budget allows at `fraction` for its multiple, measured on an honest pass
    (`ends`, `starts`: the segments' honest ends and starts). The moments stay exact."""
    names = sorted(k[len(_P) :] for k in ends[0] if k.startswith(_P))
    free = {n: ends[0][_V + n] == 0 for n in names}
    mask = free if any(bool(f.any()) for f in free.values()) else {n: torch.ones_like(free[n]) for n in names}
    unit = {n: direction(seed, n, ends[0][_P + n].shape) * mask[n] for n in names}
    norm = math.sqrt(sum(float(u.square().sum()) for u in unit.values()))
    tau = budgets(cfg, fraction)["param"]
    scale = math.inf
    for end, start, q in zip(ends, starts, plan, strict=True):
        if q:
            moved = math.sqrt(sum(float((end[_P + n].double() - start[_P + n].double()).square().sum())
                                  for n in names))  # fmt: skip
            scale = min(scale, tau * moved / (abs(q) * norm))
    return {n: unit[n] * (0.0 if not math.isfinite(scale) else scale) for n in names}


def moved_params(end: State, move: Mapping[str, Tensor], q: int) -> State:
    """`end` with its parameters moved by q·`move` (float32, like `end`)."""
    return {**end, **{_P + n: (end[_P + n].double() + q * d).float() for n, d in move.items()}}


Apply = Callable[[float], State]
Ratio = Callable[[State], float]


def _fit(apply: Apply, ratio: Ratio, probe: float) -> State:
    """apply(s) at the largest scale s found where ratio (the largest distance ÷ its budget) is at
    most 1, starting from `probe`: distances are nearly linear in s, and a bracketing search absorbs
    float32 rounding (a move below a coordinate's resolution rounds to 0 or to a whole ulp)."""
    lo, hi, s = 0.0, math.inf, probe
    for _ in range(24):
        r = ratio(apply(s))
        if not math.isfinite(r):
            hi = s
        elif r <= 1.0:
            lo = s
            if r >= 0.999:
                break
        else:
            hi = s
        guess = s / r * 0.9995 if 0.0 < r < math.inf else (s * 10.0 if r == 0.0 else s / 10.0)
        s = guess if lo < guess < hi else (math.sqrt(lo * hi) if lo > 0 and hi < math.inf else
                                           (s * 10.0 if hi == math.inf else (lo + hi) / 2))  # fmt: skip
    return apply(lo)


def steer_boundary(
    end: State, start: State, cfg: RunConfig, fraction: float, target: str = "update", where: str = "free",
    seed: int = 0, params: bool = True, cumulative: bool = True, segment: int | None = None,
) -> State:  # fmt: skip
    """The claimed boundary state: `end` (the host's own training of the segment from `start`)
    moved by `fraction` of every budget, as the module docstring says (`params=False`: the moments'
    budgets alone, the parameters exact; `cumulative=False`: the run's thresholds over all opened
    segments ignored, every boundary spends the per-segment budgets; `segment`: the one `end`
    ends, for `budgets`' share of its block). Pure; float32 like `end`."""
    if target not in TARGETS or where not in WHERE:
        raise ValueError(f"target must be one of {TARGETS}, where one of {WHERE}")
    tau = budgets(cfg, fraction, cumulative, segment)
    inner = cfg.inner
    names = sorted(k[len(_P) :] for k in end if k.startswith(_P))
    bc1, bc2 = bias_corrections(float(end["step"]), inner)
    sqrt_v = {n: (end[_V + n].double() / bc2).sqrt() for n in names}
    d = {n: sqrt_v[n] + inner.eps for n in names}  # AdamW's denominator at the boundary
    free = {n: end[_V + n] == 0 for n in names}
    any_free = any(bool(f.any()) for f in free.values())
    sigma = {n: direction(seed, n, end[_P + n].shape) for n in names}
    where_mask = free if where == "free" and any_free else {n: torch.ones_like(free[n]) for n in names}
    update = target == "update"

    def dist(group: str) -> Ratio:
        return lambda c: group_distance(end, c, start, group) / tau[group]

    def upd(which: str) -> Ratio:
        return lambda c: update_distances(end, c, inner)[which] / tau[which]

    def cum(which: str) -> Ratio:
        if not math.isfinite(tau[which]):
            return lambda c: 0.0
        return lambda c: boundary_cumulative(end, c, start, inner)[which] / tau[which]

    def worst(*ratios: Ratio) -> Ratio:
        return lambda c: max(r(c) for r in ratios)

    def moved(base: State, prefix: str, move: Mapping[str, Tensor], s: float) -> State:
        return {**base, **{prefix + n: (end[prefix + n].double() + s * move[n]).float() for n in names}}

    # the params: along σ on the chosen coordinates
    along = update and where == "along"  # more of what the segment did: a step farther, larger steps
    if along:
        dtheta = {n: end[_P + n].double() - start[_P + n].double() for n in names}
    else:
        dtheta = {n: sigma[n] * where_mask[n] for n in names}
    ratio_p = worst(dist("param"), cum("cumulative"))
    out = _fit(lambda s: moved(end, _P, dtheta, s), ratio_p, 1e-6) if params else dict(end)

    # exp_avg: −m̂ moves θ along +σ
    if update:  # a unit of update space is the same movement everywhere: spend it where θ moves
        dm = {n: end[_M + n].double() if along else -sigma[n] * where_mask[n] * d[n] * bc1 for n in names}
        ratio_m = worst(dist("exp_avg"), upd("update"), cum("cumulative_update"))
    else:  # where exp_avg_sq = 0 AdamW steps lr·m/ε (else: the smallest denominators)
        cheap = free if any_free else _smallest(d, 0.01)
        dm = {n: -sigma[n] * cheap[n] for n in names}
        ratio_m = dist("exp_avg")
    base_m = out

    def apply_m(s: float) -> State:
        st = moved(base_m, _M, dm, s)
        return make_genuine(st, inner) if update else st

    out = _fit(apply_m, ratio_m, 1e-6)

    # exp_avg_sq
    base_v = out
    if update:  # √v̂ moved by ρ·σ·sign(m): smaller where the step moves θ along σ, larger against
        rel = {n: -torch.ones_like(sigma[n]) if along else sigma[n] * torch.sign(base_v[_M + n].double())
               for n in names}  # fmt: skip
        ratio_v = worst(dist("exp_avg_sq"), upd("denominator"), cum("cumulative_update"))

        def apply_v(s: float) -> State:
            v = {_V + n: (sqrt_v[n] * (1 + s * rel[n]).clamp_min(0)).square().mul(bc2).float() for n in names}
            return make_genuine({**base_v, **v}, inner)
    else:  # every denominator shrunk (AdamW's steps grow); the free rows stay 0
        ratio_v = dist("exp_avg_sq")

        def apply_v(s: float) -> State:
            v = {_V + n: (end[_V + n].double() * (1 - s)).clamp_min(0).float() for n in names}
            return {**base_v, **v}

    out = _fit(apply_v, ratio_v, 1e-6)
    if update and ratio_m(out) > 1.0:  # the clamp moved m: v stays
        return base_v
    return out


def _smallest(d: Mapping[str, Tensor], share: float) -> dict[str, Tensor]:
    flat = torch.cat([t.reshape(-1) for t in d.values()])
    cut = float(flat.kthvalue(max(1, int(share * flat.numel()))).values)
    return {n: t <= cut for n, t in d.items()}


def make_genuine(st: State, inner: InnerOptim) -> State:
    """exp_avg clamped to |m̂| ≤ C(t)·(√v̂ + ε), the bound every genuine AdamW state meets (specs
    §6.3): what a forger does to any state it makes up, so that only replay can tell."""
    step = float(st["step"])
    if step < 1:
        return st
    bc1, bc2 = bias_corrections(step, inner)
    c = genuine_bound(int(step), inner.beta1, inner.beta2)
    if not math.isfinite(c):
        return st
    out = dict(st)
    for key in [k for k in st if k.startswith(_M)]:
        n = key[len(_M) :]
        cap = c * bc1 * ((st[_V + n].double() / bc2).sqrt() + inner.eps)
        out[key] = torch.minimum(torch.maximum(st[key].double(), -cap), cap).float()
    return out
