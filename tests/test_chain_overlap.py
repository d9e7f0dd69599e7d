"""The overlapped schedule (`overlap = "eager"`, specs/protocol.md §2.2.1) on the state machine.

Two outer steps in flight: step n+1 trains while step n is challenged, revealed, verified and
aggregated; messages name their step and meet that step's phase rules; step n+2 opens only once
step n is done, from its result; a step's result is asked for only once the previous one is
adopted (its Δs are applied to it); a rejected Δ or optimizer state never enters a later start.
"""

from __future__ import annotations

from chain import errors, queries
from chain.errors import ChainError
from chain.params import Outcome, Phase
from protocol.config import Overlap, RunConfig
from protocol.messages import MsgLeaveRun, Reason
from tests.support.chain import (
    HOSTS,
    VERIFIERS,
    Sim,
    commit_msg,
    h32,
    make_config,
    ok_block,
    reveal_for,
    reveal_msg,
    started,
    step_of,
    until_phase,
    verdict_msg,
    verdicts_for,
    vote,
)


def overlapped(**phases: int) -> RunConfig:
    return make_config(overlap=Overlap.EAGER, phases=phases)


def in_flight(sim: Sim) -> list[int]:
    return queries.run(sim.state, 1)["steps_in_flight"]


def test_none_is_the_default_and_keeps_one_step_in_flight() -> None:
    sim = started()
    assert queries.run(sim.state, 1)["overlap"] == "none"
    sim.until(step_of(sim, 0)["commit_deadline"] + 2)
    assert in_flight(sim) == [0] and 1 not in sim.state.runs[1].steps
    sim.fails(commit_msg(HOSTS[0], step=1), errors.ErrWrongOuterStep)


def test_two_steps_in_flight_each_with_its_own_phases_deadlines_and_named_errors() -> None:
    sim = started(overlapped(result_blocks=30))
    s0 = step_of(sim, 0)
    ok_block(sim, *[commit_msg(h) for h in HOSTS[:2]])
    sim.fails(commit_msg(HOSTS[0], step=1), errors.ErrStepNotInFlight)  # not open yet
    sim.until(s0["commit_deadline"] + 1)
    sim.block()  # commit_deadline + 1: step 0's training closed, step 1 opens and trains at once
    s1 = step_of(sim, 1)
    assert in_flight(sim) == [0, 1] and queries.run(sim.state, 1)["current_step"] == 1
    assert s1["open_height"] == s0["commit_deadline"] + 1 == s1["train_start"]
    assert s1["phase"] == Phase.TRAIN and step_of(sim, 0)["phase"] == Phase.CHALLENGE
    assert s1["commit_deadline"] == s1["train_start"] + 3 and s1["base_model_hash"] == h32("g0")
    assert s1["apply_to_hash"] is None  # step 0's result: not adopted yet
    # each message meets the phase rules of the step it names
    late, wrong_base, future, good = sim.block(
        commit_msg(HOSTS[2], step=0),
        commit_msg(HOSTS[0], step=1, base=h32("g1")),
        commit_msg(HOSTS[0], step=2),
        commit_msg(HOSTS[0], step=1),
    )
    assert isinstance(late, errors.ErrLateCommit) and isinstance(wrong_base, errors.ErrBaseModelMismatch)
    assert isinstance(future, errors.ErrStepNotInFlight) and not isinstance(good, ChainError)
    assert step_of(sim, 0)["phase"] == Phase.REVEAL
    revealed, too_early = sim.block(
        reveal_for(sim, HOSTS[0], 0), reveal_msg(sim, HOSTS[0], step=1, segments=[1])
    )
    assert not isinstance(revealed, ChainError) and isinstance(too_early, errors.ErrNotRevealPhase)
    ok_block(sim, reveal_for(sim, HOSTS[1], 0))
    ok_block(sim, *verdicts_for(sim, 0))
    sim.fails(vote(HOSTS[0], "g1", step=0), errors.ErrNotResultPhase)
    # step 1's training closes while step 0 is still being verified: step 2 must wait for step 0
    sim.until(s1["commit_deadline"] + 2)
    assert in_flight(sim) == [0, 1] and 2 not in sim.state.runs[1].steps
    assert step_of(sim, 1)["phase"] in (Phase.CHALLENGE, Phase.REVEAL)
    until_phase(sim, 1, Phase.REVEAL)
    ok_block(sim, reveal_for(sim, HOSTS[0], 1))
    ok_block(sim, *verdicts_for(sim, 1))
    until_phase(sim, 0, Phase.AWAITING_RESULT)
    assert step_of(sim, 0)["accepted"] == sorted(HOSTS[:2])
    ok_block(sim, vote(HOSTS[0], "g1", step=0))
    adopted_at = sim.height + 1
    ok_block(sim, vote(HOSTS[1], "g1", step=0))
    # step 0 done: step 2 opens the next block, with fresh deadlines, on step 0's result
    s0 = step_of(sim, 0)
    s2 = step_of(sim, 2)
    assert s0["phase"] == Phase.DONE and s0["result_hash"] == h32("g1")
    assert s2["open_height"] == adopted_at + 1 and s2["base_model_hash"] == h32("g1")
    assert s2["commit_deadline"] == s2["train_start"] + 3
    assert step_of(sim, 1)["apply_to_hash"] == h32("g1")
    sim.block()
    assert in_flight(sim) == [1, 2] and step_of(sim, 2)["phase"] == Phase.TRAIN
    sim.fails(verdict_msg(VERIFIERS[0], HOSTS[0], step=0), errors.ErrStepNotInFlight)  # step 0 is done
    # step 1 (one accepted Δ) is applied to g1: votes are taken now
    until_phase(sim, 1, Phase.AWAITING_RESULT)
    ok_block(sim, vote(HOSTS[0], "g2", step=1))
    assert step_of(sim, 1)["result_hash"] == h32("g2")
    assert queries.run(sim.state, 1)["global_model_hash"] == h32("g2")


