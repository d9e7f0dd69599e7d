"""The run defaults meet issue 10's collusion goals by the closed forms (`protocol.collusion`):
for accomplices holding any minority of the verifier stake, a fake reaches the model in ≤ 1% of
outer steps and faking loses money. `bench.collusion` measures the same on the state machine; one
of its sampling-windows cells runs here, against its exact formula."""

from __future__ import annotations

import math
import random

import pytest

from bench.collusion import KEYS, Trial, bench_config
from gonka_diloco.plan import window_cheat
from protocol.collusion import Defense, every_minority, max_safe_share, window_odds_keys
from protocol.config import RunConfig, Sampling, Stake
from protocol.prf import window

GNK = 10**9
FIELDS = RunConfig.model_fields


def defense(v: int, p: int, a: int) -> Defense:
    st = Stake()
    return Defense(v, p, a, st.host_slash_bps, st.fraud_host_slash_bps, st.fraud_verifier_slash_bps)


def worst_minority(d: Defense) -> tuple[float, float]:
    """(max P(pass), max profit / R) over q < 1/2: many-keys bound and every equal-keys split ≤ 60."""
    st = Stake()
    w = every_minority(d, st.reward_per_outer_step, st.min_host_stake, GNK, max_keys=60)
    return max(w["pass_bound_sup"], w["pass_exact_max"]), max(
        w["profit_bound_max_R"], w["profit_exact_max_R"]
    )


def test_the_defaults_keep_a_minority_coalitions_fake_out_and_unprofitable() -> None:
    d = defense(*(FIELDS[f].default for f in ("verifiers_per_contribution", "audit_bps", "audit_verifiers")))
    assert max_safe_share(d) == 0.5
    worst_pass, worst_profit = worst_minority(d)
    assert worst_pass <= 0.01 and worst_profit < 0


@pytest.mark.parametrize(("v", "p", "a"), [(4, 5000, 1), (5, 10_000, 1), (3, 10_000, 3)])
def test_weaker_settings_miss_the_pass_goal(v: int, p: int, a: int) -> None:
    """The previous defaults (v = 4, p = 0.5, a = 1) and any v + a ≤ 6 at p = 1 let a fake through
    in more than 1% of steps for some minority: the check above can fail."""
    d = defense(v, p, a)
    assert worst_minority(d)[0] > 0.01 and max_safe_share(d) < 0.5


# ---------------------------------------------------------------- sampling windows (issue 34)


def test_window_odds_sum_to_one_and_tend_to_the_planners_many_keys_formula() -> None:
    """`window_odds_keys` is a distribution; with many keys below ½ no dispute is won and it is the
    planner's E[σ^K1 (1 − p + p σ^K2)]; at σ = 0 it is the lazy host's detection exactly."""
    d = defense(4, 10_000, 3)
    for fake in (1, 17):
        for share in (0.0, 0.2, 0.4):
            accomplices = round(share * 20_000)
            odds = window_odds_keys(accomplices, 20_000 - accomplices, 34, fake, d)
            assert odds.passed + odds.rejected + odds.unverified == pytest.approx(1.0)
            assert odds.honest_slashed == pytest.approx(0.0, abs=1e-12)
            planner = window_cheat(34, fake, 4, 3, 1.0, share).success
            assert odds.passed == pytest.approx(planner, rel=2e-3)
        assert window_odds_keys(0, 10, 34, fake, d).passed == pytest.approx(
            window_cheat(34, fake, 4, 3, 1.0, 0).success
        )


def test_a_windows_cell_on_the_state_machine_matches_its_exact_formula() -> None:
    """300 seeded trials of one cell of `bench.collusion --windows` (H = 500, k = 5, w = 3: B = 34;
    v = 4, p = 1, a = 3; 4 accomplices of 10 keys) with a host faking 17 whole blocks: how often the
    fake reaches the model, and how often a dispute rejects it, within 3 sd of `window_odds_keys`.
    A dispute is won here now and then (the honest holders of clean windows do not vote in it)."""
    config = bench_config(4, 10_000, 3, Sampling.WINDOWS)
    n, w = config.n_segments, config.window_len
    blocks, fake, trials = -(-n // w), 17, 300
    gang = set(KEYS[:4])
    passed = rejected = 0
    for t in range(trials):
        chosen = random.Random(t).sample(range(blocks), fake)  # the host's own choice, blind to the draw
        faked = {s for b in chosen for s in window(b * w, n, w)}
        out = Trial(config, gang, f"test windows:{t}", KEYS, faked).run()
        passed += out["passed"]
        rejected += out["rejected"]
    odds = window_odds_keys(4, 6, blocks, fake, defense(4, 10_000, 3))
    for measured, exact in ((passed, odds.passed), (rejected, odds.rejected)):
        sd = math.sqrt(exact * (1 - exact) / trials)
        assert abs(measured / trials - exact) <= 3 * sd, (measured / trials, exact)


def test_a_fake_delta_under_windows_is_a_one_block_fake_of_the_last_block() -> None:
    """Only the check that ends at θ_H checks Δ (specs §6): on the state machine (`bench.collusion
    --windows`' fake-Δ table, H = 500, k = 5, w = 3: B = 34; v = 4, p = 1, a = 3; 3 accomplices of
    10 keys) honest holders of windows short of θ_H accept the fake Δ, the last block's honest holder
    rejects it, and the outcome is `window_odds_keys(A, H, B, 1)`'s within 3 sd, far above the
    σ^v·(1 − p + p·σ^a) it was when every check checked Δ."""
    from bench.collusion import cell

    r = cell(4, 10_000, 3, 3, 300, sampling=Sampling.WINDOWS)
    odds = window_odds_keys(3, 7, 34, 1, defense(4, 10_000, 3))
    assert r["fake_blocks"] == 1 and r["pass_exact"] == pytest.approx(odds.passed)
    assert r["pass_bound_many_keys"] == pytest.approx(window_cheat(34, 1, 4, 3, 1.0, 0.3).success)
    for measured, exact in ((r["passed"], odds.passed), (r["rejected"], odds.rejected)):
        assert abs(measured - exact) <= 3 * math.sqrt(exact * (1 - exact) / 300), (measured, exact)
    assert odds.passed > 0.8 and r["honest_slashed"] == 0.0
    st = Stake()  # only the host pays (its plain slash): no accomplice ACCEPT is ever contradicted
    slash_r = st.host_slash_bps / 10_000 * st.min_host_stake / st.reward_per_outer_step
    assert r["profit_per_step_R"] == pytest.approx(r["passed"] - r["rejected"] * slash_r, abs=1e-9)
