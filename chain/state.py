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
import enum
import hashlib
import json
import operator
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

from chain.params import MODULE_ACCOUNT, REWARD_POOL_ACCOUNT, ModuleParams, Outcome, Phase, Review, RunStatus
from protocol.config import Codec
from protocol.messages import Role

OMIT_AT_DEFAULT = "omit_at_default"
"""Field metadata: the field is left out of its node's canonical JSON while it holds its default,
so a field added to the state later leaves every state that never sets it (and its app hash and
rows) bit for bit as before. Only for fields of non-flat nodes (`layout`)."""


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
    role: Role
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
    codec: Codec
    tokens: int
    env: dict[str, Any]
    equivocation_tx: str | None = None  # a second, different commit: slashable evidence
    sampled_segments: list[int] = field(default_factory=list)
    verifiers: list[str] = field(default_factory=list)  # all assigned, round by round
    verifier_rounds: dict[str, int] = field(default_factory=dict)
    reveal_height: int | None = None
    openings: list[Opening] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    review: Review | None = None  # the stage after the initial rounds (kept once decided)
    audited: bool = False  # drawn by the audit lottery (with at least one auditor)
    outcome: Outcome | None = None
    reward: int = 0  # paid when the step's result is adopted (never for a Δ that was dropped)
    slashed: int = 0
    parent_delta_hash: str | None = None  # eager runs: the own previous Δ the start was built on (§2.2.1)
    final_ef_hash: str | None = field(default=None, metadata={OMIT_AT_DEFAULT: True})
    """Codec sparse: the error-feedback accumulator the host carries on (§4.1); None otherwise."""
    windows: list[int] = field(default_factory=list, metadata={OMIT_AT_DEFAULT: True})
    """Sampling windows (§2.3): the start segment of each checker slot's window (v initial slots,
    which escalations reuse, then a audit slots), drawn at the challenge; empty otherwise."""
    slots: dict[str, int] = field(default_factory=dict, metadata={OMIT_AT_DEFAULT: True})
    """Sampling windows: verifier -> its slot in `windows`. A dispute panel member has none: it
    checks the disputed windows (§2.5.3)."""
    revotes: dict[str, Verdict] = field(default_factory=dict, metadata={OMIT_AT_DEFAULT: True})
    """Sampling windows, in a dispute: a slot holder's vote on the disputed windows, its own
    window nobody disputed (`chain.module.owes_revote`, §2.5.3)."""


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
    phase: Phase = Phase.PENDING
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
    result_losses: dict[str, int] = field(default_factory=dict)  # host -> its vote's val_loss_ppm (> 0)
    unavailable: dict[str, list[str]] = field(default_factory=dict)  # reporter -> hosts (this round)
    result_hash: str | None = None
    done_height: int | None = None
    adopted: bool = False  # closed with a majority result: its accepted Δs are in `result_hash`


@dataclass
class Run:
    id: int
    creator: str
    config: dict[str, Any]  # RunConfig.model_dump(mode="json")
    config_hash: str
    created_height: int
    global_model_hash: str
    status: RunStatus = RunStatus.ACTIVE
    current_step: int = 0
    participants: dict[str, Participant] = field(default_factory=dict)
    steps: dict[int, OuterStep] = field(default_factory=dict)
    prev_optimizer: dict[str, str] = field(default_factory=dict)  # host -> last accepted optimizer hash
    prev_ef: dict[str, str] = field(default_factory=dict, metadata={OMIT_AT_DEFAULT: True})
    """Sparse runs: host -> the e_next hash of its last accepted contribution (§4.1)."""


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
    return hint in _SCALARS or _is_str_enum(hint)


def _is_str_enum(hint: Any) -> bool:
    """Phases, outcomes, roles: str-valued enums, so their JSON form is their value as is."""
    return isinstance(hint, type) and issubclass(hint, enum.StrEnum)


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
        return _omit_defaults(type(obj), {name: _to_jsonable(getattr(obj, name)) for name in names})
    return obj


