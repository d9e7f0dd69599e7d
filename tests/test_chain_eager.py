"""The eager schedule (`overlap = "eager"`, specs/protocol.md §2.2.1) on the state machine.

The two-steps-in-flight mechanics are in tests/test_chain_overlap.py; here a host's start
state: its own step n − 1 Δ, applied to the base by the outer step, stands in for the
aggregate not known yet. The chain fixes that parent when step n opens and drops a child whose
parent did not enter the model, so a Δ that was rejected, withheld or never adopted reaches no
global model through the step that started from it.
"""

from __future__ import annotations

from collections.abc import Callable

from chain import queries
from chain.params import Outcome, Phase
from protocol.config import Overlap, RunConfig
from protocol.messages import Reason
from tests.support.chain import (
    HOSTS,
    VERIFIERS,
    Sim,
    balance,
    commit_msg,
    h32,
    make_config,
    ok_block,
    reveal_for,
    stake_of,
    started,
    step_of,
    until_phase,
    verdict_msg,
    vote,
)


def eager(**phases: int) -> RunConfig:
    return make_config(overlap=Overlap.EAGER, phases=phases)


def start(sim: Sim, host: str, step: int) -> dict:
    return queries.start_state(sim.state, 1, host, step)


def drive(
    sim: Sim, done: Callable[[], bool], rejects: set[tuple[int, str]] = frozenset(), limit: int = 120
) -> None:
    """Play every honest participant block by block until `done()`: hosts reveal what they
    committed, verifiers judge what they are assigned (REJECT for the (step, host) in `rejects`)."""
    for _ in range(limit):
        if done():
            return
        msgs: list[object] = []
        for index in queries.run(sim.state, 1)["steps_in_flight"]:
            step = sim.state.runs[1].steps[index]
            if step.phase == Phase.REVEAL:
                msgs += [
                    reveal_for(sim, h, index)
                    for h, c in sorted(step.contributions.items())
                    if c.reveal_height is None
                ]
            for v in VERIFIERS:
                for h in queries.assignments(sim.state, 1, v, index)["hosts"]:
                    reason = Reason.REPLAY_MISMATCH if (index, h) in rejects else Reason.ACCEPT
                    msgs.append(verdict_msg(v, h, reason, step=index))
        ok_block(sim, *msgs)
    raise AssertionError("never done")


def phase_is(sim: Sim, index: int, phase: Phase) -> Callable[[], bool]:
    return lambda: step_of(sim, index)["phase"] == phase


def commit_two_steps(sim: Sim, hosts: list[str]) -> None:
    ok_block(sim, *[commit_msg(h) for h in hosts])
    sim.until(step_of(sim, 0)["commit_deadline"] + 2)
    ok_block(sim, *[commit_msg(h, step=1) for h in hosts])


def test_a_hosts_start_is_its_own_committed_delta_on_the_base_fixed_when_the_step_opens() -> None:
    sim = started(eager(result_blocks=30), hosts=HOSTS[:3])
    assert start(sim, HOSTS[0], 0) == {
        "base_model_hash": h32("g0"), "parent_delta_hash": None, "parent_codec": None,
        "parent_outer_step": None, "optimizer_hash": None, "ef_hash": None,
    }  # fmt: skip
    ok_block(sim, commit_msg(HOSTS[0]), commit_msg(HOSTS[1]))  # host 2 sits step 0 out
    sim.until(step_of(sim, 0)["commit_deadline"] + 2)
    s = start(sim, HOSTS[0], 1)
    assert s["base_model_hash"] == h32("g0") and s["parent_delta_hash"] == h32("delta", HOSTS[0], 0, "")
    assert s["parent_codec"] == "int8" and s["parent_outer_step"] == 0
    assert s["optimizer_hash"] == h32("opt", HOSTS[0], 0)  # the state it ended step 0 with
    assert queries.prev_optimizer_hash(sim.state, 1, HOSTS[0], 1) == s["optimizer_hash"]
    no_parent = start(sim, HOSTS[2], 1)  # nothing of its own to stand in: the base alone
    assert no_parent["parent_delta_hash"] is None and no_parent["optimizer_hash"] is None
    ok_block(sim, commit_msg(HOSTS[0], step=1), commit_msg(HOSTS[2], step=1))
    recorded = sim.state.runs[1].steps[1].contributions
    assert recorded[HOSTS[0]].parent_delta_hash == h32("delta", HOSTS[0], 0, "")
    assert recorded[HOSTS[2]].parent_delta_hash is None
    # the parent never changes while step 0 is verified (its fate is decided at step 1's results)
    until_phase(sim, 0, Phase.REVEAL)
    assert start(sim, HOSTS[0], 1) == s


