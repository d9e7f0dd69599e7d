"""A host's error-feedback accumulator for one outer step of a sparse run (specs §4.1).

The chain names the e a step starts from (`start_state.ef_hash`: the e_next of the host's last
accepted contribution; None: zeros). The host reads it from its own store tensor by tensor, folds
its Δ in as it encodes (`nodekit.errorfeedback.ef_step_stored`), writes e_next to the store as it
goes and commits its hash. The stored e is a tensor set of kind `error_feedback`, 4 B/param on
disk, kept and served to verifiers while a step the chain names it for is in flight (`Retention`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import Tensor

from nodekit.errorfeedback import ef_step_stored, start_ef
from nodekit.objects import Kind
from nodekit.store import EF_GROUP, ContentStore, StoreError
from protocol.codecs import Layout
from protocol.config import Codec, RunConfig
from protocol.errorfeedback import EFConfig


class EFLost(StoreError):
    """The accumulator the chain names for this host's start is not on its disk (or is corrupted)."""


@dataclass
class CarriedEF:
    """What `run_committed` needs to encode a sparse Δ with error feedback; `final_hash` is the
    committed hash of e_next once `encode` ran (the tensors are in `content`)."""

    content: ContentStore
    cfg: EFConfig
    start_hash: str | None
    final_hash: str = ""

    @classmethod
    def of(cls, content: ContentStore, cfg: RunConfig, start_hash: str | None) -> CarriedEF | None:
        """The run's carried accumulator (None for every codec but sparse)."""
        if cfg.codec is not Codec.SPARSE:
            return None
        if start_hash is not None and not content.has(Kind.ERROR_FEEDBACK, start_hash, EF_GROUP):
            raise EFLost(f"own error-feedback accumulator {start_hash[:12]} is not on disk")
        return cls(content, EFConfig.of(cfg), start_hash)

    def encode(self, deltas: Iterable[tuple[str, Tensor]], layout: Layout) -> bytes:
        """The payload C(β·e + Δ) from Δ given tensor by tensor; e_next stored, its hash kept."""
        payload, self.final_hash = ef_step_stored(
            self.content, layout, self.cfg, deltas, start_ef(self.content, layout, self.start_hash)
        )
        return payload
