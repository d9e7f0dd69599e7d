"""Tolerance mode's moment checks in update space and the genuine-AdamW-state bound (specs §6.3):
the bound against real AdamW, the vectors recomputed from their JSON, and the run config's fields."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from gonka_diloco.adversaries.lab import tiny_config
from protocol.config import InnerOptim, ReplayMode
from protocol.messages import MsgCreateRun
from protocol.wire import from_any, to_any
from specs.make_vectors import set_from_json
from specs.tolerance_vectors import first_failed
from verifier.calibrate import CONFIG_FIELDS
from verifier.tolerance import (
    CUMULATIVE_CHECKS,
    TOLERANCE_CHECKS,
    Cumulative,
    cumulative_mismatch,
    tolerance_distances,
    tolerance_mismatch,
)
from verifier.update_space import GENUINE_SLACK, genuine_bound, genuine_mismatch, update_distances

VECTORS = Path(__file__).resolve().parents[1] / "specs" / "vectors" / "tolerance.json"
HOST = "gonka1k4swv40ur28fvu54p8mskjj4lxkgsj07u9f8ny"


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))


def _json_float(x: float) -> float | None:
    return x if math.isfinite(x) else None


def test_vectors_recompute_from_json() -> None:
    v = json.loads(VECTORS.read_text())
    inner = InnerOptim(**v["inner"])
    assert v["slack"] == GENUINE_SLACK
    for b in v["bounds"]:
        assert _close(_json_float(genuine_bound(b["step"], b["beta1"], b["beta2"])), b["bound"]), b
    start, replay = set_from_json(v["start"]), set_from_json(v["replay"])
    seen = set()
    for c in v["cases"]:
        claim = set_from_json(c["input"]["claim"])
        d = tolerance_distances(replay, claim, start, inner)
        want_d = c["output"]["distances"]
        assert all(_close(_json_float(d[g]), want_d[g]) for g in TOLERANCE_CHECKS), c["label"]
        assert (genuine_mismatch(claim, inner) is None) == c["output"]["genuine"], c["label"]
        want = c["output"]["first_failed"]
        assert first_failed(replay, claim, start, v["thresholds"], inner) == want, c["label"]
        assert (tolerance_mismatch(replay, claim, start, v["thresholds"], inner) is None) == (want is None)
        seen.add(want)
    assert seen == {None, "genuine", "param", "exp_avg_sq", "update", "denominator"}  # each rule fires once
    for g in v["genuine"]:
        assert (genuine_mismatch(set_from_json(g["input"]), inner) is None) == g["output"], g["label"]


def test_the_bound_grows_from_one_to_its_limit_and_real_adamw_stays_under_it() -> None:
    limit = 0.1 / math.sqrt(0.05 * (1 - 0.81 / 0.95))
    cs = [genuine_bound(t, 0.9, 0.95) for t in range(1, 400)]
    assert cs[0] == 1.0 and all(a <= b for a, b in itertools.pairwise(cs)) and cs[-1] < limit
    assert cs[-1] == pytest.approx(limit, rel=1e-6)
    # AdamW on the worst gradients (growing as (β2/β1)^t: Cauchy–Schwarz's equality case), on noise,
    # on one sign forever: the state it keeps never exceeds (1 + κ)·C(t), and comes close to it
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(3000))
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, foreach=False)
    worst = 0.0
    for t in range(1, 120):
        grow = (0.95 / 0.9) ** t
        noise = torch.randn(1000, generator=g)
        p.grad = torch.cat([torch.full((1000,), 1e-3 * grow), noise, torch.ones(1000)])
        opt.step()
        st = opt.state[p]
        state = {"exp_avg/p": st["exp_avg"], "exp_avg_sq/p": st["exp_avg_sq"], "step": st["step"].float()}
        assert genuine_mismatch(state, InnerOptim(lr=1e-3, weight_decay=0.0)) is None, t
        m_hat = st["exp_avg"].double() / (1 - 0.9**t)
        ratio = float((m_hat.abs() / (st["exp_avg_sq"].double() / (1 - 0.95**t)).sqrt()).max())
        worst = max(worst, ratio / genuine_bound(t, 0.9, 0.95))
    assert 0.999 < worst <= 1 + 1e-5  # the bound is tight: the slack κ only absorbs rounding


def test_update_distance_weighs_a_nudge_by_what_adamw_makes_of_it() -> None:
    inner = InnerOptim()
    replay = {"exp_avg/w": torch.tensor([1e-3, 0.0]), "exp_avg_sq/w": torch.tensor([1e-6, 0.0]),
              "step": torch.tensor(50.0)}  # fmt: skip
    nudged = {**replay, "exp_avg/w": torch.tensor([1e-3, 1e-9])}  # 1e-6 of m where v = 0
    d = update_distances(replay, nudged, inner)
    assert d["update"] > 0.09 and d["denominator"] == 0.0  # m/ε = 0.1: a tenth of the real update
    bigger = {**replay, "exp_avg/w": torch.tensor([1e-3 + 1e-9, 0.0])}  # the same nudge where v is large
    assert update_distances(replay, bigger, inner)["update"] < 1e-5
    negative = {**replay, "exp_avg_sq/w": torch.tensor([-1.0, 0.0])}
    assert update_distances(replay, negative, inner)["update"] == math.inf
    assert "genuine" not in str(genuine_mismatch(nudged, inner) or "")  # 0.1 < C(t): genuine, yet caught


def test_run_config_carries_the_new_thresholds_and_omits_them_unset() -> None:
    tol = dict(replay_mode=ReplayMode.TOLERANCE, tolerance=1e-5, tolerance_exp_avg=2e-5,
               tolerance_exp_avg_sq=3e-5)  # fmt: skip
    old = tiny_config(**tol)
    dump = old.model_dump(mode="json")
    assert "tolerance_update" not in dump and "tolerance_denominator" not in dump  # old hashes unchanged
    assert old.tolerances["update"] == 2e-5 and old.tolerances["denominator"] == 3e-5  # unset: the moments'
    new = tiny_config(**tol, tolerance_update=4e-7, tolerance_denominator=5e-7)
    assert new.tolerances["update"] == 4e-7 and new.tolerances["denominator"] == 5e-7
    assert new.config_hash() != old.config_hash()
    assert set(CONFIG_FIELDS.values()) <= set(type(new).model_fields)
    for cfg in (old, new):
        back = from_any(to_any(MsgCreateRun(creator=HOST, config=cfg)))
        assert back.config == cfg and back.config.config_hash() == cfg.config_hash()  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        tiny_config(**tol, tolerance_update=-1.0)


def test_cumulative_vectors_recompute_from_json() -> None:
    """specs §6.4: sets of two or more replayed segments' residuals summed, from the JSON inputs alone
    (the last one `forced`: sampling segments' always-opened segment, the drawn ones summed apart)."""
    v = json.loads(VECTORS.read_text())
    inner = InnerOptim(**v["inner"])
    start, replay = set_from_json(v["start"]), set_from_json(v["replay"])
    cum = v["cumulative"]
    claims = {k: set_from_json(c) for k, c in cum["claims"].items()}
    seen = set()
    for c in cum["cases"]:
        total = Cumulative()
        names = c["input"]["claims"]
        for i, name in enumerate(names):
            assert tolerance_mismatch(replay, claims[name], start, v["thresholds"], inner) is None
            forced = c["input"]["forced_last"] and i == len(names) - 1
            total.add(replay, claims[name], start, inner, forced=forced)
        sets, want = total.sets(), c["output"]["sets"]
        assert set(sets) == set(want), c["label"]  # checked in SUMMED_SETS order (specs §6.4)
        for name in sets:
            for g in CUMULATIVE_CHECKS:  # float32 accumulators: exact sums up to the float64 norms' order
                got, exp = sets[name][g], want[name][g]
                assert abs(got - exp) <= 1e-9 * max(abs(got), abs(exp)) + 1e-12, (c["label"], name, g)
        failed = next(((g, name) for g in CUMULATIVE_CHECKS for name, d in sets.items()
                       if not d[g] < cum["thresholds"][g]), (None, None))  # fmt: skip
        assert list(failed) == [c["output"]["first_failed"], c["output"]["failed_set"]], c["label"]
        assert (cumulative_mismatch(total, cum["thresholds"]) is None) == (failed[0] is None)
        seen.add(failed)
    assert seen == {(None, None), ("cumulative", "all"), ("cumulative_update", "all"),
                    ("cumulative", "drawn")}  # fmt: skip
