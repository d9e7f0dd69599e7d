"""RFC 6962 trees, audit paths and adjacent-pair proofs against a brute-force reference."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.merkle import (
    MerkleError,
    inclusion_proof,
    merkle_root,
    pair_proof,
    verify_inclusion,
    verify_pair,
)

SIZES = range(1, 34)


def H(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def mth(d: list[bytes]) -> bytes:
    """RFC 6962 §2.1 MTH, written straight from the definition."""
    n = len(d)
    if n == 0:
        return H(b"")
    if n == 1:
        return H(b"\x00" + d[0])
    k = 1
    while k * 2 < n:
        k *= 2
    return H(b"\x01" + mth(d[:k]) + mth(d[k:]))


def path_shape(m: int, n: int) -> list[str]:
    """Sides of the audit path for leaf m of n (RFC 6962 PATH), leaf to root."""
    if n == 1:
        return []
    k = 1
    while k * 2 < n:
        k *= 2
    return [*path_shape(m, k), "R"] if m < k else [*path_shape(m - k, n - k), "L"]


def pair_shape(lo: int, n: int, targets: tuple[int, int]) -> object:
    """How a pair proof recombines: proof slots, the two leaves, and the nodes joining them."""
    if not any(lo <= t < lo + n for t in targets):
        return "proof"
    if n == 1:
        return lo - targets[0]
    k = 1
    while k * 2 < n:
        k *= 2
    return (pair_shape(lo, k, targets), pair_shape(lo + k, n - k, targets))


def leaves(n: int) -> list[bytes]:
    return [H(i.to_bytes(4, "big")) for i in range(n)]


def flip(b: bytes, bit: int = 0) -> bytes:
    return bytes([b[0] ^ (1 << bit)]) + b[1:]


def test_known_vectors() -> None:
    # RFC 6962 constants: the empty tree and a single empty leaf.
    assert merkle_root([]).hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert merkle_root([b""]).hex() == "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"


@pytest.mark.parametrize("n", SIZES)
def test_root_matches_definition(n: int) -> None:
    d = leaves(n)
    assert merkle_root(d) == mth(d)


@pytest.mark.parametrize("n", SIZES)
def test_every_inclusion_proof_verifies_and_rejects_tampering(n: int) -> None:
    d = leaves(n)
    root = mth(d)
    for i in range(n):
        proof = inclusion_proof(d, i)
        assert verify_inclusion(d[i], i, n, proof, root)
        assert not verify_inclusion(flip(d[i]), i, n, proof, root)
        assert not verify_inclusion(d[i], i, n, proof, flip(root))
        for j in range(n):
            if j != i and d[j] != d[i]:
                assert not verify_inclusion(d[i], j, n, proof, root)
        # RFC audit paths do not bind the size by themselves (the chain commits leaf_count next to
        # the root): a wrong size verifies exactly when its path has the very same shape.
        for other in range(i + 1, 2 * n + 2):
            if other != n:
                same = path_shape(i, other) == path_shape(i, n)
                assert verify_inclusion(d[i], i, other, proof, root) == same
        for k in range(len(proof)):
            bad = list(proof)
            bad[k] = flip(bad[k], 3)
            assert not verify_inclusion(d[i], i, n, bad, root)
        assert not verify_inclusion(d[i], i, n, [*proof, root], root)
        if proof:
            assert not verify_inclusion(d[i], i, n, proof[:-1], root)


@pytest.mark.parametrize("n", range(2, 34))
def test_every_pair_proof_verifies_and_rejects_tampering(n: int) -> None:
    d = leaves(n)
    root = mth(d)
    for i in range(n - 1):
        proof = pair_proof(d, i)
        assert len(proof) <= 2 * n.bit_length()
        assert verify_pair(d[i], d[i + 1], i, n, proof, root)
        assert not verify_pair(d[i + 1], d[i], i, n, proof, root)
        assert not verify_pair(flip(d[i]), d[i + 1], i, n, proof, root)
        assert not verify_pair(d[i], flip(d[i + 1]), i, n, proof, root)
        assert not verify_pair(d[i], d[i + 1], i, n, proof, flip(root))
        for j in range(n - 1):
            if j != i:
                assert not verify_pair(d[i], d[i + 1], j, n, proof, root)
        for other in range(i + 2, 2 * n + 2):  # as above: only an identically shaped tree verifies
            if other != n:
                same = pair_shape(0, other, (i, i + 1)) == pair_shape(0, n, (i, i + 1))
                assert verify_pair(d[i], d[i + 1], i, other, proof, root) == same
        for k in range(len(proof)):
            bad = list(proof)
            bad[k] = flip(bad[k], 5)
            assert not verify_pair(d[i], d[i + 1], i, n, bad, root)
            assert not verify_pair(d[i], d[i + 1], i, n, proof[:k] + proof[k + 1 :], root)
        assert not verify_pair(d[i], d[i + 1], i, n, [*proof, root], root)


def test_pair_proof_equals_what_two_inclusion_proofs_prove() -> None:
    """Binding: a pair proof for (i, i+1) verifies exactly the leaves the tree holds there."""
    d = leaves(13)
    root = mth(d)
    for i in range(12):
        assert verify_inclusion(d[i], i, 13, inclusion_proof(d, i), root)
        assert verify_inclusion(d[i + 1], i + 1, 13, inclusion_proof(d, i + 1), root)
        assert verify_pair(d[i], d[i + 1], i, 13, pair_proof(d, i), root)


@pytest.mark.parametrize(
    "call",
    [
        lambda: inclusion_proof(leaves(3), 3),
        lambda: inclusion_proof(leaves(3), -1),
        lambda: inclusion_proof([], 0),
        lambda: pair_proof(leaves(3), 2),
        lambda: pair_proof(leaves(1), 0),
        lambda: pair_proof(leaves(4), -1),
        lambda: merkle_root(["not bytes"]),  # type: ignore[list-item]
    ],
)
def test_bad_requests_raise_merkle_error(call) -> None:
    with pytest.raises(MerkleError):
        call()


def test_verifiers_answer_false_on_malformed_input() -> None:
    d = leaves(4)
    root = mth(d)
    proof = inclusion_proof(d, 1)
    assert not verify_inclusion(d[1], 1, 0, proof, root)
    assert not verify_inclusion(d[1], 1, 4, [p[:31] for p in proof], root)
    assert not verify_inclusion(d[1], 1, 4, proof, root[:31])
    assert not verify_inclusion(d[1], 1, 4, ["ab" * 32] * 2, root)  # type: ignore[list-item]
    assert not verify_inclusion("x", 1, 4, proof, root)  # type: ignore[arg-type]
    pp = pair_proof(d, 1)
    assert not verify_pair(d[1], d[2], 3, 4, pp, root)
    assert not verify_pair(d[1], d[2], 1, 1, pp, root)
    assert not verify_pair(d[1], d[2], 1, 4, [*pp, b"short"], root)


@given(st.lists(st.binary(max_size=40), min_size=2, max_size=40), st.data())
def test_random_trees_round_trip(d: list[bytes], data: st.DataObject) -> None:
    root = merkle_root(d)
    assert root == mth(d)
    i = data.draw(st.integers(0, len(d) - 2))
    assert verify_inclusion(d[i], i, len(d), inclusion_proof(d, i), root)
    assert verify_pair(d[i], d[i + 1], i, len(d), pair_proof(d, i), root)
