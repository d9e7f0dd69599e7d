"""Sampling windows on the chain (issue 34, specs §2.3, §2.5.3): each checker slot gets its own
block of w segments at the challenge; a reject is evidence about that window alone, a dispute
panel replays the disputed windows, and an honest accept of a window nobody disputed is never
slashed — while a lying reject is, and a fake Δ (which the check of the window ending at θ_H
checks) contradicts that window's accept and every revote's, never an accept of a window short of
θ_H."""

from __future__ import annotations

import pytest

from chain import queries
from chain.errors import ErrDuplicateVerdict, ErrWrongOpenings
from chain.params import Outcome, Phase, Review
from protocol import merkle, prf
from protocol.config import Sampling
from protocol.messages import MsgRevealContribution, Reason, SegmentOpening
from tests.support.chain import (
    GNK,
    HOSTS,
    VERIFIERS,
    Sim,
    commit_msg,
    leaves_of,
    make_config,
    stake_of,
    started,
    verdict_msg,
)

N = 6  # H = 12, k = 2
W = 2  # blocks [0, 2), [2, 4), [4, 6)


def windowed(**kw: object):
    kw.setdefault("verifiers_per_contribution", 2)
    return make_config(inner_steps=12, window_segments=W, **kw)


def commit(host: str) -> object:
    leaves = leaves_of(host, 0, n=N + 1)
    return commit_msg(host, trajectory_root=merkle.merkle_root(leaves).hex(), leaf_count=N + 1,
                      tokens=windowed().tokens_per_outer_step)  # fmt: skip


def reveal(host: str, segments: list[int]) -> MsgRevealContribution:
    lv = leaves_of(host, 0, n=N + 1)
    return MsgRevealContribution(creator=host, run_id=1, outer_step=0, openings=[
        SegmentOpening(segment=j, start_leaf=lv[j].hex(), end_leaf=lv[j + 1].hex(),
                       proof=[p.hex() for p in merkle.pair_proof(lv, j)]) for j in segments
    ])  # fmt: skip


def challenge(sim: Sim, host: str) -> dict:
    return next(c for c in queries.challenges(sim.state, 1)["challenges"] if c["host"] == host)


def at_verdicts(hosts: list[str], verifiers: list[str] = VERIFIERS, **kw: object) -> Sim:
    """Committed, challenged and revealed: each host's slot holders are drawn."""
    sim = started(windowed(**kw), hosts=hosts, verifiers=verifiers)
    assert all(not isinstance(r, Exception) for r in sim.block(*[commit(h) for h in hosts]))
    sim.until(sim.step()["challenge_height"] + 1)
    assert sim.step()["phase"] == Phase.REVEAL
    sim.block(*[reveal(h, challenge(sim, h)["segments"]) for h in hosts])
    return sim


def by_slot(sim: Sim, host: str) -> list[str]:
    slots = challenge(sim, host)["slots"]
    return sorted(slots, key=lambda v: slots[v])


def first_round(sim: Sim, host: str, rejecter: str, reason: Reason, accepter: str) -> list[str]:
    """The initial round of a contribution's two slot holders: one rejects with `reason`, the other
    accepts; the round closes (a dispute opens) and the panel, every other verifier, is returned."""
    sim.block(verdict_msg(rejecter, host, reason), verdict_msg(accepter, host))
    sim.until(sim.step()["round_deadline"] + 1)
    return [v for v in VERIFIERS if v not in (rejecter, accepter)]


def test_the_challenge_draws_each_slot_its_own_block_and_the_host_opens_them_all() -> None:
    sim = at_verdicts(HOSTS[:2])
    cfg = windowed()
    for host in HOSTS[:2]:
        c = challenge(sim, host)
        seed = sim.state.runs[1].steps[0].challenge_seed
        assert c["windows"] == prf.draw_windows(seed, host, N, W, cfg.checker_slots)
        assert len(set(c["windows"][:3])) == 3  # B = 3 blocks: the first three slots all differ
        assert c["segments"] == prf.windows_opened(c["windows"], N, W)
        assert sorted(c["slots"].values()) == [0, 1]  # v = 2 initial slots
        assert set(c["slots"]) == set(c["verifiers"])


