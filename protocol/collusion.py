"""The collusion model: how often a fake reaches the model, and what faking earns, in closed form.

A cheating host commits a fake Δ (one every honest verifier rejects) and its accomplices, who hold
a share q of the verifier stake, accept it. The chain (specs/protocol.md §2.5–§2.6):

1. draws v verifiers by stake; one REJECT among them disputes the contribution, and a dispute is
   decided by a stake majority of every bonded verifier, which a minority coalition always loses;
2. audits a contribution all of whose verifiers accepted with probability p = audit_bps / 10^4,
   by a more verifiers drawn by stake from a seed known only after the first verdicts; one
   REJECT again disputes it.

So the fake passes only if all v are accomplices and it is not audited or all a auditors are too:

    P_pass = P_v · (1 − p + p · P_a)

with P_v = P(v stake-weighted draws are all accomplices). For many small accomplice keys
(Sybil-split stake, the coalition's best case) P_v = q^v and P_a = q^a: each accomplice drawn
removes its own stake, so with fewer, larger keys the chance only falls (`pass_probability` is an
upper bound for every split). For N equal-stake keys of which A are accomplices the draw is a
uniform subset: P_v = C(A, v) / C(N, v), P_a = C(A − v, a') / C(N − v, a') with a' = min(a, N − v)
(`pass_probability_keys`, exact; what `bench.collusion` measures on the state machine).

The rational coalition (`expected_profit`): accomplices accept only when every verifier drawn is
one of them (verdicts are public, so a mixed draw is seen before voting: they reject with the
honest ones and escape the fraud slash); the host then loses its ordinary reject slash. Per outer
step, with reward R when the fake passes, host bond B_h, accomplice key bond b:

    E = P_pass · R − P_v · p · (1 − P_a) · (F_h · B_h + v · F_v · b) − (1 − P_v) · f_h · B_h

(f_h = host_slash_bps, F_h / F_v = fraud_host / fraud_verifier_slash_bps, all / 10^4). The value
of steering the model is not in E: only P_pass bounds an attacker who does not care about money.

Pure functions over integers and floats, no chain access: the planner models reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

BPS = 10_000


@dataclass(frozen=True)
class Defense:
    """The run parameters the formulas need (RunConfig fields of the same names)."""

    v: int  # verifiers_per_contribution
    audit_bps: int  # p × 10^4
    audit_verifiers: int  # a
    host_slash_bps: int = 1000
    fraud_host_slash_bps: int = 5000
    fraud_verifier_slash_bps: int = 5000

    @property
    def p(self) -> float:
        return self.audit_bps / BPS


def pass_probability(q: float, d: Defense) -> float:
    """P(fake reaches the model) for accomplice stake share q, many small keys: q^v (1 − p + p q^a).

    An upper bound for any split of the accomplices' stake into keys.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"stake share must be in [0, 1], got {q}")
    return q**d.v * (1 - d.p + d.p * q**d.audit_verifiers)


def _all_accomplices(accomplices: int, total: int, k: int) -> float:
    """P(a uniform k-subset of `total` equal-stake keys holds only accomplices)."""
    if k <= 0:
        return 1.0
    return comb(accomplices, k) / comb(total, k) if accomplices >= k else 0.0


def draw_odds(accomplices: int, honest: int, d: Defense) -> tuple[float, float]:
    """(P_v, P_a) for equal-stake keys: all v initial verifiers, then all a auditors, accomplices."""
    n = accomplices + honest
    if accomplices < 0 or honest < 0 or n < d.v:
        raise ValueError(f"need at least v = {d.v} keys, got {accomplices} + {honest}")
    p_v = _all_accomplices(accomplices, n, d.v)
    a = min(d.audit_verifiers, n - d.v)  # the draw returns fewer when the pool runs out
    p_a = _all_accomplices(accomplices - d.v, n - d.v, a) if p_v > 0 else 0.0
    return p_v, p_a


def pass_probability_keys(accomplices: int, honest: int, d: Defense) -> float:
    """Exact P(fake reaches the model) with `accomplices` + `honest` verifier keys of equal stake."""
    p_v, p_a = draw_odds(accomplices, honest, d)
    return p_v * (1 - d.p + d.p * p_a)


def _profit(p_v: float, p_a: float, d: Defense, reward: int, host_bond: int, key_bond: int) -> float:
    passed = p_v * (1 - d.p + d.p * p_a)
    caught_by_audit = p_v * d.p * (1 - p_a)
    fraud_loss = (d.fraud_host_slash_bps * host_bond + d.v * d.fraud_verifier_slash_bps * key_bond) / BPS
    plain_loss = d.host_slash_bps * host_bond / BPS
    return passed * reward - caught_by_audit * fraud_loss - (1 - p_v) * plain_loss


def expected_profit(q: float, d: Defense, reward: int, host_bond: int, key_bond: int) -> float:
    """E[reward − slashes] per outer step of faking, in ngonka, many small accomplice keys."""
    p_v = q**d.v
    return _profit(p_v, q**d.audit_verifiers, d, reward, host_bond, key_bond)


def expected_profit_keys(
    accomplices: int, honest: int, d: Defense, reward: int, host_bond: int, key_bond: int
) -> float:
    """`expected_profit` for equal-stake keys (exact, as `bench.collusion` runs them)."""
    p_v, p_a = draw_odds(accomplices, honest, d)
    return _profit(p_v, p_a, d, reward, host_bond, key_bond)


def max_safe_share(d: Defense, target: float = 0.01) -> float:
    """The largest accomplice stake share q < 1/2 with pass_probability(q) ≤ target (bisection)."""
    if pass_probability(0.5, d) <= target:
        return 0.5
    lo, hi = 0.0, 0.5
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if pass_probability(mid, d) <= target else (lo, mid)
    return lo


def every_minority(
    d: Defense, reward: int, host_bond: int, key_bond: int, max_keys: int = 200
) -> dict[str, float]:
    """The worst case over every accomplice minority q < 1/2: the many-keys bound's supremum (its
    value at 1/2: it grows with q) and the exact equal-keys formula's maximum over every N ≤
    max_keys keys with A < N/2 accomplices, for P(pass) and for the profit (in units of reward)."""
    cases = [(k, n - k) for n in range(d.v, max_keys + 1) for k in range((n + 1) // 2)]
    bound_profit = max(expected_profit(q / 1000, d, reward, host_bond, key_bond) for q in range(500))
    exact_profit = max(expected_profit_keys(k, h, d, reward, host_bond, key_bond) for k, h in cases)
    return {
        "pass_bound_sup": pass_probability(0.5, d),
        "pass_exact_max": max(pass_probability_keys(k, h, d) for k, h in cases),
        "profit_bound_max_R": bound_profit / reward,
        "profit_exact_max_R": exact_profit / reward,
        "max_keys": max_keys,
    }
