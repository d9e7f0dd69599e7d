"""The `inference.diloco` module as an executable specification (DESIGN §1, §4).

Each `process_*(state, msg, ctx)` first runs every validity check, each one explicit and raising
its own named `ChainError`, and only then writes: a failing message changes nothing, which the
app relies on to discard failed txs without snapshots. `begin_block` moves outer steps through
their phases and derives challenges and audits; `end_block` closes verdict rounds, audits and
disputes, finalizes contributions and ends result rounds (specs/protocol.md §2.5–§2.7).
Deterministic: no wall clock, no randomness but block hashes through `protocol.prf`, every
iteration over a collection in sorted order.

Every write to a `Contribution` is followed by `touched(c)`, which drops its cached app-hash
digest (chain.state); nothing ever writes to a DONE outer step, whose digest is sealed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from chain import errors
from chain.params import (
    BONDING_DELAY_BLOCKS,
    BPS_DENOMINATOR,
    CHALLENGE_DELAY,
    MODULE_ACCOUNT,
    REVEAL_GRACE_SHARE,
    REWARD_POOL_ACCOUNT,
    SEED_BLOCKS,
    SLASHED_OUTCOMES,
    Outcome,
    Phase,
    Review,
    RunStatus,
)
from chain.state import (
    ChainState,
    Contribution,
    Opening,
    OuterStep,
    Participant,
    Run,
    Verdict,
    balance_of,
    get_or_create_account,
    touched,
    transfer,
)
from protocol import merkle, prf
from protocol.config import Codec, Overlap, Phases, ReplayMode, RunConfig
from protocol.messages import (
    MsgCommitPseudoGradient,
    MsgCreateRun,
    MsgJoinRun,
    MsgLeaveRun,
    MsgReportUnavailable,
    MsgRevealContribution,
    MsgSend,
    MsgSubmitOuterResult,
    MsgSubmitVerdict,
    Reason,
    Role,
)
from protocol.modelsize import ModelSize, ModelSizeError, model_size


@dataclass(frozen=True)
class BlockContext:
    """Everything a block brings into the state machine from outside, in one place. Both engines
    fill it from consensus data only (never a local clock): the embedded node from its own header
    chain, the CometBFT app from `RequestFinalizeBlock` (specs/protocol.md §2.9)."""

    height: int
    time_ns: int  # block time, unix nanoseconds (an integer: no floats in state transitions)
    prev_block_hash: str  # hex; enters `recent_block_hashes`, which seed challenges and audits


@dataclass(frozen=True)
class TxContext:
    height: int
    time_ns: int  # the block's time, unix nanoseconds
    tx_hash: str
    signer: str  # bech32 address whose signature the app verified


@dataclass(frozen=True)
class Event:
    type: str
    attributes: dict[str, str] = field(default_factory=dict)


def _event(kind: str, **attributes: Any) -> Event:
    return Event(kind, {k: str(v) for k, v in attributes.items()})


# ---------------------------------------------------------------- helpers (read only)

_CONFIGS: dict[str, RunConfig] = {}


def run_config(run: Run) -> RunConfig:
    """The run's typed config (cached by its hash: the stored dict never changes)."""
    config = _CONFIGS.get(run.config_hash)
    if config is None:
        config = _CONFIGS[run.config_hash] = RunConfig.model_validate(run.config)
    return config


def in_poc_window(height: int, phases: Phases) -> bool:
    """The first `poc_window` heights of every epoch are reserved for Proof-of-Compute."""
    return height % phases.epoch_length < phases.poc_window


def training_start(open_height: int, phases: Phases) -> int:
    """The first height >= open_height outside a PoC window."""
    if in_poc_window(open_height, phases):
        return open_height - open_height % phases.epoch_length + phases.poc_window
    return open_height


def new_outer_step(index: int, open_height: int, config: RunConfig, base_model_hash: str) -> OuterStep:
    phases = config.phases
    start = training_start(open_height, phases)
    commit_deadline = start + phases.train_blocks
    reveal_deadline = commit_deadline + 1 + phases.reveal_blocks
    verify_deadline = reveal_deadline + phases.verify_blocks
    return OuterStep(
        index=index,
        open_height=open_height,
        train_start=start,
        commit_deadline=commit_deadline,
        reveal_deadline=reveal_deadline,
        verify_deadline=verify_deadline,
        base_model_hash=base_model_hash,
        round_deadline=verify_deadline,
    )


def reveal_closes(step: OuterStep, phases: Phases) -> int:
    """The last height a reveal is taken: the reveal deadline, then a grace of part of the verify
    window (`REVEAL_GRACE_SHARE`). A late reveal is verified like any other; only a commitment
    still unrevealed after this is `missing_reveal` (§2.2, lateness is not fraud)."""
    return step.reveal_deadline + phases.verify_blocks // REVEAL_GRACE_SHARE


def active_verifiers(run: Run, bonded_by: int | None = None) -> list[str]:
    """Sorted bonded verifiers not on their way out; with `bonded_by`, only those that joined at or
    before that height (their stake has served its bonding delay: `draw_cutoff`)."""
    return sorted(
        a
        for a, p in run.participants.items()
        if p.role == Role.VERIFIER
        and not p.leaving
        and (bonded_by is None or p.joined_height <= bonded_by)
    )


def bonding_delay(state: ChainState) -> int:
    """The genesis `bonding_delay_blocks` (its default when the genesis left it out)."""
    return int(state.params.get("bonding_delay_blocks", BONDING_DELAY_BLOCKS))


def draw_cutoff(step: OuterStep, delay: int) -> int:
    """The last join height whose stake a step's draws may use: `challenge_height − delay`.

    One pool per step, fixed at its challenge (specs §2.3 step 3): the initial draw, the
    escalations (which reuse the challenge seed, so anyone could compute who a late bond would
    make drawn), the audit and every dispute panel all use stake bonded at least `delay` blocks
    before the challenge, i.e. before the first of its seed blocks existed and before any of the
    step's draws or verdicts could be seen. Stake that joins later serves from the next step on."""
    assert step.challenge_height is not None, "the pool is fixed at the challenge"
    return step.challenge_height - delay


def verifier_pool(run: Run, bonded_by: int | None = None) -> prf.StakePool:
    """The active verifiers with their bonded stakes: every draw is weighted by stake."""
    return prf.StakePool({a: run.participants[a].stake for a in active_verifiers(run, bonded_by)})


class DrawPools:
    """The stake pools one block's verifier draws use (built once, on first use): every active
    verifier, and in bitwise mode those declaring each replay class (specs §6.1). A commitment's
    draws (initial round, escalations, audit) come from the verifiers of its `env.replay_class`
    when any of them is bonded with stake, from the whole pool only when none is: a verifier of
    another class could only abstain. Only stake bonded by `bonded_by` (`draw_cutoff`) is drawn."""

    def __init__(self, run: Run, bonded_by: int) -> None:
        self.run = run
        self.bonded_by = bonded_by
        self.bitwise = run_config(run).replay_mode is ReplayMode.BITWISE
        self._all: prf.StakePool | None = None
        self._by_class: dict[str, prf.StakePool] = {}

    def all(self) -> prf.StakePool:
        if self._all is None:
            self._all = verifier_pool(self.run, self.bonded_by)
        return self._all

    def of_class(self, replay_class: str) -> prf.StakePool:
        pool = self._by_class.get(replay_class)
        if pool is None:
            stakes = {
                a: self.run.participants[a].stake
                for a in active_verifiers(self.run, self.bonded_by)
                if self.run.participants[a].replay_class == replay_class
            }
            pool = self._by_class[replay_class] = prf.StakePool(stakes)
        return pool

    def for_contribution(self, c: Contribution) -> prf.StakePool:
        cls = str(c.env.get("replay_class") or "")
        if self.bitwise and cls:
            pool = self.of_class(cls)
            if pool.total > 0:
                return pool
        return self.all()


def stake_of(run: Run, address: str) -> int:
    participant = run.participants.get(address)
    return participant.stake if participant is not None else 0


def result_weight(step: OuterStep, hosts: Iterable[str]) -> int:
    """The weight of some hosts in a result round: their tokens (what the outer step weighs by)."""
    return sum(step.contributions[h].tokens for h in hosts)


_TALLY = "_result_tally_cache"
_ACCEPTED_WEIGHT = "_accepted_weight_cache"
"""Derived values kept beside an outer step (instance attributes outside its fields: never hashed,
persisted or compared), so a result round of n votes costs O(n) rather than O(n²). Both rely on a
contribution's `tokens` never changing after its commit, and are recomputed on any other change."""


