"""Row-wise persistence of `ChainState`: a block writes the rows that changed, not the whole state.

The state is cut into rows generically, by its dataclasses' type hints, so a field added to any
of them persists without being listed here:

- every value of a `dict[K, <dataclass>]` field is a row of its own (an account, a run, a
  participant, an outer step, a contribution, a verdict, and whatever such maps are added later),
  keyed by its path from the root, e.g. `["runs",1,"steps",3,"contributions","gonka1…"]`;
- a row's body is the canonical JSON of all its other fields (scalars, lists, maps of scalars,
  nested dataclasses), exactly as `chain.state.state_to_json` writes them; the root is `[]`.

`RowTracker` remembers what it last handed to the database and, per block, walks the state to
find what changed. The walk costs the live state, not the history, because it reuses the app
hash's digest caches (chain/state.py): an object whose cached digest equals the digest it had
when it was last written is skipped with its whole subtree. A finished (DONE) outer step keeps
its digest for good, so it is written once and never visited again; a contribution keeps its
digest until the module touches it. Rows of plain scalar objects (accounts, participants,
verdicts) are compared by their field values, other rows by their canonical JSON.

`build_state` is the inverse: rows in any order back to a `ChainState` whose app hash the store
then checks against the last block header.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any

from chain.state import (
    _DIGEST,
    ChainState,
    _canon,
    _field_hints,
    _from_jsonable,
    _is_flat,
    _to_jsonable,
)

Path = tuple[Any, ...]
"""Field names and map keys from the root (`ChainState`) to a row's object."""


def path_key(path: Path) -> str:
    """The row's primary key: the path as compact JSON (ints stay ints, so keys keep their type)."""
    return json.dumps(list(path), separators=(",", ":"))


def subtree_range(path: Path) -> tuple[str, str]:
    """[low, high) of the keys of every row strictly below `path` (for deleting a removed subtree):
    their JSON arrays share the prefix `[...,` and nothing else sorts between the bounds."""
    prefix = path_key(path)[:-1] + ","
    return prefix, prefix[:-1] + chr(ord(",") + 1)


@dataclass(frozen=True)
class Layout:
    """How one dataclass is cut: inline fields go in its row, child maps hold rows of their own."""

    inline: tuple[str, ...]
    children: tuple[tuple[str, type, type], ...]  # (field, key type, value dataclass)
    flat: bool  # every field a scalar: rows compared by a tuple of values, no serialization


_LAYOUTS: dict[type, Layout] = {}


def _child_map(hint: Any) -> tuple[type, type] | None:
    """(key type, dataclass) when `hint` is exactly `dict[K, <dataclass>]`."""
    if typing.get_origin(hint) is not dict:
        return None
    key_t, val_t = typing.get_args(hint)
    if isinstance(val_t, type) and dataclasses.is_dataclass(val_t):
        return key_t, val_t
    return None


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
        cached = _LAYOUTS[cls] = Layout(tuple(inline), tuple(children), _is_flat(cls))
    return cached


def row_body(obj: Any) -> dict[str, Any]:
    """The JSON-able body of `obj`'s row: its inline fields."""
    return {name: _to_jsonable(getattr(obj, name)) for name in layout(type(obj)).inline}


@dataclass
class RowDelta:
    """What one commit writes: rows to insert or replace, subtrees to delete (their root first)."""

    upserts: list[tuple[str, str]] = field(default_factory=list)  # (path key, body JSON)
    deletes: list[Path] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(len(k) + len(v) for k, v in self.upserts)


class _Shadow:
    """What was last written for one row and, per child map, for each of its children."""

    __slots__ = ("children", "digest", "fingerprint")

    def __init__(self) -> None:
        self.fingerprint: Any = None
        self.digest: str | None = None
        self.children: dict[str, dict[Any, _Shadow]] = {}


