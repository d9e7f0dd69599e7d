"""Deterministic randomness (DESIGN §4): every random choice is SHA-256 of a ':'-joined string.

Any node, and any other implementation, recomputes the same batches, sampled segments and
verifiers from public inputs only (run seed, block hash, addresses), so nobody can steer them
and everybody can check them. Selections are sha256-keyed sorts; integers in a range are drawn
by rejection sampling over 64-bit words, so there is no modulo bias.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

Part = str | int

_HEX = re.compile(r"^[0-9a-f]+$")
_U64 = 1 << 64


class PrfError(ValueError):
    """A PRF input is out of range (bad bound, bad count, malformed block hash)."""


def _message(seed: Part, parts: Iterable[Part]) -> bytes:
    return ":".join(str(p) for p in (seed, *parts)).encode()


def prf_bytes(seed: Part, *parts: Part) -> bytes:
    """sha256("{seed}:{part1}:{part2}…") — the one primitive everything below is built from."""
    return hashlib.sha256(_message(seed, parts)).digest()


def _words(seed: Part, parts: tuple[Part, ...]) -> Iterable[int]:
    """Big-endian 64-bit words of d0 = prf_bytes(seed, *parts), then d1 = sha256(d0), d2 = …"""
    digest = prf_bytes(seed, *parts)
    while True:
        for i in range(0, 32, 8):
            yield int.from_bytes(digest[i : i + 8], "big")
        digest = hashlib.sha256(digest).digest()


def prf_int(seed: Part, *parts: Part, bound: int) -> int:
    """Uniform integer in [0, bound): the first word w < 2^64 − (2^64 mod bound), reduced mod bound."""
    if not isinstance(bound, int) or isinstance(bound, bool) or not 1 <= bound <= _U64:
        raise PrfError(f"bound must be an integer in [1, 2^64], got {bound!r}")
    limit = _U64 - (_U64 % bound)
    for w in _words(seed, parts):
        if w < limit:
            return w % bound
    raise AssertionError("unreachable: the word stream is infinite")


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


def verifier_ranking(block_hash_hex: str, host: str, verifiers: Iterable[str]) -> list[str]:
    """All distinct verifiers except the host, ordered by sha256(block:verifier:host:address)."""
    seed = _block_seed(block_hash_hex)
    candidates = {a for a in verifiers if a != host}
    return sorted(candidates, key=lambda a: (prf_bytes(seed, "verifier", host, a), a))


def assign_verifiers(
    block_hash_hex: str, host: str, verifiers: Iterable[str], v: int, round: int = 0
) -> list[str]:
    """Round r takes ranks [r·v, (r+1)·v) of the keyed ranking: rounds are disjoint.

    With too few verifiers a round returns as many as remain (possibly none); the order of
    `verifiers` and duplicates in it never matter.
    """
    if v < 1 or round < 0:
        raise PrfError(f"need v >= 1 and round >= 0, got v={v}, round={round}")
    ranked = verifier_ranking(block_hash_hex, host, verifiers)
    return ranked[round * v : (round + 1) * v]
