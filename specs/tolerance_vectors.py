"""Vectors of tolerance mode's moment checks (specs/protocol.md §6.3; `specs/vectors/tolerance.json`).

Small exact float32 states: a segment start, the verifier's replayed end and several claimed ends,
each with the five distances of `verifier.tolerance.TOLERANCE_CHECKS`, whether the claim is a
genuine AdamW state, and which check fails first under the listed thresholds (none: accepted);
the bound C(t) for several (β1, β2, t); and the genuine-state verdict of edge cases. Distances are
float64 sums whose order an implementation may choose: compare them to ~1e-12 relative.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from protocol.config import InnerOptim
from verifier.tolerance import (
    CUMULATIVE_CHECKS,
    TOLERANCE_CHECKS,
    Cumulative,
    cumulative_mismatch,
    tolerance_distances,
    tolerance_mismatch,
)
from verifier.update_space import GENUINE_SLACK, genuine_bound, genuine_mismatch

State = dict[str, torch.Tensor]
THRESHOLDS = {"param": 1e-3, "exp_avg": 1e-3, "exp_avg_sq": 1e-3, "update": 1e-3, "denominator": 1e-3}
CUMULATIVE_THRESHOLDS = {"cumulative": 2.4e-4, "cumulative_update": 9e-5}
"""§6.4's thresholds for the `cumulative` vectors: below what one residual of theirs reaches alone
(so two aligned, √2 times it, fail), above 1/√2 of it (two residuals, one of them 0)."""


def _float(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def first_failed(replay: State, claim: State, start: State, thresholds: dict[str, float],
                 inner: InnerOptim) -> str | None:  # fmt: skip
    """The spec's order: the genuine-state check, then each distance of TOLERANCE_CHECKS."""
    if genuine_mismatch(claim, inner) is not None:
        return "genuine"
    d = tolerance_distances(replay, claim, start, inner)
    return next((c for c in TOLERANCE_CHECKS if not d[c] < thresholds[c]), None)


def _states() -> tuple[State, State]:
    from specs.make_vectors import ramp

    start: State = {
        "param/w": ramp(6, (2, 3)),
        "param/b": ramp(3, (3,), mul=5),
        "exp_avg/w": ramp(6, (2, 3), mul=11) / 1024,
        "exp_avg/b": ramp(3, (3,), mul=13) / 1024,
        "exp_avg_sq/w": ramp(6, (2, 3), mul=17).abs() / 65536,
        "exp_avg_sq/b": ramp(3, (3,), mul=19).abs() / 65536,
        "step": torch.tensor(2.0),
    }
    start["exp_avg/w"][0, 0] = 0.0  # a coordinate no gradient ever reached (an unused embedding row)
    start["exp_avg_sq/w"][0, 0] = 0.0
    replay: State = {
        "param/w": start["param/w"] - ramp(6, (2, 3), mul=7) / 4096,
        "param/b": start["param/b"] - 1 / 1024,
        "exp_avg/w": start["exp_avg/w"] * 0.875,
        "exp_avg/b": start["exp_avg/b"] * 0.875 + 1 / 8192,
        "exp_avg_sq/w": start["exp_avg_sq/w"] * 0.9375,
        "exp_avg_sq/b": start["exp_avg_sq/b"] * 0.9375 + 1 / 2**20,
        "step": torch.tensor(3.0),
    }
    return start, replay


def _claims(replay: State, inner: InnerOptim) -> dict[str, State]:
    def edit(name: str, index: tuple[int, ...], value: float) -> State:
        out = {k: v.clone() for k, v in replay.items()}
        out[name][index] = value
        return out

    bc1, bc2 = 1 - inner.beta1**3, 1 - inner.beta2**3
    c3 = genuine_bound(3, inner.beta1, inner.beta2)
    v11, b1 = float(replay["exp_avg_sq/w"][1, 1]), float(replay["exp_avg_sq/b"][1])
    up = float(np.nextafter(np.float32(replay["param/w"][1, 2]), np.float32(9)))
    return {
        "equal": replay,
        "one_ulp_param": edit("param/w", (1, 2), up),
        # a nudge the group norm of exp_avg does not see, a step of lr·m̂/ε in update space
        "exp_avg_nudged_where_exp_avg_sq_is_0": edit("exp_avg/w", (0, 0), -(2.0**-36)),
        # exp_avg_sq where it was 0: invisible to the group norm of exp_avg_sq, dominated by the
        # large ones; a quarter of the denominator there
        "exp_avg_sq_set_where_it_was_0": edit("exp_avg_sq/w", (0, 0), 2.0**-60),
        # a denominator shrunk 16× (4× in √v̂) where it is large: both see it
        "denominator_shrunk": edit("exp_avg_sq/b", (1,), b1 / 16),
        # |m̂| = 2·C(t)·√v̂: no gradient sequence gives it
        "not_genuine": edit("exp_avg/w", (1, 1), 2 * c3 * bc1 * math.sqrt(v11 / bc2)),
        "param_moved": edit("param/b", (0,), float(replay["param/b"][0]) + 0.25),
    }


def _residual_claims(replay: State) -> dict[str, State]:
    """Claims off the replay by a small residual in the params and in exp_avg (the next update),
    one way (`up`) or the other (`down`): each within every per-segment threshold."""
    out = {}
    for label, sign, dp in (("up", 1.0, 2.0**-21), ("down", -1.0, 2.0**-21), ("exp_avg_up", 1.0, 0.0)):
        c = {k: v.clone() for k, v in replay.items()}
        c["param/w"][1, 2] += sign * dp
        c["exp_avg/b"][1] *= 1 + sign * 2.0**-11
        out[label] = c
    out["equal"] = replay
    return out


