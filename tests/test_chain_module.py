"""The `inference.diloco` state machine: every message's success path and every named error.

`Sim` drives blocks like the app does (begin_block, txs, end_block) and checks, for every failed
message, that the state is byte-identical to before it: the "all checks before any write" rule;
and, after every block, that the cached app hash equals one recomputed from the content.
"""

from __future__ import annotations

import pytest

from chain import errors, queries
from chain.errors import ChainError
from chain.genesis import Genesis
from chain.module import TxContext, process_msg
from chain.params import MODULE_ACCOUNT, REWARD_POOL_ACCOUNT, ModuleParams, Outcome, Phase, Review
from chain.state import total_supply
from protocol import prf
from protocol.config import Codec, RunConfig, Sampling
from protocol.messages import (
    Coin,
    EnvFingerprint,
    MsgCommitPseudoGradient,
    MsgCreateRun,
    MsgJoinRun,
    MsgLeaveRun,
    MsgReportUnavailable,
    MsgSend,
    MsgSubmitOuterResult,
    Reason,
    Role,
)
from tests.support.chain import (
    AUTH,
    GNK,
    HOSTS,
    POOR,
    STRANGER,
    VERIFIERS,
    Sim,
    addr,
    assigned,
    balance,
    commit_msg,
    h32,
    join,
    make_config,
    make_state,
    reveal_msg,
    stake_of,
    started,
    to_reveal,
    to_verify_deadline,
    verdict_msg,
    vote,
)

# ---------------------------------------------------------------- genesis and bank


def test_genesis_funds_accounts_in_sorted_order_and_conserves_supply() -> None:
    state = make_state()
    assert state.accounts[MODULE_ACCOUNT].number == 0
    assert state.accounts[REWARD_POOL_ACCOUNT].balance == 10_000 * GNK
    funded = sorted(a for a in state.accounts if a not in (MODULE_ACCOUNT, REWARD_POOL_ACCOUNT))
    assert [state.accounts[a].number for a in funded] == list(range(2, 2 + len(funded)))
    assert total_supply(state) == 10_000 * GNK + 10 * 1000 * GNK + GNK


def test_genesis_rejects_negative_balance_and_pool_as_account() -> None:
    with pytest.raises(ValueError, match="negative"):
        Genesis(authority=AUTH, accounts={POOR: -1})
    with pytest.raises(ValueError, match="reward pool"):
        Genesis(authority=AUTH, accounts={REWARD_POOL_ACCOUNT: 5})


def test_send_moves_funds_and_creates_the_recipient_account() -> None:
    sim = Sim(make_state())
    new = addr("newcomer")
    events = sim.ok(MsgSend(from_address=STRANGER, to_address=new, amount=[Coin(amount=7), Coin(amount=3)]))
    assert events[0].type == "transfer" and events[0].attributes["amount"] == "10"
    assert balance(sim, new) == 10 and balance(sim, STRANGER) == 1000 * GNK - 10
    assert sim.state.accounts[new].number == sim.state.next_account_number - 1


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        (MsgSend(from_address=STRANGER, to_address=POOR, amount=[Coin(amount=0)]), errors.ErrInvalidAmount),
        (
            MsgSend(from_address=POOR, to_address=STRANGER, amount=[Coin(amount=2 * GNK)]),
            errors.ErrInsufficientFunds,
        ),
    ],
)
def test_send_errors(msg: MsgSend, error: type[ChainError]) -> None:
    Sim(make_state()).fails(msg, error)


def test_envelope_errors_signer_mismatch_and_unknown_message() -> None:
    state = make_state()
    msg = MsgSend(from_address=STRANGER, to_address=POOR, amount=[Coin(amount=1)])
    ctx = TxContext(height=1, time_ns=1, tx_hash=h32("x"), signer=POOR)
    with pytest.raises(errors.ErrSignerMismatch):
        process_msg(state, msg, ctx)
    with pytest.raises(errors.ErrUnknownMessage):
        process_msg(state, object(), ctx)


def test_error_codes_are_unique_and_named() -> None:
    assert len(errors.ERRORS) >= 38
    err = errors.ErrBadProof("segment 3")
    assert (err.codespace, err.code, err.name) == ("diloco", 35, "ErrBadProof")
    assert "segment 3" in str(err)


# ---------------------------------------------------------------- runs and participants


def test_create_run_records_config_and_opens_step_zero_after_the_join_window() -> None:
    sim = Sim(make_state())
    config = make_config()
    sim.ok(MsgCreateRun(creator=AUTH, config=config))
    run = queries.run(sim.state, 1)
    assert run["config_hash"] == config.config_hash() and run["global_model_hash"] == h32("g0")
    step = sim.step()
    assert step["phase"] == Phase.PENDING and step["open_height"] == 1 + config.phases.join_blocks
    assert step["commit_deadline"] == step["train_start"] + 3
    assert step["reveal_deadline"] == step["commit_deadline"] + 1 + 6
    assert step["verify_deadline"] == step["reveal_deadline"] + 6
    sim.until(step["train_start"] + 1)
    assert sim.step()["phase"] == Phase.TRAIN


def test_step_zero_waits_for_its_quorum_then_trains_with_fresh_deadlines() -> None:
    """min_hosts / min_verifiers: outer step 0 re-opens block by block, deadlines with it, until
    enough participants are bonded; a late node never finds training over before it joined."""
    sim = Sim(make_state())
    config = make_config(phases={"min_hosts": 2, "min_verifiers": 1})
    created = sim.ok(MsgCreateRun(creator=AUTH, config=config))
    assert created and sim.step()["phase"] == Phase.PENDING
    sim.ok(join(Role.HOST, HOSTS[0]))
    sim.ok(join(Role.VERIFIER, VERIFIERS[0]))
    first = sim.step()
    sim.until(first["train_start"] + 5)  # past the original train start with one host of two
    waiting = sim.step()
    assert waiting["phase"] == Phase.PENDING and waiting["train_start"] == sim.state.height + 1
    assert waiting["train_start"] > first["train_start"]
    assert waiting["commit_deadline"] == waiting["train_start"] + 3
    sim.ok(join(Role.HOST, HOSTS[1]))  # the quorum: training starts at the next block
    sim.block()
    step = sim.step()
    assert step["phase"] == Phase.TRAIN and step["commit_deadline"] == step["train_start"] + 3
    assert sim.state.height <= step["train_start"] + 1
    sim.ok(commit_msg(HOSTS[0]))  # commits are taken on the new schedule
    # a run without a quorum set starts on its schedule, whoever has joined (the default)
    other = Sim(make_state())
    other.ok(MsgCreateRun(creator=AUTH, config=make_config()))
    other.until(other.step()["train_start"] + 1)
    assert other.step()["phase"] == Phase.TRAIN