def test_a_child_of_a_rejected_delta_is_dropped_unslashed_and_the_honest_child_enters() -> None:
    """The cheat's step 0 Δ is rejected; its step 1 contribution, accepted by every verifier,
    trained from a start containing that Δ: it is dropped as parent_not_accepted when step 1's
    result round starts (no reward, no slash; its verifiers are not slashed either), and its
    step 2 start has no parent. The honest host's child enters step 1's result."""
    cheat, honest = HOSTS[1], HOSTS[0]
    sim = started(eager(result_blocks=30), verifiers=VERIFIERS[:3])
    commit_two_steps(sim, [honest, cheat])
    both_wait = [phase_is(sim, i, Phase.AWAITING_RESULT) for i in (0, 1)]
    drive(sim, lambda: all(w() for w in both_wait), rejects={(0, cheat)})
    assert step_of(sim, 0)["outcomes"][cheat] == Outcome.REJECTED
    assert step_of(sim, 1)["accepted"] == sorted([honest, cheat])  # step 0 not done: not decided yet
    cheat_stake, verifier_stakes = stake_of(sim, cheat), [stake_of(sim, v) for v in VERIFIERS[:3]]
    ok_block(sim, vote(honest, "g1", step=0))  # step 0 adopted without the cheat: step 1's round starts
    s1 = step_of(sim, 1)
    assert s1["outcomes"][cheat] == Outcome.PARENT_NOT_ACCEPTED and s1["accepted"] == [honest]
    assert stake_of(sim, cheat) == cheat_stake
    assert [stake_of(sim, v) for v in VERIFIERS[:3]] == verifier_stakes
    sim.block()
    assert start(sim, cheat, 2)["parent_delta_hash"] is None  # its step 1 Δ may not enter either
    assert start(sim, cheat, 2)["optimizer_hash"] is None  # step 0's state was rejected: fresh
    assert start(sim, honest, 2)["parent_delta_hash"] == h32("delta", honest, 1, "")
    before = balance(sim, cheat)
    ok_block(sim, vote(honest, "g2", step=1))
    assert step_of(sim, 1)["result_hash"] == h32("g2") and balance(sim, cheat) == before  # no reward
    assert sim.state.runs[1].steps[1].contributions[honest].reward > 0


def test_a_step_that_closes_unchanged_drops_every_child_built_on_it() -> None:
    """Step 0 gets no majority result: G_1 = G_0, so no step 0 Δ entered the model, and every step 1
    contribution that started from its host's step 0 Δ is dropped; step 1 then has nothing to apply
    and closes unchanged too, and step 2's starts carry no parent."""
    sim = started(eager(result_blocks=3, result_rounds=1))
    commit_two_steps(sim, HOSTS[:2])
    drive(sim, phase_is(sim, 0, Phase.DONE))
    assert step_of(sim, 0)["result_hash"] == h32("g0")
    drive(sim, phase_is(sim, 1, Phase.DONE))  # step 1 finalizes after step 0 closed: dropped then
    s1 = step_of(sim, 1)
    assert all(s1["outcomes"][h] == Outcome.PARENT_NOT_ACCEPTED for h in HOSTS[:2])
    assert s1["accepted"] == [] and s1["result_hash"] == h32("g0")
    sim.block()
    assert all(start(sim, h, 2)["parent_delta_hash"] is None for h in HOSTS[:2])


def nxt(sim: Sim, host: str) -> dict | None:
    return queries.next_start_state(sim.state, 1, host)


def test_the_next_steps_start_is_answered_before_it_opens_exactly_as_it_will_open() -> None:
    """`next_start_state`: the start of the step after the newest, before it opens, once every
    part of it is fixed (the step before the newest done) — what `start_state` answers when it
    opens, so a host can train it while slower hosts are still committing; null while the step
    before the newest is in flight (its result is the next base) and in sequential runs."""
    host, other = HOSTS[0], HOSTS[1]
    sim = started(eager(result_blocks=30, train_blocks=40), verifiers=VERIFIERS[:3])  # step 0 ends in 1's
    assert nxt(sim, host) == {
        "outer_step": 1, "base_model_hash": h32("g0"), "parent_delta_hash": None, "parent_codec": None,
        "parent_outer_step": None, "optimizer_hash": None, "ef_hash": None,
    }  # fmt: skip
    ok_block(sim, commit_msg(host))  # committed: its own step 0 Δ is its step 1 parent
    early = nxt(sim, host)
    assert early is not None and early["parent_delta_hash"] == h32("delta", host, 0, "")
    assert early["optimizer_hash"] == h32("opt", host, 0)
    ok_block(sim, commit_msg(other))
    sim.until(step_of(sim, 0)["commit_deadline"] + 2)  # step 1 opens
    assert {"outer_step": 1, **start(sim, host, 1)} == early
    assert nxt(sim, host) is None  # step 2 builds on step 0's result, not known yet
    ok_block(sim, *[commit_msg(h, step=1) for h in (host, other)])
    drive(sim, phase_is(sim, 0, Phase.AWAITING_RESULT))
    ok_block(sim, vote(host, "g1", step=0), vote(other, "g1", step=0))  # adopted: step 2's start is fixed
    assert step_of(sim, 0)["phase"] == Phase.DONE and step_of(sim, 1)["phase"] == Phase.TRAIN
    early = nxt(sim, host)
    assert early is not None and early["outer_step"] == 2 and early["base_model_hash"] == h32("g1")
    assert early["parent_delta_hash"] == h32("delta", host, 1, "")
    drive(sim, lambda: sim.state.runs[1].current_step == 2)
    assert {"outer_step": 2, **start(sim, host, 2)} == early
    sequential = started(make_config(phases={"result_blocks": 30}))
    ok_block(sequential, commit_msg(host))
    assert queries.next_start_state(sequential.state, 1, host) is None