def vote_weights(step: OuterStep) -> dict[str, int]:
    """The result round's weight behind each voted model hash. Votes are only ever added within a
    round (a new round starts a new `result_votes`), so a vote extends the last count."""
    votes = tuple(step.result_votes.items())
    counted, weights = step.__dict__.get(_TALLY, ((), {}))
    if votes[: len(counted)] != counted:
        counted, weights = (), {}
    weights = dict(weights)
    for host, model_hash in votes[len(counted) :]:
        weights[model_hash] = weights.get(model_hash, 0) + step.contributions[host].tokens
    step.__dict__[_TALLY] = (votes, weights)
    return weights


def accepted_weight(step: OuterStep) -> int:
    """The weight of the result round's accepted set (recomputed when the set changed)."""
    accepted = tuple(step.accepted)
    known = step.__dict__.get(_ACCEPTED_WEIGHT)
    if known is None or known[0] != accepted:
        known = step.__dict__[_ACCEPTED_WEIGHT] = (accepted, result_weight(step, accepted))
    return known[1]


def _require_run(state: ChainState, run_id: int) -> Run:
    run = state.runs.get(run_id)
    if run is None:
        raise errors.ErrUnknownRun(f"run {run_id}")
    return run


def overlapped(run: Run) -> bool:
    """Does the run train step n+1 while step n is verified and aggregated (§2.2.1)? Only the
    eager schedule does."""
    return run_config(run).overlap is Overlap.EAGER


def entered(step: OuterStep) -> list[str]:
    """The hosts whose Δs are in the step's result: its accepted set if a majority adopted the
    result, nobody if it closed unchanged (or is not closed yet)."""
    return step.accepted if step.adopted else []


def eager_parent(run: Run, host: str, outer_step: int) -> Contribution | None:
    """Eager runs (§2.2.1): the host's step n − 1 contribution its step n starts from, if any.

    It is the parent when it was committed without equivocation and is *eligible*: it has no
    parent itself, or its parent's Δ entered step n − 2's result (step n − 2 is done whenever
    step n is open, so the parent is fixed when step n opens and never changes after)."""
    if not overlapped(run) or outer_step < 1:
        return None
    before = run.steps.get(outer_step - 1)
    c = before.contributions.get(host) if before is not None else None
    if c is None or c.equivocation_tx is not None:
        return None
    if c.parent_delta_hash is not None:
        grand = run.steps.get(outer_step - 2)
        if grand is None or grand.phase != Phase.DONE or host not in entered(grand):
            return None
    return c


def steps_in_flight(run: Run) -> list[OuterStep]:
    """The open (not DONE) outer steps, oldest first: the current one, and under the overlapped
    schedule possibly the one before it (never more: a step opens only once the one two before it
    is done)."""
    indices = (run.current_step - 1, run.current_step)
    return [run.steps[i] for i in indices if i in run.steps and run.steps[i].phase != Phase.DONE]


def _predecessor_done(run: Run, step: OuterStep) -> bool:
    """Is the result this step's Δs are applied to known (the previous step done, or none)?"""
    before = run.steps.get(step.index - 1)
    return before is None or before.phase == Phase.DONE


def _require_step(run: Run, outer_step: int) -> OuterStep:
    """The step a message names. Sequential runs: the current step (ErrWrongOuterStep otherwise);
    overlapped runs: any step in flight (ErrStepNotInFlight otherwise). The phase checks of each
    message then apply to that step alone."""
    if not overlapped(run):
        if outer_step != run.current_step:
            raise errors.ErrWrongOuterStep(f"outer step {outer_step}, current is {run.current_step}")
        return run.steps[run.current_step]
    step = run.steps.get(outer_step)
    if step is None or step.phase == Phase.DONE or outer_step < run.current_step - 1:
        flying = [s.index for s in steps_in_flight(run)]
        raise errors.ErrStepNotInFlight(f"outer step {outer_step}; in flight {flying}")
    return step


def _pending_in(step: OuterStep, address: str) -> bool:
    """Does this step still need the participant (its commit, its verdicts, or, while results are
    asked for, its accepted Δ)?"""
    if step.phase in (Phase.PENDING, Phase.DONE):
        return False
    if step.phase == Phase.AWAITING_RESULT:
        return address in step.accepted
    return any(address == c.host or address in c.verifier_rounds for c in step.contributions.values())


def start_optimizer(run: Run, host: str, outer_step: int | None = None) -> str | None:
    """The optimizer hash a host's start state of `outer_step` carries (None: fresh zeros).

    Sequential runs: the host's last accepted optimizer state (`prev_optimizer`, for the current
    step). Overlapped runs: the one the host committed in the step whose result is this step's
    base (two steps before) if it was accepted there, else fresh: the start state is the base
    model plus an optimizer state from the same verified step, so a Δ or an optimizer state that
    was not accepted never enters a later start (§2.2.1)."""
    if not overlapped(run):
        return run.prev_optimizer.get(host)
    index = run.current_step if outer_step is None else outer_step
    parent = eager_parent(run, host, index)
    if parent is not None:  # eager: the state the host ended its parent step with
        return parent.final_optimizer_hash
    base = run.steps.get(index - 2)
    c = base.contributions.get(host) if base is not None else None
    return c.final_optimizer_hash if c is not None and c.outcome == Outcome.ACCEPTED else None


def start_ef(run: Run, host: str, outer_step: int | None = None) -> str | None:
    """The error-feedback accumulator hash a host's start state of `outer_step` carries (codec
    sparse; None: zeros, or a run without error feedback). It follows the optimizer state in
    every case (`start_optimizer`): the e_next its last accepted contribution committed
    (`prev_ef`, sequential runs), or in overlapped runs the eager parent's, else that of its
    accepted contribution two steps before. So an e from a contribution that did not enter the
    model never carries into a later start, like its AdamW moments (§4.1)."""
    if not overlapped(run):
        return run.prev_ef.get(host)
    index = run.current_step if outer_step is None else outer_step
    parent = eager_parent(run, host, index)
    if parent is not None:
        return parent.final_ef_hash
    base = run.steps.get(index - 2)
    c = base.contributions.get(host) if base is not None else None
    return c.final_ef_hash if c is not None and c.outcome == Outcome.ACCEPTED else None


def _keep_carried(run: Run, host: str, c: Contribution) -> None:
    """An accepted contribution: the host's next start carries its optimizer state and e_next."""
    run.prev_optimizer[host] = c.final_optimizer_hash
    if c.final_ef_hash is not None:
        run.prev_ef[host] = c.final_ef_hash
    else:
        run.prev_ef.pop(host, None)


def _drop_carried(run: Run, host: str) -> None:
    """Any other outcome: nothing it carried chains on (fresh optimizer, zero accumulator)."""
    run.prev_optimizer.pop(host, None)
    run.prev_ef.pop(host, None)


def apply_to_hash(run: Run, step: OuterStep) -> str | None:
    """The global model G the step's accepted Δs are applied to by the outer optimizer: the step's
    base (sequential runs, and step 0), or the previous step's result (overlapped runs: Δs
    measured from an earlier start), None while that result is not adopted yet."""
    if not overlapped(run) or step.index == 0:
        return step.base_model_hash
    before = run.steps[step.index - 1]
    return before.result_hash if before.phase == Phase.DONE else None


def _is_pending(run: Run, address: str) -> bool:
    """Does a step in flight still need this participant? A pending participant unbonds only after
    the step's slashes: nobody escapes one by leaving."""
    if run.status != RunStatus.ACTIVE:
        return False
    return any(_pending_in(step, address) for step in steps_in_flight(run))


def _pending_elsewhere(run: Run, step: OuterStep) -> list[str]:
    """Leaving participants that another step in flight still needs (overlapped runs only)."""
    others = [s for s in steps_in_flight(run) if s.index != step.index]
    return [
        a
        for a in sorted(run.participants)
        if run.participants[a].leaving and any(_pending_in(s, a) for s in others)
    ]


# ---------------------------------------------------------------- bank


def process_send(state: ChainState, msg: MsgSend, ctx: TxContext) -> list[Event]:
    amount = sum(coin.amount for coin in msg.amount)
    if amount <= 0:
        raise errors.ErrInvalidAmount("amount must be positive")
    if balance_of(state, msg.from_address) < amount:
        raise errors.ErrInsufficientFunds(f"balance {balance_of(state, msg.from_address)} < {amount}")

    transfer(state, msg.from_address, msg.to_address, amount)
    return [_event("transfer", sender=msg.from_address, recipient=msg.to_address, amount=amount)]


