"""The module's whole state as plain typed data, its canonical JSON form and its app hash.

Plain dataclasses (no methods that write) keep the state readable as a specification and make
the canonical serialization mechanical: `state_to_json` / `state_from_json` round-trip exactly and
the node persists with them.

`app_hash` is a hash tree over that same canonical JSON (specs/protocol.md §2.5): contributions,
outer steps and runs are each hashed on their own and their parents carry the hex digests in
their place. Its value depends only on the state's content, so it is identical after a JSON
round-trip; the cost per block does not grow with the run's history because digests are cached
on the objects: a contribution's until the module writes to it (`touched`), and a finished (DONE)
outer step's for good, since nothing writes to a finished step ("sealed"). Like the module, this
is not thread-safe: callers serialize access (the node: one event loop; InProcessChain: a lock).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from chain.params import MODULE_ACCOUNT, REWARD_POOL_ACCOUNT, ModuleParams, Phase, RunStatus


@dataclass
class Account:
    """A bank account; the app's ante handler reads/bumps `sequence`, sets `pub_key`, takes fees."""

    address: str
    number: int
    sequence: int = 0
    pub_key: str | None = None  # hex of the compressed secp256k1 key, known after the first tx
    balance: int = 0


@dataclass
class Participant:
    """A bonded host or verifier of one run; `stake` left the account balance when it joined."""

    address: str
    role: str  # protocol.messages.Role value
    stake: int
    endpoint: str
    joined_height: int
    leaving: bool = False  # unbonds when the pending outer step finalizes


@dataclass
class Opening:
    """One revealed segment: the leaves at both ends (their pair proof was checked on chain)."""

    segment: int
    start_leaf: str
    end_leaf: str


@dataclass
class Verdict:
    verifier: str
    reason: int  # protocol.messages.Reason; 0 = accept
    evidence_hash: str
    detail: str
    height: int
    round: int


@dataclass
class Contribution:
    """One host's commitment in one outer step, and everything that happens to it."""

    host: str
    height: int
    tx_hash: str
    base_model_hash: str
    trajectory_root: str
    leaf_count: int
    delta_hash: str
    final_optimizer_hash: str
    codec: str
    tokens: int
    env: dict[str, Any]
    equivocation_tx: str | None = None  # a second, different commit: slashable evidence
    sampled_segments: list[int] = field(default_factory=list)
    verifiers: list[str] = field(default_factory=list)  # all assigned, round by round
    verifier_rounds: dict[str, int] = field(default_factory=dict)
    reveal_height: int | None = None
    openings: list[Opening] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    review: str | None = None  # chain.params.Review: the stage after the initial rounds (kept once decided)
    audited: bool = False  # drawn by the audit lottery (with at least one auditor)
    outcome: str | None = None  # chain.params.Outcome
    reward: int = 0  # paid when the step's result is adopted (never for a Δ that was dropped)
    slashed: int = 0


@dataclass
class OuterStep:
    """One outer step of a run: its deadlines (all in block heights), phase and results."""

    index: int
    open_height: int
    train_start: int
    commit_deadline: int
    reveal_deadline: int
    verify_deadline: int
    base_model_hash: str
    phase: str = Phase.PENDING
    round: int = 0
    round_deadline: int = 0  # the verdict deadline of the current round
    challenge_height: int | None = None
    challenge_seed: str | None = None  # hash of block commit_deadline + 1
    audit_height: int | None = None  # when the audit lottery is drawn (close of verdict rounds + 2)
    audit_seed: str | None = None
    contributions: dict[str, Contribution] = field(default_factory=dict)
    finalized_height: int | None = None
    accepted: list[str] = field(default_factory=list)  # sorted; the current result round's set
    dropped: list[str] = field(default_factory=list)  # sorted; Δs dropped as unavailable (withheld)
    result_round: int = 0
    result_deadline: int | None = None
    result_votes: dict[str, str] = field(default_factory=dict)  # host -> model hash (this round)
    unavailable: dict[str, list[str]] = field(default_factory=dict)  # reporter -> hosts (this round)
    result_hash: str | None = None
    done_height: int | None = None