def test_a_step_finalized_before_its_predecessor_is_done_waits_for_its_result() -> None:
    """Step 1 finalizes while step 0 still collects votes: step 1's votes are refused
    (ErrPreviousResultPending), its result round starts when step 0 closes, and without votes
    it closes unchanged on step 0's result after its bounded rounds."""
    sim = started(
        overlapped(train_blocks=1, reveal_blocks=2, verify_blocks=2, result_blocks=20, result_rounds=1)
    )
    ok_block(sim, commit_msg(HOSTS[0]))
    sim.until(step_of(sim, 0)["commit_deadline"] + 2)
    ok_block(sim, commit_msg(HOSTS[0], step=1))
    until_phase(sim, 0, Phase.REVEAL)
    ok_block(sim, reveal_for(sim, HOSTS[0], 0), *verdicts_for(sim, 0))
    until_phase(sim, 1, Phase.REVEAL)
    ok_block(sim, reveal_for(sim, HOSTS[0], 1), *verdicts_for(sim, 1))
    until_phase(sim, 1, Phase.AWAITING_RESULT)
    assert step_of(sim, 0)["phase"] == Phase.AWAITING_RESULT
    assert step_of(sim, 1)["result_deadline"] is None
    sim.fails(vote(HOSTS[0], "g2", step=1), errors.ErrPreviousResultPending)
    assert 2 not in sim.state.runs[1].steps  # step 0 is not done: no third step
    ok_block(sim, vote(HOSTS[0], "g1", step=0))
    closed = sim.height
    assert step_of(sim, 1)["result_deadline"] == closed + 20
    assert step_of(sim, 2)["open_height"] == closed + 1
    sim.until(closed + 21)
    sim.block()
    s1 = step_of(sim, 1)
    assert s1["phase"] == Phase.DONE and s1["result_hash"] == h32("g1")  # unchanged: step 0's result