def test_training_never_starts_inside_a_poc_window() -> None:
    sim = Sim(make_state())
    sim.until(8)
    sim.ok(MsgCreateRun(creator=AUTH, config=make_config(phases={"epoch_length": 10, "poc_window": 4})))
    step = sim.step()
    assert step["open_height"] == 9 and step["train_start"] == 9  # 9 % 10 = 9: outside the window
    sim2 = Sim(make_state())
    sim2.until(9)
    sim2.ok(MsgCreateRun(creator=AUTH, config=make_config(phases={"epoch_length": 10, "poc_window": 4})))
    assert sim2.step()["open_height"] == 10 and sim2.step()["train_start"] == 14


def test_create_run_errors() -> None:
    sim = Sim(make_state(ModuleParams(max_active_runs=1)))
    sim.fails(MsgCreateRun(creator=STRANGER, config=make_config()), errors.ErrUnauthorized)
    sim.ok(MsgCreateRun(creator=AUTH, config=make_config()))
    sim.fails(MsgCreateRun(creator=AUTH, config=make_config()), errors.ErrTooManyRuns)


def test_join_bonds_stake_and_leave_returns_it() -> None:
    sim = Sim(make_state())
    sim.ok(MsgCreateRun(creator=AUTH, config=make_config()))
    before = balance(sim, HOSTS[0])
    sim.ok(join(Role.HOST, HOSTS[0], 12 * GNK))
    assert balance(sim, HOSTS[0]) == before - 12 * GNK and stake_of(sim, HOSTS[0]) == 12 * GNK
    (p,) = queries.participants(sim.state, 1)["participants"]
    assert p["role"] == "host" and p["endpoint"].startswith("http://")
    events = sim.ok(MsgLeaveRun(creator=HOSTS[0], run_id=1))
    assert events[0].type == "unbond" and balance(sim, HOSTS[0]) == before and stake_of(sim, HOSTS[0]) == 0


def test_join_and_leave_errors() -> None:
    sim = Sim(make_state(ModuleParams(max_participants_per_run=2)))
    sim.ok(MsgCreateRun(creator=AUTH, config=make_config()))
    sim.fails(join(Role.HOST, HOSTS[0], run_id=9), errors.ErrUnknownRun)
    sim.fails(join(Role.HOST, HOSTS[0], stake=GNK), errors.ErrStakeTooLow)
    sim.fails(join(Role.VERIFIER, POOR, stake=5 * GNK), errors.ErrInsufficientFunds)
    sim.ok(join(Role.HOST, HOSTS[0]))
    sim.fails(join(Role.HOST, HOSTS[0]), errors.ErrAlreadyJoined)
    sim.fails(join(Role.VERIFIER, HOSTS[0]), errors.ErrRoleConflict)
    sim.ok(join(Role.VERIFIER, VERIFIERS[0]))
    sim.fails(join(Role.HOST, HOSTS[1]), errors.ErrRunFull)
    sim.fails(MsgLeaveRun(creator=STRANGER, run_id=1), errors.ErrNotParticipant)
    sim.fails(MsgLeaveRun(creator=STRANGER, run_id=7), errors.ErrUnknownRun)


def test_leave_with_a_pending_commit_unbonds_at_finalization() -> None:
    sim = started()
    to_reveal(sim, [HOSTS[0]])
    events = sim.ok(MsgLeaveRun(creator=HOSTS[0], run_id=1))
    assert events[0].type == "leave_pending" and stake_of(sim, HOSTS[0]) == 10 * GNK
    sim.fails(MsgLeaveRun(creator=HOSTS[0], run_id=1), errors.ErrAlreadyLeaving)
    to_verify_deadline(sim)  # no reveal: slashed first, then the rest unbonds
    assert stake_of(sim, HOSTS[0]) == 0
    assert any(e.type == "unbond" and e.attributes["amount"] == str(9 * GNK) for e in sim.events)


# ---------------------------------------------------------------- commit


def test_commit_records_the_contribution() -> None:
    sim = started()
    events = sim.ok(commit_msg(HOSTS[0]))
    assert events[0].type == "commit"
    (c,) = queries.commitments(sim.state, 1)["commitments"]
    assert c["host"] == HOSTS[0] and c["leaf_count"] == 3 and c["equivocation_tx"] is None


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        (commit_msg(HOSTS[0], step=1), errors.ErrWrongOuterStep),
        (commit_msg(STRANGER), errors.ErrNotHost),
        (commit_msg(VERIFIERS[0]), errors.ErrNotHost),
        (commit_msg(HOSTS[0], base=h32("other")), errors.ErrBaseModelMismatch),
        (commit_msg(HOSTS[0], codec=Codec.BF16), errors.ErrCodecMismatch),
        (commit_msg(HOSTS[0], leaf_count=5), errors.ErrLeafCount),
        (commit_msg(HOSTS[0], tokens=1), errors.ErrBadTokens),
        (commit_msg(HOSTS[0], env=EnvFingerprint(torch_version="2.13.0", threads=2)), errors.ErrEnvMismatch),
        (commit_msg(HOSTS[0]).model_copy(update={"run_id": 5}), errors.ErrUnknownRun),
    ],
)
def test_commit_errors(msg: MsgCommitPseudoGradient, error: type[ChainError]) -> None:
    started().fails(msg, error)


def test_tolerance_mode_accepts_a_commit_from_another_thread_count() -> None:
    tol = {"tolerance": 1e-5, "tolerance_exp_avg": 1e-4, "tolerance_exp_avg_sq": 1e-4}
    sim = started(make_config(replay_mode="tolerance", **tol))
    sim.ok(commit_msg(HOSTS[0], env=EnvFingerprint(torch_version="2.13.0", threads=2)))


def test_commit_timing_errors() -> None:
    sim = Sim(make_state())
    sim.ok(MsgCreateRun(creator=AUTH, config=make_config(phases={"join_blocks": 3})))
    sim.ok(join(Role.HOST, HOSTS[0]))
    sim.fails(commit_msg(HOSTS[0]), errors.ErrNotTrainPhase)
    sim.until(sim.step()["commit_deadline"])
    sim.ok(commit_msg(HOSTS[0]))  # the deadline block itself is in time
    sim.fails(commit_msg(HOSTS[0], salt="x"), errors.ErrLateCommit)


def test_identical_commit_fails_and_different_commit_is_equivocation() -> None:
    sim = started()
    first, same, other, third = sim.block(
        commit_msg(HOSTS[0]),
        commit_msg(HOSTS[0]),
        commit_msg(HOSTS[0], salt="other"),
        commit_msg(HOSTS[0], salt="3"),
    )
    assert isinstance(same, errors.ErrDuplicateCommit) and isinstance(third, errors.ErrDuplicateCommit)
    assert [e.type for e in first] == ["commit"] and [e.type for e in other] == ["equivocation"]
    assert queries.commitment(sim.state, 1, HOSTS[0])["equivocation_tx"] is not None