# ---------------------------------------------------------------- runs and participants


def check_model_size(config: RunConfig, max_params: int, max_tensors: int) -> ModelSize:
    """The run's model must be countable from its spec and within the chain's bounds, before any
    node is asked to build it (specs §2.4): a run whose model no node can hold would make every
    node that joins it try, and fail, to allocate it."""
    try:
        size = model_size(config.model)
    except ModelSizeError as exc:
        raise errors.ErrBadModelSpec(f"{config.model.factory}: {exc}") from None
    if size.context is not None and config.seq_len > size.context:
        raise errors.ErrBadModelSpec(f"seq_len {config.seq_len} exceeds the model's context {size.context}")
    if size.params > max_params:
        raise errors.ErrModelTooLarge(
            f"{config.model.factory}: {size.params} parameters > max_model_params {max_params}"
        )
    if size.tensors is not None and size.tensors > max_tensors:
        raise errors.ErrModelTooLarge(
            f"{config.model.factory}: {size.tensors} tensors > max_model_tensors {max_tensors}"
        )
    return size


def process_create_run(state: ChainState, msg: MsgCreateRun, ctx: TxContext) -> list[Event]:
    if msg.creator != state.authority:
        raise errors.ErrUnauthorized(f"{msg.creator} is not the authority")
    active = sum(1 for r in state.runs.values() if r.status == RunStatus.ACTIVE)
    params = state.module_params()
    if active >= params.max_active_runs:
        raise errors.ErrTooManyRuns(f"{active} active runs")
    config = msg.config
    check_model_size(config, params.max_model_params, params.max_model_tensors)

    run = Run(
        id=state.next_run_id,
        creator=msg.creator,
        config=config.model_dump(mode="json"),
        config_hash=config.config_hash(),
        created_height=ctx.height,
        global_model_hash=config.initial_model_hash,
    )
    run.steps[0] = new_outer_step(0, ctx.height + config.phases.join_blocks, config, run.global_model_hash)
    state.runs[run.id] = run
    state.next_run_id += 1
    step = run.steps[0]
    return [
        _event("create_run", run_id=run.id, config_hash=run.config_hash, creator=msg.creator),
        _event("outer_step_opened", run_id=run.id, outer_step=0, train_start=step.train_start),
    ]


def process_join_run(state: ChainState, msg: MsgJoinRun, ctx: TxContext) -> list[Event]:
    run = _require_run(state, msg.run_id)
    if run.status != RunStatus.ACTIVE:
        raise errors.ErrRunFinished(f"run {run.id}")
    existing = run.participants.get(msg.creator)
    if existing is not None and existing.role == msg.role:
        raise errors.ErrAlreadyJoined(f"already a {existing.role}")
    if existing is not None:
        raise errors.ErrRoleConflict(f"already a {existing.role}")
    stake_params = run_config(run).stake
    minimum = stake_params.min_host_stake if msg.role is Role.HOST else stake_params.min_verifier_stake
    if msg.stake < minimum:
        raise errors.ErrStakeTooLow(f"{msg.stake} < {minimum}")
    if len(run.participants) >= state.module_params().max_participants_per_run:
        raise errors.ErrRunFull(f"{len(run.participants)} participants")
    if balance_of(state, msg.creator) < msg.stake:
        raise errors.ErrInsufficientFunds(f"balance {balance_of(state, msg.creator)} < stake {msg.stake}")

    get_or_create_account(state, msg.creator).balance -= msg.stake
    run.participants[msg.creator] = Participant(
        address=msg.creator,
        role=Role(msg.role),
        stake=msg.stake,
        endpoint=msg.endpoint,
        joined_height=ctx.height,
        replay_class=msg.replay_class,
    )
    return [_event("join_run", run_id=run.id, address=msg.creator, role=msg.role.value, stake=msg.stake)]


def _unbond(state: ChainState, run: Run, address: str) -> Event:
    participant = run.participants.pop(address)
    get_or_create_account(state, address).balance += participant.stake
    return _event("unbond", run_id=run.id, address=address, amount=participant.stake)


def process_leave_run(state: ChainState, msg: MsgLeaveRun, ctx: TxContext) -> list[Event]:
    run = _require_run(state, msg.run_id)
    participant = run.participants.get(msg.creator)
    if participant is None:
        raise errors.ErrNotParticipant(f"{msg.creator} in run {run.id}")
    if participant.leaving:
        raise errors.ErrAlreadyLeaving(f"{msg.creator} unbonds when outer step {run.current_step} finalizes")

    if _is_pending(run, msg.creator):
        participant.leaving = True
        return [_event("leave_pending", run_id=run.id, address=msg.creator, outer_step=run.current_step)]
    return [_unbond(state, run, msg.creator)]


# ---------------------------------------------------------------- commit


def _commit_fields(msg: MsgCommitPseudoGradient) -> dict[str, Any]:
    return {
        "base_model_hash": msg.base_model_hash,
        "trajectory_root": msg.trajectory_root,
        "leaf_count": msg.leaf_count,
        "delta_hash": msg.delta_hash,
        "final_optimizer_hash": msg.final_optimizer_hash,
        "codec": msg.codec,
        "tokens": msg.tokens,
        "env": msg.env.model_dump(mode="json"),
        "final_ef_hash": msg.final_ef_hash or None,
    }


def check_commit_ef(config: RunConfig, msg: MsgCommitPseudoGradient) -> None:
    """A sparse run's commit binds the accumulator its host carries on; no other run's does (§4.1)."""
    if config.codec is Codec.SPARSE and not msg.final_ef_hash:
        raise errors.ErrMissingEFHash("codec sparse: the commit must carry final_ef_hash")
    if config.codec is not Codec.SPARSE and msg.final_ef_hash:
        raise errors.ErrUnexpectedEFHash(f"codec {config.codec.value} carries no error-feedback accumulator")


def _same_commit(c: Contribution, fields: dict[str, Any]) -> bool:
    return all(getattr(c, name) == value for name, value in fields.items())


def process_commit(state: ChainState, msg: MsgCommitPseudoGradient, ctx: TxContext) -> list[Event]:
    run = _require_run(state, msg.run_id)
    if run.status != RunStatus.ACTIVE:
        raise errors.ErrRunFinished(f"run {run.id}")
    step = _require_step(run, msg.outer_step)
    if ctx.height > step.commit_deadline:
        raise errors.ErrLateCommit(f"height {ctx.height} > commit deadline {step.commit_deadline}")
    if step.phase != Phase.TRAIN:
        raise errors.ErrNotTrainPhase(f"training starts at {step.train_start}")
    participant = run.participants.get(msg.creator)
    if participant is None or participant.role != Role.HOST or participant.leaving:
        raise errors.ErrNotHost(f"{msg.creator} in run {run.id}")
    if msg.base_model_hash != step.base_model_hash:  # sequential runs: the run's global model hash
        raise errors.ErrBaseModelMismatch(f"the step's base model hash is {step.base_model_hash}")
    config = run_config(run)
    if msg.codec is not config.codec:
        raise errors.ErrCodecMismatch(f"{msg.codec.value} != {config.codec.value}")
    if msg.leaf_count != config.n_segments + 1:
        raise errors.ErrLeafCount(f"{msg.leaf_count} != {config.n_segments + 1}")
    if msg.tokens != config.tokens_per_outer_step:
        raise errors.ErrBadTokens(f"{msg.tokens} != {config.tokens_per_outer_step}")
    if config.replay_mode is ReplayMode.BITWISE and msg.env.threads != config.threads:
        raise errors.ErrEnvMismatch(f"threads {msg.env.threads} != {config.threads}")
    check_commit_ef(config, msg)
    fields = _commit_fields(msg)
    existing = step.contributions.get(msg.creator)
    if existing is not None and (_same_commit(existing, fields) or existing.equivocation_tx is not None):
        raise errors.ErrDuplicateCommit(f"{msg.creator} already committed at height {existing.height}")

    if existing is not None:  # a second, different commitment: evidence of equivocation
        existing.equivocation_tx = ctx.tx_hash
        touched(existing)
        return [
            _event("equivocation", run_id=run.id, outer_step=step.index, host=msg.creator, tx=ctx.tx_hash)
        ]
    parent = eager_parent(run, msg.creator, step.index)
    step.contributions[msg.creator] = Contribution(
        host=msg.creator, height=ctx.height, tx_hash=ctx.tx_hash, **fields,
        parent_delta_hash=None if parent is None else parent.delta_hash,
    )  # fmt: skip
    return [
        _event("commit", run_id=run.id, outer_step=step.index, host=msg.creator, delta_hash=msg.delta_hash)
    ]