def _cumulative_cases(start: State, replay: State, inner: InnerOptim) -> list[dict[str, Any]]:
    """Replayed segments (each from `start`, replayed to `replay`, claimed as listed), summed (§6.4);
    `forced_last`: the last one is sampling segments' always-opened segment, its set summed apart."""
    from specs.make_vectors import set_to_json

    claims = _residual_claims(replay)
    cases = []
    sequences = {"aligned": ["up", "up", "up"], "opposed": ["up", "down", "up", "down"],
                 "one_of_two": ["up", "equal"], "single": ["up"], "exp_avg_aligned": ["exp_avg_up"] * 2,
                 "exp_avg_one_of_two": ["exp_avg_up", "equal"], "none_off": ["equal", "equal"]}  # fmt: skip
    # forced: the last is the always-opened one; its residual cancels part of the drawn ones' sum, but
    # the drawn ones are summed apart; a single drawn segment is its own per-segment check (s = 2)
    forced = {"cancelled_by_the_last": ["up", "up", "down"], "one_drawn_cancelled": ["up", "down"],
              "drawn_cancel_last_equal": ["up", "down", "equal"]}  # fmt: skip
    every = [*((k, v, False) for k, v in sequences.items()), *((k, v, True) for k, v in forced.items())]
    for label, seq, last in every:
        total = Cumulative()
        for i, name in enumerate(seq):
            assert tolerance_mismatch(replay, claims[name], start, THRESHOLDS, inner) is None
            total.add(replay, claims[name], start, inner, forced=last and i == len(seq) - 1)
        sets = total.sets()
        why = cumulative_mismatch(total, CUMULATIVE_THRESHOLDS)
        failed = next(((c, name) for c in CUMULATIVE_CHECKS for name, d in sets.items()
                       if not d[c] < CUMULATIVE_THRESHOLDS[c]), (None, None))  # fmt: skip
        assert (why is None) == (failed[0] is None)
        out = {"sets": {name: {g: _float(v) for g, v in d.items()} for name, d in sets.items()},
               "distances": {g: _float(v) for g, v in total.distances().items()},
               "first_failed": failed[0], "failed_set": failed[1]}  # fmt: skip
        cases.append({"label": label, "input": {"claims": seq, "forced_last": last}, "output": out})
    return [{"claims": {k: set_to_json(v) for k, v in claims.items()}, "thresholds": CUMULATIVE_THRESHOLDS,
             "cases": cases}]  # fmt: skip


def _genuine_cases() -> dict[str, State]:
    return {
        # t = 1: m = 0.1·g, v = 0.05·g², so |m̂| = √v̂ = |g| (C(1) = 1): genuine
        "t1_first_step": {"exp_avg/x": torch.tensor([0.125, -0.0625, 0.0]),
                          "exp_avg_sq/x": torch.tensor([0.078125, 0.01953125, 0.0]),
                          "step": torch.tensor(1.0)},
        # t = 1, |m̂|/√v̂ = 2: not genuine
        "t1_twice_the_bound": {"exp_avg/x": torch.tensor([0.25]), "exp_avg_sq/x": torch.tensor([0.078125]),
                               "step": torch.tensor(1.0)},
        "step0_nonzero": {"exp_avg/x": torch.tensor([0.0, 2.0**-40]), "exp_avg_sq/x": torch.zeros(2),
                          "step": torch.tensor(0.0)},
        "step0_zero": {"exp_avg/x": torch.zeros(2), "exp_avg_sq/x": torch.zeros(2),
                       "step": torch.tensor(0.0)},
        "negative_v": {"exp_avg/x": torch.zeros(2), "exp_avg_sq/x": torch.tensor([1.0, -1.0]),
                       "step": torch.tensor(4.0)},
        "fractional_step": {"exp_avg/x": torch.zeros(1), "exp_avg_sq/x": torch.zeros(1),
                            "step": torch.tensor(2.5)},
    }  # fmt: skip


def tolerance_vectors() -> dict[str, Any]:
    from specs.make_vectors import set_to_json

    inner = InnerOptim()
    bounds = [
        {"beta1": b1, "beta2": b2, "step": t, "bound": _float(genuine_bound(t, b1, b2))}
        for b1, b2, ts in (
            (0.9, 0.95, (1, 2, 3, 10, 100, 1000)),
            (0.9, 0.999, (1, 10, 1000)),
            (0.0, 0.95, (1, 5)),
            (0.95, 0.9, (1, 10, 100)),
            (0.9, 0.0, (1, 3)),
        )
        for t in ts
    ]
    start, replay = _states()
    cases = []
    for label, claim in _claims(replay, inner).items():
        failed = first_failed(replay, claim, start, THRESHOLDS, inner)
        assert (failed is None) == (tolerance_mismatch(replay, claim, start, THRESHOLDS, inner) is None)
        d = tolerance_distances(replay, claim, start, inner)
        cases.append({
            "label": label,
            "input": {"claim": set_to_json(claim)},
            "output": {"distances": {g: _float(v) for g, v in d.items()},
                       "genuine": genuine_mismatch(claim, inner) is None, "first_failed": failed},
        })  # fmt: skip
    genuine = [
        {"label": label, "input": set_to_json(st), "output": genuine_mismatch(st, inner) is None}
        for label, st in _genuine_cases().items()
    ]
    return {
        "inner": inner.model_dump(mode="json"),
        "slack": GENUINE_SLACK,
        "bounds": bounds,
        "thresholds": THRESHOLDS,
        "start": set_to_json(start),
        "replay": set_to_json(replay),
        "cases": cases,
        "genuine": genuine,
        # §6.4, added after the above: sets of the replayed segments' residuals summed
        "cumulative": _cumulative_cases(start, replay, inner)[0],
    }