def test_commit_on_a_finished_run_fails() -> None:
    sim = started(make_config(max_outer_steps=1))
    sim.until(sim.step()["verify_deadline"] + 1)  # nobody committed: step 0 closes, the run finishes
    assert queries.run(sim.state, 1)["status"] == "finished"
    sim.fails(commit_msg(HOSTS[0]), errors.ErrRunFinished)
    sim.fails(join(Role.HOST, HOSTS[2]), errors.ErrRunFinished)


# ---------------------------------------------------------------- challenge, reveal, verdict, result


def test_challenge_seed_hashes_the_three_blocks_up_to_the_one_after_the_deadline() -> None:
    sim = started(make_config(sampling=Sampling.SEGMENTS))  # windows: tests/test_chain_windows.py
    sim.ok(commit_msg(HOSTS[0]))
    sim.until(sim.step()["commit_deadline"] + 1)
    sim.block()  # commit_deadline + 1: the first block no committer could see
    assert sim.step()["phase"] == Phase.CHALLENGE
    seed = prf.seed_from_blocks(sim.hashes[-3:])  # blocks commit_deadline - 1 .. commit_deadline + 1
    sim.block()
    assert sim.state.recent_block_hashes == sim.hashes[-4:-1]  # the ring as begin_block saw it
    ch = queries.challenges(sim.state, 1)
    assert ch["seed"] == seed and ch["challenge_height"] == sim.step()["commit_deadline"] + 2
    (item,) = ch["challenges"]
    assert item["segments"] == prf.sample_segments(seed, HOSTS[0], 2, 1)
    stakes = dict.fromkeys(VERIFIERS[:3], 5 * GNK)
    assert item["verifiers"] == prf.assign_verifiers(seed, HOSTS[0], stakes, 1)


def test_full_outer_step_accepts_pays_at_adoption_and_opens_the_next_step() -> None:
    sim = started()
    to_reveal(sim, HOSTS[:2])
    for host in HOSTS[:2]:
        sim.ok(reveal_msg(sim, host))
    assert [r["host"] for r in queries.reveals(sim.state, 1)["reveals"]] == sorted(HOSTS[:2])
    for host in HOSTS[:2]:
        (v,) = assigned(sim, host)
        assert queries.assignments(sim.state, 1, v)["hosts"].count(host) == 1
        sim.ok(verdict_msg(v, host))
    assert len(queries.verdicts(sim.state, 1)["verdicts"]) == 2
    pool = balance(sim, REWARD_POOL_ACCOUNT)
    to_verify_deadline(sim)
    step = sim.step()
    assert step["phase"] == Phase.AWAITING_RESULT and step["accepted"] == sorted(HOSTS[:2])
    assert balance(sim, REWARD_POOL_ACCOUNT) == pool  # paid only once the Δs reach the model
    assert queries.prev_optimizer_hash(sim.state, 1, HOSTS[0]) == h32("opt", HOSTS[0], 0)
    assert queries.prev_optimizer_hash(sim.state, 1, HOSTS[2]) is None
    assert [a["host"] for a in queries.accepted(sim.state, 1, 0)["accepted"]] == sorted(HOSTS[:2])
    new = h32("g1")
    sim.ok(MsgSubmitOuterResult(creator=HOSTS[0], run_id=1, outer_step=0, model_hash=new))
    assert sim.step()["outer_step"] == 0  # 1 of 2 is not a majority
    sim.ok(MsgSubmitOuterResult(creator=HOSTS[1], run_id=1, outer_step=0, model_hash=new))
    assert queries.run(sim.state, 1)["global_model_hash"] == new
    assert balance(sim, REWARD_POOL_ACCOUNT) == pool - 100 * GNK  # equal tokens: 50 GNK each
    assert [a["reward"] for a in queries.accepted(sim.state, 1, 0)["accepted"]] == [50 * GNK] * 2
    nxt = sim.step()
    assert nxt["outer_step"] == 1 and nxt["open_height"] == sim.height + 1 and nxt["base_model_hash"] == new
    sim.block()
    sim.fails(commit_msg(HOSTS[0], step=1), errors.ErrBaseModelMismatch)
    sim.ok(commit_msg(HOSTS[0], step=1, base=new))


def test_reveal_errors() -> None:
    sim = started(make_config(sampling=Sampling.SEGMENTS))
    sim.ok(commit_msg(HOSTS[0]))
    sim.fails(reveal_msg(sim, HOSTS[0], segments=[1]), errors.ErrNotRevealPhase)
    sim.until(sim.step()["challenge_height"])
    cases = [
        (reveal_msg(sim, HOSTS[1], segments=[1]), errors.ErrNoCommitment),
        (reveal_msg(sim, HOSTS[0], step=1, segments=[1]), errors.ErrWrongOuterStep),
        (reveal_msg(sim, HOSTS[0], segments=[0]), errors.ErrWrongOpenings),
        (reveal_msg(sim, HOSTS[0], segments=[0, 1]), errors.ErrWrongOpenings),
        (reveal_msg(sim, HOSTS[0], segments=[1], salt="forged"), errors.ErrBadProof),
    ]
    assert prf.sample_segments(sim.prev_hash, HOSTS[0], 2, 1) == [1]  # s = 1: only the last segment
    good_msg = reveal_msg(sim, HOSTS[0], segments=[1])
    *failed, good, again = sim.block(*[m for m, _ in cases], good_msg, good_msg)
    assert [type(r) for r in failed] == [e for _, e in cases]
    assert [e.type for e in good] == ["reveal"] and isinstance(again, errors.ErrAlreadyRevealed)


def test_a_late_reveal_in_the_grace_is_judged_and_accepted_not_slashed() -> None:
    """Lateness is not fraud: past the reveal deadline, through `reveal_closes` (half the verify
    window), a reveal is still taken and judged like an on-time one."""
    sim = started()
    to_reveal(sim, HOSTS[:2])
    step = sim.step()
    assert step["reveal_closes"] == step["reveal_deadline"] + 6 // 2
    stakes = [stake_of(sim, h) for h in HOSTS[:2]]
    sim.ok(reveal_msg(sim, HOSTS[1]))
    sim.until(step["reveal_closes"])  # the next block is the last that takes a reveal
    assert sim.step()["phase"] == Phase.VERIFY
    sim.ok(reveal_msg(sim, HOSTS[0]))
    sim.block(*[verdict_msg(assigned(sim, h)[0], h) for h in HOSTS[:2]])
    to_verify_deadline(sim)
    assert sim.step()["accepted"] == sorted(HOSTS[:2])
    assert [stake_of(sim, h) for h in HOSTS[:2]] == stakes