# ---------------------------------------------------------------- reveal


def process_reveal(state: ChainState, msg: MsgRevealContribution, ctx: TxContext) -> list[Event]:
    run = _require_run(state, msg.run_id)
    step = _require_step(run, msg.outer_step)
    contribution = step.contributions.get(msg.creator)
    if contribution is None:
        raise errors.ErrNoCommitment(f"{msg.creator} in outer step {step.index}")
    if step.challenge_seed is None:
        raise errors.ErrNotRevealPhase(f"challenge at height {step.commit_deadline + CHALLENGE_DELAY}")
    last = reveal_closes(step, run_config(run).phases)
    if ctx.height > last:
        raise errors.ErrLateReveal(
            f"height {ctx.height} > {last} (reveal deadline {step.reveal_deadline} and its grace)"
        )
    if contribution.reveal_height is not None:
        raise errors.ErrAlreadyRevealed(f"at height {contribution.reveal_height}")
    segments = [o.segment for o in msg.openings]
    if segments != contribution.sampled_segments:
        raise errors.ErrWrongOpenings(f"opened {segments}, sampled {contribution.sampled_segments}")
    root = bytes.fromhex(contribution.trajectory_root)
    for o in msg.openings:
        proof = [bytes.fromhex(p) for p in o.proof]
        left, right = bytes.fromhex(o.start_leaf), bytes.fromhex(o.end_leaf)
        if not merkle.verify_pair(left, right, o.segment, contribution.leaf_count, proof, root):
            raise errors.ErrBadProof(f"segment {o.segment}")

    contribution.reveal_height = ctx.height
    contribution.openings = [Opening(o.segment, o.start_leaf, o.end_leaf) for o in msg.openings]
    touched(contribution)
    return [_event("reveal", run_id=run.id, outer_step=step.index, host=msg.creator)]


# ---------------------------------------------------------------- verdict

_VERDICT_PHASES = (Phase.REVEAL, Phase.VERIFY, Phase.ESCALATION, Phase.AUDIT, Phase.CONFIRM)


def process_verdict(state: ChainState, msg: MsgSubmitVerdict, ctx: TxContext) -> list[Event]:
    run = _require_run(state, msg.run_id)
    step = _require_step(run, msg.outer_step)
    if step.phase in (Phase.PENDING, Phase.TRAIN, Phase.CHALLENGE):
        raise errors.ErrNotVerdictPhase(f"phase {step.phase}")
    if step.phase not in _VERDICT_PHASES or ctx.height > step.round_deadline:
        raise errors.ErrLateVerdict(f"verdicts closed at height {step.round_deadline}")
    contribution = step.contributions.get(msg.host)
    if contribution is None:
        raise errors.ErrNoCommitment(f"{msg.host} in outer step {step.index}")
    if contribution.outcome is not None:
        raise errors.ErrAlreadyDecided(f"{msg.host}: {contribution.outcome}")
    if msg.creator not in contribution.verifier_rounds:
        raise errors.ErrNotAssignedVerifier(f"{msg.creator} for {msg.host}")
    revote = owes_revote(contribution, msg.creator)
    if msg.creator in contribution.verdicts and not revote:
        raise errors.ErrDuplicateVerdict(f"{msg.creator} for {msg.host}")

    verdict = Verdict(
        verifier=msg.creator,
        reason=int(msg.reason),
        evidence_hash=msg.evidence_hash,
        detail=msg.detail,
        height=ctx.height,
        round=step.round,
    )
    if revote:  # a windowed dispute: its vote on the disputed windows, beside its own window's
        contribution.revotes[msg.creator] = verdict
    else:
        contribution.verdicts[msg.creator] = verdict
    touched(contribution)
    return [
        _event(
            "verdict",
            run_id=run.id,
            outer_step=step.index,
            host=msg.host,
            verifier=msg.creator,
            reason=msg.reason.name,
        )
    ]


# ---------------------------------------------------------------- outer result


def next_base(run: Run) -> str | None:
    """Overlapped runs: the base of the step after the newest, once it is fixed — the run goes on
    past the newest step and the step before the newest is done, so the run's global model is
    the result it will open on (the newest step cannot close before the next one opens) — else
    None. The next step's whole start state (§2.2.1) is then fixed: a host may train it early."""
    newest = run.steps[run.current_step]
    config = run_config(run)
    if run.status != RunStatus.ACTIVE or not overlapped(run) or newest.phase == Phase.PENDING:
        return None
    if not _predecessor_done(run, newest):
        return None
    if config.max_outer_steps and newest.index + 1 >= config.max_outer_steps:
        return None
    return run.global_model_hash


def _open_overlapped(run: Run, open_height: int) -> list[Event]:
    """Overlapped runs: open the next step at `open_height` once the newest step's training has
    closed (its commit deadline passed) and its base is fixed (`next_base`: no older step in
    flight; the run's global model now, the result of the step two before it)."""
    newest = run.steps[run.current_step]
    base = next_base(run)
    if base is None or newest.phase == Phase.TRAIN:
        return []
    nxt = new_outer_step(newest.index + 1, open_height, run_config(run), base)
    run.steps[nxt.index] = nxt
    run.current_step = nxt.index
    return [_event("outer_step_opened", run_id=run.id, outer_step=nxt.index, train_start=nxt.train_start)]


def _start_results(state: ChainState, run: Run, step: OuterStep, height: int) -> list[Event]:
    """Overlapped runs: the previous step just closed, so this finalized step's Δs can be applied to
    its result: result round 0 starts now (or, with nothing accepted, the step closes unchanged).
    It first drops every accepted Δ whose start was built on a parent Δ that is not in that
    result (§2.2.1): nothing that did not enter the model reaches it through a child."""
    events: list[Event] = []
    if step.index > 0:
        in_model = set(entered(run.steps[step.index - 1]))
        for host in list(step.accepted):
            c = step.contributions[host]
            if c.parent_delta_hash is not None and host not in in_model:
                c.outcome = Outcome.PARENT_NOT_ACCEPTED
                touched(c)
                _drop_carried(run, host)
                step.accepted.remove(host)
                events.append(_event("parent_not_accepted", run_id=run.id, outer_step=step.index, host=host))
    if not step.accepted:
        return events + _close_step(state, run, step, run.global_model_hash, height)
    step.result_deadline = height + run_config(run).phases.result_blocks
    return [*events, _event("result_round", run_id=run.id, outer_step=step.index, round=step.result_round)]


def _open_next_step(run: Run, step: OuterStep, open_height: int) -> list[Event]:
    """Open outer step n+1 on the recorded global hash, or finish the run at max_outer_steps."""
    config = run_config(run)
    if config.max_outer_steps and step.index + 1 >= config.max_outer_steps:
        run.status = RunStatus.FINISHED
        return [_event("run_finished", run_id=run.id, outer_steps=step.index + 1)]
    nxt = new_outer_step(step.index + 1, open_height, config, run.global_model_hash)
    run.steps[nxt.index] = nxt
    run.current_step = nxt.index
    return [_event("outer_step_opened", run_id=run.id, outer_step=nxt.index, train_start=nxt.train_start)]


def _release_leavers(state: ChainState, run: Run, keep: list[str]) -> list[Event]:
    """Unbond every leaving participant (sorted) except those in `keep` (still pending)."""
    leaving = [a for a in sorted(run.participants) if run.participants[a].leaving and a not in keep]
    return [_unbond(state, run, a) for a in leaving]


def _pay_rewards(state: ChainState, run: Run, step: OuterStep) -> list[Event]:
    """Each host whose Δ reached the model gets its token share of min(reward, pool balance)."""
    total_tokens = result_weight(step, step.accepted)
    budget = min(run_config(run).stake.reward_per_outer_step, balance_of(state, REWARD_POOL_ACCOUNT))
    events = []
    for host in step.accepted:
        c = step.contributions[host]
        c.reward = budget * c.tokens // total_tokens if total_tokens else 0
        touched(c)
        transfer(state, REWARD_POOL_ACCOUNT, host, c.reward)
        events.append(_event("reward", run_id=run.id, outer_step=step.index, host=host, amount=c.reward))
    return events


