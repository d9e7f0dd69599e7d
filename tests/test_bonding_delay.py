"""The bonding delay (specs §2.3 step 3): stake enters a step's draws only if it was bonded at least
`bonding_delay_blocks` (default SEED_BLOCKS + 1 = 4) before the step's challenge.

The adversary is a verifier that bonds in the block right before a challenge, the way the proposer
of that block could: it tries its keys on a copy of the chain (it knows every seed input once its
own block is made) and bonds the key that the challenge draws for its colluding host. Without the
delay it is drawn every time; with it, the honest verifier bonded earlier is drawn and the late
bonder is not, in the challenge, in the escalation that reuses the challenge's seed, or on a
dispute's panel, and it is drawn like anyone once the delay has passed (the next step).
"""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from chain import errors, module
from chain.params import BONDING_DELAY_BLOCKS, SEED_BLOCKS, ModuleParams, Phase, Review
from protocol.messages import Reason, Role
from tests.support.chain import (
    GNK,
    HOSTS,
    STRANGER,
    VERIFIERS,
    Sim,
    assigned,
    commit_msg,
    join,
    make_state,
    reveal_msg,
    started,
    verdict_msg,
    vote,
)

HONEST = VERIFIERS[0]
TARGET = HOSTS[0]  # the host the late bonder wants to judge (its accomplice)
KEYS = [*VERIFIERS[1:], STRANGER, *HOSTS[2:]]  # funded addresses that are not participants yet


class LateBonder:
    """Bonds, in the block before a challenge, whichever of its keys that challenge draws for its host."""

    def __init__(self, keys: list[str], stake: int) -> None:
        self.keys, self.stake = keys, stake

    def bond_before_challenge(self, sim: Sim, target: str) -> str:
        challenge = sim.step()["challenge_height"]
        sim.until(challenge - 1)  # the next block is the last one before the challenge
        for key in self.keys:
            trial = copy.deepcopy(sim)
            trial.block(join(Role.VERIFIER, key, stake=self.stake))
            trial.until(challenge + 1)  # the challenge block runs
            if key in assigned(trial, target):
                break
        else:
            key = self.keys[0]
        (result,) = sim.block(join(Role.VERIFIER, key, stake=self.stake))
        assert not isinstance(result, Exception), result
        return key


def until_phase(sim: Sim, phase: Phase, limit: int = 40) -> None:
    for _ in range(limit):
        if sim.step()["phase"] == phase:
            return
        sim.block()
    raise AssertionError(f"step {sim.step()['outer_step']} never reached {phase}: {sim.step()['phase']}")


def _challenged_with_a_late_bonder() -> tuple[Sim, str]:
    """Step 0 of a run whose only verifier bonded at its creation: both hosts commit, a late bonder
    with 20x the honest stake bonds right before the challenge, and the challenge runs."""
    sim = started(verifiers=[HONEST])
    sim.block(*[commit_msg(h) for h in HOSTS[:2]])
    late = LateBonder(KEYS, stake=100 * GNK).bond_before_challenge(sim, TARGET)
    sim.until(sim.step()["challenge_height"] + 1)
    assert sim.step()["phase"] == Phase.REVEAL
    return sim, late


def test_a_verifier_bonded_right_before_the_challenge_is_not_drawn_the_one_bonded_earlier_is() -> None:
    sim, late = _challenged_with_a_late_bonder()
    assert assigned(sim, TARGET) == [HONEST] and assigned(sim, HOSTS[1]) == [HONEST]
    joined = sim.state.runs[1].participants[late].joined_height
    assert sim.step()["challenge_height"] - joined < BONDING_DELAY_BLOCKS