def test_reveals_close_after_the_grace_and_a_missing_one_is_slashed() -> None:
    """The adversary: a host that saw its challenge and keeps its openings back. Past the grace it
    cannot reveal, and it ends `missing_reveal`, slashed; the honest host beside it is accepted."""
    sim = started()
    to_reveal(sim, HOSTS[:2])
    stake = stake_of(sim, HOSTS[0])
    sim.ok(reveal_msg(sim, HOSTS[1]))
    sim.ok(verdict_msg(assigned(sim, HOSTS[1])[0], HOSTS[1]))
    sim.until(sim.step()["reveal_closes"] + 1)
    sim.fails(reveal_msg(sim, HOSTS[0]), errors.ErrLateReveal)
    to_verify_deadline(sim)
    step = sim.step()
    assert step["outcomes"] == {HOSTS[0]: Outcome.MISSING_REVEAL, HOSTS[1]: Outcome.ACCEPTED}
    assert step["accepted"] == [HOSTS[1]]
    assert stake_of(sim, HOSTS[0]) < stake and stake_of(sim, HOSTS[1]) == stake


def test_verify_does_not_close_early_while_a_reveal_is_owed_in_the_grace() -> None:
    """Early close (§2.3.1) must not cut a late host's grace short: even with every verdict in
    (here its verifier already reported the data missing), the window stays open until reveals close."""
    sim = started(make_config(phases={"early_close": True}))
    to_reveal(sim, HOSTS[:2])
    sim.ok(reveal_msg(sim, HOSTS[1]))
    sim.until(sim.step()["reveal_deadline"] + 1)
    closes = sim.step()["reveal_closes"]
    sim.block(
        verdict_msg(assigned(sim, HOSTS[1])[0], HOSTS[1]),
        verdict_msg(assigned(sim, HOSTS[0])[0], HOSTS[0], Reason.MISSING_DATA),
    )
    sim.until(closes)
    assert sim.step()["phase"] == Phase.VERIFY and sim.step()["reveal_closes"] == closes
    sim.ok(reveal_msg(sim, HOSTS[0]))


def test_verdict_errors() -> None:
    sim = started()
    sim.ok(commit_msg(HOSTS[0]))
    sim.fails(verdict_msg(VERIFIERS[0], HOSTS[0]), errors.ErrNotVerdictPhase)
    sim.until(sim.step()["challenge_height"] + 1)
    (v,) = assigned(sim, HOSTS[0])
    other = next(x for x in VERIFIERS[:3] if x != v)
    sim.fails(verdict_msg(v, HOSTS[1]), errors.ErrNoCommitment)
    sim.fails(verdict_msg(other, HOSTS[0]), errors.ErrNotAssignedVerifier)
    sim.fails(verdict_msg(v, HOSTS[0], step=3), errors.ErrWrongOuterStep)
    sim.block(reveal_msg(sim, HOSTS[0]), verdict_msg(v, HOSTS[0]))
    sim.fails(verdict_msg(v, HOSTS[0]), errors.ErrDuplicateVerdict)
    to_verify_deadline(sim)  # accepted: the step awaits its result, verdicts are closed
    assert sim.step()["phase"] == Phase.AWAITING_RESULT
    sim.fails(verdict_msg(other, HOSTS[0]), errors.ErrLateVerdict)


def accepted_step(hosts: list[str], config: RunConfig | None = None) -> Sim:
    """A step whose `hosts` were all accepted (v = 1, no audit): it awaits its result."""
    sim = started(config, hosts=hosts)
    to_reveal(sim, hosts)
    txs = [m for host in hosts for m in (reveal_msg(sim, host), verdict_msg(assigned(sim, host)[0], host))]
    assert not any(isinstance(r, ChainError) for r in sim.block(*txs))
    to_verify_deadline(sim)
    assert sim.step()["phase"] == Phase.AWAITING_RESULT and sim.step()["accepted"] == sorted(hosts)
    return sim


def report(host: str, *missing: str, step: int = 0) -> MsgReportUnavailable:
    return MsgReportUnavailable(creator=host, run_id=1, outer_step=step, hosts=list(missing))


def test_outer_result_errors() -> None:
    sim = started(hosts=HOSTS[:3])
    to_reveal(sim, HOSTS[:3])
    sim.fails(vote(HOSTS[0], "a"), errors.ErrNotResultPhase)
    txs = [
        m for host in HOSTS[:3] for m in (reveal_msg(sim, host), verdict_msg(assigned(sim, host)[0], host))
    ]
    assert not any(isinstance(r, ChainError) for r in sim.block(*txs))
    to_verify_deadline(sim)
    wrong_step, stranger, first, dup = sim.block(
        vote(HOSTS[0], "a", step=1), vote(HOSTS[3], "a"), vote(HOSTS[0], "a"), vote(HOSTS[0], "a")
    )
    assert isinstance(wrong_step, errors.ErrWrongOuterStep)
    assert isinstance(stranger, errors.ErrNotAcceptedHost)
    assert isinstance(dup, errors.ErrDuplicateOuterResult) and not isinstance(first, ChainError)


def test_a_lone_vote_or_a_plurality_is_never_adopted_and_the_step_still_closes() -> None:
    """Withhold-and-forge: an accepted host votes for a model it made up; nobody else can vote.
    Its lone vote (and a 1:1 plurality over 3 hosts) is no majority: after `result_rounds` rounds
    the step closes with G_{n+1} = G_n, pays nobody, and the next step opens on G_n."""
    config = make_config(phases={"result_rounds": 2})
    sim = accepted_step(HOSTS[:3], config)
    pool = balance(sim, REWARD_POOL_ACCOUNT)
    sim.block(vote(HOSTS[0], "forged"))
    first_deadline = sim.step()["result_deadline"]
    sim.until(first_deadline)
    sim.block(vote(HOSTS[1], "honest"))  # the deadline block: 1:1:0 of 3 is no majority
    step = sim.step()
    assert step["outer_step"] == 0 and step["result_round"] == 1 and step["result_votes"] == {}
    assert step["result_deadline"] == first_deadline + 5 and step["accepted"] == sorted(HOSTS[:3])
    sim.block(vote(HOSTS[0], "forged"))
    sim.until(step["result_deadline"] + 1)  # last round over: G_n stays
    done = queries.outer_step(sim.state, 1, 0)
    assert done["phase"] == Phase.DONE and done["result_hash"] == h32("g0")
    assert queries.run(sim.state, 1)["global_model_hash"] == h32("g0")
    assert sim.step()["outer_step"] == 1 and sim.step()["base_model_hash"] == h32("g0")
    assert balance(sim, REWARD_POOL_ACCOUNT) == pool  # no Δ reached the model: nobody is paid
    assert any(e.type == "result_failed" for e in sim.events)