def _close_step(state: ChainState, run: Run, step: OuterStep, model_hash: str, height: int) -> list[Event]:
    step.result_hash = model_hash
    step.phase = Phase.DONE
    step.done_height = height
    run.global_model_hash = model_hash
    if not overlapped(run):
        events = _release_leavers(state, run, [])
        return events + _open_next_step(run, step, height + 1)
    events = _release_leavers(state, run, _pending_elsewhere(run, step))
    config = run_config(run)
    if config.max_outer_steps and step.index + 1 >= config.max_outer_steps:
        run.status = RunStatus.FINISHED
        return [*events, _event("run_finished", run_id=run.id, outer_steps=step.index + 1)]
    successor = run.steps.get(step.index + 1)
    if (
        successor is not None
        and successor.phase == Phase.AWAITING_RESULT
        and successor.result_deadline is None
    ):
        events += _start_results(state, run, successor, height)
    return events + _open_overlapped(run, height + 1)


def _adopt_result(state: ChainState, run: Run, step: OuterStep, model_hash: str, height: int) -> list[Event]:
    """A strict majority of the round's accepted weight agreed: G_{n+1}; the Δs in it are paid."""
    step.adopted = True
    events = _pay_rewards(state, run, step)
    events.append(_event("global_model", run_id=run.id, outer_step=step.index, model_hash=model_hash))
    return events + _close_step(state, run, step, model_hash, height)


def _require_result_round(
    state: ChainState, msg: MsgSubmitOuterResult | MsgReportUnavailable
) -> tuple[Run, OuterStep]:
    """The checks a result vote and an unavailability report share: run, step, phase, sender."""
    run = _require_run(state, msg.run_id)
    step = _require_step(run, msg.outer_step)
    if step.phase != Phase.AWAITING_RESULT:
        raise errors.ErrNotResultPhase(f"phase {step.phase}")
    if not _predecessor_done(run, step):
        raise errors.ErrPreviousResultPending(f"outer step {step.index - 1} is not done")
    if msg.creator not in step.accepted:
        raise errors.ErrNotAcceptedHost(f"{msg.creator} in outer step {step.index}")
    return run, step


def process_outer_result(state: ChainState, msg: MsgSubmitOuterResult, ctx: TxContext) -> list[Event]:
    run, step = _require_result_round(state, msg)
    if msg.creator in step.result_votes:
        raise errors.ErrDuplicateOuterResult(f"{msg.creator} reported {step.result_votes[msg.creator]}")

    step.result_votes[msg.creator] = msg.model_hash
    if msg.val_loss_ppm:  # informational (§2.7): stored with the vote, never counted
        step.result_losses[msg.creator] = msg.val_loss_ppm
    step.unavailable.pop(msg.creator, None)  # it computed the result: it had every Δ after all
    events = [_event("outer_result", run_id=run.id, outer_step=step.index, host=msg.creator)]
    if 2 * vote_weights(step)[msg.model_hash] > accepted_weight(step):
        events += _adopt_result(state, run, step, msg.model_hash, ctx.height)
    return events


def process_report_unavailable(state: ChainState, msg: MsgReportUnavailable, ctx: TxContext) -> list[Event]:
    run, step = _require_result_round(state, msg)
    if msg.creator in step.result_votes:
        raise errors.ErrReportAfterVote(f"{msg.creator} voted {step.result_votes[msg.creator]}")
    if msg.creator in step.unavailable:
        raise errors.ErrDuplicateReport(f"{msg.creator} in result round {step.result_round}")
    accepted = set(step.accepted)
    missing = [h for h in msg.hosts if h not in accepted]
    if missing:
        raise errors.ErrNotInResultSet(f"{missing[0]} in result round {step.result_round}")

    step.unavailable[msg.creator] = sorted(msg.hosts)
    hosts = ",".join(sorted(msg.hosts))
    return [
        _event("report_unavailable", run_id=run.id, outer_step=step.index, reporter=msg.creator, hosts=hosts)
    ]


# ---------------------------------------------------------------- dispatch

Handler = Callable[[ChainState, Any, TxContext], list[Event]]
HANDLERS: dict[type, Handler] = {
    MsgCreateRun: process_create_run,
    MsgJoinRun: process_join_run,
    MsgLeaveRun: process_leave_run,
    MsgCommitPseudoGradient: process_commit,
    MsgRevealContribution: process_reveal,
    MsgSubmitVerdict: process_verdict,
    MsgSubmitOuterResult: process_outer_result,
    MsgReportUnavailable: process_report_unavailable,
    MsgSend: process_send,
}


def process_msg(state: ChainState, msg: Any, ctx: TxContext) -> list[Event]:
    """Run one message; on `ChainError` the state is exactly as before."""
    handler = HANDLERS.get(type(msg))
    if handler is None:
        raise errors.ErrUnknownMessage(type(msg).__name__)
    if msg.creator != ctx.signer:
        raise errors.ErrSignerMismatch(f"creator {msg.creator}, signer {ctx.signer}")
    return handler(state, msg, ctx)


# ---------------------------------------------------------------- begin block


def block_seed(state: ChainState) -> str:
    """The seed of a draw in this block: SHA-256 over the last SEED_BLOCKS block hashes."""
    return prf.seed_from_blocks(state.recent_block_hashes)


def _assign(c: Contribution, verifiers: list[str], round: int, first_slot: int | None = None) -> None:
    """Append verifiers to a contribution's rounds; with `first_slot` (a windowed contribution's
    initial, escalation or audit draw) the i-th drawn verifier holds slot first_slot + i."""
    new = [v for v in verifiers if v not in c.verifier_rounds]
    c.verifiers += new
    c.verifier_rounds.update(dict.fromkeys(new, round))
    if first_slot is not None and c.windows:
        c.slots.update({v: first_slot + i for i, v in enumerate(verifiers) if v in new})
    touched(c)


def _derive_challenge(run: Run, step: OuterStep, seed: str, height: int, delay: int) -> list[Event]:
    config = run_config(run)
    step.challenge_seed = seed
    step.challenge_height = height
    pools = DrawPools(run, draw_cutoff(step, delay))
    events = []
    n = config.n_segments
    for host in sorted(step.contributions):
        c = step.contributions[host]
        if config.windowed:  # every slot's window now, the audit's too: the host serves them all
            c.windows = prf.draw_windows(seed, host, n, config.window_len, config.checker_slots)
            c.sampled_segments = prf.windows_opened(c.windows, n, config.window_len)
        else:
            c.sampled_segments = prf.sample_segments(seed, host, n, config.sampled_segments)
        _assign(c, pools.for_contribution(c).draw(seed, host, config.verifiers_per_contribution, 0), 0, 0)
        events.append(
            _event(
                "challenge",
                run_id=run.id,
                outer_step=step.index,
                host=host,
                segments=",".join(map(str, c.sampled_segments)),
                verifiers=",".join(c.verifiers),
                **({"windows": ",".join(map(str, c.windows))} if c.windows else {}),
            )
        )
    return events


def _open_dispute(run: Run, step: OuterStep, c: Contribution, delay: int) -> Event:
    """Some verifier rejected: every active verifier of the step's pool is asked (its stake bonded
    before the challenge, `draw_cutoff`: stake bought once the dispute is visible has no vote),
    and the stake majority of the panel will decide."""
    c.review = Review.CONFIRM
    _assign(c, active_verifiers(run, draw_cutoff(step, delay)), step.round)
    return _event("dispute", run_id=run.id, outer_step=step.index, host=c.host, round=step.round)


def _has_reject(c: Contribution) -> bool:
    return any(v.reason != Reason.ACCEPT for v in c.verdicts.values())


def _draw_audits(run: Run, step: OuterStep, seed: str, height: int, delay: int) -> list[Event]:
    """The audit lottery, from a seed no verifier knew when it voted: each provisionally accepted
    contribution is audited with probability audit_bps / 10^4 by `audit_verifiers` more verifiers
    drawn by stake, never one already assigned to it (nor its host)."""
    config = run_config(run)
    pools = DrawPools(run, draw_cutoff(step, delay))
    step.audit_seed = seed
    events: list[Event] = []
    waiting = False
    for host in sorted(step.contributions):
        c = step.contributions[host]
        if c.outcome is not None:
            continue
        if c.review == Review.CONFIRM:
            waiting = True
            continue
        if _has_reject(c):  # a late reject since the rounds closed: disputed like any other
            events.append(_open_dispute(run, step, c, delay))
            waiting = True
            continue
        auditors: list[str] = []
        if prf.audited(seed, host, config.audit_bps):
            pool = pools.for_contribution(c)
            auditors = pool.draw(seed, host, config.audit_verifiers, step.round, exclude=c.verifier_rounds)
        if auditors:
            c.review, c.audited = Review.AUDIT, True
            _assign(c, auditors, step.round, config.verifiers_per_contribution)  # the audit slots
            waiting = True
            events.append(
                _event("audit", run_id=run.id, outer_step=step.index, host=host, verifiers=",".join(auditors))
            )
        else:
            c.outcome = Outcome.ACCEPTED
            touched(c)
    if not waiting:  # nothing to wait for: this block's end_block finalizes
        step.round_deadline = height
    return events


