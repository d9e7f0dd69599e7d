"""A host's error-feedback accumulator for one outer step of a sparse run (specs §4.1).

The chain names the e a step starts from (`start_state.ef_hash`: the e_next of the host's last
accepted contribution; None: zeros). The host reads it from its own store tensor by tensor, folds
its Δ in as it encodes (`nodekit.errorfeedback.ef_step_stored`), writes e_next to the store as it
goes and commits its hash. The stored e is a tensor set of kind `error_feedback`, 4 B/param on
disk, kept and served to verifiers while a step the chain names it for is in flight (`Retention`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from nodekit.errorfeedback import EFWriter, ef_step_stored, start_ef
from nodekit.objects import Kind
from nodekit.store import EF_GROUP, ContentStore, StoreError
from protocol.codecs import Layout
from protocol.config import Codec, RunConfig
from protocol.errorfeedback import EFConfig


class FreshEFs:
    """Accumulators written while a step trains, before a record names them. In an overlapped run
    the host prunes (aggregation thread) while it trains the next step: pruning must not delete an
    e_next that is on disk but not yet in its step's record. `writing` marks a write in progress
    (pruning then leaves every accumulator for the next time); `held(n)` is what was written for
    steps after n, which pruning after step n keeps. `lock` is the host's (pruning holds it)."""

    def __init__(self, lock: AbstractContextManager[Any]) -> None:
        self.lock = lock
        self.writing = 0
        self.steps: dict[str, int] = {}

    def write(self, outer_step: int, write: Callable[[], str]) -> str:
        """Run `write` (it stores an accumulator, returns its hash) outside the lock, marked."""
        with self.lock:
            self.writing += 1
        h = ""
        try:
            h = write()
            return h
        finally:
            with self.lock:
                self.writing -= 1
                if h:
                    self.steps[h] = outer_step

    def held(self, after: int) -> set[str] | None:
        """Under `lock`: the accumulators written for steps after `after` (the older ones are in
        their records by now); None while a write is in progress (prune nothing now)."""
        self.steps = {h: m for h, m in self.steps.items() if m > after}
        return None if self.writing else set(self.steps)


class EFLost(StoreError):
    """The accumulator the chain names for this host's start is not on its disk (or is corrupted)."""


@dataclass
class CarriedEF:
    """What `run_committed` needs to encode a sparse Δ with error feedback; `final_hash` is the
    committed hash of e_next once `encode` ran (the tensors are in `content`)."""

    content: ContentStore
    cfg: EFConfig
    start_hash: str | None
    outer_step: int = 0
    fresh: FreshEFs | None = None
    final_hash: str = ""

    @classmethod
    def of(
        cls, content: ContentStore, cfg: RunConfig, start_hash: str | None, outer_step: int = 0,
        fresh: FreshEFs | None = None,
    ) -> CarriedEF | None:  # fmt: skip
        """The run's carried accumulator (None for every codec but sparse)."""
        if cfg.codec is not Codec.SPARSE:
            return None
        if start_hash is not None and not content.has(Kind.ERROR_FEEDBACK, start_hash, EF_GROUP):
            raise EFLost(f"own error-feedback accumulator {start_hash[:12]} is not on disk")
        return cls(content, EFConfig.of(cfg), start_hash, outer_step, fresh)

    def encode(self, deltas: Iterable[tuple[str, Tensor]], layout: Layout) -> bytes:
        """The payload C(β·e + Δ) from Δ given tensor by tensor; e_next stored, its hash kept."""
        payload = b""

        def step() -> str:
            nonlocal payload
            start = start_ef(self.content, layout, self.start_hash)
            payload, h = ef_step_stored(self.content, layout, self.cfg, deltas, start)
            return h

        self.final_hash = self._written(step)
        return payload

    def store(self, e: Mapping[str, Tensor], layout: Layout) -> str:
        """Store another accumulator for this step (an adversary's forged e_next); its hash."""

        def write() -> str:
            writer = EFWriter(self.content, layout)
            for name in sorted(e):
                writer.write(name, e[name])
            return writer.finish()

        return self._written(write)

    def _written(self, write: Callable[[], str]) -> str:
        return write() if self.fresh is None else self.fresh.write(self.outer_step, write)