def test_when_nobody_votes_the_step_closes_after_the_bounded_rounds() -> None:
    sim = accepted_step(HOSTS[:2])  # result_rounds = 3 (default), result_blocks = 5
    finalized = sim.step()["finalized_height"]
    sim.until(finalized + 3 * 5 + 1)
    step0 = queries.outer_step(sim.state, 1, 0)
    assert step0["phase"] == Phase.DONE and step0["done_height"] == finalized + 15
    assert step0["result_hash"] == h32("g0") and sim.step()["outer_step"] == 1


def test_votes_are_weighted_by_tokens_and_a_strict_majority_adopts_at_once() -> None:
    sim = accepted_step(HOSTS[:3])
    sim.block(vote(HOSTS[0], "g1"))
    assert sim.step()["outer_step"] == 0
    sim.block(vote(HOSTS[2], "g1"))  # 2 of 3 equal weights: adopted in this block
    assert queries.run(sim.state, 1)["global_model_hash"] == h32("g1")


def test_a_withholder_reported_by_a_majority_is_dropped_slashed_unpaid_and_results_asked_again() -> None:
    sim = accepted_step(HOSTS[:3])
    good, withholder = sorted(HOSTS[:3])[:2], sorted(HOSTS[:3])[2]
    pool = balance(sim, REWARD_POOL_ACCOUNT)
    sim.block(vote(withholder, "forged"), report(good[0], withholder))
    assert sim.step()["unavailable"] == {good[0]: [withholder]}
    sim.block(report(good[1], withholder))
    sim.until(sim.step()["result_deadline"] + 1)
    step = sim.step()
    assert step["outer_step"] == 0 and step["result_round"] == 1
    assert step["accepted"] == good and step["dropped"] == [withholder]
    assert step["outcomes"][withholder] == Outcome.WITHHELD and step["result_votes"] == {}
    assert (
        stake_of(sim, withholder) == 9 * GNK and queries.prev_optimizer_hash(sim.state, 1, withholder) is None
    )
    assert [a["host"] for a in queries.accepted(sim.state, 1)["accepted"]] == good  # what nodes aggregate
    sim.block(vote(good[0], "g1-without-withholder"))
    sim.block(vote(good[1], "g1-without-withholder"))
    assert queries.run(sim.state, 1)["global_model_hash"] == h32("g1-without-withholder")
    rewards = {a["host"]: a["reward"] for a in queries.accepted(sim.state, 1, 0)["accepted"]}
    assert rewards == dict.fromkeys(good, 50 * GNK) and balance(sim, REWARD_POOL_ACCOUNT) == pool - 100 * GNK
    assert queries.commitment(sim.state, 1, withholder, 0) is not None
    assert sim.state.runs[1].steps[0].contributions[withholder].reward == 0


def test_a_minority_report_drops_nobody() -> None:
    sim = accepted_step(HOSTS[:3])
    liar, *_ = sorted(HOSTS[:3])
    sim.block(report(liar, sorted(HOSTS[:3])[1]))  # one of three: no majority
    sim.until(sim.step()["result_deadline"] + 1)
    step = sim.step()
    assert step["result_round"] == 1 and step["dropped"] == [] and len(step["accepted"]) == 3
    assert all(stake_of(sim, h) == 10 * GNK for h in HOSTS[:3])


def test_report_errors() -> None:
    sim = started(hosts=HOSTS[:3])
    to_reveal(sim, HOSTS[:3])
    sim.fails(report(HOSTS[0], HOSTS[1]), errors.ErrNotResultPhase)
    txs = [
        m for host in HOSTS[:3] for m in (reveal_msg(sim, host), verdict_msg(assigned(sim, host)[0], host))
    ]
    sim.block(*txs)
    to_verify_deadline(sim)
    sim.fails(report(HOSTS[3], HOSTS[1]), errors.ErrNotAcceptedHost)
    sim.fails(report(HOSTS[0], HOSTS[3]), errors.ErrNotInResultSet)
    sim.fails(report(HOSTS[0], HOSTS[1], step=1), errors.ErrWrongOuterStep)
    sim.ok(report(HOSTS[0], HOSTS[1]))
    sim.fails(report(HOSTS[0], HOSTS[2]), errors.ErrDuplicateReport)
    sim.ok(vote(HOSTS[1], "g1"))
    sim.fails(report(HOSTS[1], HOSTS[2]), errors.ErrReportAfterVote)
    sim.ok(vote(HOSTS[0], "g1"))  # a vote withdraws the voter's own report: it had every Δ after all
    assert queries.outer_step(sim.state, 1, 0)["unavailable"] == {}
    with pytest.raises(ValueError, match="own"):
        report(HOSTS[0], HOSTS[0])
    with pytest.raises(ValueError, match="distinct"):
        report(HOSTS[0], HOSTS[1], HOSTS[1])
    with pytest.raises(ValueError):
        MsgReportUnavailable(creator=HOSTS[0], run_id=1, outer_step=0, hosts=[])


def test_an_accepted_host_that_leaves_stays_bonded_until_the_result() -> None:
    sim = accepted_step(HOSTS[:3])
    withholder = sorted(HOSTS[:3])[2]
    events = sim.ok(MsgLeaveRun(creator=withholder, run_id=1))
    assert events[0].type == "leave_pending" and stake_of(sim, withholder) == 10 * GNK
    sim.block(*[report(h, withholder) for h in sorted(HOSTS[:3])[:2]])
    sim.until(sim.step()["result_deadline"] + 1)  # dropped and slashed while still bonded
    assert stake_of(sim, withholder) == 9 * GNK
    _, adopted = sim.block(*[vote(h, "g1") for h in sorted(HOSTS[:3])[:2]])
    assert stake_of(sim, withholder) == 0  # unbonded with what was left, once the step closed
    assert not isinstance(adopted, ChainError)
    assert any(e.type == "unbond" and e.attributes["amount"] == str(9 * GNK) for e in adopted)


# ---------------------------------------------------------------- finalization outcomes


def to_finalized(sim: Sim) -> dict:
    """Run blocks until the current step is finalized (through any audit and dispute window)."""
    index = sim.step()["outer_step"]
    while queries.outer_step(sim.state, 1, index)["finalized_height"] is None:
        sim.block()
    return queries.outer_step(sim.state, 1, index)


def panel_of(sim: Sim, host: str, step: int = 0) -> list[str]:
    """Everyone a contribution is assigned to now (initial, audit and dispute panel)."""
    ch = queries.challenges(sim.state, 1, step)["challenges"]
    return sorted(next(c["verifier_rounds"] for c in ch if c["host"] == host))


