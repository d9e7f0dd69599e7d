"""`phases.early_close` (specs/protocol.md §2.3.1) on the state machine: a window closes at the end
of the block in which the last message it waits for landed, and the later deadlines move up by as
much; a participant who stays silent leaves the window at its full length, and nobody but the
last of them can close it for the others."""

from __future__ import annotations

from chain import queries
from chain.params import Outcome, Phase
from protocol.config import Overlap, Phases, RunConfig
from tests.support.chain import (
    HOSTS,
    commit_msg,
    h32,
    make_config,
    ok_block,
    reveal_for,
    started,
    step_of,
    verdicts_for,
    vote,
)

PHASES = {"train_blocks": 20, "reveal_blocks": 10, "verify_blocks": 20, "result_blocks": 30}


def early(**kw: object) -> RunConfig:
    return make_config(phases={**PHASES, "early_close": True}, **kw)


def test_the_flag_is_omitted_from_the_config_unless_set() -> None:
    assert "early_close" not in Phases().model_dump() and Phases(early_close=True).model_dump()["early_close"]
    assert make_config().config_hash() == make_config(phases={"early_close": False}).config_hash()


def test_every_window_closes_once_all_it_waits_for_is_in() -> None:
    sim = started(early())
    s0 = step_of(sim, 0)
    ok_block(sim, *[commit_msg(h) for h in HOSTS[:2]])
    committed = sim.height
    s = step_of(sim, 0)
    assert s["commit_deadline"] == committed < s0["commit_deadline"]
    moved = s0["commit_deadline"] - committed
    assert s["reveal_deadline"] == s0["reveal_deadline"] - moved  # the windows keep their lengths
    sim.block()
    sim.block()
    assert step_of(sim, 0)["phase"] == Phase.REVEAL
    ok_block(sim, *[reveal_for(sim, h, 0) for h in HOSTS[:2]])
    revealed = sim.height
    assert step_of(sim, 0)["reveal_deadline"] == revealed
    sim.block()
    assert step_of(sim, 0)["phase"] == Phase.VERIFY
    ok_block(sim, *verdicts_for(sim, 0))
    # every verdict in: the round ends in this block, the audit lottery draws its auditors, and
    # once they have judged the step is finalized
    for _ in range(10):
        if step_of(sim, 0)["phase"] == Phase.AWAITING_RESULT:
            break
        ok_block(sim, *verdicts_for(sim, 0))
    s = step_of(sim, 0)
    assert s["phase"] == Phase.AWAITING_RESULT and s["accepted"] == sorted(HOSTS[:2])
    assert sim.height < s0["verify_deadline"]  # the whole step took a fraction of its fixed windows
    ok_block(sim, *[vote(h, "g1") for h in HOSTS[:2]])
    assert step_of(sim, 1)["base_model_hash"] == h32("g1")


def test_a_silent_host_leaves_the_train_window_at_full_length() -> None:
    """Host 1 never commits: the train window cannot close before its deadline (a host that has
    committed cannot cut short the time the others have); the step goes on without it."""
    sim = started(early())
    s0 = step_of(sim, 0)
    ok_block(sim, commit_msg(HOSTS[0]))
    sim.until(s0["commit_deadline"])
    assert step_of(sim, 0)["commit_deadline"] == s0["commit_deadline"]
    assert step_of(sim, 0)["phase"] == Phase.TRAIN
    sim.until(s0["commit_deadline"] + 2)
    assert step_of(sim, 0)["phase"] in (Phase.CHALLENGE, Phase.REVEAL)


def test_a_host_that_does_not_reveal_leaves_the_reveal_window_at_full_length() -> None:
    sim = started(early())
    ok_block(sim, *[commit_msg(h) for h in HOSTS[:2]])
    sim.block()
    sim.block()
    ok_block(sim, reveal_for(sim, HOSTS[0], 0))
    s = step_of(sim, 0)
    sim.until(s["reveal_deadline"])
    assert step_of(sim, 0)["reveal_deadline"] == s["reveal_deadline"]
    sim.until(s["verify_deadline"] + 1)
    assert step_of(sim, 0)["outcomes"][HOSTS[1]] == Outcome.MISSING_REVEAL


def test_an_overlapped_run_opens_its_next_step_when_training_closes_early() -> None:
    sim = started(early(overlap=Overlap.EAGER))
    ok_block(sim, *[commit_msg(h) for h in HOSTS[:2]])
    closed = sim.height
    sim.block()
    assert step_of(sim, 1)["open_height"] == closed + 1
    assert queries.run(sim.state, 1)["steps_in_flight"] == [0, 1]
