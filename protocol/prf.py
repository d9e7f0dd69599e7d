"""Deterministic randomness (DESIGN §4): every random choice is SHA-256 of a ':'-joined string.

Any node, and any other implementation, recomputes the same batches, sampled segments and
verifiers from public inputs only (run seed, block hash, addresses), so nobody can steer them
and everybody can check them. Segment selections are sha256-keyed sorts; verifier draws are
weighted by bonded stake (integer-only successive sampling); integers in a range are drawn by
rejection sampling over 64-bit words, so there is no modulo bias and no float in any draw.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

Part = str | int

_HEX = re.compile(r"^[0-9a-f]+$")
_U64 = 1 << 64
MAX_BOUND = 1 << 256
"""Largest `prf_int` bound: far above any sum of stakes in ngonka."""
BPS = 10_000
"""Probabilities on chain are integers in basis points (no floats in state transitions)."""
SEED_TAG = b"gonka-diloco/seed/v1\x00"
"""Domain tag of `seed_from_blocks`."""


class PrfError(ValueError):
    """A PRF input is out of range (bad bound, bad count, malformed block hash)."""


def _message(seed: Part, parts: Iterable[Part]) -> bytes:
    return ":".join(str(p) for p in (seed, *parts)).encode()


def prf_bytes(seed: Part, *parts: Part) -> bytes:
    """sha256("{seed}:{part1}:{part2}…") — the one primitive everything below is built from."""
    return hashlib.sha256(_message(seed, parts)).digest()


def _words(seed: Part, parts: tuple[Part, ...]) -> Iterator[int]:
    """Big-endian 64-bit words of d0 = prf_bytes(seed, *parts), then d1 = sha256(d0), d2 = …"""
    digest = prf_bytes(seed, *parts)
    while True:
        for i in range(0, 32, 8):
            yield int.from_bytes(digest[i : i + 8], "big")
        digest = hashlib.sha256(digest).digest()


def prf_int(seed: Part, *parts: Part, bound: int) -> int:
    """Uniform integer in [0, bound) by rejection sampling over the word stream.

    Each sample is m = max(1, ceil(bitlen(bound − 1) / 64)) consecutive words read as one
    big-endian integer w < 2^(64m); the first w < 2^(64m) − (2^(64m) mod bound) gives w mod bound.
    For bound ≤ 2^64 (m = 1) that is one word per sample. Larger bounds (a sum of stakes) need m > 1.
    """
    if not isinstance(bound, int) or isinstance(bound, bool) or not 1 <= bound <= MAX_BOUND:
        raise PrfError(f"bound must be an integer in [1, 2^256], got {bound!r}")
    m = max(1, -(-(bound - 1).bit_length() // 64))
    span = 1 << (64 * m)
    limit = span - (span % bound)
    words = _words(seed, parts)
    while True:
        w = 0
        for _ in range(m):
            w = (w << 64) | next(words)
        if w < limit:
            return w % bound


def coin(seed: Part, item_id: Part) -> float:
    """A per-item coin in [0, 1): the top 53 bits of sha256("{seed}:{item_id}") over 2^53."""
    return (int.from_bytes(prf_bytes(seed, item_id)[:8], "big") >> 11) / float(1 << 53)


def _block_seed(block_hash_hex: str) -> str:
    if not isinstance(block_hash_hex, str) or not _HEX.match(block_hash_hex.lower()):
        raise PrfError(f"block hash must be a non-empty hex string, got {block_hash_hex!r}")
    return block_hash_hex.lower()


def shard_index(run_seed: int, host: str, n_shards: int) -> int:
    """Which data shard a host trains on for the whole run."""
    return prf_int(run_seed, "shard", host, bound=n_shards)


def batch_offsets(
    run_seed: int, host: str, outer_step: int, inner_step: int, batch_size: int, n_positions: int
) -> list[int]:
    """Start positions of one inner step's batch within the host's shard (independent draws)."""
    if batch_size < 0:
        raise PrfError(f"batch_size must be >= 0, got {batch_size}")
    return [
        prf_int(run_seed, "batch", host, outer_step, inner_step, b, bound=n_positions)
        for b in range(batch_size)
    ]


def sample_segments(block_hash_hex: str, host: str, n_segments: int, s: int) -> list[int]:
    """s distinct segments of n, sorted; the last one (n−1) always, the other s−1 by keyed sort.

    The last segment is always opened because it ends at θ_H, the state Δ is computed from.
    """
    seed = _block_seed(block_hash_hex)
    if n_segments < 1 or not 1 <= s <= n_segments:
        raise PrfError(f"need 1 <= s <= n_segments, got s={s}, n_segments={n_segments}")
    others = sorted(range(n_segments - 1), key=lambda i: prf_bytes(seed, "segment", host, i))
    return sorted([*others[: s - 1], n_segments - 1])


def window_blocks(n_segments: int, w: int) -> int:
    """B = ⌈n / w⌉: the aligned blocks a trajectory of n segments splits into (the last may be short)."""
    if n_segments < 1 or w < 1:
        raise PrfError(f"need n_segments >= 1 and w >= 1, got n_segments={n_segments}, w={w}")
    return -(-n_segments // w)


def lone_last_block(n_segments: int, w: int) -> bool:
    """The last block is segment n − 1 alone (n mod w = 1, n > w): no window sums it with another,
    so in tolerance mode the window before takes it on (specs §6.4, `RunConfig.lone_last`)."""
    return n_segments > w and (n_segments - 1) % w == 0


def window(start: int, n_segments: int, w: int) -> list[int]:
    """The segments of the window (block) that starts at segment `start`."""
    return list(range(start, min(n_segments, start + w)))


def draw_windows(block_hash_hex: str, host: str, n_segments: int, w: int, slots: int) -> list[int]:
    """The start segment of each checker slot's window: the B aligned blocks of w segments in
    sha256-keyed order, slot j taking block j (cycling once every block is taken).

    Distinct slots get distinct blocks while there are blocks left, so c checkers cover c blocks;
    every block is equally likely, so no segment is safer to fake than another.
    """
    seed = _block_seed(block_hash_hex)
    blocks = window_blocks(n_segments, w)
    if slots < 0:
        raise PrfError(f"need slots >= 0, got {slots}")
    order = sorted(range(blocks), key=lambda b: prf_bytes(seed, "window", host, b))
    return [order[j % blocks] * w for j in range(slots)]


def windows_opened(starts: Iterable[int], n_segments: int, w: int) -> list[int]:
    """The segments a windowed contribution opens: every slot's window, and the last segment
    (its end leaf is θ_H, which every checker checks Δ against), sorted."""
    opened = {n_segments - 1}
    for start in starts:
        opened.update(window(start, n_segments, w))
    return sorted(opened)


def seed_from_blocks(block_hashes: Sequence[str]) -> str:
    """The seed of a challenge or audit draw: SHA-256 over several consecutive block hashes.

    sha256("gonka-diloco/seed/v1" ‖ 0x00 ‖ UTF-8 of the lower-cased hashes joined by ":"), hex.
    Blocks with different proposers each control one input, never the whole seed.
    """
    if not block_hashes:
        raise PrfError("need at least one block hash")
    joined = ":".join(_block_seed(h) for h in block_hashes)
    return hashlib.sha256(SEED_TAG + joined.encode()).hexdigest()


def audited(seed_hex: str, host: str, audit_bps: int) -> bool:
    """The audit lottery of one accepted contribution: prf_int(seed, "audit", host, 10000) < audit_bps."""
    if not 0 <= audit_bps <= BPS:
        raise PrfError(f"audit_bps must be in [0, {BPS}], got {audit_bps}")
    return prf_int(_block_seed(seed_hex), "audit", host, bound=BPS) < audit_bps


class StakePool:
    """Bonded verifiers and their stakes, ready for many stake-weighted draws in one block.

    Weighted sampling without replacement, integers only (`draw`): each pick i draws
    x = prf_int(seed, "verifier", host, round, i, bound=R) over the remaining weight R and takes
    the first remaining candidate, in address order, whose cumulative stake exceeds x. A Fenwick
    tree over the address-ordered stakes makes a pick O(log n), and the pool is built once per
    block for all hosts: a challenge over h hosts costs O(n + h·(v + excluded)·log n).
    Zero-stake entries can never be drawn: Sybil keys without stake buy nothing.
    """

    def __init__(self, stakes: Mapping[str, int]) -> None:
        for a, w in stakes.items():
            if not isinstance(w, int) or isinstance(w, bool) or w < 0:
                raise PrfError(f"stake of {a} must be a non-negative integer, got {w!r}")
        self.addresses = sorted(a for a, w in stakes.items() if w > 0)
        self.weights = [stakes[a] for a in self.addresses]
        self.position = {a: i for i, a in enumerate(self.addresses)}
        self.total = sum(self.weights)
        self._tree = [0] * (len(self.addresses) + 1)  # Fenwick tree, 1-based
        for i, w in enumerate(self.weights):
            self._add(i, w)

    def _add(self, i: int, delta: int) -> None:
        j = i + 1
        while j < len(self._tree):
            self._tree[j] += delta
            j += j & -j

    def _find(self, x: int) -> int:
        """The smallest index whose prefix sum of (remaining) weights exceeds x."""
        pos, step = 0, 1 << len(self._tree).bit_length()
        while step:
            nxt = pos + step
            if nxt < len(self._tree) and self._tree[nxt] <= x:
                pos = nxt
                x -= self._tree[nxt]
            step >>= 1
        return pos  # 0-based index of the candidate

    def draw(
        self, block_hash_hex: str, host: str, count: int, round: int = 0, exclude: Iterable[str] = ()
    ) -> list[str]:
        """Up to `count` distinct verifiers, never `host` nor one in `exclude`, weighted by stake.

        Fewer (possibly none) when the remaining stake runs out. The pool is unchanged afterwards.
        """
        seed = _block_seed(block_hash_hex)
        if count < 0 or round < 0:
            raise PrfError(f"need count >= 0 and round >= 0, got count={count}, round={round}")
        removed: list[int] = []
        remaining = self.total
        for a in {host, *exclude}:
            i = self.position.get(a)
            if i is not None:
                self._add(i, -self.weights[i])
                removed.append(i)
                remaining -= self.weights[i]
        picks: list[str] = []
        try:
            for i in range(count):
                if remaining <= 0:
                    break
                j = self._find(prf_int(seed, "verifier", host, round, i, bound=remaining))
                picks.append(self.addresses[j])
                self._add(j, -self.weights[j])
                removed.append(j)
                remaining -= self.weights[j]
        finally:
            for j in removed:
                self._add(j, self.weights[j])
        return picks


def assign_verifiers(
    block_hash_hex: str,
    host: str,
    stakes: Mapping[str, int],
    v: int,
    round: int = 0,
    exclude: Iterable[str] = (),
) -> list[str]:
    """v verifiers for `host`, drawn by bonded stake (`StakePool.draw`): the one verifier draw.

    Each round (and an audit) passes its own `round`, and the verifiers already assigned as
    `exclude`, so rounds are disjoint. With too little stake left it returns fewer, possibly none.
    """
    if v < 1:
        raise PrfError(f"need v >= 1, got v={v}")
    return StakePool(stakes).draw(block_hash_hex, host, v, round, exclude)
