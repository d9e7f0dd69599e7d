"""The module's whole state as plain typed data, its canonical JSON form and its app hash.

Plain dataclasses (no methods that write) keep the state readable as a specification and make
the canonical serialization mechanical: `state_to_json` / `state_from_json` round-trip exactly.

The state is a tree of nodes (specs/protocol.md §2.8): the root, and every value of a
`dict[K, <dataclass>]` field (accounts, runs, participants, outer steps, contributions, verdicts,
and any such map added later). A node's digest hashes its own fields' canonical JSON and its
children's digests; the root's is the app hash, and each node's own text is also its persisted
row (chain/persist.py), so one serialization per changed node serves both. The cost per block
follows what changed, not the run's history: a flat node (only scalar fields) keeps its text and
digest with the tuple of its values, a contribution until the module writes to it (`touched`),
and a finished (DONE) outer step for good, since nothing writes to a finished step ("sealed").
Like the module, this is not thread-safe: callers serialize access (the node: one event loop;
InProcessChain: a lock).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import re
import types
import typing
from collections.abc import Callable
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
    replay_class: str = ""  # a verifier's declared replay class (specs §6.1): what bitwise draws prefer


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


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
"""One encoder for every canonical text: `json.dumps` with options builds a new one per call."""


def _canon(obj: Any) -> str:
    """Sorted keys, no spaces, ASCII: equal values give equal strings."""
    return _ENCODER.encode(obj)


def state_to_dict(state: ChainState) -> dict[str, Any]:
    return _to_jsonable(state)


def state_to_json(state: ChainState) -> str:
    """Canonical form: sorted keys, no spaces, ASCII. Equal states give equal strings."""
    return _canon(state_to_dict(state))


def state_from_json(text: str | bytes) -> ChainState:
    return _from_jsonable(ChainState, json.loads(text))


# ---------------------------------------------------------------- the tree: nodes, app hash

_KINDS: dict[type, str] = {}


def kind(cls: type) -> str:
    """A node's kind in its domain tag: `app` for the root, else the class name in kebab case
    (`OuterStep` -> `outer-step`), so a dataclass added to the state gets a tag of its own."""
    name = _KINDS.get(cls)
    if name is None:
        kebab = re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()
        name = _KINDS[cls] = "app" if cls is ChainState else kebab
    return name


@dataclass(frozen=True)
class Layout:
    """How one dataclass sits in the tree: its own (inline) fields, and its child maps
    (`dict[K, <dataclass>]` fields), whose values are nodes of their own."""

    inline: tuple[str, ...]
    children: tuple[tuple[str, type, type], ...]  # (field, key type, value dataclass)
    flat: bool  # every field a scalar: its own text is cached by a tuple of the values
    values: Callable[[Any], Any]  # the inline fields' values, as a tuple (operator.attrgetter)


_LAYOUTS: dict[type, Layout] = {}


def _child_map(hint: Any) -> tuple[type, type] | None:
    """(key type, dataclass) when `hint` is exactly `dict[K, <dataclass>]`."""
    if typing.get_origin(hint) is not dict:
        return None
    key_t, val_t = typing.get_args(hint)
    if isinstance(val_t, type) and dataclasses.is_dataclass(val_t):
        return key_t, val_t
    return None


def _has_float(hint: Any) -> bool:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return any(_has_float(arg) for arg in typing.get_args(hint))
    return hint is float


def layout(cls: type) -> Layout:
    cached = _LAYOUTS.get(cls)
    if cached is None:
        inline: list[str] = []
        children: list[tuple[str, type, type]] = []
        for name, hint in _field_hints(cls):
            child = _child_map(hint)
            if child is None:
                inline.append(name)
            else:
                children.append((name, *child))
        getter = operator.attrgetter(*inline)
        values = getter if len(inline) > 1 else (lambda obj: (getter(obj),))
        # Cached by values only when equal values always print the same: no float fields (1 == 1.0).
        flat = _is_flat(cls) and not any(_has_float(hint) for _, hint in _field_hints(cls))
        cached = _LAYOUTS[cls] = Layout(tuple(inline), tuple(children), flat, values)
    return cached


_DIGEST = "_digest_cache"
"""Instance attributes outside the dataclass fields, never serialized, compared or hashed: a node's
digest (whole subtree), and its own text (`_OWN`: (fingerprint or None, canonical JSON))."""
_OWN = "_own_cache"
TOUCH_TRACKED: tuple[type, ...] = (Contribution,)
"""Classes the module calls `touched` on after every write: their texts and digests are cached."""


def touched(obj: Contribution | OuterStep) -> None:
    """Drop a node's cached digest and text; the module calls it right after every write to a
    contribution (a DONE outer step is sealed: nothing writes to it)."""
    obj.__dict__.pop(_DIGEST, None)
    obj.__dict__.pop(_OWN, None)


def sealed(obj: Any) -> bool:
    """A finished outer step: never written again, so its digest is kept for good."""
    return isinstance(obj, OuterStep) and obj.phase == Phase.DONE


def own_text(obj: Any, cached: bool = True) -> str:
    """canon(the node's own fields): its persisted row, and the first part of its digest's input.
    Cached where it is safe: a flat node's with the tuple of its values (so no `touched` is needed:
    a changed value is seen), a touch-tracked node's until `touched`; other nodes are recomputed."""
    lay = layout(type(obj))
    if lay.flat:
        return _flat(obj, cached)[1]
    entry = obj.__dict__.get(_OWN) if cached else None
    if entry is not None:
        return entry[1]
    text = _canon({name: _to_jsonable(getattr(obj, name)) for name in lay.inline})
    if cached and isinstance(obj, TOUCH_TRACKED):
        obj.__dict__[_OWN] = (None, text)
    return text