def test_missing_reveal_and_a_confirmed_rejection_are_slashed_and_contradicting_verifiers_too() -> None:
    sim = started()
    to_reveal(sim, HOSTS[:2])
    sim.ok(reveal_msg(sim, HOSTS[1]))
    (v1,) = assigned(sim, HOSTS[1])
    sim.ok(verdict_msg(v1, HOSTS[1], Reason.REPLAY_MISMATCH))
    (v0,) = assigned(sim, HOSTS[0])
    if v0 != v1:
        sim.ok(verdict_msg(v0, HOSTS[0]))  # "accepts" a contribution that was never revealed
    module = balance(sim, MODULE_ACCOUNT)
    to_verify_deadline(sim)  # host 0 is decided; host 1's reject disputes it: every verifier is asked
    step = sim.step()
    assert step["phase"] == Phase.CONFIRM and step["reviews"][HOSTS[1]] == Review.CONFIRM
    assert panel_of(sim, HOSTS[1]) == VERIFIERS[:3]
    others = [v for v in VERIFIERS[:3] if v != v1]
    assert all(HOSTS[1] in queries.assignments(sim.state, 1, v)["hosts"] for v in others)
    sim.block(verdict_msg(others[0], HOSTS[1], Reason.REPLAY_MISMATCH))  # 2 of 3 stakes: confirmed
    to_finalized(sim)
    outcomes = queries.outer_step(sim.state, 1, 0)["outcomes"]
    assert outcomes == {HOSTS[0]: Outcome.MISSING_REVEAL, HOSTS[1]: Outcome.REJECTED}
    assert stake_of(sim, HOSTS[0]) == stake_of(sim, HOSTS[1]) == 9 * GNK  # 10% of 10 GNK: nobody vouched
    slashed_verifier = 5 * GNK * 500 // 10_000 if v0 != v1 else 0
    assert balance(sim, MODULE_ACCOUNT) == module + 2 * GNK + slashed_verifier
    assert sim.step()["outer_step"] == 1 and queries.run(sim.state, 1)["global_model_hash"] == h32("g0")


def test_a_lone_malicious_reject_is_outvoted_by_stake_and_slashed_the_host_is_accepted() -> None:
    sim = started()
    to_reveal(sim, [HOSTS[0]])
    (v,) = assigned(sim, HOSTS[0])
    sim.block(reveal_msg(sim, HOSTS[0]), verdict_msg(v, HOSTS[0], Reason.REPLAY_MISMATCH))
    to_verify_deadline(sim)
    sim.block(*[verdict_msg(x, HOSTS[0]) for x in VERIFIERS[:3] if x != v])
    step = to_finalized(sim)
    assert step["outcomes"] == {HOSTS[0]: Outcome.ACCEPTED} and stake_of(sim, HOSTS[0]) == 10 * GNK
    assert stake_of(sim, v) == 5 * GNK - 5 * GNK * 500 // 10_000


def test_a_dispute_without_a_stake_majority_is_unverified_and_slashes_nobody() -> None:
    sim = started()
    to_reveal(sim, [HOSTS[0]])
    (v,) = assigned(sim, HOSTS[0])
    sim.block(reveal_msg(sim, HOSTS[0]), verdict_msg(v, HOSTS[0], Reason.REPLAY_MISMATCH))
    to_verify_deadline(sim)
    sim.block(verdict_msg(next(x for x in VERIFIERS[:3] if x != v), HOSTS[0]))  # 1:1, one silent
    step = to_finalized(sim)
    assert step["outcomes"] == {HOSTS[0]: Outcome.UNVERIFIED} and step["phase"] == Phase.DONE
    assert stake_of(sim, HOSTS[0]) == 10 * GNK and all(stake_of(sim, x) == 5 * GNK for x in VERIFIERS[:3])


