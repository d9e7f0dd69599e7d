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
    adopt_text,
    cached_digest,
    forget_texts,
    hashed_text,
    layout,
    map_cache,
    node_digest,
    omitted_fields,
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
    """What was last written for one row: its text, its digest, per child map the map's text
    (canon {key: D(child)}) and each child's digest (a flat child's) or shadow (another node's)."""

    __slots__ = ("children", "digest", "maps", "sealed", "text")

    def __init__(self) -> None:
        self.text: str | None = None
        self.digest: str | None = None
        self.maps: dict[str, str] = {}
        self.children: dict[str, dict[Any, Any]] = {}
        self.sealed = False  # written sealed: what is below is no longer tracked


class RowTracker:
    """Finds the rows that changed since the last `delta`; not thread-safe (like the module)."""

    def __init__(self) -> None:
        self._root = _Shadow()

    def delta(self, state: ChainState) -> RowDelta:
        """Every row that differs from what this tracker last returned, and every deleted subtree.
        Call after the block's app hash: the walk reads the texts and digests that pass computed
        (a state never hashed is hashed first)."""
        if hashed_text(state) is None:
            node_digest(state)
        out = RowDelta()
        self._walk(state, self._root, (), out)
        return out

    def prime(self, state: ChainState) -> None:
        """Mark `state` as already persisted (after loading it), so nothing is rewritten."""
        if hashed_text(state) is None:
            node_digest(state)
        self._walk(state, self._root, (), None)

    def _walk(self, obj: Any, shadow: _Shadow, path: Path, out: RowDelta | None) -> None:
        """Record `obj`'s subtree as written; `out` receives the rows that changed (None: priming)."""
        if shadow.sealed:  # a sealed node changed: never by the module, but a state rewritten from
            if out is not None:  # outside could; its untracked subtree is rewritten whole
                out.deletes.append(path)
            shadow.__init__()  # type: ignore[misc]
        text = hashed_text(obj) or own_text(obj)  # the app hash's own serialization, reused
        if text != shadow.text:
            if out is not None:
                out.upserts.append((path_key(path), text))
            shadow.text = text
        for name, _, child_cls in layout(type(obj)).children:
            cache = map_cache(obj, name)
            if cache.text == shadow.maps.get(name):
                continue  # same keys, same digests: nothing below changed since it was written
            known = shadow.children.setdefault(name, {})
            if len(known) > len(cache.entries) or not known.keys() <= cache.entries.keys():
                for key in sorted(known.keys() - cache.entries.keys(), key=_sort_key):
                    if out is not None:
                        out.deletes.append((*path, name, key))
                    del known[key]
            if layout(child_cls).flat:  # leaves: their texts are in the map's cache, no recursion
                for key, (_, digest, child_text, _) in cache.entries.items():
                    if known.get(key) != digest:
                        if child_text is None:  # MapCache keeps every flat child's row text
                            raise RuntimeError(f"flat child {key!r} of map {name!r} at {list(path)}: no text")
                        if out is not None:
                            out.upserts.append((path_key((*path, name, key)), child_text))
                        known[key] = digest
            else:
                children = getattr(obj, name)
                for key, (_, digest, _, _) in cache.entries.items():
                    child_shadow = known.get(key)
                    if child_shadow is None:
                        child_shadow = known[key] = _Shadow()
                    if child_shadow.digest != digest:
                        self._walk(children[key], child_shadow, (*path, name, key), out)
                        child_shadow.digest = digest
            shadow.maps[name] = cache.text
        if sealed(obj) and cached_digest(obj) is not None:  # written for the last time (its digest
            # is kept for good, so it is skipped from now on): keep neither its texts nor its children's
            forget_texts(obj)
            shadow.children.clear()
            shadow.maps.clear()
            shadow.sealed = True


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
        key_list: list[type] = []
        for name in fields:
            children = {c[0]: c for c in layout(cls).children}
            if name not in children:
                raise RowError(f"{cls.__name__} has no map of rows named {name!r} (path {list(path)})")
            _, key_t, cls = children[name]
            key_list.append(key_t)
        found = _RESOLVED[fields] = (cls, tuple(key_list))
    cls, key_types = found
    for key, key_t in zip(path[1::2], key_types, strict=True):
        if not isinstance(key, key_t) or isinstance(key, bool):
            raise RowError(f"key {key!r} in {list(path)} is not a {key_t.__name__}")
    return cls


def build_state(rows: list[tuple[str, str]], adopt_texts: bool = False) -> ChainState:
    """Rows (in any order) back to the state; raises `RowError` when they do not fit together.
    `adopt_texts`: each node keeps its row as its own text (`chain.state.adopt_text`), so the
    app hash that the caller then checks is computed without serializing the state again."""
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
        may_omit = {name for name, _ in omitted_fields(cls)}
        if not isinstance(body, dict) or not (set(lay.inline) - may_omit <= body.keys() <= set(lay.inline)):
            raise RowError(f"row {list(path)}: fields {sorted(body)} are not {cls.__name__}'s")
        for name, _, _ in lay.children:
            body[name] = {}
        obj = _from_jsonable(cls, body)
        if adopt_texts:
            adopt_text(obj, text)
        if path:
            parent = objects.get(path[:-2])
            if parent is None:
                raise RowError(f"row {list(path)} has no parent row")
            getattr(parent, path[-2])[path[-1]] = obj
        objects[path] = obj
    return objects[()]
