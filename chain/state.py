"""The module's whole state as plain typed data, its canonical JSON form and its app hash.

Plain dataclasses (no methods that write) keep the state readable as a specification and make
the canonical serialization mechanical: `state_to_json` / `state_from_json` round-trip exactly,
the node persists with them, and `app_hash` is SHA-256 over the same bytes.
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
    outcome: str | None = None  # chain.params.Outcome
    reward: int = 0
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
    contributions: dict[str, Contribution] = field(default_factory=dict)
    finalized_height: int | None = None
    accepted: list[str] = field(default_factory=list)  # sorted
    result_deadline: int | None = None
    result_votes: dict[str, str] = field(default_factory=dict)  # host -> model hash
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


def _to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_jsonable(v) for v in obj]
    return obj


def _from_jsonable(tp: Any, data: Any) -> Any:
    """Rebuild typed data from its JSON form, driven by the dataclasses' type hints."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        if data is None:
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _from_jsonable(inner, data)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _from_jsonable(hints[f.name], data[f.name]) for f in dataclasses.fields(tp)})
    if origin is dict:
        key_t, val_t = typing.get_args(tp)
        return {key_t(k): _from_jsonable(val_t, v) for k, v in data.items()}
    if origin is list:
        (item_t,) = typing.get_args(tp)
        return [_from_jsonable(item_t, v) for v in data]
    return data


def state_to_dict(state: ChainState) -> dict[str, Any]:
    return _to_jsonable(state)


def state_to_json(state: ChainState) -> str:
    """Canonical form: sorted keys, no spaces, ASCII. Equal states give equal strings."""
    return json.dumps(state_to_dict(state), sort_keys=True, separators=(",", ":"))


def state_from_json(text: str | bytes) -> ChainState:
    return _from_jsonable(ChainState, json.loads(text))


def app_hash(state: ChainState) -> bytes:
    """SHA-256 of the canonical JSON: what each block header commits to."""
    return hashlib.sha256(state_to_json(state).encode()).digest()
