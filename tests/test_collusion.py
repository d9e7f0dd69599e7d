"""The run defaults meet issue 10's collusion goals by the closed forms (`protocol.collusion`):
for accomplices holding any minority of the verifier stake, a fake reaches the model in ≤ 1% of
outer steps and faking loses money. `bench.collusion` measures the same on the state machine."""

from __future__ import annotations

import pytest

from protocol.collusion import Defense, every_minority, max_safe_share
from protocol.config import RunConfig, Stake

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