def _flat(obj: Any, cached: bool, lay: Layout | None = None) -> list[Any]:
    """[values, own text, digest or None] of a flat node, refreshed when a value changed."""
    lay = lay or layout(type(obj))
    values = lay.values(obj)
    entry = obj.__dict__.get(_OWN) if cached else None
    if entry is None or entry[0] != values:
        entry = [values, _ENCODER.encode(dict(zip(lay.inline, values, strict=True))), None]
        if cached:
            obj.__dict__[_OWN] = entry
    return entry


def flat_text(obj: Any, lay: Layout) -> str:
    """A flat node's own text, from its cache when its values did not change."""
    return _flat(obj, True, lay)[1]


def flat_digest(obj: Any, lay: Layout, cached: bool = True) -> str:
    entry = _flat(obj, cached, lay)
    if entry[2] is None:
        entry[2] = _digest(type(obj), entry[1], "{}")
    return entry[2]


def _digest(cls: type, own: str, children: str) -> str:
    return hashlib.sha256(_tag(cls) + own.encode() + b"\x00" + children.encode()).hexdigest()


def node_digest(obj: Any, cached: bool = True) -> str:
    """D(node) = SHA-256(tag(kind) ‖ canon(own fields) ‖ 0x00 ‖ canon({map: {key: D(child)}})), hex.

    Kept where nothing can change it unseen: a flat node's with its values, a touch-tracked node's
    until `touched`, a sealed step's for good (its subtree's cached texts are then dropped: it is
    never visited again, so history costs no memory here)."""
    lay = layout(type(obj))
    if lay.flat:
        return flat_digest(obj, lay, cached)
    digest = obj.__dict__.get(_DIGEST) if cached else None
    if digest is not None:
        return digest
    own = own_text(obj, cached)
    children: dict[str, dict[str, str]] = {}
    for name, _, child_cls in lay.children:
        child_lay = layout(child_cls)
        items = getattr(obj, name).items()
        if child_lay.flat:  # the many small nodes (accounts, participants, verdicts): no recursion
            children[name] = {str(key): flat_digest(child, child_lay, cached) for key, child in items}
        else:
            children[name] = {str(key): node_digest(child, cached) for key, child in items}
    digest = _digest(type(obj), own, _canon(children))
    if cached and (isinstance(obj, TOUCH_TRACKED) or sealed(obj)):
        obj.__dict__[_DIGEST] = digest
        if sealed(obj):
            forget_texts(obj)
    return digest


def forget_texts(obj: Any) -> None:
    """Drop the cached own texts below a sealed node: it is never visited again."""
    for child in _descendants(obj):
        child.__dict__.pop(_OWN, None)


def cached_digest(obj: Any) -> str | None:
    """The digest a node carries without recomputing anything (None: not cached or may be stale)."""
    return obj.__dict__.get(_DIGEST)


def _descendants(obj: Any) -> Any:
    for name, _, _ in layout(type(obj)).children:
        for child in getattr(obj, name).values():
            yield child
            yield from _descendants(child)


_TAGS: dict[type, bytes] = {}


def _tag(cls: type) -> bytes:
    tag = _TAGS.get(cls)
    if tag is None:
        tag = _TAGS[cls] = f"gonka-diloco/{kind(cls)}/v2".encode() + b"\x00"
    return tag


def app_hash(state: ChainState, cached: bool = True) -> bytes:
    """The root node's digest as 32 raw bytes: what each block header commits to (§2.8).
    `cached=False` recomputes every digest from the content (tests compare)."""
    return bytes.fromhex(node_digest(state, cached))