_OMITTED: dict[type, tuple[tuple[str, Callable[[], Any]], ...]] = {}


def omitted_fields(cls: type) -> tuple[tuple[str, Callable[[], Any]], ...]:
    """(name, default maker) of the class's `OMIT_AT_DEFAULT` fields, cached."""
    found = _OMITTED.get(cls)
    if found is None:
        found = _OMITTED[cls] = tuple(
            (f.name, _default_maker(f)) for f in dataclasses.fields(cls) if f.metadata.get(OMIT_AT_DEFAULT)
        )
    return found


def _default_maker(f: dataclasses.Field[Any]) -> Callable[[], Any]:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    return lambda: f.default


def _omit_defaults(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """Drop the `OMIT_AT_DEFAULT` fields that hold their default (their JSON form compared)."""
    for name, make in omitted_fields(cls):
        if name in data and data[name] == _to_jsonable(make()):
            del data[name]
    return data


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
    decode = _decoder(tp)
    return data if decode is None else decode(data)


_DECODERS: dict[Any, Callable[[Any], Any] | None] = {}


def _decoder(tp: Any) -> Callable[[Any], Any] | None:
    """The function rebuilding a `tp` from its JSON form, or None where the JSON form already is
    the value (scalars, `Any`, lists and str-keyed dicts of those). Built once per type from its
    hints, so a restart pays no type inspection per object."""
    if tp in _DECODERS:
        return _DECODERS[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    decode: Callable[[Any], Any] | None = None
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in args if a is not type(None)]
        some = _decoder(inner)
        if some is not None:
            decode = lambda data: None if data is None else some(data)  # noqa: E731
    elif _is_str_enum(tp):
        decode = tp
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a hint is a class, never an instance
        fields = tuple((name, _decoder(hint)) for name, hint in _field_hints(tp))
        optional = {name for name, _ in omitted_fields(tp)}
        decode = lambda data: tp(  # noqa: E731
            **{
                name: data[name] if f is None else f(data[name])
                for name, f in fields
                if name in data or name not in optional  # an omitted field takes its default
            }
        )
    elif origin is dict:
        key_t, value = args[0], _decoder(args[1])
        if key_t is not str or value is not None:
            decode = lambda data: {  # noqa: E731
                key_t(k): v if value is None else value(v) for k, v in data.items()
            }
    elif origin is list:
        item = _decoder(args[0])
        if item is not None:
            decode = lambda data: [item(v) for v in data]  # noqa: E731
    _DECODERS[tp] = decode
    return decode


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
    native: tuple[bool, ...]  # per inline field: its value is already its JSON form (`_is_native`)
    map_prefixes: tuple[tuple[str, str], ...]  # (field, '"field":'), the child maps sorted by name


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


def _is_native(hint: Any) -> bool:
    """Is a value of this type its own JSON form (what `_to_jsonable` would return, equal and
    encoded alike)? Scalars, and lists and str-keyed dicts of them; not `Any`, not dataclasses,
    not int-keyed dicts (their keys become strings first, which changes their sorted order)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return all(_is_native(arg) for arg in args)
    if origin is list:
        return _is_native(args[0])
    if origin is dict:
        return args[0] is str and _is_native(args[1])
    return hint in _SCALARS


def layout(cls: type) -> Layout:
    cached = _LAYOUTS.get(cls)
    if cached is None:
        inline: list[str] = []
        native: list[bool] = []
        children: list[tuple[str, type, type]] = []
        for name, hint in _field_hints(cls):
            child = _child_map(hint)
            if child is None:
                inline.append(name)
                native.append(_is_native(hint))
            else:
                children.append((name, *child))
        getter = operator.attrgetter(*inline)
        values = getter if len(inline) > 1 else (lambda obj: (getter(obj),))
        # Cached by values only when equal values always print the same: no float fields (1 == 1.0).
        flat = _is_flat(cls) and not any(_has_float(hint) for _, hint in _field_hints(cls))
        assert not (_is_flat(cls) and omitted_fields(cls)), f"{cls.__name__}: OMIT_AT_DEFAULT in a flat node"
        prefixes = tuple((name, _quote(name) + ":") for name in sorted(c[0] for c in children))
        cached = _LAYOUTS[cls] = Layout(tuple(inline), tuple(children), flat, values, tuple(native), prefixes)
    return cached


_DIGEST = "_digest_cache"
"""Instance attributes outside the dataclass fields, never serialized, compared or hashed: a node's
digest (whole subtree; kept only where nothing can change it unseen), its own text (`_OWN`: as the
last hash pass computed it; reused only for touch-tracked nodes), and its child maps' parts of the
digest (`_MAPS`: a `MapCache` per map)."""
_OWN = "_own_cache"
_MAPS = "_maps_cache"
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
    tracked = cached and isinstance(obj, TOUCH_TRACKED)
    entry = obj.__dict__.get(_OWN) if tracked else None
    if entry is not None:
        return entry[1]
    if cached:  # fields that already are their JSON form skip the conversion (most of the work)
        own = zip(lay.inline, lay.values(obj), lay.native, strict=True)
        data = {name: value if native else _to_jsonable(value) for name, value, native in own}
    else:
        data = {name: _to_jsonable(getattr(obj, name)) for name in lay.inline}
    text = _canon(_omit_defaults(type(obj), data))
    if tracked:
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


def _digest(cls: type, own: str, children: str) -> str:
    return hashlib.sha256(_tag(cls) + own.encode() + b"\x00" + children.encode()).hexdigest()


@dataclass
class MapCache:
    """One child map's part of its parent's digest, canon({key: D(child)}), with what it was
    computed from: the keys in dict order and, per key, a stamp (a flat child's tuple of values,
    another node's digest). A hash pass compares the stamps (one C-level pass over the map) and
    re-hashes only the entries whose stamp changed; an unchanged map costs no hashing at all.
    `entries[key]` = (stamp, digest, own text of a flat child (its row) or None, `"key":"digest"`)."""

    keys: list[Any]
    stamps: list[Any]
    entries: dict[Any, tuple[Any, str, str | None, str]]
    order: list[Any]  # the keys sorted as canon sorts them (by their string form)
    text: str


def map_cache(obj: Any, name: str) -> MapCache:
    """The map's cache as the last hash pass left it (computed now if there was none): the row
    tracker reads the digests and the flat children's texts that the app hash computed."""
    cache = obj.__dict__.get(_MAPS, {}).get(name)
    if cache is None:
        (key_t, child_cls) = next((k, c) for n, k, c in layout(type(obj)).children if n == name)
        cache = _map_cache(obj, name, key_t, child_cls)
    return cache


def _map_cache(obj: Any, name: str, key_t: type, child_cls: type) -> MapCache:
    children: dict[Any, Any] = getattr(obj, name)
    lay = layout(child_cls)
    keys = list(children)
    if lay.flat:
        stamps = list(map(lay.values, children.values()))
    else:
        stamps = [c.__dict__.get(_DIGEST) or node_digest(c) for c in children.values()]
    caches = obj.__dict__.setdefault(_MAPS, {})
    cache: MapCache | None = caches.get(name)
    if cache is not None and cache.stamps == stamps and cache.keys == keys:
        return cache
    old = cache.entries if cache is not None else {}
    entries = {}
    changed = []
    for key, stamp, child in zip(keys, stamps, children.values(), strict=True):
        entry = old.get(key)
        if entry is None or entry[0] != stamp:
            text = None
            if lay.flat:  # its own text: the one it carries for these values (a row read back), or new
                known = child.__dict__.pop(_OWN, None)
                if known is not None and known[0] == stamp:
                    text = known[1]
                else:
                    text = _ENCODER.encode(dict(zip(lay.inline, stamp, strict=True)))
                digest = _digest(child_cls, text, "{}")
            else:
                digest = stamp
                changed.append(key)
            entry = (stamp, digest, text, f'{_quote(str(key))}:"{digest}"')
        entries[key] = entry
    if cache is not None and cache.keys == keys:
        order = cache.order
    else:
        order = sorted(keys) if key_t is str else sorted(keys, key=str)
    if cache is not None and any(sealed(children[key]) for key in changed):
        _forget_older_seals(children, changed)
    text = "{" + ",".join([entries[key][3] for key in order]) + "}"
    cache = caches[name] = MapCache(keys, stamps, entries, order, text)
    return cache


def _forget_older_seals(children: dict[Any, Any], fresh: list[Any]) -> None:
    """A child was sealed by this pass: drop the cached texts of the siblings sealed before it.
    The row tracker has written those (and forgets them itself); without one, a run keeps the
    texts of its latest finished step only. History costs no memory."""
    for key, child in children.items():
        if key not in fresh and sealed(child) and (_MAPS in child.__dict__ or _OWN in child.__dict__):
            forget_texts(child)


def node_digest(obj: Any, cached: bool = True) -> str:
    """D(node) = SHA-256(tag(kind) ‖ canon(own fields) ‖ 0x00 ‖ canon({map: {key: D(child)}})), hex.

    Kept where nothing can change it unseen: a flat node's with its values, a touch-tracked node's
    until `touched`, a sealed step's for good. The other nodes (the root, a run, a live step) are
    re-hashed from their own text and their maps' cached parts (`MapCache`). `cached=False`
    recomputes everything from the content (the definition, written out; tests compare)."""
    lay = layout(type(obj))
    omitted = {name for name, _ in omitted_fields(type(obj))}  # a map omitted at its default: when empty
    if not cached:
        own = own_text(obj, cached=False)
        children = {
            name: {str(key): node_digest(child, cached=False) for key, child in getattr(obj, name).items()}
            for name, _, _ in lay.children
            if name not in omitted or getattr(obj, name)
        }
        return _digest(type(obj), own, _canon(children))
    if lay.flat:
        entry = _flat(obj, True, lay)
        if entry[2] is None:
            entry[2] = _digest(type(obj), entry[1], "{}")
        return entry[2]
    digest = obj.__dict__.get(_DIGEST)
    if digest is not None:
        return digest
    own = own_text(obj)
    obj.__dict__[_OWN] = (None, own)  # the text this pass hashed: the row tracker writes it
    maps = {
        name: _map_cache(obj, name, key_t, cls).text
        for name, key_t, cls in lay.children
        if name not in omitted or getattr(obj, name)
    }
    parts = [prefix + maps[name] for name, prefix in lay.map_prefixes if name in maps]
    children_text = "{" + ",".join(parts) + "}"
    digest = _digest(type(obj), own, children_text)
    if isinstance(obj, TOUCH_TRACKED) or sealed(obj):
        obj.__dict__[_DIGEST] = digest
    return digest


def adopt_text(obj: Any, text: str) -> None:
    """Take `text` (its row, read back) as the node's own text instead of serializing it again.
    Only for a state the caller then checks against a known app hash: a matching root digest
    proves every adopted text is the one that was hashed."""
    lay = layout(type(obj))
    obj.__dict__[_OWN] = [lay.values(obj), text, None] if lay.flat else (None, text)


def hashed_text(obj: Any) -> str | None:
    """A node's own text as the last hash pass computed it (its row); None if never hashed."""
    entry = obj.__dict__.get(_OWN)
    return entry[1] if entry is not None else None


def forget_texts(obj: Any) -> None:
    """Drop the cached texts and map parts of a sealed node and below: it is never visited again
    (its digest, and its children's, stay)."""
    for node in (obj, *_descendants(obj)):
        node.__dict__.pop(_OWN, None)
        node.__dict__.pop(_MAPS, None)


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
