"""A slow blob holder: correct bytes on a bad link, or a peer that trickles to stall a fetch.

The rule it attacks: a fetch hedges a chunk that has not arrived in its share of the time to an
idle holder and drops a holder below the byte-rate floor (`nodekit.fetch`), so a holder listed
first that serves slowly costs about one hedge, never its chunks' full time.
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