def test_a_reveal_must_open_every_window_and_the_last_segment() -> None:
    sim = started(windowed(), hosts=HOSTS[:1])
    sim.block(commit(HOSTS[0]))
    sim.until(sim.step()["challenge_height"] + 1)
    segments = challenge(sim, HOSTS[0])["segments"]
    assert N - 1 in segments
    sim.fails(reveal(HOSTS[0], segments[:-1]), ErrWrongOpenings)
    sim.ok(reveal(HOSTS[0], segments))


def test_a_rejected_window_is_disputed_alone_and_the_honest_accept_of_another_is_not_slashed() -> None:
    sim = at_verdicts(HOSTS[:1])
    host = HOSTS[0]
    catcher, other = by_slot(sim, host)
    assert challenge(sim, host)["windows"][0] != challenge(sim, host)["windows"][1]
    sim.block(verdict_msg(catcher, host, Reason.REPLAY_MISMATCH), verdict_msg(other, host))
    sim.until(sim.step()["round_deadline"] + 1)
    c = challenge(sim, host)
    assert c["review"] == Review.CONFIRM and c["disputed"] == [c["windows"][0]]
    panel = [v for v in VERIFIERS if v not in (catcher, other)]
    before = {v: stake_of(sim, v) for v in VERIFIERS}
    host_before = stake_of(sim, host)
    sim.block(*[verdict_msg(v, host, Reason.REPLAY_MISMATCH) for v in panel])
    sim.until(sim.step()["round_deadline"] + 1)
    contribution = sim.state.runs[1].steps[0].contributions[host]
    assert contribution.outcome == Outcome.REJECTED
    assert stake_of(sim, other) == before[other]  # its own window was clean: not contradicted
    assert all(stake_of(sim, v) == before[v] for v in VERIFIERS)
    cfg = windowed()
    # not a fraud (nobody vouched for the failed window): the ordinary host slash
    assert host_before - stake_of(sim, host) == 10 * GNK * cfg.stake.host_slash_bps // 10_000


def test_a_lying_reject_of_an_honest_window_is_outvoted_and_slashed() -> None:
    sim = at_verdicts(HOSTS[:1])
    host = HOSTS[0]
    liar, other = by_slot(sim, host)
    panel = first_round(sim, host, liar, Reason.REPLAY_MISMATCH, other)
    liar_before, other_before = stake_of(sim, liar), stake_of(sim, other)
    # the panel and the holder of the other window (its revote) replay the liar's window: it matches
    sim.block(*[verdict_msg(v, host) for v in [*panel, other]])
    sim.until(sim.step()["round_deadline"] + 1)
    assert sim.state.runs[1].steps[0].contributions[host].outcome == Outcome.ACCEPTED
    assert stake_of(sim, liar) < liar_before and stake_of(sim, other) == other_before


def test_a_fake_delta_contradicts_the_accept_of_the_window_ending_at_theta_h() -> None:
    sim = at_verdicts(HOSTS[:1])
    host = HOSTS[0]
    honest, colluder = by_slot(sim, host)
    assert challenge(sim, host)["windows"][1] == N - W  # the colluder's window ends at θ_H
    panel = first_round(sim, host, honest, Reason.DELTA_MISMATCH, colluder)
    before = stake_of(sim, colluder)
    sim.block(*[verdict_msg(v, host, Reason.DELTA_MISMATCH) for v in panel])
    sim.until(sim.step()["round_deadline"] + 1)
    c = sim.state.runs[1].steps[0].contributions[host]
    assert c.outcome == Outcome.REJECTED
    cfg = windowed()
    assert before - stake_of(sim, colluder) == before * cfg.stake.fraud_verifier_slash_bps // 10_000


