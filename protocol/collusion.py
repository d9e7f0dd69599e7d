"""The collusion model: how often a fake reaches the model, and what faking earns, in closed form.

A cheating host commits a fake Δ (under sampling segments one every honest verifier rejects; for
windows see below) and its accomplices, who hold a share q of the verifier stake, accept it. The
chain (specs/protocol.md §2.5–§2.6):

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

Sampling windows (specs §2.3, §2.5.3, §6) change what a checker sees: only the check that ends at
θ_H (the last block's; in tolerance mode also the window a lone last segment is merged into,
`RunConfig.window_reaches_end`) checks Δ against it. A host that fakes Δ can commit a θ_H that
matches it, which only the replay of segment n − 1 catches, so a fake Δ meets that check alone:
it is a one-block fake of the last block, `window_odds_keys(..., fake=1)` (every block being
equally likely for every slot), not the formulas above, which hold for sampling segments (every
check replays n − 1). A host that fakes segments likewise meets only the checkers whose window
holds a faked one (`window_odds_keys`); a dispute is decided among every assigned verifier, the
slot holders of windows nobody disputed answering through their revotes (Δ first).

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


@dataclass(frozen=True)
class WindowOdds:
    """One outer step of a windowed host with F faked blocks of B, per outcome (they sum to 1)."""

    passed: float
    """P(the fake reaches the model): no honest checker saw it, or its coalition won the dispute."""
    rejected: float
    """P(a dispute rejects it): the host loses host_slash_bps (no accomplice vote is contradicted)."""
    unverified: float
    """P(a dispute ties): excluded from the model, nobody slashed."""
    honest_slashed: float
    """E[honest verdicts slashed per outer step]: every honest voter of a dispute the coalition won."""


def _hyper(total: int, good: int, draws: int, k: int) -> float:
    """P(k good in a uniform draws-subset of total with `good` good ones)."""
    return comb(good, k) * comb(total - good, draws - k) / comb(total, draws)


def window_odds_keys(accomplices: int, honest: int, blocks: int, fake: int, d: Defense) -> WindowOdds:
    """Exact outcome of a host that faked segments in `fake` of the B = `blocks` window blocks,
    against `accomplices` + `honest` verifier keys of equal stake (what `bench.collusion --windows`
    runs on the state machine). Honest checkers reject iff their slot's window holds a faked
    segment; accomplices accept on their slots and, on a dispute panel, whenever that does not lose.

    N = A + H keys; v initial slots, then a' = min(a, N − v) audit slots (audited with probability
    p when a' > 0), v + a' ≤ B so every slot has its own block. The slot holders are a uniform
    ordered draw without replacement: h1 honest among the v, h2 among the a' (hypergeometric); the
    F fake blocks sit at a uniform F-subset of the B positions, so r1, r2 honest initial / audit
    slots land on one with P(r1, r2) = C(h1, r1)·C(h2, r2)·C(B − h1 − h2, F − r1 − r2) / C(B, F).

    - r1 ≥ 1: a dispute; every key votes (the panel, the rejecters and, by their revotes, the
      holders of undisputed windows, §2.5.3): honest keys reject, accomplices accept, so the
      coalition's margin is m = A − H whoever holds which slot;
    - r1 = 0: accepted unless audited; audited, r2 = 0: accepted; r2 ≥ 1: a dispute, margin m.

    A dispute passes the fake iff m > 0 (a majority coalition: every honest voter is then
    slashed), ties iff m = 0, else rejects it. So, for every minority,

        P_pass = Σ_{h1} P(h1) · P(r1 = 0 | h1) · [(1 − p) + p·Σ_{h2} P(h2 | h1)·P(r2 = 0 | h1, h2)].

    With many small keys (A, H → ∞ at A/N = σ < ½) this tends to the planner's
    E[σ^K1·(1 − p + p·σ^K2)] (`gonka_diloco.plan.window_cheat`); drawn without replacement, a
    finite coalition's odds are below it.
    """
    n = accomplices + honest
    if accomplices < 0 or honest < 0 or n < d.v:
        raise ValueError(f"need at least v = {d.v} keys, got {accomplices} + {honest}")
    a = min(d.audit_verifiers, n - d.v)
    if not 0 <= fake <= blocks or d.v + a > blocks:
        raise ValueError(f"need 0 ≤ F ≤ B and v + a' ≤ B (distinct windows): F = {fake}, B = {blocks}")
    p = d.p if a > 0 else 0.0
    every = comb(blocks, fake)
    out = {"passed": 0.0, "rejected": 0.0, "unverified": 0.0, "honest_slashed": 0.0}

    def dispute(weight: float, margin: int, honest_voters: int) -> None:
        if margin > 0:
            out["passed"] += weight
            out["honest_slashed"] += weight * honest_voters
        else:
            out["unverified" if margin == 0 else "rejected"] += weight

    for h1 in range(max(0, d.v - accomplices), min(d.v, honest) + 1):
        w1 = _hyper(n, honest, d.v, h1)
        for r1 in range(1, min(h1, fake) + 1):
            w = w1 * comb(h1, r1) * comb(blocks - h1, fake - r1) / every
            dispute(w, accomplices - honest, honest)
        out["passed"] += w1 * (1 - p) * comb(blocks - h1, fake) / every
        if p == 0:
            continue
        for h2 in range(max(0, a - (accomplices - d.v + h1)), min(a, honest - h1) + 1):
            w2 = w1 * p * _hyper(n - d.v, honest - h1, a, h2)
            for r2 in range(min(h2, fake) + 1):
                w = w2 * comb(h2, r2) * comb(blocks - h1 - h2, fake - r2) / every
                if r2 == 0:
                    out["passed"] += w
                else:
                    dispute(w, accomplices - honest, honest)
    return WindowOdds(**out)


def window_pass_probability_keys(accomplices: int, honest: int, blocks: int, fake: int, d: Defense) -> float:
    """P(a windowed fake of F blocks reaches the model), equal-stake keys (`window_odds_keys`)."""
    return window_odds_keys(accomplices, honest, blocks, fake, d).passed


def window_expected_profit_keys(
    accomplices: int, honest: int, blocks: int, fake: int, d: Defense, reward: int, host_bond: int
) -> float:
    """E[reward − slashes] per outer step for the cheater and its accomplices (`window_odds_keys`):
    the coalition never votes against an outcome it cannot change, so only the host pays, its
    plain reject slash."""
    odds = window_odds_keys(accomplices, honest, blocks, fake, d)
    return odds.passed * reward - odds.rejected * d.host_slash_bps * host_bond / BPS
