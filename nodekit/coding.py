"""Training-state chunks on the wire coded against G_n (specs §8.2), both sides.

A holder that has the base G_n in its store serves `GET /blobs/state/{hash}/coded/{i}?base=G`:
chunk i of the state (read from disk and checked against its digest first) coded by
`protocol.statecode` against G's parameters (`StateCoder`). A fetcher that holds G too asks for
that, decodes it (`StateCoding`) and checks the decoded chunk's digest against the state's
manifest like any chunk: the content hash names the canonical bytes, so a holder coding against
another base, or coding another chunk, is caught like one sending bad bytes. A holder that does not
code is asked for plain byte ranges instead.

G's parameters are read from the content store by element range (`StoredBase`): one of G's chunks
at a time, each verified, never a whole tensor.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from nodekit.objects import Kind, model_specs
from nodekit.serve import Served
from nodekit.store import ContentStore, StoreError
from protocol import chunks
from protocol.statecode import StateLayout, decode_chunk, encode_chunk, max_coded_len
from protocol.tensors import TensorSpec, canonical_size, data_offsets


class BaseUnreadable(RuntimeError):
    """Our own copy of G failed its checks: not a holder's fault (never a ValueError, which the
    decoder would take for a bad coded chunk)."""


class StoredBase:
    """G's parameters as element ranges (`protocol.statecode.BaseElements`), read from the store's
    copy of G (kind `model`), each of its chunks checked against its digest; the last two chunks
    read are kept (a state chunk's pieces come from one or two of G's chunks, in order)."""

    def __init__(self, store: ContentStore, h: str, layout: Mapping[str, tuple[int, ...]]) -> None:
        specs = model_specs(layout)
        self.store, self.hash = store, h
        self.length = canonical_size(specs)
        if store.length(Kind.MODEL, h) != self.length:
            raise StoreError(f"model {h[:12]} does not fit this run's layout")
        self._offsets = {
            n.removeprefix("param/"): ab for n, ab in data_offsets(specs).items() if n.startswith("param/")
        }
        self._lock = threading.Lock()
        self._cache: dict[int, bytes] = {}

    def _chunk(self, i: int) -> bytes:
        with self._lock:
            got = self._cache.get(i)
        if got is None:
            a, b = chunks.chunk_span(i, self.length, self.store.chunk_bytes)
            try:
                got = b"".join(self.store.read(Kind.MODEL, self.hash, a, b))
            except (StoreError, OSError) as e:
                raise BaseUnreadable(f"model {self.hash[:12]}: {e}") from e
            with self._lock:
                if len(self._cache) >= 2:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[i] = got
        return got

    def elements(self, name: str, first: int, n: int, itemsize: int) -> np.ndarray:
        a, b = self._offsets[name]
        lo, hi = a + first * itemsize, a + (first + n) * itemsize
        if first < 0 or n < 0 or hi > b:
            raise ValueError(f"elements [{first}, {first + n}) outside {name!r}")
        c = self.store.chunk_bytes
        out = bytearray()
        for i in range(lo // c, -(-hi // c)):
            data = self._chunk(i)
            out += data[max(lo, i * c) - i * c : min(hi, i * c + len(data)) - i * c]
        return np.frombuffer(bytes(out), dtype=np.uint8)


@dataclass
class StateCoder:
    """The server's side: chunk `index` of a served state, coded against base G (`None` when this
    node does not hold G, or G does not fit the run's layout: the fetcher asks for bytes instead)."""

    store: ContentStore
    state_specs: list[TensorSpec]
    layout: Mapping[str, tuple[int, ...]]
    _bases: dict[str, StoredBase] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.state_layout = StateLayout.of(self.state_specs, self.store.chunk_bytes)

    def base(self, h: str) -> StoredBase | None:
        with self._lock:
            got = self._bases.get(h)
        if got is not None:
            return got
        if not self.store.has(Kind.MODEL, h):
            return None
        try:
            got = StoredBase(self.store, h, self.layout)
        except (StoreError, OSError):
            return None
        with self._lock:
            while len(self._bases) >= 2:  # G_n and G_{n−1} at most (an overlapped run's two steps)
                self._bases.pop(next(iter(self._bases)))
            self._bases[h] = got
        return got

    def __call__(self, obj: Served, index: int, base: str) -> bytes | None:
        if obj.length != self.state_layout.total or not 0 <= index < self.state_layout.n_chunks:
            return None
        g = self.base(base)
        if g is None:
            return None
        a, b = self.state_layout.span(index)
        chunk = b"".join(obj.read(a, b))  # checked against its digest on the way
        try:
            return encode_chunk(self.state_layout, index, chunk, g)
        except BaseUnreadable:  # G went from our disk meanwhile: plain bytes then
            with self._lock:
                self._bases.pop(base, None)
            return None


@dataclass(frozen=True)
class StateCoding:
    """The fetcher's side (`BlobClient.fetch(coding=...)`): the base it names and holds, the state
    layout, and the decoder. A decoded chunk is checked against its digest by the fetcher."""

    base: str
    layout: StateLayout
    reader: StoredBase

    @classmethod
    def of(
        cls,
        store: ContentStore,
        base: str,
        state_specs: list[TensorSpec],
        layout: Mapping[str, tuple[int, ...]],
    ) -> StateCoding | None:
        """None when the store does not hold G (`base`): then states are fetched as plain bytes."""
        if not store.has(Kind.MODEL, base):
            return None
        try:
            reader = StoredBase(store, base, layout)
        except (StoreError, OSError):
            return None
        return cls(base, StateLayout.of(state_specs, store.chunk_bytes), reader)

    def max_len(self, index: int) -> int:
        return max_coded_len(self.layout, index)

    def decode(self, index: int, data: bytes | bytearray | memoryview) -> bytes:
        """The canonical bytes of chunk `index` (`StateCodeError`, a ValueError, on bad input)."""
        return decode_chunk(self.layout, index, data, self.reader)


__all__ = ["BaseUnreadable", "StateCoder", "StateCoding", "StoredBase"]
