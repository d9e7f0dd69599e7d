"""protocol.statecode: chunks of a training state coded against G_n round-trip exactly for any
layout and chunk size, decode alone, and any other input is one StateCodeError (fuzzed); a chunk
coded against another base, or of another state, is caught by its digest."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import chunks
from protocol.statecode import (
    HEADER,
    StateCodeError,
    StateLayout,
    Transform,
    coded_transform,
    decode_chunk,
    decode_verified,
    encode_chunk,
    max_coded_len,
)
from protocol.tensors import canonical_bytes, specs_of

State = dict[str, torch.Tensor]


def _state(seed: int, shapes: list[tuple[int, ...]], moved: float = 1e-3) -> tuple[State, State]:
    """A training-state-like tensor set (float32 params near a base, int8/uint8 codes, scales) and
    its base (G_n's params)."""
    g = torch.Generator().manual_seed(seed)
    base = {f"w{i}": torch.randn(s, generator=g) for i, s in enumerate(shapes)}
    state: dict[str, torch.Tensor] = {"step": torch.tensor(7.0)}
    for n, t in base.items():
        state[f"param/{n}"] = t + moved * torch.randn(t.shape, generator=g)
        state[f"exp_avg_code/{n}"] = torch.randint(-127, 128, t.shape, generator=g).to(torch.int8)
        state[f"exp_avg_sq/{n}"] = torch.rand(t.shape, generator=g) * 1e-4
    return state, base


def _roundtrip(state: dict, base: dict | None, chunk_bytes: int) -> tuple[int, int]:
    data = canonical_bytes(state)
    layout = StateLayout.of(specs_of(state), chunk_bytes)
    assert layout.total == len(data)
    coded_total = 0
    for i in range(layout.n_chunks):
        a, b = layout.span(i)
        assert sum(p.end - p.start for p in layout.pieces(i)) == b - a
        coded = encode_chunk(layout, i, data[a:b], base)
        assert len(coded) <= max_coded_len(layout, i)
        assert coded_transform(coded) is (Transform.DIFF if base is not None else Transform.PLANES)
        digest = chunks.chunk_digest(data[a:b])
        assert decode_verified(layout, i, coded, digest, base) == data[a:b]
        coded_total += len(coded)
    return len(data), coded_total


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 1000),
    shapes=st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple), min_size=1, max_size=4),
    chunk=st.integers(256, 5000),
    with_base=st.booleans(),
)
def test_any_layout_and_chunk_size_round_trips(seed: int, shapes: list, chunk: int, with_base: bool) -> None:
    state, base = _state(seed, shapes)
    _roundtrip(state, base if with_base else None, chunk)


def test_params_near_their_base_code_smaller_than_without() -> None:
    state, base = _state(0, [(256, 64), (64,)])
    raw, planes = _roundtrip(state, None, 1 << 16)
    _, diff = _roundtrip(state, base, 1 << 16)
    assert diff < planes < raw


def _coded(chunk: int = 1024) -> tuple[StateLayout, bytes, list[bytes], dict, dict]:
    state, base = _state(1, [(40, 30), (30,)])
    data = canonical_bytes(state)
    layout = StateLayout.of(specs_of(state), chunk)
    digests = [chunks.chunk_digest(data[a:b]) for a, b in (layout.span(i) for i in range(layout.n_chunks))]
    return layout, data, digests, state, base


def test_another_base_or_another_chunk_is_caught_by_the_digest() -> None:
    layout, data, digests, _, base = _coded()
    i = next(i for i in range(layout.n_chunks) if any(p.base for p in layout.pieces(i)))  # holds params
    a, b = layout.span(i)
    honest = encode_chunk(layout, i, data[a:b], base)
    assert decode_verified(layout, i, honest, digests[i], base) == data[a:b]
    other_base = {n: t + 1e-3 for n, t in base.items()}
    lying = encode_chunk(layout, i, data[a:b], other_base)  # coded against a base we do not hold
    with pytest.raises(StateCodeError, match="digest"):
        decode_verified(layout, i, lying, digests[i], base)
    other, _ = _state(2, [(40, 30), (30,)])  # a chunk of another state, right index and length
    od = canonical_bytes(other)
    with pytest.raises(StateCodeError, match="digest"):
        decode_verified(layout, i, encode_chunk(layout, i, od[a:b], base), digests[i], base)


def test_bad_coded_chunks_are_one_error() -> None:
    layout, data, _, _, base = _coded()
    a, b = layout.span(1)
    good = encode_chunk(layout, 1, data[a:b], base)
    frame = good[HEADER.size :]
    cases = {
        "short": good[:10],
        "magic": b"XXXX" + good[4:],
        "version": good[:4] + b"\x02" + good[5:],
        "transform": good[:5] + b"\x09" + good[6:],
        "reserved": good[:6] + b"\x01\x00" + good[8:],
        "index": HEADER.pack(b"GDSC", 1, 2, 0, 0, b - a) + frame,
        "length": HEADER.pack(b"GDSC", 1, 2, 0, 1, b - a + 1) + frame,
        "trailing": good + b"junk",
        "truncated": good[:-3],
        "oversized": good + bytes(max_coded_len(layout, 1)),
        "no frame": good[: HEADER.size] + b"\x00" * 20,
    }
    for name, bad in cases.items():
        with pytest.raises(StateCodeError):
            decode_chunk(layout, 1, bad, base)
        assert name
    with pytest.raises(StateCodeError, match="base"):
        decode_chunk(layout, 1, good, None)  # DIFF needs the base
    with pytest.raises(StateCodeError):
        encode_chunk(layout, 1, data[a : b - 1], base)
    i = next(i for i in range(layout.n_chunks) if any(p.base for p in layout.pieces(i)))
    a, b = layout.span(i)
    with pytest.raises(StateCodeError, match="base has no"):
        encode_chunk(layout, i, data[a:b], {"w0": torch.zeros(3), "w1": torch.zeros(3)})


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fuzzed_coded_chunks_decode_or_raise_one_error(data: st.DataObject) -> None:
    layout, raw, digests, _, base = _coded()
    i = data.draw(st.integers(0, layout.n_chunks - 1))
    a, b = layout.span(i)
    good = bytearray(encode_chunk(layout, i, raw[a:b], base))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(good) - 1))
        good[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        good = good[: data.draw(st.integers(0, len(good)))]
    with contextlib.suppress(StateCodeError):
        decode_verified(layout, i, bytes(good), digests[i], base)


def test_statecode_vectors() -> None:
    """specs/vectors/statecode.json: each chunk's pieces and DIFF body from the inputs, and its
    given coding decodes to the chunk (§8.2)."""
    import json

    from protocol.tensors import decode_canonical
    from specs.make_vectors import VECTORS
    from specs.state_vectors import _floats

    for v in json.loads((VECTORS / "statecode.json").read_text()):
        data = bytes.fromhex(v["input"]["canonical"])
        base = {n: _floats(b) for n, b in v["input"]["base"].items()}
        layout = StateLayout.of(specs_of(decode_canonical(data)), v["input"]["chunk_bytes"])
        for i, want in enumerate(v["output"]["chunks"]):
            a, b = layout.span(i)
            assert [[p.start, p.end, p.itemsize, p.base, p.first] for p in layout.pieces(i)] == want["pieces"]
            assert decode_chunk(layout, i, bytes.fromhex(want["one_coding"]), base) == data[a:b]
            coded = encode_chunk(layout, i, data[a:b], base)
            import zstandard

            assert zstandard.ZstdDecompressor().decompress(coded[HEADER.size :]).hex() == want["diff_body"]