def test_an_accept_of_an_undisputed_window_is_no_vote_on_the_disputed_one_until_its_revote() -> None:
    """Four verifiers of equal stake, two slots: the holder of the clean window accepted its own
    window, which says nothing of the disputed one, so in the dispute it is asked again (a revote,
    like the panel) and counts as silent until it answers: every bonded verifier's stake is in the
    majority, so no coalition can win a dispute by leaving honest stake out of the count."""
    sim = at_verdicts(HOSTS[:1])
    host = HOSTS[0]
    catcher, other = by_slot(sim, host)
    sim.block(verdict_msg(catcher, host, Reason.REPLAY_MISMATCH), verdict_msg(other, host))
    sim.until(sim.step()["round_deadline"] + 1)
    c = challenge(sim, host)
    assert c["revotes_owed"] == [other]
    panel = [v for v in VERIFIERS if v not in (catcher, other)]
    assert all(queries.assignments(sim.state, 1, v)["hosts"] == [host] for v in [*panel, other])
    sim.block(verdict_msg(panel[0], host, Reason.REPLAY_MISMATCH),
              verdict_msg(other, host, Reason.REPLAY_MISMATCH))  # fmt: skip
    assert challenge(sim, host)["revotes_owed"] == []
    sim.fails(verdict_msg(other, host), ErrDuplicateVerdict)  # one revote
    sim.until(sim.step()["round_deadline"] + 1)
    # R = catcher, panel[0], other's revote: 3 of 4 equal stakes; its own accept is not contradicted
    step = sim.state.runs[1].steps[0]
    assert step.contributions[host].outcome == Outcome.REJECTED
    assert stake_of(sim, other) == 5 * GNK


def test_a_minority_cannot_win_a_windowed_dispute_over_the_honest_holders_of_clean_windows() -> None:
    """The coalition holds the faked window's slot and the panel; honest slot holders of clean
    windows are the honest stake. Counted out, they would let the coalition's panel outvote the
    catcher; counted in (silent until they revote), the coalition's accepts are no majority."""
    sim = at_verdicts(HOSTS[:1], verifiers=VERIFIERS[:3], verifiers_per_contribution=3)
    host = HOSTS[0]
    holders = by_slot(sim, host)
    assert len(holders) == 3 and len(set(challenge(sim, host)["windows"][:3])) == 3
    catcher, clean_a, clean_b = holders
    sim.block(verdict_msg(catcher, host, Reason.REPLAY_MISMATCH), verdict_msg(clean_a, host),
              verdict_msg(clean_b, host))  # fmt: skip
    sim.until(sim.step()["round_deadline"] + 1)
    # one clean holder (a colluder) revotes ACCEPT on the disputed window, the other is silent:
    # 1 accept, 1 reject, 1 silent of 3 — no majority, never a coalition's win
    sim.block(verdict_msg(clean_a, host))
    sim.until(sim.step()["round_deadline"] + 1)
    assert sim.state.runs[1].steps[0].contributions[host].outcome == Outcome.UNVERIFIED


def test_escalations_reuse_the_initial_slots_and_auditors_take_the_audit_slots() -> None:
    sim = at_verdicts(HOSTS[:1], audit_bps=10_000, audit_verifiers=2)
    host = HOSTS[0]
    first = by_slot(sim, host)
    sim.block(*[verdict_msg(v, host) for v in first])
    sim.until(sim.step()["round_deadline"] + 1)
    step = sim.state.runs[1].steps[0]
    while step.audit_seed is None:
        sim.block()
    c = challenge(sim, host)
    auditors = [v for v, r in c["verifier_rounds"].items() if v not in first]
    assert auditors and sorted(c["slots"][a] for a in auditors) == list(range(2, 2 + len(auditors)))


@pytest.mark.parametrize("sampling", list(Sampling))
def test_segment_sampling_is_unchanged_and_records_no_windows(sampling: Sampling) -> None:
    sim = started(make_config(sampling=sampling), hosts=HOSTS[:1])
    sim.block(commit_msg(HOSTS[0]))
    sim.until(sim.step()["challenge_height"] + 1)
    c = challenge(sim, HOSTS[0])
    seed = sim.state.runs[1].steps[0].challenge_seed
    if sampling is Sampling.SEGMENTS:
        assert c["segments"] == prf.sample_segments(seed, HOSTS[0], 2, 1) and "windows" not in c
        assert sim.state.runs[1].steps[0].contributions[HOSTS[0]].windows == []
    else:
        assert c["segments"] == [0, 1] and c["windows"]


def test_rejects_for_different_reasons_add_up() -> None:
    """Two honest checkers reject for different reasons (one could not fetch its window's data, the
    other found Δ wrong): a check that stopped at its segments says nothing of Δ and is not
    counted there, so Δ fails and the host is rejected — where counting both on one question would
    leave it unverified."""
    sim = at_verdicts(HOSTS[:1], verifiers=VERIFIERS[:2])  # no panel beyond the two slot holders
    host = HOSTS[0]
    a, b = by_slot(sim, host)
    sim.block(verdict_msg(a, host, Reason.MISSING_DATA), verdict_msg(b, host, Reason.DELTA_MISMATCH))
    sim.until(sim.step()["round_deadline"] + 1)
    sim.until(sim.step()["round_deadline"] + 1)
    assert sim.state.runs[1].steps[0].contributions[host].outcome == Outcome.REJECTED