@dataclass
class Run:
    id: int
    creator: str
    config: dict[str, Any]  # RunConfig.model_dump(mode="json")
    config_hash: str
    created_height: int
    global_model_hash: str
    status: str = RunStatus.ACTIVE
    current_step: int = 0
    participants: dict[str, Participant] = field(default_factory=dict)
    steps: dict[int, OuterStep] = field(default_factory=dict)
    prev_optimizer: dict[str, str] = field(default_factory=dict)  # host -> last accepted optimizer hash


@dataclass
class ChainState:
    chain_id: str
    authority: str
    params: dict[str, Any]  # ModuleParams.model_dump()
    accounts: dict[str, Account] = field(default_factory=dict)
    next_account_number: int = 0
    runs: dict[int, Run] = field(default_factory=dict)
    next_run_id: int = 1
    height: int = 0  # the last height begin_block ran for
    recent_block_hashes: list[str] = field(default_factory=list)  # the last SEED_BLOCKS, oldest first

    def module_params(self) -> ModuleParams:
        return ModuleParams.model_validate(self.params)


# ---------------------------------------------------------------- accounts


def get_or_create_account(state: ChainState, address: str) -> Account:
    """New accounts get the next account number, as in the Cosmos SDK's auth module."""
    account = state.accounts.get(address)
    if account is None:
        account = Account(address=address, number=state.next_account_number)
        state.accounts[address] = account
        state.next_account_number += 1
    return account


def balance_of(state: ChainState, address: str) -> int:
    account = state.accounts.get(address)
    return account.balance if account else 0


def transfer(state: ChainState, sender: str, recipient: str, amount: int) -> None:
    """Move `amount` ngonka; callers check funds first (raises ValueError as a last guard)."""
    if amount < 0 or balance_of(state, sender) < amount:
        raise ValueError(f"transfer of {amount} from {sender} not covered")
    source = get_or_create_account(state, sender)
    target = get_or_create_account(state, recipient)
    source.balance -= amount
    target.balance += amount


def total_supply(state: ChainState) -> int:
    """Balances plus bonded stake: conserved by every message and every block."""
    bonded = sum(p.stake for run in state.runs.values() for p in run.participants.values())
    return sum(a.balance for a in state.accounts.values()) + bonded


def module_accounts() -> tuple[str, str]:
    return MODULE_ACCOUNT, REWARD_POOL_ACCOUNT


# ---------------------------------------------------------------- canonical JSON

_SCALARS = (str, int, float, bool, type(None))
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...] | None:
    """The dataclass's field names, cached: `dataclasses.fields` per object is the slow part."""
    names = _FIELD_NAMES.get(cls)
    if names is None and dataclasses.is_dataclass(cls):
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


_FLAT: dict[type, bool] = {}


def _is_scalar_type(hint: Any) -> bool:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return all(_is_scalar_type(arg) for arg in typing.get_args(hint))
    return hint in _SCALARS


def _is_flat(cls: type) -> bool:
    """Are all the dataclass's fields scalars (Account, Participant, Verdict, Opening)? Those are
    the many small objects; converting them without recursion is most of the speed-up."""
    flat = _FLAT.get(cls)
    if flat is None:
        flat = _FLAT[cls] = all(_is_scalar_type(hint) for _, hint in _field_hints(cls))
    return flat


def _to_jsonable(obj: Any) -> Any:
    if isinstance(obj, _SCALARS):
        return obj
    if isinstance(obj, dict):
        return {str(k): _to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_jsonable(v) for v in obj]
    names = _field_names(type(obj))
    if names is not None:
        if _is_flat(type(obj)):
            return {name: getattr(obj, name) for name in names}
        return {name: _to_jsonable(getattr(obj, name)) for name in names}
    return obj


