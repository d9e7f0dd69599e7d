"""RFC 6962 Merkle trees over trajectory leaves, with single-leaf and adjacent-pair proofs.

A host commits to its segment-boundary state hashes with one root; later it opens a segment
(its start and end leaves, which are adjacent) with one `pair_proof`. Hashing follows RFC 6962 /
RFC 9162: leaf = SHA-256(0x00 || data), node = SHA-256(0x01 || left || right), and a tree of n
leaves splits at the largest power of two smaller than n.

Like RFC 6962 audit paths, a proof does not bind the tree size on its own (a larger tree whose
path to the leaf has the same shape recomputes the same root); the size is trusted because the
chain records `leaf_count` next to the root.

Proof generators raise `MerkleError` on bad arguments; verifiers only ever answer True/False,
because what they check comes from untrusted peers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

HASH_LEN = 32
MAX_TREE_SIZE = 1 << 32


class MerkleError(ValueError):
    """A proof was requested for an index or tree that does not exist."""


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """Largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def _check_leaves(leaves: Sequence[bytes]) -> list[bytes]:
    if len(leaves) > MAX_TREE_SIZE:
        raise MerkleError(f"more than {MAX_TREE_SIZE} leaves")
    for i, d in enumerate(leaves):
        if not isinstance(d, bytes | bytearray):
            raise MerkleError(f"leaf {i} must be bytes, got {type(d).__name__}")
    return [leaf_hash(bytes(d)) for d in leaves]


def _root(hashes: Sequence[bytes]) -> bytes:
    """MTH over already-hashed leaves, level by level (RFC split rule == carry odd node up)."""
    level = list(hashes)
    while len(level) > 1:
        nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]); the empty tree's root is SHA-256 of the empty string, as in RFC 6962."""
    hashes = _check_leaves(leaves)
    if not hashes:
        return hashlib.sha256(b"").digest()
    return _root(hashes)


def _path(hashes: Sequence[bytes], m: int) -> list[bytes]:
    """RFC 6962 PATH(m, D[n]), leaf-to-root order."""
    n = len(hashes)
    if n == 1:
        return []
    k = _split(n)
    if m < k:
        return [*_path(hashes[:k], m), _root(hashes[k:])]
    return [*_path(hashes[k:], m - k), _root(hashes[:k])]


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """Audit path for leaf `index`."""
    hashes = _check_leaves(leaves)
    if not isinstance(index, int) or not 0 <= index < len(hashes):
        raise MerkleError(f"index {index!r} outside a tree of {len(hashes)} leaves")
    return _path(hashes, index)


def _valid_hashes(proof: object) -> bool:
    return isinstance(proof, list | tuple) and all(
        isinstance(p, bytes | bytearray) and len(p) == HASH_LEN for p in proof
    )


def _valid_root(root: object) -> bool:
    return isinstance(root, bytes | bytearray) and len(root) == HASH_LEN


def root_of_hashes(hashes: Sequence[bytes]) -> bytes:
    """MTH over leaves that are already leaf hashes (e.g. chunk digests, `protocol.chunks`)."""
    if not hashes or len(hashes) > MAX_TREE_SIZE:
        raise MerkleError(f"a tree of {len(hashes)} leaves")
    return _root(hashes)


def inclusion_proof_of_hashes(hashes: Sequence[bytes], index: int) -> list[bytes]:
    """Audit path for leaf `index` of a tree given by its leaf hashes."""
    if not isinstance(index, int) or not 0 <= index < len(hashes) <= MAX_TREE_SIZE:
        raise MerkleError(f"index {index!r} outside a tree of {len(hashes)} leaves")
    return _path(hashes, index)


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2: recompute the root from the leaf and its audit path."""
    if not (isinstance(leaf, bytes | bytearray) and _valid_root(root)):
        return False
    got = root_from_path(leaf_hash(bytes(leaf)), index, size, proof)
    return got is not None and got == bytes(root)


def root_from_path(r: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes | None:
    """The root an audit path leads to from leaf hash `r`, or None if the path cannot fit (index, size)."""
    if not _valid_hashes(proof):
        return None
    if not (isinstance(index, int) and isinstance(size, int) and 0 <= index < size <= MAX_TREE_SIZE):
        return None
    fn, sn = index, size - 1
    for p in proof:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = node_hash(bytes(p), r)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, bytes(p))
        fn >>= 1
        sn >>= 1
    return r if sn == 0 else None


def _pair_collect(hashes: Sequence[bytes], lo: int, targets: tuple[int, int], out: list[bytes]) -> None:
    """Depth-first, left to right: emit the root of every subtree that holds neither target."""
    n = len(hashes)
    if not any(lo <= t < lo + n for t in targets):
        out.append(_root(hashes))
        return
    if n == 1:
        return
    k = _split(n)
    _pair_collect(hashes[:k], lo, targets, out)
    _pair_collect(hashes[k:], lo + k, targets, out)


def pair_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """One proof for the adjacent leaves `index` and `index + 1` (a segment's two ends).

    It carries, in depth-first left-to-right order, the root of every maximal subtree that
    holds neither leaf; its shape depends only on (index, size), so the verifier rebuilds it.
    """
    hashes = _check_leaves(leaves)
    if not isinstance(index, int) or not 0 <= index < len(hashes) - 1:
        raise MerkleError(f"pair index {index!r} outside a tree of {len(hashes)} leaves")
    out: list[bytes] = []
    _pair_collect(hashes, 0, (index, index + 1), out)
    return out


def _pair_rebuild(lo: int, n: int, known: dict[int, bytes], proof: Iterator[bytes]) -> bytes | None:
    if not any(lo <= t < lo + n for t in known):
        return next(proof, None)
    if n == 1:
        return known[lo]
    k = _split(n)
    left = _pair_rebuild(lo, k, known, proof)
    right = _pair_rebuild(lo + k, n - k, known, proof)
    if left is None or right is None:
        return None
    return node_hash(left, right)


def verify_pair(
    left: bytes, right: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> bool:
    """Check that `left` is leaf `index` and `right` is leaf `index + 1` of the tree with `root`."""
    if not (isinstance(left, bytes | bytearray) and isinstance(right, bytes | bytearray)):
        return False
    if not (_valid_hashes(proof) and _valid_root(root)):
        return False
    if not (isinstance(index, int) and isinstance(size, int) and 0 <= index < size - 1 < MAX_TREE_SIZE):
        return False
    known = {index: leaf_hash(bytes(left)), index + 1: leaf_hash(bytes(right))}
    it = iter(bytes(p) for p in proof)
    got = _pair_rebuild(0, size, known, it)
    if got is None or next(it, None) is not None:  # too few or too many proof hashes
        return False
    return got == bytes(root)
