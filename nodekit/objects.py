"""What nodes move around, and one policy for their sizes and transfer deadlines.

Every object is addressed by its chunked content hash (`protocol.chunks`), and its exact length
follows from the run's model layout and config: a node never needs a fixed size cap, and a
holder that declares any other length is lying. Deadlines scale with size (a bytes-per-second
floor), so a 360 GB state over a slow link is not cut off while a stalled peer still is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import nn

from protocol import chunks
from protocol.codecs import payload_len
from protocol.config import Moments, RunConfig
from protocol.inner import PARAM
from protocol.moments import optimizer_specs as moment_specs
from protocol.tensors import StateKind, TensorSpec, canonical_header, canonical_size, domain

HASH_RE = re.compile(r"^[0-9a-f]{64}$")


class Kind(StrEnum):
    """A blob kind: the route segment `/blobs/{kind}/{hash}` and the hashed domain."""

    STATE = "state"  # a training state (a trajectory leaf)
    OPTIMIZER = "optimizer"  # AdamW moments + step (a host's carried state, by its chain hash)
    MODEL = "model"  # a global model G (params + outer momentum)
    DELTA = "delta"  # a Δ payload (protocol.codecs)
    ERROR_FEEDBACK = "error_feedback"  # a sparse run's carried accumulator e (specs §4.1), by its chain hash


KINDS: tuple[str, ...] = tuple(k.value for k in Kind)
DOMAINS: dict[Kind, bytes] = {
    Kind.STATE: domain(StateKind.TRAINING),
    Kind.OPTIMIZER: domain(StateKind.OPTIMIZER),
    Kind.MODEL: domain(StateKind.GLOBAL),
    Kind.DELTA: chunks.DELTA_DOMAIN,
    Kind.ERROR_FEEDBACK: domain(StateKind.ERROR_FEEDBACK),
}


def check_ref(kind: str, blob_hash: str) -> Kind:
    if kind not in KINDS:
        raise ValueError(f"unknown blob kind {kind!r}; expected one of {KINDS}")
    if not isinstance(blob_hash, str) or not HASH_RE.match(blob_hash):
        raise ValueError(f"blob hash must be 64 lower-case hex characters, got {blob_hash!r}")
    return Kind(kind)


class HeldError(ValueError):
    """A held bitmap of the wrong length, or with bits past the last chunk."""


def held_bitmap(held: Iterable[int], n: int) -> bytes:
    """Which of an object's n chunks a node holds (specs §8, `/held`): ⌈n/8⌉ bytes, bit i (byte
    i // 8, least significant bit first) set iff chunk i is held."""
    out = bytearray(-(-n // 8))
    for i in held:
        out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def parse_held(data: bytes | bytearray, n: int) -> set[int]:
    """The chunk indices of a held bitmap of an object of n chunks: exactly ⌈n/8⌉ bytes, padding 0."""
    if len(data) != -(-n // 8):
        raise HeldError(f"held bitmap of {len(data)} bytes for {n} chunks")
    held = {i for i in range(n) if data[i >> 3] >> (i & 7) & 1}
    if held_bitmap(held, n) != bytes(data):
        raise HeldError("held bitmap sets bits past the last chunk")
    return held


@dataclass(frozen=True)
class ObjectRef:
    """One object to fetch or serve: its kind, content hash, exact length and chunk size."""

    kind: Kind
    hash: str
    length: int
    chunk_bytes: int

    def __post_init__(self) -> None:
        check_ref(self.kind, self.hash)
        chunks.n_chunks(self.length, self.chunk_bytes)

    @property
    def domain(self) -> bytes:
        return DOMAINS[self.kind]

    @property
    def n_chunks(self) -> int:
        return chunks.n_chunks(self.length, self.chunk_bytes)

    def span(self, index: int) -> tuple[int, int]:
        return chunks.chunk_span(index, self.length, self.chunk_bytes)


def training_specs(model: nn.Module, moments: Moments = Moments.FP32) -> list[TensorSpec]:
    """The training state's tensors (replay.step.training_state) as the model and the run's
    moment format (`InnerOptim.moments`) imply them."""
    layout = {name: tuple(p.shape) for name, p in model.named_parameters()}
    out: list[TensorSpec] = [(f"{PARAM}/{n}", p.dtype, tuple(p.shape)) for n, p in model.named_parameters()]
    return sorted([*out, *moment_specs(layout, moments)])


def optimizer_specs(model: nn.Module, moments: Moments = Moments.FP32) -> list[TensorSpec]:
    return [s for s in training_specs(model, moments) if not s[0].startswith(f"{PARAM}/")]


def ef_specs(layout: Mapping[str, tuple[int, ...]]) -> list[TensorSpec]:
    """The error-feedback accumulator: float32, the model's parameter names and shapes (§4.1)."""
    return sorted((name, torch.float32, tuple(shape)) for name, shape in layout.items())


def model_specs(layout: Mapping[str, tuple[int, ...]]) -> list[TensorSpec]:
    out = [
        (f"{k}/{name}", torch.float32, tuple(shape))
        for name, shape in layout.items()
        for k in ("param", "momentum")
    ]
    return sorted(out)


@dataclass(frozen=True)
class ObjectPolicy:
    """Exact sizes of a run's objects, from its model: the one limits policy of both nodes."""

    chunk_bytes: int
    specs: dict[Kind, list[TensorSpec]]
    delta_length: int

    @classmethod
    def of(cls, model: nn.Module, cfg: RunConfig) -> ObjectPolicy:
        layout = {n: tuple(p.shape) for n, p in model.named_parameters()}
        return cls(
            chunk_bytes=cfg.state_chunk_bytes,
            specs={
                Kind.STATE: training_specs(model, cfg.inner.moments),
                Kind.OPTIMIZER: optimizer_specs(model, cfg.inner.moments),
                Kind.MODEL: model_specs(layout),
                Kind.ERROR_FEEDBACK: ef_specs(layout),
            },
            delta_length=payload_len(cfg.codec, cfg.codec_block_size, layout, cfg.codec_topk or None),
        )

    def length(self, kind: Kind | str) -> int:
        kind = Kind(kind)
        return self.delta_length if kind is Kind.DELTA else canonical_size(self.specs[kind])

    def header(self, kind: Kind | str) -> bytes | None:
        """The exact canonical header of a tensor-set kind (None for Δ payloads)."""
        kind = Kind(kind)
        return None if kind is Kind.DELTA else canonical_header(self.specs[kind])

    def ref(self, kind: Kind | str, blob_hash: str) -> ObjectRef:
        return ObjectRef(Kind(kind), blob_hash, self.length(kind), self.chunk_bytes)


@dataclass(frozen=True)
class TransferPolicy:
    """Deadlines that scale with size: `base_s` plus the time `nbytes` take at `min_bytes_per_s`."""

    min_bytes_per_s: float = 1_000_000.0
    base_s: float = 10.0

    def timeout(self, nbytes: int) -> float:
        return self.base_s + max(0, nbytes) / self.min_bytes_per_s
