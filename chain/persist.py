"""Row-wise persistence of `ChainState`: a block writes the rows that changed, not the whole state.

The rows are the nodes of the app-hash tree (chain/state.py, specs/protocol.md §2.8), cut
generically by the dataclasses' type hints, so a field added to any of them persists without
being listed here:

- every value of a `dict[K, <dataclass>]` field is a node and a row of its own (an account, a
  run, a participant, an outer step, a contribution, a verdict, and whatever such maps are added
  later), keyed by its path from the root, e.g. `["runs",1,"steps",3,"contributions","gonka1…"]`;
- a row's body is the node's own text: the canonical JSON of its other fields, which the app hash
  has already computed (one serialization per changed node serves both); the root is `[]`.

`RowTracker` remembers what it last handed to the database and, per block, walks the state to
find what changed. The walk costs the live state, not the history: a node whose cached digest
equals the one it had when last written is skipped with its whole subtree. A finished (DONE)
outer step keeps its digest for good, so it is written once and never visited again (and the
tracker forgets its subtree); a contribution keeps its digest until the module touches it; a
flat node (account, participant, verdict) is compared by its cached text, refreshed only when
one of its values changed.

`build_state` is the inverse: rows in any order back to a `ChainState` whose app hash the store
then checks against the last block header.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

from chain.state import (
    ChainState,
    _from_jsonable,
    cached_digest,
    flat_text,
    forget_texts,
    layout,
    own_text,
    sealed,
)

Path = tuple[Any, ...]
"""Field names and map keys from the root (`ChainState`) to a row's object."""


def path_key(path: Path) -> str:
    """The row's primary key: the path as compact JSON (ints stay ints, so keys keep their type);
    `json.dumps(list(path), separators=(",", ":"))`, written out because it runs for every row."""
    parts = [_quote(p) if isinstance(p, str) else str(int(p)) for p in path]
    return "[" + ",".join(parts) + "]"


def subtree_range(path: Path) -> tuple[str, str]:
    """[low, high) of the keys of every row strictly below `path` (for deleting a removed subtree):
    their JSON arrays share the prefix `[...,` and nothing else sorts between the bounds."""
    prefix = path_key(path)[:-1] + ","
    return prefix, prefix[:-1] + chr(ord(",") + 1)


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

    __slots__ = ("children", "digest", "text")

    def __init__(self) -> None:
        self.text: str | None = None
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
        digest = cached_digest(obj)
        if digest is not None and digest == shadow.digest:
            return  # the app hash vouches that nothing below changed since it was written
        text = own_text(obj)  # the app hash's own serialization, reused
        if text != shadow.text:
            out.upserts.append((path_key(path), text))
            shadow.text = text
        for name, _, child_cls in layout(type(obj)).children:
            current: dict[Any, Any] = getattr(obj, name)
            known = shadow.children.setdefault(name, {})
            if len(known) > len(current) or not known.keys() <= current.keys():
                for key in sorted(known.keys() - current.keys(), key=_sort_key):
                    out.deletes.append((*path, name, key))
                    del known[key]
            child_lay = layout(child_cls)
            if child_lay.flat:  # leaves: compare texts (cached with their values), no recursion
                for key, child in current.items():
                    child_shadow = known.get(key)
                    if child_shadow is None:
                        child_shadow = known[key] = _Shadow()
                    text = flat_text(child, child_lay)
                    if text is not child_shadow.text and text != child_shadow.text:
                        out.upserts.append((path_key((*path, name, key)), text))
                        child_shadow.text = text
                continue
            for key, child in current.items():
                child_shadow = known.get(key)
                if child_shadow is None:
                    child_shadow = known[key] = _Shadow()
                self._walk(child, child_shadow, (*path, name, key), out)
        shadow.digest = digest
        if digest is not None and sealed(obj):  # written for the last time (its digest is kept
            # for good, so it is skipped from now on): keep neither its texts nor its children's
            forget_texts(obj)
            shadow.children.clear()


def _sort_key(key: Any) -> tuple[int, Any]:
    return (0, key) if isinstance(key, int) else (1, str(key))


def all_rows(state: ChainState) -> list[tuple[str, str]]:
    """Every row of `state` (genesis, or a rewrite from scratch)."""
    return RowTracker().delta(state).upserts


class RowError(ValueError):
    """Rows that do not form a state: a missing parent, an unknown field, a malformed path."""


_RESOLVED: dict[tuple[Any, ...], tuple[type, tuple[type, ...]]] = {}


def _resolve(path: Path) -> type:
    """The row's dataclass for a non-root path, from the type hints alone (cached per field path)."""
    fields = path[0::2]
    found = _RESOLVED.get(fields)
    if found is None:
        if len(path) % 2:
            raise RowError(f"path {list(path)} ends on a field, not a key")
        cls: type = ChainState
        key_types: list[type] = []
        for name in fields:
            children = {c[0]: c for c in layout(cls).children}
            if name not in children:
                raise RowError(f"{cls.__name__} has no map of rows named {name!r} (path {list(path)})")
            _, key_t, cls = children[name]
            key_types.append(key_t)
        found = _RESOLVED[fields] = (cls, tuple(key_types))
    cls, key_types = found
    for key, key_t in zip(path[1::2], key_types, strict=True):
        if not isinstance(key, key_t) or isinstance(key, bool):
            raise RowError(f"key {key!r} in {list(path)} is not a {key_t.__name__}")
    return cls


def build_state(rows: list[tuple[str, str]]) -> ChainState:
    """Rows (in any order) back to the state; raises `RowError` when they do not fit together."""
    parsed = sorted(
        ((tuple(json.loads(key)), key, body) for key, body in rows), key=lambda r: (len(r[0]), r[1])
    )
    if not parsed or parsed[0][0] != ():
        raise RowError("no root row")
    objects: dict[Path, Any] = {}
    for path, _, text in parsed:
        cls = _resolve(path) if path else ChainState
        lay = layout(cls)
        body = json.loads(text)
        if not isinstance(body, dict) or body.keys() != set(lay.inline):
            raise RowError(f"row {list(path)}: fields {sorted(body)} are not {cls.__name__}'s")
        for name, _, _ in lay.children:
            body[name] = {}
        obj = _from_jsonable(cls, body)
        if path:
            parent = objects.get(path[:-2])
            if parent is None:
                raise RowError(f"row {list(path)} has no parent row")
            getattr(parent, path[-2])[path[-1]] = obj
        objects[path] = obj
    return objects[()]
