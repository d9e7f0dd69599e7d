"""Chunked content hashes: the definition, parallel = serial, single-chunk proofs, sharded ranks."""

from __future__ import annotations

import hashlib
import itertools
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import chunks, merkle
from protocol.chunks import ChunkError, chunk_proof, combine_shards, hash_stream, shard_digests, verify_chunk
from protocol.tensors import StateKind, canonical_bytes, canonical_size, domain, specs_of, tensor_hash

DOM = domain(StateKind.TRAINING)


def reference(data: bytes, c: int) -> str:
    """The spec's formula, written out with hashlib and the RFC 6962 tree of `protocol.merkle`."""
    leaves = [data[i : i + c] for i in range(0, len(data), c)]
    tree = merkle.merkle_root(leaves)
    body = b"gonka-diloco/chunked/v1\x00" + DOM + struct.pack("<QQ", c, len(data)) + tree
    return hashlib.sha256(body).hexdigest()


@given(st.binary(min_size=1, max_size=3000), st.integers(256, 1024))
@settings(max_examples=60, deadline=None)
def test_definition_and_parallel_equals_serial(data: bytes, c: int) -> None:
    want = reference(data, c)
    pieces = [data[:7], data[7:300], data[300:]]  # buffers need not align with chunks
    assert hash_stream(DOM, pieces, c)[0] == want
    assert hash_stream(DOM, pieces, c, parallel=False)[0] == want


def test_big_state_hashes_in_parallel_and_differs_by_chunk_size_and_kind() -> None:
    g = torch.Generator().manual_seed(0)
    state = {f"param/{i}": torch.randn(300_000, generator=g) for i in range(8)}  # ~9.6 MB: parallel path
    data = canonical_bytes(state)
    assert len(data) == canonical_size(specs_of(state))
    h = tensor_hash(state, StateKind.TRAINING, 1 << 20)
    assert h == reference(data, 1 << 20)
    assert h != tensor_hash(state, StateKind.TRAINING, 1 << 19)
    assert h != tensor_hash(state, StateKind.OPTIMIZER, 1 << 20)


def test_any_chunk_checks_against_the_hash_alone() -> None:
    data = b"".join(hashlib.sha256(bytes([i])).digest() for i in range(88)) + b"tail"
    c = 256
    h, digests = hash_stream(DOM, [data], c)
    n = len(digests)
    assert n == chunks.n_chunks(len(data), c) == 12  # 2820 bytes
    for i in range(n):
        a, b = chunks.chunk_span(i, len(data), c)
        proof = chunk_proof(digests, i)
        assert verify_chunk(h, DOM, c, len(data), i, data[a:b], proof)
        flipped = data[a:b][:-1] + bytes([data[b - 1] ^ 1])
        assert not verify_chunk(h, DOM, c, len(data), i, flipped, proof)  # one bit off
        assert not verify_chunk(h, DOM, c, len(data), (i + 1) % n, data[a:b], proof)  # wrong place
        assert not verify_chunk(h, DOM, c, len(data) + 1, i, data[a:b], proof)  # wrong length
    assert chunks.verify_manifest(h, DOM, c, len(data), digests)
    assert not chunks.verify_manifest(h, DOM, c, len(data), digests[:-1])
    assert not chunks.verify_manifest(h, DOM, c, len(data), [digests[1], digests[0], *digests[2:]])


@pytest.mark.parametrize("edges", [[0, 1000, 2048, 3000], [0, 256, 512, 3000], [0, 1, 2999, 3000]])
def test_ranks_holding_shards_hash_only_their_part(edges: list[int]) -> None:
    """Three ranks with unaligned shards: each sends digests of its whole chunks plus the bytes of the
    chunks it holds only part of; the combination is the whole object's digest list."""
    data = hashlib.sha256(b"x").digest() * 94  # 3008 bytes
    data = data[:3000]
    c = 256
    shards = [shard_digests(a, [data[a:b]], len(data), c) for a, b in itertools.pairwise(edges)]
    _, want = hash_stream(DOM, [data], c)
    assert combine_shards(shards, len(data), c) == want
    travelled = sum(len(b) for s in shards for parts in s.edges.values() for _, b in parts)
    assert travelled <= 2 * c * (len(edges) - 2)  # at most the straddling chunks' bytes
    with pytest.raises(ChunkError, match=r"no shard holds|cover"):
        combine_shards(shards[:-1], len(data), c)


def test_bad_parameters_are_named_errors() -> None:
    with pytest.raises(ChunkError):
        chunks.n_chunks(0, 256)
    with pytest.raises(ChunkError):
        chunks.n_chunks(10, 16)
    with pytest.raises(ChunkError):
        chunks.chunk_span(5, 1000, 256)