def test_without_the_delay_the_late_bonder_is_drawn_for_its_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same adversary against the rule it defeats (draws from every bonded verifier): drawn."""
    monkeypatch.setattr(module, "bonding_delay", lambda state: 0)
    sim, late = _challenged_with_a_late_bonder()
    assert assigned(sim, TARGET) == [late]


def test_once_its_delay_has_passed_the_late_bonder_is_drawn_like_anyone() -> None:
    sim, late = _challenged_with_a_late_bonder()
    sim.block(*[reveal_msg(sim, h) for h in HOSTS[:2]], *[verdict_msg(HONEST, h) for h in HOSTS[:2]])
    until_phase(sim, Phase.AWAITING_RESULT)
    sim.block(*[vote(h, "g1") for h in HOSTS[:2]])
    assert sim.step()["outer_step"] == 1
    sim.until(sim.step()["train_start"])
    sim.block(*[commit_msg(h, step=1, base=sim.step()["base_model_hash"]) for h in HOSTS[:2]])
    sim.until(sim.step()["challenge_height"] + 1)
    drawn = {v for h in HOSTS[:2] for v in assigned(sim, h)}
    assert late in drawn  # 100 GNK against 5: drawn for at least one of the two hosts


def test_escalation_reusing_the_challenge_seed_draws_only_from_the_challenge_pool() -> None:
    """The honest verifier stays silent: the escalation round (seeded by the challenge's seed, so a
    late bond's draw is computable in advance) finds no one new in the pool fixed at the challenge."""
    sim, late = _challenged_with_a_late_bonder()
    sim.block(*[reveal_msg(sim, h) for h in HOSTS[:2]])
    until_phase(sim, Phase.ESCALATION)
    assert assigned(sim, TARGET) == [HONEST] and late not in assigned(sim, HOSTS[1])


def test_a_dispute_panel_is_the_stake_bonded_before_the_challenge() -> None:
    """The honest verifier rejects host 0: the dispute asks every verifier of the step's pool; the
    late bonder's stake, which could have been bought after seeing the reject, has no vote."""
    sim, late = _challenged_with_a_late_bonder()
    sim.block(
        *[reveal_msg(sim, h) for h in HOSTS[:2]],
        verdict_msg(HONEST, TARGET, Reason.REPLAY_MISMATCH),
        verdict_msg(HONEST, HOSTS[1]),
    )
    until_phase(sim, Phase.CONFIRM)
    c = sim.state.runs[1].steps[0].contributions[TARGET]
    assert c.review == Review.CONFIRM and sorted(c.verifier_rounds) == [HONEST]
    (refused,) = sim.block(verdict_msg(late, TARGET))
    assert isinstance(refused, errors.ErrNotAssignedVerifier)


def test_genesis_may_lengthen_the_delay_but_not_shorten_it_below_the_seed_window() -> None:
    assert BONDING_DELAY_BLOCKS == SEED_BLOCKS + 1
    with pytest.raises(ValidationError, match="bonding_delay_blocks"):
        ModuleParams(bonding_delay_blocks=SEED_BLOCKS)
    assert "bonding_delay_blocks" not in ModuleParams().model_dump()  # genesis and app hash unchanged
    assert ModuleParams(bonding_delay_blocks=10).model_dump()["bonding_delay_blocks"] == 10
    assert module.bonding_delay(make_state(ModuleParams(bonding_delay_blocks=10))) == 10
    assert module.bonding_delay(make_state()) == BONDING_DELAY_BLOCKS


def test_step_zero_waits_until_its_quorum_is_drawable_at_the_earliest_challenge() -> None:
    """min_verifiers counts a verifier once its stake will have served the delay by the earliest
    challenge training could bring (an early-closed window: the block after next), so a quorum
    reached in the last block before training is never one the challenge then leaves out."""
    from chain.module import bonding_delay
    from chain.params import CHALLENGE_DELAY
    from protocol.messages import MsgCreateRun
    from tests.support.chain import AUTH, make_config

    sim = Sim(make_state())
    config = make_config(phases={"min_hosts": 1, "min_verifiers": 1, "early_close": True})
    sim.ok(MsgCreateRun(creator=AUTH, config=config))
    sim.ok(join(Role.HOST, TARGET))
    sim.until(sim.step()["train_start"] + 3)  # no verifier: step 0 keeps re-opening
    joined = sim.height + 1
    sim.ok(join(Role.VERIFIER, HONEST))
    until_phase(sim, Phase.TRAIN)
    start = sim.step()["train_start"]
    assert start + CHALLENGE_DELAY - joined >= bonding_delay(sim.state)  # waited for the stake to serve
    sim.block(commit_msg(TARGET))  # the host commits at once: the window closes early, the challenge next
    until_phase(sim, Phase.REVEAL)
    assert assigned(sim, TARGET) == [HONEST]