_FIELD_HINTS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _field_hints(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, type) per field, cached: `typing.get_type_hints` per object made restarts slow."""
    hints = _FIELD_HINTS.get(cls)
    if hints is None:
        resolved = typing.get_type_hints(cls)
        hints = _FIELD_HINTS[cls] = tuple((f.name, resolved[f.name]) for f in dataclasses.fields(cls))
    return hints


def _from_jsonable(tp: Any, data: Any) -> Any:
    """Rebuild typed data from its JSON form, driven by the dataclasses' type hints."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        if data is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _from_jsonable(inner, data)
    if dataclasses.is_dataclass(tp):
        return tp(**{name: _from_jsonable(hint, data[name]) for name, hint in _field_hints(tp)})
    if origin is dict:
        key_t, val_t = typing.get_args(tp)
        return {key_t(k): _from_jsonable(val_t, v) for k, v in data.items()}
    if origin is list:
        (item_t,) = typing.get_args(tp)
        return [_from_jsonable(item_t, v) for v in data]
    return data


def _canon(obj: Any) -> str:
    """Sorted keys, no spaces, ASCII: equal values give equal strings."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def state_to_dict(state: ChainState) -> dict[str, Any]:
    return _to_jsonable(state)


def state_to_json(state: ChainState) -> str:
    """Canonical form: sorted keys, no spaces, ASCII. Equal states give equal strings."""
    return _canon(state_to_dict(state))


def state_from_json(text: str | bytes) -> ChainState:
    return _from_jsonable(ChainState, json.loads(text))


# ---------------------------------------------------------------- app hash

APP_HASH_TAGS = {
    "contribution": b"gonka-diloco/contribution/v1\x00",
    "outer_step": b"gonka-diloco/outer-step/v1\x00",
    "run": b"gonka-diloco/run/v1\x00",
    "app": b"gonka-diloco/app/v1\x00",
}
"""Domain separation: a digest of one kind of node can never stand for another kind."""

_DIGEST = "_digest_cache"
"""Instance attribute outside the dataclass fields: never serialized, compared or hashed."""


def touched(obj: Contribution | OuterStep) -> None:
    """Drop a cached digest; the module calls it right after every write to a contribution."""
    obj.__dict__.pop(_DIGEST, None)


def _digest(kind: str, body: dict[str, Any]) -> str:
    return hashlib.sha256(APP_HASH_TAGS[kind] + _canon(body).encode()).hexdigest()


def _fields_except(obj: Any, skip: str) -> dict[str, Any]:
    names = _field_names(type(obj))
    assert names is not None
    return {name: _to_jsonable(getattr(obj, name)) for name in names if name != skip}


def contribution_digest(c: Contribution, cached: bool = True) -> str:
    """H(tag ‖ canonical JSON of the contribution)."""
    digest = c.__dict__.get(_DIGEST) if cached else None
    if digest is None:
        digest = _digest("contribution", _to_jsonable(c))
        if cached:
            c.__dict__[_DIGEST] = digest
    return digest


def step_digest(step: OuterStep, cached: bool = True) -> str:
    """H(tag ‖ canonical JSON of the step with each contribution replaced by its digest).

    A DONE step is sealed: the module never writes to it again, so its digest is kept for good.
    """
    digest = step.__dict__.get(_DIGEST) if cached else None
    if digest is None:
        body = _fields_except(step, "contributions")
        body["contributions"] = {h: contribution_digest(c, cached) for h, c in step.contributions.items()}
        digest = _digest("outer_step", body)
        if cached and step.phase == Phase.DONE:
            step.__dict__[_DIGEST] = digest
    return digest


def run_digest(run: Run, cached: bool = True) -> str:
    """H(tag ‖ canonical JSON of the run with each outer step replaced by its digest)."""
    body = _fields_except(run, "steps")
    body["steps"] = {str(i): step_digest(s, cached) for i, s in run.steps.items()}
    return _digest("run", body)


def app_hash(state: ChainState, cached: bool = True) -> bytes:
    """H(tag ‖ canonical JSON of the state with each run replaced by its digest): what each block
    header commits to. `cached=False` recomputes every digest from the content (tests compare)."""
    body = _fields_except(state, "runs")
    body["runs"] = {str(i): run_digest(r, cached) for i, r in state.runs.items()}
    return hashlib.sha256(APP_HASH_TAGS["app"] + _canon(body).encode()).digest()
