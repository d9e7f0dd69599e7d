"""Hostile blob holders: a slow one (correct bytes on a bad link, or a trickle to stall a fetch)
and one serving garbage chunks under an honest manifest.

Coders (specs §8.2) that code a state's chunk against another base than the one asked for, or code
another chunk: the fetcher checks every decoded chunk against its digest, so both are caught like a
holder sending bad bytes.

The rules they attack: a fetch hedges a chunk that has not arrived in its share of the time to an
idle holder and drops a holder below the byte-rate floor (`nodekit.fetch`), so a holder listed
first that serves slowly costs about one hedge, never its chunks' full time; every chunk is
checked against its digest, and a node's threads asking for one object share one fetch
(`nodekit.flight`) without the failure of one that was given only a garbage holder failing one
that was given an honest holder too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from nodekit.coding import StateCoder
from nodekit.serve import BytesObject, Served
from protocol.statecode import encode_chunk


class SlowHolder(BytesObject):
    """Correct bytes, `delay` seconds before each `step` bytes (step 1: a trickle)."""

    def __init__(self, data: bytes, chunk: int, step: int, delay: float) -> None:
        super().__init__(data, chunk)
        self.step, self.delay = step, delay

    def read(self, start: int, end: int) -> Iterator[bytes]:
        for a in range(start, end, self.step):
            time.sleep(self.delay)
            yield self.data[a : min(end, a + self.step)]


class GarbageHolder(BytesObject):
    """The object's honest manifest (so it is asked for chunks), then every chunk's bytes wrong."""

    def __init__(self, data: bytes, chunk: int) -> None:
        super().__init__(bytes(b ^ 0x55 for b in data), chunk)
        self._honest = BytesObject(data, chunk)

    def digests(self) -> list[bytes]:
        return self._honest.digests()


class WrongBaseCoder(StateCoder):
    """Codes every state chunk against a base other than the one the fetcher named (zeros: the
    parameters as they are), as if it held another G: the fetcher decodes against its own G and
    gets bytes that fail the chunk's digest (specs §8.2)."""

    def __call__(self, obj: Served, index: int, base: str) -> bytes | None:
        if self.base(base) is None:
            return None
        a, b = self.state_layout.span(index)
        zeros = {n.removeprefix("param/"): torch.zeros(s, dtype=d) for n, d, s in self.state_specs}
        return encode_chunk(self.state_layout, index, b"".join(obj.read(a, b)), zeros)


class OtherChunkCoder(StateCoder):
    """Codes, against the right base, a chunk that is not the state's (one byte changed): it decodes
    cleanly, to bytes whose hash is not the chunk's digest."""

    def __call__(self, obj: Served, index: int, base: str) -> bytes | None:
        g = self.base(base)
        if g is None:
            return None
        a, b = self.state_layout.span(index)
        chunk = bytearray(b"".join(obj.read(a, b)))
        chunk[-1] ^= 0x01
        return encode_chunk(self.state_layout, index, chunk, g)
