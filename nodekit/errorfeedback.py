"""A sparse run's error-feedback accumulator on a node's disk (specs §4.1), for both nodes.

The host folds its Δ into the e the chain names and carries e_next on; a verifier rebuilds the
same step from its replay. Both read the start e tensor by tensor from the store (`start_ef`:
memory-mapped reads, each chunk verified) and write e_next tensor by tensor as
`protocol.errorfeedback.ef_tensors` yields it (`EFWriter`), hashing the file afterwards, so
neither ever holds a whole extra accumulator (4 B/param) beside the one tensor in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor

from nodekit.objects import DOMAINS, Kind, ef_specs
from nodekit.store import EF_GROUP, ContentStore, StoreError
from nodekit.storefiles import StoredTensors
from protocol import chunks
from protocol.codecs import Layout
from protocol.config import Codec, RunConfig
from protocol.errorfeedback import EFConfig, ef_header, ef_tensors
from protocol.tensors import canonical_header, canonical_size, data_offsets


class EFWriter:
    """e_next into the content store (group `error_feedback`) one tensor at a time, in any order;
    `finish()` hashes the file (one read pass, O(chunk) memory) and files it under its hash."""

    def __init__(self, content: ContentStore, layout: Layout) -> None:
        self.content = content
        self.specs = ef_specs(layout)
        self.offsets = data_offsets(self.specs)
        self.length = canonical_size(self.specs)
        self.sink = content.scratch(Kind.ERROR_FEEDBACK, EF_GROUP, self.length)
        self.sink.write_at(0, canonical_header(self.specs))
        self.written: set[str] = set()

    def write(self, name: str, t: Tensor) -> None:
        start, end = self.offsets[name]
        flat = t.detach().to("cpu", torch.float32).contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy().data
        if len(data) != end - start:
            raise StoreError(f"accumulator {name!r}: {len(data)} bytes, the layout says {end - start}")
        self.sink.write_at(start, data)
        self.written.add(name)

    def finish(self) -> str:
        """The hash of what was written (`errorfeedback.ef_hash` of it); the file is in the store."""
        if self.written != set(self.offsets):
            self.abort()
            raise StoreError(f"accumulator incomplete: {len(self.written)} of {len(self.offsets)} tensors")
        c = self.content.chunk_bytes
        digests = []
        with open(self.sink.path, "rb") as f:
            for i in range(chunks.n_chunks(self.length, c)):
                a, b = chunks.chunk_span(i, self.length, c)
                digests.append(chunks.chunk_digest(f.read(b - a)))
        h = chunks.content_hash(DOMAINS[Kind.ERROR_FEEDBACK], c, self.length, digests)
        self.content.commit(Kind.ERROR_FEEDBACK, h, EF_GROUP, self.sink, digests)
        return h

    def abort(self) -> None:
        self.content.abort(self.sink)


def start_ef(content: ContentStore, layout: Layout, h: str | None) -> Mapping[str, Tensor] | None:
    """The e a step starts from, read tensor by tensor from the store (verified on read); None for
    zeros (the chain names none). `StoreError` if it is not on disk or does not fit the layout."""
    if h is None:
        return None
    return StoredTensors(content, Kind.ERROR_FEEDBACK, h, ef_specs(layout), EF_GROUP)


def ef_step_stored(
    content: ContentStore,
    layout: Layout,
    cfg: EFConfig,
    deltas: Iterable[tuple[str, Tensor]],
    start: Mapping[str, Tensor] | None,
) -> tuple[bytes, str]:
    """(payload C(β·e + Δ), hash of e_next) with e_next written to the store as it is computed:
    Δ given tensor by tensor in name order (θ_start − θ_H), e read by name from `start`."""
    writer = EFWriter(content, layout)
    bodies = []
    try:
        for t in ef_tensors(deltas, start, layout, cfg):
            bodies.append(t.body)
            writer.write(t.name, t.e_next)
            del t
    except BaseException:
        writer.abort()
        raise
    return ef_header(layout, cfg) + b"".join(bodies), writer.finish()


class ServedEF:
    """An `EFWriter` whose finished accumulator is also served (`keep(kind, hash, group)`)."""

    def __init__(self, writer: EFWriter, keep: Callable[[Kind, str, str], None]) -> None:
        self.writer, self.keep = writer, keep

    def write(self, name: str, t: Tensor) -> None:
        self.writer.write(name, t)

    def finish(self) -> str:
        h = self.writer.finish()
        self.keep(Kind.ERROR_FEEDBACK, h, EF_GROUP)
        return h

    def abort(self) -> None:
        self.writer.abort()


def sparse_codec(cfg: RunConfig) -> EFConfig | None:
    """The run's sparse codec and error-feedback decay, None for the dense codecs."""
    return EFConfig.of(cfg) if cfg.codec is Codec.SPARSE else None