class RowTracker:
    """Finds the rows that changed since the last `delta`; not thread-safe (like the module)."""

    def __init__(self) -> None:
        self._root = _Shadow()

    def delta(self, state: ChainState) -> RowDelta:
        """Every row that differs from what this tracker last returned, and every deleted subtree.
        Call after the block's app hash: the digests it caches are what let the walk skip."""
        out = RowDelta()
        self._walk(state, self._root, (), out)
        return out

    def prime(self, state: ChainState) -> None:
        """Mark `state` as already persisted (after loading it), so nothing is rewritten."""
        self.delta(state)

    def _walk(self, obj: Any, shadow: _Shadow, path: Path, out: RowDelta) -> None:
        digest = obj.__dict__.get(_DIGEST)
        if digest is not None and digest == shadow.digest:
            return  # the app hash vouches that nothing below changed since it was written
        lay = layout(type(obj))
        if lay.flat:
            fingerprint: Any = tuple([getattr(obj, name) for name in lay.inline])
            if fingerprint != shadow.fingerprint:
                body = _canon({name: getattr(obj, name) for name in lay.inline})
                out.upserts.append((path_key(path), body))
        else:
            fingerprint = _canon(row_body(obj))
            if fingerprint != shadow.fingerprint:
                out.upserts.append((path_key(path), fingerprint))
        shadow.fingerprint = fingerprint
        for name, _, _ in lay.children:
            current: dict[Any, Any] = getattr(obj, name)
            known = shadow.children.setdefault(name, {})
            if len(known) > len(current) or not known.keys() <= current.keys():
                for key in sorted(known.keys() - current.keys(), key=_sort_key):
                    out.deletes.append((*path, name, key))
                    del known[key]
            for key, child in current.items():
                child_shadow = known.get(key)
                if child_shadow is None:
                    child_shadow = known[key] = _Shadow()
                self._walk(child, child_shadow, (*path, name, key), out)
        shadow.digest = digest


def _sort_key(key: Any) -> tuple[int, Any]:
    return (0, key) if isinstance(key, int) else (1, str(key))


def all_rows(state: ChainState) -> list[tuple[str, str]]:
    """Every row of `state` (genesis, or a rewrite from scratch)."""
    return RowTracker().delta(state).upserts


class RowError(ValueError):
    """Rows that do not form a state: a missing parent, an unknown field, a malformed path."""


def _resolve(path: Path) -> tuple[type, type]:
    """(parent dataclass, row dataclass) for a non-root path, from the type hints alone."""
    cls: type = ChainState
    parent = cls
    for i in range(0, len(path), 2):
        name = path[i]
        if i + 1 >= len(path):
            raise RowError(f"path {list(path)} ends on a field, not a key")
        children = {c[0]: c for c in layout(cls).children}
        if name not in children:
            raise RowError(f"{cls.__name__} has no map of rows named {name!r} (path {list(path)})")
        _, key_t, val_t = children[name]
        if not isinstance(path[i + 1], key_t):
            raise RowError(f"key {path[i + 1]!r} of {name} is not a {key_t.__name__}")
        parent, cls = cls, val_t
    return parent, cls


def build_state(rows: list[tuple[str, str]]) -> ChainState:
    """Rows (in any order) back to the state; raises `RowError` when they do not fit together."""
    parsed: list[tuple[Path, dict[str, Any]]] = []
    for key, body in rows:
        path = tuple(json.loads(key))
        parsed.append((path, json.loads(body)))
    parsed.sort(key=lambda item: (len(item[0]), [_sort_key(p) for p in item[0]]))
    if not parsed or parsed[0][0] != ():
        raise RowError("no root row")
    objects: dict[Path, Any] = {}
    for path, body in parsed:
        cls = ChainState if not path else _resolve(path)[1]
        lay = layout(cls)
        if set(body) != set(lay.inline):
            raise RowError(f"row {list(path)}: fields {sorted(body)} are not {cls.__name__}'s")
        obj = _from_jsonable(cls, {**body, **{name: {} for name, _, _ in lay.children}})
        if path:
            parent = objects.get(path[:-2])
            if parent is None:
                raise RowError(f"row {list(path)} has no parent row")
            getattr(parent, path[-2])[path[-1]] = obj
        objects[path] = obj
    root = objects.get(())
    if not isinstance(root, ChainState):
        raise RowError("no root row")
    return root