def _quorum_joined(run: Run, height: int, delay: int) -> bool:
    """Outer step 0 trains only once `min_hosts` hosts and `min_verifiers` verifiers are bonded
    (later steps never wait: a run that has started goes on with whoever is left). A verifier counts
    once its stake will be drawable at the earliest challenge training from `height` could bring
    (`height + CHALLENGE_DELAY`, a train window closed early in its first block): a quorum is never
    one the challenge's bonding delay then leaves out."""
    if run.current_step != 0:
        return True
    phases = run_config(run).phases
    active = [p for p in run.participants.values() if not p.leaving]
    hosts = sum(1 for p in active if p.role == Role.HOST)
    drawable = height + CHALLENGE_DELAY - delay
    verifiers = sum(1 for p in active if p.role == Role.VERIFIER and p.joined_height <= drawable)
    return hosts >= phases.min_hosts and verifiers >= phases.min_verifiers


def _postpone_first_step(run: Run, step: OuterStep, height: int) -> list[Event]:
    """Re-open outer step 0 at the next block, its deadlines with it, until the quorum has joined."""
    first_delay = step.open_height == run.created_height + run_config(run).phases.join_blocks
    run.steps[0] = new_outer_step(0, height + 1, run_config(run), step.base_model_hash)
    if not first_delay:
        return []
    return [_event("outer_step_postponed", run_id=run.id, outer_step=0, reason="waiting for participants")]


def begin_block(state: ChainState, ctx: BlockContext) -> list[Event]:
    """Advance each active run's current outer step through the phases its deadlines imply."""
    state.height = ctx.height
    state.recent_block_hashes = [*state.recent_block_hashes, ctx.prev_block_hash][-SEED_BLOCKS:]
    events: list[Event] = []
    h = ctx.height
    for run_id in sorted(state.runs):
        run = state.runs[run_id]
        if run.status != RunStatus.ACTIVE:
            continue
        for step in steps_in_flight(run):
            events += _advance(state, run, step, h)
        if overlapped(run):
            opened = _open_overlapped(run, h)  # the newest step's training just closed
            if opened:
                events += opened + _advance(state, run, run.steps[run.current_step], h)
    return events


def _advance(state: ChainState, run: Run, step: OuterStep, h: int) -> list[Event]:
    """The begin-block transitions of one step in flight (§2.3), each possibly enabled by the last."""
    events: list[Event] = []
    if (
        step.phase == Phase.PENDING
        and h >= step.train_start
        and not _quorum_joined(run, h, bonding_delay(state))
    ):
        events += _postpone_first_step(run, step, h)
        step = run.steps[step.index]
    if step.phase == Phase.PENDING and h >= step.train_start:
        step.phase = Phase.TRAIN
        events.append(_event("phase", run_id=run.id, outer_step=step.index, phase=step.phase))
    if step.phase == Phase.TRAIN and h > step.commit_deadline:
        step.phase = Phase.CHALLENGE
        events.append(_event("phase", run_id=run.id, outer_step=step.index, phase=step.phase))
    if step.phase == Phase.CHALLENGE and h >= step.commit_deadline + CHALLENGE_DELAY:
        step.phase = Phase.REVEAL
        events += _derive_challenge(run, step, block_seed(state), h, bonding_delay(state))
        events.append(_event("phase", run_id=run.id, outer_step=step.index, phase=step.phase))
    if step.phase == Phase.REVEAL and h > step.reveal_deadline:
        step.phase = Phase.VERIFY
        events.append(_event("phase", run_id=run.id, outer_step=step.index, phase=step.phase))
    if (
        step.phase == Phase.AUDIT
        and step.audit_seed is None
        and step.audit_height is not None
        and h >= step.audit_height
    ):
        events += _draw_audits(run, step, block_seed(state), h, bonding_delay(state))
    return events


# ---------------------------------------------------------------- end block: verdicts


def _tally(c: Contribution) -> tuple[int, int]:
    accepts = sum(1 for v in c.verdicts.values() if v.reason == Reason.ACCEPT)
    return accepts, len(c.verdicts) - accepts


def _initial_review(c: Contribution, final_round: bool) -> Outcome | Review | None:
    """At the end of an initial round: an outcome, a review stage, or None to escalate."""
    if c.reveal_height is None:
        return Outcome.MISSING_REVEAL
    if c.equivocation_tx is not None:
        return Outcome.EQUIVOCATED
    accepts, rejects = _tally(c)
    if rejects:
        return Review.CONFIRM  # one reject disputes it: only the stake majority may decide against it
    if 2 * accepts > len(c.verifiers):
        return Review.PROVISIONAL
    if not final_round:
        return None
    return Review.PROVISIONAL if accepts else Outcome.UNVERIFIED  # no verdicts: nobody slashed


class Question(StrEnum):
    """What a dispute asks (§2.5.3). A check that ends at θ_H (every check under sampling segments;
    under windows, the one whose window replays segment n − 1, and every panel vote) checks the Δ
    against it; the rest of a check (proofs, claims, the start, the replayed segments, the data) is
    about the segments it opened."""

    SEGMENTS = "segments"
    DELTA = "delta"


def _question_of(reason: int) -> Question:
    return Question.DELTA if reason == Reason.DELTA_MISMATCH else Question.SEGMENTS


def disputed_windows(c: Contribution) -> list[int]:
    """Windowed contributions: the start segments of the windows some slot holder rejected, sorted:
    what a dispute panel replays (with the Δ)."""
    return sorted(
        {c.windows[c.slots[v]] for v, x in c.verdicts.items() if x.reason != Reason.ACCEPT and v in c.slots}
    )


