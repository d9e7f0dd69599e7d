"""The eager start (`overlap = "eager"`, specs §2.2.1): what a host's step n trains from when its
step n − 1 contribution is its parent, and what a verifier rebuilds segment 0 from.

start params = `protocol.outer.eager_start(G_{n−1}.params, G_{n−1}.momentum, Δ, lr, mu)` (the
outer step with α·Δ as the only Δ) with Δ = decode(the parent's committed payload), decoded exactly
as aggregation decodes it (`protocol.codecs.iter_decode`). The host and every verifier compute it
from the same bytes with the same element-wise float32 operations, so the start is bitwise one.

It is never held whole: `EagerStart` is a read-only mapping that computes a tensor when it is read
(one decoded Δ tensor, one G tensor and its momentum), so a 30B start costs no 4 B/param of memory.
Readers go in name order (loading a model, measuring Δ, checking a start), which is the payload's
order, so one pass over the payload serves them; the update is element-wise, so computing it one
tensor at a time gives the bits of the whole-model call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping

from torch import Tensor

from nodekit.globalmodel import GlobalModel
from protocol.codecs import CodecError, iter_decode, read_header
from protocol.config import OuterOptim
from protocol.outer import eager_start as start_params

__all__ = ["EagerStart", "eager_start"]


def eager_start(gm: GlobalModel, payload: bytes | memoryview, outer: OuterOptim) -> EagerStart:
    """The eager start on G_{n−1} = `gm` with the parent Δ `payload`."""
    return EagerStart(gm.params, gm.momentum, payload, outer)


class EagerStart(Mapping[str, Tensor]):
    """The start params of an eager step, computed on access from G_{n−1} and the parent Δ payload.

    Raises `CodecError` at construction if the payload does not fit G's layout (it hashes right:
    the author committed to a Δ that does not decode, so no start can be built from it)."""

    def __init__(
        self,
        params: Mapping[str, Tensor],
        momentum: Mapping[str, Tensor],
        payload: bytes | memoryview,
        outer: OuterOptim,
    ) -> None:
        """`params`/`momentum`: G_{n−1}'s (in memory or `StoredTensors` read from disk)."""
        self.params, self.momentum, self.payload, self.outer = params, momentum, payload, outer
        shapes = getattr(params, "shapes", None)
        self.shapes = dict(shapes) if shapes is not None else {k: tuple(t.shape) for k, t in params.items()}
        header = read_header(payload)
        if dict(header.shapes) != {k: tuple(v) for k, v in self.shapes.items()}:
            raise CodecError("parent Δ does not fit the global model's layout")
        self._names = sorted(self.shapes)
        self._index = {n: i for i, n in enumerate(self._names)}
        self._lock = threading.Lock()
        self._cursor: Iterator[tuple[str, Tensor]] | None = None
        self._next = 0  # index in name order of what the cursor yields next

    def _delta(self, name: str) -> Tensor:
        """Δ[name], decoded by a cursor that moves forward through the payload (restarted when a
        reader goes back: a second pass, never a whole decoded Δ)."""
        i = self._index[name]
        with self._lock:
            if self._cursor is None or i < self._next:
                self._cursor, self._next = iter_decode(self.payload, self.shapes), 0
            while True:
                got, t = next(self._cursor)
                self._next += 1
                if got == name:
                    return t

    def __getitem__(self, name: str) -> Tensor:
        if name not in self.shapes:
            raise KeyError(name)
        d = self._delta(name)
        params = start_params(
            {name: self.params[name]},
            {name: self.momentum[name]},
            {name: d},
            self.outer.lr,
            self.outer.momentum,
        )
        return params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
