"""The run defaults meet issue 10's collusion goals by the closed forms (`protocol.collusion`):
for accomplices holding any minority of the verifier stake, a fake reaches the model in ≤ 1% of
outer steps and faking loses money. `bench.collusion` measures the same on the state machine."""

from __future__ import annotations

import pytest

from protocol.collusion import (
    Defense,
    expected_profit,
    expected_profit_keys,
    max_safe_share,
    pass_probability,
    pass_probability_keys,
)
from protocol.config import RunConfig, Stake

GNK = 10**9
FIELDS = RunConfig.model_fields


def defense(v: int, p: int, a: int) -> Defense:
    st = Stake()
    return Defense(v, p, a, st.host_slash_bps, st.fraud_host_slash_bps, st.fraud_verifier_slash_bps)


def worst_minority(d: Defense, max_keys: int = 60) -> tuple[float, float]:
    """(max P(pass), max profit / R) over q < 1/2: many-keys bound and every equal-keys split."""
    st = Stake()
    r, bond = st.reward_per_outer_step, st.min_host_stake
    cases = [(k, n - k) for n in range(d.v, max_keys + 1) for k in range((n + 1) // 2)]
    passes = [pass_probability(0.5, d), *(pass_probability_keys(k, h, d) for k, h in cases)]
    profits = [expected_profit(q / 200, d, r, bond, GNK) for q in range(100)]
    profits += [expected_profit_keys(k, h, d, r, bond, GNK) for k, h in cases]
    return max(passes), max(profits) / r


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