class Answer(StrEnum):
    """A verifier's answer to a dispute's question."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_REACHED = "not_reached"
    """Its check stopped at a failure before the question: not counted either way."""
    SILENT = "silent"
    """No verdict on it (yet): counted in the stake the majority is out of, never for a side."""


def owes_revote(c: Contribution, verifier: str) -> bool:
    """Windowed disputes (§2.5.3): a slot holder whose own window nobody disputed judged only that
    window; like the panel it is asked to replay the disputed ones (Δ first), once, so that every
    bonded verifier of the step's pool votes on them and a coalition can never be a majority of a
    voter set its honest members were left out of."""
    return (
        c.review == Review.CONFIRM
        and bool(c.windows)
        and verifier in c.slots
        and verifier in c.verdicts
        and verifier not in c.revotes
        and c.windows[c.slots[verifier]] not in disputed_windows(c)
    )


def _answer_of(verdict: Verdict, question: Question, delta_first: bool) -> Answer:
    """A check stops at its first failure: a slot holder (and, without windows, every verifier)
    checks its segments first and Δ last, so its segments reject says nothing of the Δ and its Δ
    reject says the segments passed; a dispute panel member (windows: no slot, or a slot holder's
    revote) checks Δ first, so a Δ reject says nothing of the disputed windows and a segments
    reject says Δ passed — every panel vote answers Δ, and no lone Δ claim decides it."""
    if verdict.reason == Reason.ACCEPT:
        return Answer.PASSED
    if _question_of(verdict.reason) is question:
        return Answer.FAILED
    reached = question is (Question.DELTA if delta_first else Question.SEGMENTS)
    return Answer.PASSED if reached else Answer.NOT_REACHED


def ends_short(run: Run, c: Contribution, verdict: Verdict) -> bool:
    """A slot holder's first verdict on a window that ends short of θ_H (§6): its check never
    compared Δ with θ_H, so its ACCEPT says nothing of the Δ. A DELTA_MISMATCH it sends anyway is
    a claim like any other, and it is held to it."""
    slot = c.slots.get(verdict.verifier) if c.windows else None
    return slot is not None and not run_config(run).window_reaches_end(c.windows[slot])


def _answer(run: Run, c: Contribution, verifier: str, question: Question) -> Answer:
    """What a verifier's vote in a dispute says on a question. Every assigned verifier is a voter
    on both questions: a slot holder speaks on the segments of the disputed windows, and on the Δ
    when its window ended short of θ_H, through its revote only (its own verdict is about its own
    window), and not at all where it owes none (it holds a disputed window, short of θ_H)."""
    revote = c.revotes.get(verifier)
    if revote is not None:
        return _answer_of(revote, question, delta_first=True)
    verdict = c.verdicts.get(verifier)
    if verdict is None:
        return Answer.SILENT
    if not c.windows:
        return _answer_of(verdict, question, delta_first=False)
    slot = c.slots.get(verifier)
    if slot is None:  # a panel member
        return _answer_of(verdict, question, delta_first=True)
    undisputed = c.windows[slot] not in disputed_windows(c)
    if question is Question.SEGMENTS and undisputed:
        return Answer.SILENT  # not about the disputed windows; its revote would be
    if question is Question.DELTA and ends_short(run, c, verdict) and verdict.reason != Reason.DELTA_MISMATCH:
        return Answer.SILENT if undisputed else Answer.NOT_REACHED  # its revote would answer it
    return _answer_of(verdict, question, delta_first=False)


def _questions(c: Contribution) -> list[Question]:
    """The questions a dispute asks: those some reject raised, in a fixed order."""
    votes = [*c.verdicts.values(), *c.revotes.values()]
    raised = {_question_of(x.reason) for x in votes if x.reason != Reason.ACCEPT}
    return [q for q in Question if q in raised]


def _decide(run: Run, c: Contribution, question: Question) -> Outcome:
    """One question's stake-weighted majority out of every assigned verifier's stake: REJECTED
    (it failed), ACCEPTED (it passed) or UNVERIFIED (no majority either way). A voter whose check
    stopped before the question is not counted; a silent one is (silence never makes a majority)."""
    answers = [(stake_of(run, v), _answer(run, c, v, question)) for v in c.verifier_rounds]
    panel = sum(w for w, a in answers if a is not Answer.NOT_REACHED)
    if 2 * sum(w for w, a in answers if a is Answer.FAILED) > panel:
        return Outcome.REJECTED
    if 2 * sum(w for w, a in answers if a is Answer.PASSED) > panel:
        return Outcome.ACCEPTED
    return Outcome.UNVERIFIED


def _confirmed(run: Run, c: Contribution) -> Outcome:
    """A dispute's outcome: each question it asks decided by the stake majority of every bonded
    verifier assigned to it (after `_open_dispute`, every active verifier); rejected if any
    question failed, accepted if every one passed, otherwise unverified."""
    decisions = [_decide(run, c, q) for q in _questions(c)]
    if Outcome.REJECTED in decisions:
        return Outcome.REJECTED
    if decisions and all(d == Outcome.ACCEPTED for d in decisions):
        return Outcome.ACCEPTED
    return Outcome.UNVERIFIED


def _slash(state: ChainState, run: Run, address: str, bps: int) -> int:
    participant = run.participants.get(address)
    if participant is None:
        return 0
    amount = participant.stake * bps // BPS_DENOMINATOR
    participant.stake -= amount
    get_or_create_account(state, MODULE_ACCOUNT).balance += amount
    return amount


def _contradicts(run: Run, c: Contribution, verdict: Verdict, delta_first: bool) -> bool:
    """Does this verdict say the opposite of what was decided? A reject of an accepted
    contribution; an accept of a slashed one — except that, for a contribution rejected by a
    dispute, a verdict contradicts only an answer it gave on a question the dispute decided the
    other way (an honest accept of a window nobody disputed is no answer on the disputed ones)."""
    outcome = c.outcome
    if outcome == Outcome.ACCEPTED:
        return verdict.reason != Reason.ACCEPT
    if outcome not in SLASHED_OUTCOMES:
        return False
    if outcome != Outcome.REJECTED or c.review != Review.CONFIRM:
        return verdict.reason == Reason.ACCEPT
    slot = c.slots.get(verdict.verifier)
    own_window_only = not delta_first and slot is not None and c.windows[slot] not in disputed_windows(c)
    short = not delta_first and ends_short(run, c, verdict) and verdict.reason != Reason.DELTA_MISMATCH
    for q in _questions(c):
        if (q is Question.SEGMENTS and own_window_only) or (q is Question.DELTA and short):
            continue
        said, decided = _answer_of(verdict, q, delta_first), _decide(run, c, q)
        if (said, decided) in ((Answer.PASSED, Outcome.REJECTED), (Answer.FAILED, Outcome.ACCEPTED)):
            return True
    return False


def _votes(c: Contribution) -> list[tuple[Verdict, bool]]:
    """Every verdict on a contribution with how its check ran (Δ first: a panel member's and a
    revote), in sorted verifier order: first verdicts, then revotes."""
    panel = bool(c.windows)
    first = [(c.verdicts[v], panel and v not in c.slots) for v in sorted(c.verdicts)]
    return first + [(c.revotes[v], True) for v in sorted(c.revotes)]


def _is_fraud(run: Run, c: Contribution) -> bool:
    """Rejected by a confirmed dispute although a verifier accepted what it found failed: evidence
    of collusion."""
    return (
        c.outcome == Outcome.REJECTED
        and c.review == Review.CONFIRM
        and any(v.reason == Reason.ACCEPT and _contradicts(run, c, v, d) for v, d in _votes(c))
    )


def _finalize_step(state: ChainState, run: Run, step: OuterStep, height: int) -> list[Event]:
    """Slash, record the accepted set and each host's optimizer hash, release leavers not needed
    for the result; rewards wait for the result (only Δs that reach the model are paid)."""
    stake = run_config(run).stake
    events: list[Event] = []
    for host in sorted(step.contributions):
        c = step.contributions[host]
        assert c.outcome is not None
        fraud = _is_fraud(run, c)
        if c.outcome in SLASHED_OUTCOMES:
            c.slashed = _slash(
                state, run, host, stake.fraud_host_slash_bps if fraud else stake.host_slash_bps
            )
            touched(c)
        for verdict, delta_first in _votes(c):
            if _contradicts(run, c, verdict, delta_first):
                bps = stake.fraud_verifier_slash_bps if fraud else stake.verifier_slash_bps
                who = verdict.verifier
                amount = _slash(state, run, who, bps)
                events.append(_event("slash_verifier", run_id=run.id, verifier=who, host=host, amount=amount))
    step.accepted = sorted(h for h, c in step.contributions.items() if c.outcome == Outcome.ACCEPTED)
    for host in sorted(step.contributions):
        c = step.contributions[host]
        if c.outcome == Outcome.ACCEPTED:
            _keep_carried(run, host, c)
        else:  # an unverified state never chains on: the host restarts from a fresh optimizer
            _drop_carried(run, host)
        events.append(
            _event(
                "contribution_finalized",
                run_id=run.id,
                outer_step=step.index,
                host=host,
                outcome=c.outcome,
                slashed=c.slashed,
            )
        )
    events += _release_leavers(state, run, [*step.accepted, *_pending_elsewhere(run, step)])
    step.finalized_height = height
    events.append(
        _event("outer_step_finalized", run_id=run.id, outer_step=step.index, accepted=",".join(step.accepted))
    )
    if overlapped(run):
        step.phase = Phase.AWAITING_RESULT
        if not _predecessor_done(run, step):  # result rounds start when the previous step closes
            return events
        return events + _start_results(state, run, step, height)
    if not step.accepted:  # nothing to aggregate: the global model stays, the next step opens at once
        step.phase = Phase.DONE
        step.done_height = height
        return events + _open_next_step(run, step, height + 1)
    step.phase = Phase.AWAITING_RESULT
    step.result_deadline = height + run_config(run).phases.result_blocks
    return events


def _after_initial_rounds(state: ChainState, run: Run, step: OuterStep, height: int) -> list[Event]:
    """Every contribution is decided, provisionally accepted or disputed: audit, confirm, or finish."""
    config = run_config(run)
    open_ = [
        step.contributions[h] for h in sorted(step.contributions) if step.contributions[h].outcome is None
    ]
    provisional = [c for c in open_ if c.review == Review.PROVISIONAL]
    events: list[Event] = []
    if provisional and config.audit_bps > 0:
        step.round += 1
        step.phase = Phase.AUDIT
        step.audit_height = height + CHALLENGE_DELAY  # seeded by blocks no verdict could see
        step.round_deadline = step.audit_height + config.phases.audit_blocks
        for c in open_:
            if c.review == Review.CONFIRM:
                events.append(_open_dispute(run, step, c, bonding_delay(state)))
        return [*events, _event("phase", run_id=run.id, outer_step=step.index, phase=step.phase)]
    for c in provisional:
        c.outcome = Outcome.ACCEPTED
        touched(c)
    return events + _confirm_or_finalize(
        state, run, step, [c for c in open_ if c.review == Review.CONFIRM], height
    )


def _confirm_or_finalize(
    state: ChainState, run: Run, step: OuterStep, disputes: list[Contribution], height: int
) -> list[Event]:
    if not disputes:
        return _finalize_step(state, run, step, height)
    step.round += 1
    step.phase = Phase.CONFIRM
    step.round_deadline = height + run_config(run).phases.confirm_blocks
    events = [_open_dispute(run, step, c, bonding_delay(state)) for c in disputes]
    return [*events, _event("phase", run_id=run.id, outer_step=step.index, phase=step.phase)]


def _end_round(state: ChainState, run: Run, step: OuterStep, height: int) -> list[Event]:
    """Close an initial verdict round: decide, hold for review, or escalate the missing verdicts."""
    config = run_config(run)
    final_round = step.round >= config.phases.max_escalations
    undecided = []
    for host in sorted(step.contributions):
        c = step.contributions[host]
        if c.outcome is None and c.review is None:
            review = _initial_review(c, final_round)
            if isinstance(review, Review):
                c.review = review
            else:
                c.outcome = review
            touched(c)
            if review is None:
                undecided.append(c)
    if not undecided:
        return _after_initial_rounds(state, run, step, height)

    step.round += 1
    step.round_deadline = height + config.phases.escalation_blocks
    step.phase = Phase.ESCALATION
    pools = DrawPools(run, draw_cutoff(step, bonding_delay(state)))
    events = []
    assert step.challenge_seed is not None
    for c in undecided:
        new = pools.for_contribution(c).draw(
            step.challenge_seed,
            c.host,
            config.verifiers_per_contribution,
            step.round,
            exclude=c.verifier_rounds,
        )
        _assign(c, new, step.round, 0)  # the initial slots' windows again
        events.append(
            _event(
                "escalation",
                run_id=run.id,
                outer_step=step.index,
                host=c.host,
                round=step.round,
                verifiers=",".join(new),
            )
        )
    return events


def _end_review(state: ChainState, run: Run, step: OuterStep, height: int) -> list[Event]:
    """Close the audit or the confirmation window: decide disputes; an audit that found a reject
    opens one (in the audit window only); every other audited contribution is accepted."""
    disputes: list[Contribution] = []
    for host in sorted(step.contributions):
        c = step.contributions[host]
        if c.outcome is not None:
            continue
        if c.review == Review.CONFIRM:
            c.outcome = _confirmed(run, c)
        elif _has_reject(c) and step.phase == Phase.AUDIT:
            disputes.append(c)
            continue
        else:
            c.outcome = Outcome.ACCEPTED
        touched(c)
    return _confirm_or_finalize(state, run, step, disputes, height)


# ---------------------------------------------------------------- end block: results


def _end_result_round(state: ChainState, run: Run, step: OuterStep, height: int) -> list[Event]:
    """No majority by the deadline: drop the Δs a majority of the accepted weight could not fetch
    (slashed for withholding), then ask again over the rest, or close the step with G_n."""
    config = run_config(run)
    total = result_weight(step, step.accepted)
    reporters_of: dict[str, list[str]] = {}  # host -> the reporters that could not fetch its Δ
    for reporter, hosts in step.unavailable.items():
        for host in hosts:
            reporters_of.setdefault(host, []).append(reporter)
    events: list[Event] = []
    for host in list(step.accepted):
        if 2 * result_weight(step, reporters_of.get(host, [])) > total:
            c = step.contributions[host]
            c.outcome = Outcome.WITHHELD
            amount = _slash(state, run, host, config.stake.host_slash_bps)
            c.slashed += amount
            touched(c)
            _drop_carried(run, host)
            step.accepted.remove(host)
            step.dropped = sorted([*step.dropped, host])
            events.append(_event("withheld", run_id=run.id, outer_step=step.index, host=host, amount=amount))
    if step.accepted and step.result_round + 1 < config.phases.result_rounds:
        step.result_round += 1
        step.result_votes = {}
        step.result_losses = {}
        step.unavailable = {}
        step.result_deadline = height + config.phases.result_blocks
        again = _event("result_round", run_id=run.id, outer_step=step.index, round=step.result_round)
        return [*events, again]
    # G_{n+1} = the latest global model (sequential runs: the step's base; overlapped runs: the
    # previous step's result, to which this step's Δs would have been applied)
    events.append(
        _event("result_failed", run_id=run.id, outer_step=step.index, model_hash=run.global_model_hash)
    )
    return events + _close_step(state, run, step, run.global_model_hash, height)


def end_block(state: ChainState, ctx: BlockContext) -> list[Event]:
    """Close verdict, audit and confirmation windows and result rounds that end at this height."""
    events: list[Event] = []
    h = ctx.height
    for run_id in sorted(state.runs):
        run = state.runs[run_id]
        for step in steps_in_flight(run):  # oldest first: its close may start the next one's results
            if run.status == RunStatus.ACTIVE and step.phase != Phase.DONE:
                if run_config(run).phases.early_close:
                    events += _close_early(run, step, h)
                events += _end_step_block(state, run, step, h)
    return events


def _shift_deadlines(step: OuterStep, by: int) -> None:
    """Move every deadline after the one that closed early `by` blocks earlier (the windows keep
    their lengths)."""
    step.reveal_deadline -= by
    step.verify_deadline -= by
    step.round_deadline -= by


def _waiting_for_commits(run: Run, step: OuterStep) -> bool:
    hosts = [a for a, p in run.participants.items() if p.role == Role.HOST and not p.leaving]
    return not step.contributions or any(a not in step.contributions for a in hosts)


def _waiting_for_reveals(step: OuterStep) -> bool:
    return any(c.outcome is None and c.reveal_height is None for c in step.contributions.values())


def _waiting_for_verdicts(step: OuterStep) -> bool:
    """Does a verifier of the current round still owe a verdict on an undecided contribution?"""
    if step.phase == Phase.AUDIT and step.audit_seed is None:
        return True  # the auditors are not drawn yet
    return any(
        (v not in c.verdicts and r == step.round) or owes_revote(c, v)
        for c in step.contributions.values()
        if c.outcome is None
        for v, r in c.verifier_rounds.items()
    )


def _close_early(run: Run, step: OuterStep, h: int) -> list[Event]:
    """`phases.early_close` (§2.3.1): a window whose every awaited message is in by the end of block
    h closes at h, and the later deadlines move up by as much. Only the last honest message can
    close a window early, so no participant can shorten one for the others; one that stays silent
    only leaves the window at its full length."""
    closed = None
    if step.phase == Phase.TRAIN and h < step.commit_deadline and not _waiting_for_commits(run, step):
        _shift_deadlines(step, step.commit_deadline - h)
        step.commit_deadline, closed = h, Phase.TRAIN
    elif step.phase == Phase.REVEAL and h < step.reveal_deadline and not _waiting_for_reveals(step):
        _shift_deadlines(step, step.reveal_deadline - h)
        step.reveal_deadline, closed = h, Phase.REVEAL
    elif (
        step.phase in (Phase.VERIFY, Phase.ESCALATION, Phase.AUDIT, Phase.CONFIRM)
        and h < step.round_deadline
        and not _waiting_for_verdicts(step)
        and not (h < reveal_closes(step, run_config(run).phases) and _waiting_for_reveals(step))
    ):
        if step.phase == Phase.VERIFY:
            step.verify_deadline = h
        step.round_deadline, closed = h, step.phase
    if closed is None:
        return []
    return [_event("closed_early", run_id=run.id, outer_step=step.index, phase=closed, height=h)]


def _end_step_block(state: ChainState, run: Run, step: OuterStep, h: int) -> list[Event]:
    """The end-block transitions of one step in flight (§2.6)."""
    events: list[Event] = []
    if step.phase in (Phase.VERIFY, Phase.ESCALATION) and h >= step.round_deadline:
        events += _end_round(state, run, step, h)
    elif step.phase in (Phase.AUDIT, Phase.CONFIRM) and h >= step.round_deadline:
        events += _end_review(state, run, step, h)
    if step.phase == Phase.AWAITING_RESULT and step.result_deadline is not None and h >= step.result_deadline:
        events += _end_result_round(state, run, step, h)
    return events