def test_draws_are_weighted_by_stake_and_the_confirmation_by_stake_too() -> None:
    """One verifier holds 8 of 10 stake units: it is drawn first most of the time, and in a
    dispute its reject outweighs the two small verifiers' accepts."""
    sim = Sim(make_state())
    sim.ok(MsgCreateRun(creator=AUTH, config=make_config()))
    big, small = VERIFIERS[0], VERIFIERS[1:3]
    sim.block(
        join(Role.HOST, HOSTS[0]),
        join(Role.VERIFIER, big, 40 * GNK),
        *[join(Role.VERIFIER, v) for v in small],
    )
    sim.until(sim.step()["train_start"])
    to_reveal(sim, [HOSTS[0]])
    stakes = {big: 40 * GNK, **dict.fromkeys(small, 5 * GNK)}
    assert assigned(sim, HOSTS[0]) == prf.assign_verifiers(sim.step()["challenge_seed"], HOSTS[0], stakes, 1)
    (v,) = assigned(sim, HOSTS[0])  # whoever is drawn rejects: the dispute asks every verifier
    sim.block(reveal_msg(sim, HOSTS[0]), verdict_msg(v, HOSTS[0], Reason.REPLAY_MISMATCH))
    to_verify_deadline(sim)
    rest = [x for x in [big, *small] if x != v]
    sim.block(
        *[verdict_msg(x, HOSTS[0], Reason.REPLAY_MISMATCH if x == big else Reason.ACCEPT) for x in rest]
    )
    step = to_finalized(sim)
    assert step["outcomes"] == {HOSTS[0]: Outcome.REJECTED}  # 40 (or 45) of 50 stake rejects
    accepted = [x for x in small if x != v]
    assert accepted and all(stake_of(sim, x) == 5 * GNK // 2 for x in accepted)  # accepted a confirmed reject
    assert all(stake_of(sim, x) == 5 * GNK for x in small if x == v)  # its reject was confirmed


def fraud_sim(audit_bps: int = 10_000) -> tuple[Sim, str]:
    """v = 1, every accepted contribution audited by one more verifier: an accomplice accepted."""
    sim = started(make_config(audit_bps=audit_bps, phases={"audit_blocks": 3, "confirm_blocks": 3}))
    to_reveal(sim, [HOSTS[0]])
    (accomplice,) = assigned(sim, HOSTS[0])
    sim.block(reveal_msg(sim, HOSTS[0]), verdict_msg(accomplice, HOSTS[0]))
    return sim, accomplice


def test_an_audit_drawn_after_the_verdicts_catches_a_colluding_accept_and_slashes_both_hard() -> None:
    sim, accomplice = fraud_sim()
    to_verify_deadline(sim)
    closed = sim.height  # the block whose end_block closed the verdict round
    step = sim.step()
    assert step["phase"] == Phase.AUDIT and step["audit_height"] == closed + 2
    assert step["reviews"][HOSTS[0]] == Review.PROVISIONAL and step["finalized_height"] is None
    sim.until(step["audit_height"] + 1)
    step = sim.step()
    assert step["audit_seed"] == prf.seed_from_blocks(sim.hashes[closed - 2 : closed + 1])
    item = next(c for c in queries.challenges(sim.state, 1)["challenges"] if c["host"] == HOSTS[0])
    (auditor,) = [v for v, r in item["verifier_rounds"].items() if r == step["round"]]
    assert item["audited"] and auditor != accomplice and HOSTS[0] not in item["verifier_rounds"]
    assert queries.assignments(sim.state, 1, auditor)["hosts"] == [HOSTS[0]]  # nodes pick audits up
    sim.block(verdict_msg(auditor, HOSTS[0], Reason.DELTA_MISMATCH))
    sim.until(sim.step()["round_deadline"] + 1)
    assert sim.step()["phase"] == Phase.CONFIRM  # the audit found a reject: a dispute
    third = next(v for v in VERIFIERS[:3] if v not in (accomplice, auditor))
    sim.block(verdict_msg(third, HOSTS[0], Reason.DELTA_MISMATCH))
    step = to_finalized(sim)
    assert step["outcomes"] == {HOSTS[0]: Outcome.REJECTED} and step["accepted"] == []
    assert stake_of(sim, HOSTS[0]) == 5 * GNK and stake_of(sim, accomplice) == 5 * GNK // 2  # 50% each
    assert stake_of(sim, auditor) == stake_of(sim, third) == 5 * GNK
    assert queries.run(sim.state, 1)["global_model_hash"] == h32("g0")  # the fake never reached G


def test_an_audit_that_accepts_or_is_not_drawn_accepts() -> None:
    sim, _ = fraud_sim()
    to_verify_deadline(sim)
    sim.until(sim.step()["audit_height"] + 1)
    item = next(c for c in queries.challenges(sim.state, 1)["challenges"] if c["host"] == HOSTS[0])
    (auditor,) = [v for v, r in item["verifier_rounds"].items() if r == sim.step()["round"]]
    sim.block(verdict_msg(auditor, HOSTS[0]))
    step = to_finalized(sim)
    assert step["outcomes"] == {HOSTS[0]: Outcome.ACCEPTED} and step["phase"] == Phase.AWAITING_RESULT
    sim2, _ = fraud_sim(audit_bps=0)  # no audit: accepted at the end of the verdict round
    to_verify_deadline(sim2)
    assert sim2.step()["phase"] == Phase.AWAITING_RESULT


def test_the_default_draws_cap_at_a_pool_smaller_than_v_plus_a() -> None:
    """The run defaults (v, p, a) on devnet-sized pools: the initial draw takes whoever is bonded,
    the audit whoever is left (fewer than a, or nobody), and the step still closes accepted."""
    defaults = {f: RunConfig.model_fields[f].default for f in ("audit_bps", "audit_verifiers")}
    v = RunConfig.model_fields["verifiers_per_contribution"].default
    assert v + defaults["audit_verifiers"] > len(VERIFIERS)  # a pool smaller than v + a
    phases = {"audit_blocks": 3, "confirm_blocks": 3}
    for v_run, pool, initial, auditors in ((v, 3, 3, 0), (2, 4, 2, 2)):
        sim = started(make_config(verifiers_per_contribution=v_run, phases=phases, **defaults), [HOSTS[0]],
                      VERIFIERS[:pool])  # fmt: skip
        to_reveal(sim, [HOSTS[0]])
        first = assigned(sim, HOSTS[0])
        assert len(first) == initial
        sim.block(reveal_msg(sim, HOSTS[0]), *[verdict_msg(x, HOSTS[0]) for x in first])
        to_verify_deadline(sim)
        assert sim.step()["phase"] == Phase.AUDIT  # p = 1: every accepted contribution goes to audit
        sim.until(sim.step()["audit_height"] + 1)
        assert sim.step()["audit_seed"] is not None  # the audit was drawn
        audit = [x for x in panel_of(sim, HOSTS[0]) if x not in first]
        assert len(audit) == auditors
        sim.block(*[verdict_msg(x, HOSTS[0]) for x in audit])
        step = to_finalized(sim)
        assert step["outcomes"] == {HOSTS[0]: Outcome.ACCEPTED} and step["phase"] == Phase.AWAITING_RESULT


def test_equivocator_is_rejected_even_with_an_accepting_verifier() -> None:
    sim = started()
    sim.ok(commit_msg(HOSTS[0]))
    sim.ok(commit_msg(HOSTS[0], salt="b"))
    sim.until(sim.step()["challenge_height"] + 1)
    sim.ok(reveal_msg(sim, HOSTS[0]))
    (v,) = assigned(sim, HOSTS[0])
    sim.ok(verdict_msg(v, HOSTS[0]))
    to_verify_deadline(sim)
    assert queries.outer_step(sim.state, 1, 0)["outcomes"] == {HOSTS[0]: Outcome.EQUIVOCATED}
    assert stake_of(sim, HOSTS[0]) == 9 * GNK and stake_of(sim, v) == 5 * GNK - 25 * GNK // 100


def test_missing_verdicts_escalate_and_a_split_is_disputed() -> None:
    config = make_config(verifiers_per_contribution=3)
    sim = started(config, hosts=HOSTS[:2], verifiers=VERIFIERS)
    to_reveal(sim, HOSTS[:2])
    for host in HOSTS[:2]:
        sim.ok(reveal_msg(sim, host))
    a0, a1 = assigned(sim, HOSTS[0]), assigned(sim, HOSTS[1])
    sim.ok(verdict_msg(a0[0], HOSTS[0]))
    sim.ok(verdict_msg(a0[1], HOSTS[0], Reason.DELTA_MISMATCH))  # a split: disputed at once
    sim.ok(verdict_msg(a1[0], HOSTS[1]))  # 1 of 3: no majority yet, escalates
    to_verify_deadline(sim)
    step = sim.step()
    assert step["phase"] == Phase.ESCALATION and step["round"] == 1
    assert step["reviews"] == {HOSTS[0]: Review.CONFIRM, HOSTS[1]: None}
    (late,) = [c for c in queries.challenges(sim.state, 1)["challenges"] if c["host"] == HOSTS[1]]
    (extra,) = [v for v, r in late["verifier_rounds"].items() if r == 1]
    sim.ok(verdict_msg(extra, HOSTS[1]))  # 2 of 4 accept, none rejects: provisionally accepted
    to_verify_deadline(sim)
    assert sim.step()["phase"] == Phase.CONFIRM and panel_of(sim, HOSTS[0]) == VERIFIERS
    sim.block(*[verdict_msg(v, HOSTS[0], Reason.DELTA_MISMATCH) for v in VERIFIERS if v not in a0[:2]])
    step = to_finalized(sim)
    assert step["outcomes"] == {HOSTS[0]: Outcome.REJECTED, HOSTS[1]: Outcome.ACCEPTED}
    assert stake_of(sim, a0[0]) == 5 * GNK // 2  # its accept was contradicted by a confirmed dispute


def test_verdict_on_an_already_decided_contribution() -> None:
    config = make_config(verifiers_per_contribution=3)
    sim = started(config, hosts=HOSTS[:2], verifiers=VERIFIERS)
    to_reveal(sim, HOSTS[:2])
    sim.ok(reveal_msg(sim, HOSTS[0]))
    a0 = assigned(sim, HOSTS[0])
    sim.ok(verdict_msg(a0[0], HOSTS[0]))
    to_verify_deadline(sim)  # host 1 never revealed: decided in round 0; host 0 escalates
    assert sim.step()["phase"] == Phase.ESCALATION
    sim.fails(verdict_msg(a0[1], HOSTS[1]), errors.ErrAlreadyDecided)


def test_empty_accepted_set_keeps_the_model_and_opens_the_next_step_at_once() -> None:
    sim = started()
    to_reveal(sim, [HOSTS[0]])
    to_verify_deadline(sim)
    step0 = queries.outer_step(sim.state, 1, 0)
    assert step0["phase"] == Phase.DONE and step0["accepted"] == []
    assert sim.step()["open_height"] == step0["finalized_height"] + 1


# ---------------------------------------------------------------- replay classes (specs §6.1)

CPU_1T = EnvFingerprint(torch_version="2.13.0", threads=1)
H200 = EnvFingerprint(
    torch_version="2.13.0+cu130", threads=1, device="cuda", gpu_name="NVIDIA H200",
    compute_capability="9.0", sm_count=132, cuda_version="13.0",
)  # fmt: skip
H100 = EnvFingerprint(**{**H200.model_dump(exclude={"replay_class"}), "gpu_name": "NVIDIA H100 80GB HBM3"})


def class_sim(config: RunConfig, verifiers: dict[str, tuple[int, str]]) -> Sim:
    """Hosts 0 (CPU), 1 (H200), 2 (H100: no verifier has it) commit; `verifiers`: stake, class."""
    sim = Sim(make_state())
    sim.ok(MsgCreateRun(creator=AUTH, config=config))
    joins = [
        MsgJoinRun(creator=v, run_id=1, role=Role.VERIFIER, endpoint="http://x", stake=s, replay_class=c)
        for v, (s, c) in verifiers.items()
    ]
    results = sim.block(*[join(Role.HOST, h) for h in HOSTS[:3]], *joins)
    assert not any(isinstance(r, ChainError) for r in results)
    sim.until(sim.step()["train_start"])
    envs = (CPU_1T, H200, H100)
    results = sim.block(*[commit_msg(h, env=e) for h, e in zip(HOSTS[:3], envs, strict=True)])
    assert not any(isinstance(r, ChainError) for r in results)
    sim.until(sim.step()["challenge_height"] + 1)
    return sim


def test_bitwise_draws_come_from_the_verifiers_of_the_commitments_class_if_any_is_bonded() -> None:
    """One small CPU verifier, two big H200 ones: in bitwise mode the CPU host gets the CPU verifier
    (alone: v = 2 draws fewer rather than verifiers who could only abstain), the H200 host only H200
    verifiers, and the H100 host (no verifier of its class) the whole pool by stake. In tolerance
    mode every draw is from the whole pool."""
    cpu, g1, g2 = VERIFIERS[:3]
    verifiers = {cpu: (5 * GNK, CPU_1T.replay_class), g1: (40 * GNK, H200.replay_class),
                 g2: (40 * GNK, H200.replay_class)}  # fmt: skip
    stakes = {v: s for v, (s, _) in verifiers.items()}
    sim = class_sim(make_config(verifiers_per_contribution=2), verifiers)
    seed = sim.step()["challenge_seed"]
    assert assigned(sim, HOSTS[0]) == [cpu]
    assert sorted(assigned(sim, HOSTS[1])) == sorted([g1, g2])
    assert assigned(sim, HOSTS[2]) == prf.assign_verifiers(seed, HOSTS[2], stakes, 2)
    declared = {p["address"]: p["replay_class"] for p in queries.participants(sim.state, 1)["participants"]}
    assert all(declared[v] == c for v, (_, c) in verifiers.items())

    tol = make_config(verifiers_per_contribution=2, replay_mode="tolerance", tolerance=0.1,
                      tolerance_exp_avg=0.1, tolerance_exp_avg_sq=0.1)  # fmt: skip
    sim = class_sim(tol, verifiers)
    seed = sim.step()["challenge_seed"]
    for h in HOSTS[:3]:
        assert assigned(sim, h) == prf.assign_verifiers(seed, h, stakes, 2)


def test_a_class_squatter_is_drawn_abstains_and_the_classs_honest_verifier_decides() -> None:
    """`class_squatter` declares the CPU class with 8× the stake of the honest CPU verifier, so it
    is drawn for the CPU host; it cannot replay that host bit for bit and sends nothing (its
    node abstains). The escalation draws from the same class without it: the honest CPU verifier
    accepts, the host is accepted; the squatter earns nothing and the H200 verifier is never
    asked."""
    from gonka_diloco.adversaries.verifiers import ClassSquatter

    honest, squatter, gpu = VERIFIERS[:3]
    claimed = ClassSquatter(CPU_1T.replay_class).declared_class(H200)  # an H200 machine claiming CPU
    assert claimed == CPU_1T.replay_class != H200.replay_class
    verifiers = {honest: (5 * GNK, CPU_1T.replay_class), squatter: (40 * GNK, claimed),
                 gpu: (40 * GNK, H200.replay_class)}  # fmt: skip
    for attempt in range(8):  # a challenge that draws the squatter first (it has 8/9 of the class)
        sim = class_sim(make_config(seed=attempt), verifiers)
        if assigned(sim, HOSTS[0]) == [squatter]:
            break
    assert assigned(sim, HOSTS[0]) == [squatter]
    sim.block(reveal_msg(sim, HOSTS[0]))
    to_verify_deadline(sim)
    assert assigned(sim, HOSTS[0]) == [squatter, honest]  # escalated within the class
    sim.block(verdict_msg(honest, HOSTS[0]))
    step = to_finalized(sim)
    assert step["outcomes"][HOSTS[0]] == Outcome.ACCEPTED
    assert gpu not in assigned(sim, HOSTS[0]) and stake_of(sim, squatter) == 40 * GNK


def test_join_run_refuses_a_malformed_replay_class() -> None:
    with pytest.raises(ValueError, match="replay_class"):
        MsgJoinRun(creator=VERIFIERS[0], run_id=1, role=Role.VERIFIER, endpoint="http://x", stake=1,
                   replay_class="H200")  # fmt: skip