def test_a_lying_delta_reject_next_to_a_failed_window_is_outvoted_by_the_panel_and_slashed() -> None:
    """The host faked a window (its checker rejects it); the other checker lies that Δ is wrong, to
    make every accept a vote on Δ. The panel checks Δ first (then the disputed window), so every
    panel vote answers Δ: Δ passes, the liar is slashed, the window fails and the host with it."""
    sim = at_verdicts(HOSTS[:1])
    host = HOSTS[0]
    catcher, liar = by_slot(sim, host)
    sim.block(verdict_msg(catcher, host, Reason.REPLAY_MISMATCH),
              verdict_msg(liar, host, Reason.DELTA_MISMATCH))  # fmt: skip
    sim.until(sim.step()["round_deadline"] + 1)
    panel = [v for v in VERIFIERS if v not in (catcher, liar)]
    before = {v: stake_of(sim, v) for v in VERIFIERS}
    sim.block(*[verdict_msg(v, host, Reason.REPLAY_MISMATCH) for v in panel])  # Δ right, window wrong
    sim.until(sim.step()["round_deadline"] + 1)
    assert sim.state.runs[1].steps[0].contributions[host].outcome == Outcome.REJECTED
    assert stake_of(sim, liar) < before[liar]
    assert all(stake_of(sim, v) == before[v] for v in (catcher, *panel))


@pytest.mark.parametrize(
    "revote", [None, Reason.ACCEPT, Reason.DELTA_MISMATCH], ids=["none", "accept", "delta"]
)
def test_an_accept_of_a_window_short_of_theta_h_is_no_vote_on_the_delta_until_its_revote(
    revote: Reason | None,
) -> None:
    """The holder of a window ending short of θ_H never compared Δ with θ_H (specs §6): its ACCEPT
    is no answer on a Δ dispute, so it is not slashed for it when the panel rejects the Δ. Like the
    panel it owes a revote (Δ first): an ACCEPT there contradicts the rejected Δ and is slashed."""
    sim = at_verdicts(HOSTS[:1])
    host = HOSTS[0]
    short, last = by_slot(sim, host)
    windows = challenge(sim, host)["windows"]
    cfg = windowed()
    assert not cfg.window_reaches_end(windows[0]) and cfg.window_reaches_end(windows[1])
    panel = first_round(sim, host, last, Reason.DELTA_MISMATCH, short)
    assert challenge(sim, host)["revotes_owed"] == [short]
    before = stake_of(sim, short)
    votes = [verdict_msg(v, host, Reason.DELTA_MISMATCH) for v in panel]
    sim.block(*votes, *([] if revote is None else [verdict_msg(short, host, revote)]))
    sim.until(sim.step()["round_deadline"] + 1)
    c = sim.state.runs[1].steps[0].contributions[host]
    assert c.outcome == Outcome.REJECTED
    slashed = before - stake_of(sim, short)
    fraud = before * cfg.stake.fraud_verifier_slash_bps // 10_000
    assert slashed == (fraud if revote is Reason.ACCEPT else 0)


def test_a_delta_dispute_is_decided_by_the_window_ending_at_theta_h_and_the_revotes() -> None:
    """A lying DELTA_MISMATCH from the holder of the window ending at θ_H: the panel and the other
    holder's revote (Δ first) find the Δ right, so the host is accepted and the liar slashed; the
    short window's first ACCEPT alone would not have decided it."""
    sim = at_verdicts(HOSTS[:1])
    host = HOSTS[0]
    short, liar = by_slot(sim, host)
    panel = first_round(sim, host, liar, Reason.DELTA_MISMATCH, short)
    before = stake_of(sim, liar)
    sim.block(*[verdict_msg(v, host) for v in [*panel, short]])
    sim.until(sim.step()["round_deadline"] + 1)
    assert sim.state.runs[1].steps[0].contributions[host].outcome == Outcome.ACCEPTED
    assert stake_of(sim, liar) < before
