"""Hostile blob holders: a slow one (correct bytes on a bad link, or a trickle to stall a fetch)
and one serving garbage chunks under an honest manifest.

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

from nodekit.serve import BytesObject


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
