"""Training and optimizer states by outer step over a `ContentStore`: what a host persists at
boundaries and serves once they are opened, and the canonical-bytes form states travel in."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from torch import Tensor

from nodekit.objects import Kind
from nodekit.store import ContentStore, StoreError, state_group_step
from protocol.chunks import DEFAULT_CHUNK_BYTES
from protocol.tensors import (
    StateKind,
    TensorFormatError,
    TensorSpec,
    canonical_bytes,
    canonical_pieces,
    decode_canonical,
    tensor_hash,
)

# ---------------------------------------------------------------- training states by outer step


def state_to_bytes(state: Mapping[str, Tensor]) -> bytes:
    """The served and stored form of a state: its canonical bytes (never pickle)."""
    return canonical_bytes(state)


def state_from_bytes(
    data: bytes,
    expected_hash: str | None = None,
    kind: StateKind = StateKind.TRAINING,
    *,
    max_bytes: int | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> dict[str, Tensor]:
    """Parse untrusted canonical bytes, bounded in size, and check the content hash if given."""
    if max_bytes is not None and len(data) > max_bytes:
        raise StoreError(f"state of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        state = decode_canonical(data)
    except TensorFormatError as e:
        raise StoreError(f"not a canonical tensor set: {e}") from e
    if expected_hash is not None:
        got = tensor_hash(state, kind, chunk_bytes)
        if got != expected_hash:
            raise StoreError(f"state hash {got[:12]}… does not match the expected {expected_hash[:12]}…")
    return state


_KIND_OF = {StateKind.TRAINING: Kind.STATE, StateKind.OPTIMIZER: Kind.OPTIMIZER, StateKind.GLOBAL: Kind.MODEL}


class StateStore:
    """Training (and optimizer) states by outer step over a `ContentStore`: what a host persists
    at boundaries and serves when opened. Kept for the behaviours' `ctx.store`."""

    def __init__(
        self, root: Path | str, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, checkpoint_every: int = 1
    ) -> None:
        self.content = ContentStore(root, chunk_bytes)
        self.root = self.content.root
        self.chunk_bytes = chunk_bytes
        self.checkpoint_every = max(1, checkpoint_every)
        """m: a host persists every m-th boundary while training (trainer.boundaries.Boundaries)."""
        self.pending: list[Future[Any]] = []
        """Writes still running in the background (the last boundary of a step)."""

    def flush(self) -> None:
        """Wait for background writes; a failed one is re-raised here."""
        while self.pending:
            self.pending.pop().result()

    def put(self, state: Mapping[str, Tensor], outer_step: int, kind: StateKind = StateKind.TRAINING) -> str:
        return self.content.put_tensors(_KIND_OF[kind], state, _group(outer_step))

    def put_hashed(
        self,
        state: Mapping[str, Tensor],
        outer_step: int,
        h: str,
        digests: Sequence[bytes] | None = None,
        kind: StateKind = StateKind.TRAINING,
    ) -> None:
        """Save a state whose hash the caller just computed (saves hashing twice on the hot path)."""
        pieces = canonical_pieces(state)
        if digests is None:
            self.content.put_pieces(_KIND_OF[kind], pieces, _group(outer_step))
        else:
            self.content.put_pieces(_KIND_OF[kind], pieces, _group(outer_step), h=h, digests=digests)

    def stage_hashed(
        self, state: Mapping[str, Tensor], outer_step: int, h: str, digests: Sequence[bytes]
    ) -> Callable[[], None]:
        """`put_hashed` in two halves (`ContentStore.stage_pieces`): bytes now, durable later."""
        return self.content.stage_pieces(Kind.STATE, canonical_pieces(state), _group(outer_step), h, digests)

    def has(self, h: str, outer_step: int | None = None, kind: StateKind = StateKind.TRAINING) -> bool:
        self.flush()
        group = None if outer_step is None else _group(outer_step)
        return self.content.has(_KIND_OF[kind], h, group)

    def find(self, h: str, outer_step: int | None = None, kind: StateKind = StateKind.TRAINING) -> Path:
        self.flush()
        group = None if outer_step is None else _group(outer_step)
        path = self.content.find(_KIND_OF[kind], h, group)
        if path is None:
            raise StoreError(f"state {h[:12]}… is not in the store")
        return path

    def get_bytes(self, h: str, outer_step: int | None = None, kind: StateKind = StateKind.TRAINING) -> bytes:
        self.flush()
        group = None if outer_step is None else _group(outer_step)
        if not self.content.has(_KIND_OF[kind], h, group):
            raise StoreError(f"state {h[:12]}… is not in the store")
        return self.content.read_bytes(_KIND_OF[kind], h, group)

    def get(
        self,
        h: str,
        outer_step: int | None = None,
        kind: StateKind = StateKind.TRAINING,
        specs: Sequence[TensorSpec] | None = None,
    ) -> dict[str, Tensor]:
        self.flush()
        group = None if outer_step is None else _group(outer_step)
        if not self.content.has(_KIND_OF[kind], h, group):
            raise StoreError(f"state {h[:12]}… is not in the store")
        return self.content.load_tensors(_KIND_OF[kind], h, specs, group)

    def delete(self, h: str, outer_step: int | None = None, kind: StateKind = StateKind.TRAINING) -> None:
        self.flush()
        self.content.delete(_KIND_OF[kind], h, None if outer_step is None else _group(outer_step))

    def hashes(self, outer_step: int, kind: StateKind = StateKind.TRAINING) -> list[str]:
        self.flush()
        return self.content.hashes(_KIND_OF[kind], _group(outer_step))

    def outer_steps(self) -> list[int]:
        return sorted(m for g in self.content.groups() if (m := state_group_step(g)) is not None)

    def prune(self, before: int) -> list[int]:
        """Delete every outer step < `before` (those are finalized); returns what was removed."""
        self.flush()
        gone = [n for n in self.outer_steps() if n < before]
        for n in gone:
            self.content.drop_group(_group(n))
        return gone

    def bytes_on_disk(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())


def _group(outer_step: int) -> str:
    if not isinstance(outer_step, int) or outer_step < 0:
        raise StoreError("outer_step must be an int >= 0")
    return str(outer_step)


def clone_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}