def test_a_rejected_contribution_never_enters_a_later_start_state() -> None:
    """Host 1's Δ of step 0 is rejected: step 2's base is step 0's result, aggregated over the
    accepted set without it, and its start optimizer is fresh, not the one it committed in step 0
    or in step 1 (a child of the rejected Δ); step 1, which trained during step 0's verification,
    started from G_0 and each host's own step 0 Δ and optimizer (its parent, tests/test_chain_eager.py)."""
    cheat, honest = HOSTS[1], HOSTS[0]
    sim = started(overlapped(result_blocks=30), verifiers=VERIFIERS[:3])
    ok_block(sim, commit_msg(honest), commit_msg(cheat))
    sim.until(step_of(sim, 0)["commit_deadline"] + 2)
    s1 = step_of(sim, 1)
    assert s1["base_model_hash"] == h32("g0")
    for host in (honest, cheat):  # step 1's start: G_0 and the optimizer of its step 0 parent
        assert queries.prev_optimizer_hash(sim.state, 1, host, 1) == h32("opt", host, 0)
    ok_block(sim, commit_msg(honest, step=1), commit_msg(cheat, step=1))
    until_phase(sim, 0, Phase.REVEAL)
    ok_block(sim, reveal_for(sim, honest, 0), reveal_for(sim, cheat, 0))
    ok_block(sim, *verdicts_for(sim, 0, {cheat: Reason.REPLAY_MISMATCH}))
    until_phase(sim, 0, Phase.CONFIRM)  # the reject opened a dispute: every verifier's stake decides
    ok_block(sim, *verdicts_for(sim, 0, {cheat: Reason.REPLAY_MISMATCH}))
    until_phase(sim, 0, Phase.AWAITING_RESULT)
    s0 = step_of(sim, 0)
    assert s0["outcomes"][cheat] == Outcome.REJECTED and s0["accepted"] == [honest]
    assert [a["host"] for a in queries.accepted(sim.state, 1, 0)["accepted"]] == [honest]
    ok_block(sim, vote(honest, "g0 + honest delta", step=0))
    s2 = step_of(sim, 2)
    assert s2["base_model_hash"] == h32("g0 + honest delta")
    assert queries.prev_optimizer_hash(sim.state, 1, honest, 2) == h32("opt", honest, 1)  # its parent's
    assert queries.prev_optimizer_hash(sim.state, 1, cheat, 2) is None  # not a rejected state or its child's
    # a commit on anything but the adopted result (e.g. step 1's base) is refused
    sim.block()
    sim.fails(commit_msg(cheat, step=2, base=h32("g0")), errors.ErrBaseModelMismatch)
    sim.ok(commit_msg(cheat, step=2, base=h32("g0 + honest delta")))


def test_a_host_that_crashes_during_overlap_is_slashed_once_and_rejoins_from_the_chain() -> None:
    """Host 1 commits step 0, crashes before revealing it and misses step 1; it comes back for
    step 2: still bonded (less the missing-reveal slash), it commits on step 0's result with a
    fresh optimizer, while host 0 carried on throughout."""
    sim = started(overlapped(result_blocks=30))
    ok_block(sim, commit_msg(HOSTS[0]), commit_msg(HOSTS[1]))
    sim.until(step_of(sim, 0)["commit_deadline"] + 2)
    ok_block(sim, commit_msg(HOSTS[0], step=1))
    until_phase(sim, 0, Phase.REVEAL)
    ok_block(sim, reveal_for(sim, HOSTS[0], 0))
    ok_block(sim, *verdicts_for(sim, 0))
    until_phase(sim, 0, Phase.AWAITING_RESULT)
    assert step_of(sim, 0)["outcomes"][HOSTS[1]] == Outcome.MISSING_REVEAL
    ok_block(sim, vote(HOSTS[0], "g1", step=0))
    sim.block()
    assert queries.prev_optimizer_hash(sim.state, 1, HOSTS[1], 2) is None
    assert queries.prev_optimizer_hash(sim.state, 1, HOSTS[0], 2) == h32("opt", HOSTS[0], 1)  # its parent's
    ok_block(sim, commit_msg(HOSTS[1], step=2, base=h32("g1")), commit_msg(HOSTS[0], step=2, base=h32("g1")))
    assert sorted(step_of(sim, 2)["committed"]) == sorted(HOSTS[:2])


def test_an_overlapped_run_finishes_after_its_last_step_and_a_leaver_stays_bonded_while_needed() -> None:
    sim = started(make_config(overlap=Overlap.EAGER, max_outer_steps=2, phases={"result_blocks": 30}))
    ok_block(sim, commit_msg(HOSTS[0]))
    sim.until(step_of(sim, 0)["commit_deadline"] + 2)
    ok_block(sim, commit_msg(HOSTS[0], step=1))
    ok_block(sim, MsgLeaveRun(creator=HOSTS[0], run_id=1))  # pending in both steps
    until_phase(sim, 0, Phase.REVEAL)
    ok_block(sim, reveal_for(sim, HOSTS[0], 0), *verdicts_for(sim, 0))
    until_phase(sim, 1, Phase.REVEAL)
    ok_block(sim, reveal_for(sim, HOSTS[0], 1), *verdicts_for(sim, 1))
    until_phase(sim, 0, Phase.AWAITING_RESULT)
    ok_block(sim, vote(HOSTS[0], "g1", step=0))
    assert HOSTS[0] in sim.state.runs[1].participants  # step 1 still needs it
    assert 2 not in sim.state.runs[1].steps  # max_outer_steps = 2
    until_phase(sim, 1, Phase.AWAITING_RESULT)
    ok_block(sim, vote(HOSTS[0], "g2", step=1))
    assert sim.state.runs[1].status == "finished"
    assert HOSTS[0] not in sim.state.runs[1].participants  # unbonded once nothing needed it
