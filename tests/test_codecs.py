"""Codecs: exact rounding rules, error bounds, determinism, and decoders that only raise CodecError."""

from __future__ import annotations

import contextlib
import hashlib
import struct

import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codecs import (
    CodecError,
    body_len,
    decode,
    delta_hash,
    encode,
    from_blob,
    read_header,
    to_blob,
)
from protocol.config import Codec

CODECS = [c for c in Codec if c is not Codec.SPARSE]  # the sparse codec: tests/test_sparse_codec.py
BIG = 1 << 30


def delta(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "h.0.attn.w": torch.randn(33, 20, generator=g) * 1e-3,
        "h.0.ln.b": torch.randn(7, generator=g),
        "scalar": torch.tensor(-0.25),
        "zeros": torch.zeros(3, 5),
        "empty": torch.zeros(0, 4),
    }


def layout(t: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in t.items()}


def blockwise_bound(x: torch.Tensor, block: int, qmax: int) -> torch.Tensor:
    """Half a quantization step of each element's block, plus float32 rounding slack."""
    flat = x.reshape(-1)
    n = flat.numel()
    pad = torch.zeros(-(-n // block) * block)
    pad[:n] = flat.abs()
    step = pad.view(-1, block).amax(1) / qmax
    per = step.repeat_interleave(block)[:n]
    return (per / 2 * (1 + 1e-5) + 1e-30).reshape(x.shape)


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_error_bounds(codec: Codec) -> None:
    d = delta()
    out = decode(encode(d, codec, 16), layout(d))
    assert layout(out) == layout(d)
    for k, x in d.items():
        y = out[k]
        assert y.dtype is torch.float32
        err = (y - x).abs()
        if codec is Codec.FP32:
            assert torch.equal(y, x)
        elif codec is Codec.BF16:
            assert torch.equal(y, x.to(torch.bfloat16).float())
            assert bool((err <= x.abs() * 2**-8).all())
        else:
            qmax = 127 if codec is Codec.INT8 else 7
            assert bool((err <= blockwise_bound(x, 16, qmax)).all()), k
        if k == "zeros":
            assert torch.equal(y, torch.zeros(3, 5))


def test_int8_layout_and_round_half_to_even() -> None:
    # absmax 127 -> scale 1.0, so x / scale is x itself and the rounding rule shows directly.
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 127.0, -3.49, 0.0])
    p = encode({"x": x}, "int8", 8)
    h = read_header(p)
    body = p[h.header_len :]
    assert struct.unpack("<f", body[:4]) == (1.0,)
    assert list(struct.unpack("<8b", body[4:])) == [0, 2, 2, 0, -2, 127, -3, 0]


def test_int4_packing_low_nibble_first_and_zero_padding() -> None:
    x = torch.tensor([7.0, -7.0, 1.0, -1.0, 3.0])  # scale 1.0, odd length
    p = encode({"x": x}, "int4", 8)
    h = read_header(p)
    body = p[h.header_len :]
    assert struct.unpack("<f", body[:4]) == (1.0,)
    assert body[4:] == bytes([0x97, 0xF1, 0x03])  # (7, -7) (1, -1) (3, pad 0)


def test_zero_and_underflowing_blocks_store_scale_zero() -> None:
    x = torch.tensor([1e-45, -1e-45] + [0.0] * 6 + [1.0] * 8)
    out = decode(encode({"x": x}, "int8", 8), {"x": (16,)})["x"]
    assert torch.equal(out[:8], torch.zeros(8))
    assert torch.equal(out[8:], torch.ones(8))


@pytest.mark.parametrize("codec", CODECS)
def test_encoding_is_deterministic_and_order_free(codec: Codec) -> None:
    d = delta()
    p = encode(d, codec, 32)
    assert encode(dict(reversed(list(d.items()))), codec, 32) == p
    assert delta_hash(p) == delta_hash(encode(delta(), codec, 32))
    assert len(p) == read_header(p).header_len + body_len(codec, 32, layout(d))


def test_hash_is_domain_separated_and_changes_with_every_choice() -> None:
    d = delta()
    hashes = {delta_hash(encode(d, c, b)) for c in ("int8", "int4") for b in (16, 32)}
    hashes |= {delta_hash(encode(d, c, 16)) for c in ("fp32", "bf16")}
    assert len(hashes) == 6
    # fp32/bf16 do not depend on the block size
    assert encode(d, "fp32", 16) == encode(d, "fp32", 64)
    p = encode(d, "int8", 16)
    assert delta_hash(p) != hashlib.sha256(p).hexdigest()
    assert delta_hash(p, 256) != delta_hash(p, 512)  # the chunk size is part of the hash
    with pytest.raises(CodecError):
        delta_hash(b"")


@pytest.mark.parametrize("codec", CODECS)
def test_blob_round_trip_and_header_is_plain(codec: Codec) -> None:
    d = delta()
    p = encode(d, codec, 16)
    blob = to_blob(p)
    h = read_header(p)
    assert blob[: h.header_len] == p[: h.header_len]
    assert from_blob(blob, layout(d), max_payload_bytes=len(p), codec=codec, block_size=16) == p


@pytest.mark.parametrize(
    ("tensors", "codec", "block"),
    [
        ({"x": torch.tensor([1.0, float("nan")])}, "int8", 16),
        ({"x": torch.tensor([float("inf")])}, "fp32", 16),
        ({"x": torch.tensor([3.4e38])}, "bf16", 16),  # finite in fp32, overflows bf16
        ({"x": torch.tensor([1e300], dtype=torch.float64)}, "fp32", 16),
        ({"x": torch.tensor([1, 2])}, "int8", 16),
        ({"x": [1.0]}, "int8", 16),
        ({}, "int8", 16),
        ({"": torch.zeros(1)}, "int8", 16),
        ({"x": torch.zeros(1)}, "int2", 16),
        ({"x": torch.zeros(1)}, "int8", 4),
        ({"x": torch.zeros(1)}, "int8", (1 << 20) + 1),
    ],
)
def test_encode_rejects_bad_input(tensors, codec, block) -> None:
    with pytest.raises(CodecError):
        encode(tensors, codec, block)


def test_layout_mismatches_are_refused_before_decompression() -> None:
    d = delta()
    blob = to_blob(encode(d, "int8", 16))
    lay = layout(d)
    bad_layouts = [
        {**lay, "h.0.ln.b": (8,)},
        {k: v for k, v in lay.items() if k != "scalar"},
        {**lay, "extra": (1,)},
        {("renamed" if k == "zeros" else k): v for k, v in lay.items()},
    ]
    for bad in bad_layouts:
        with pytest.raises(CodecError):
            from_blob(blob, bad, max_payload_bytes=BIG)
        with pytest.raises(CodecError):
            decode(from_blob(blob, lay, max_payload_bytes=BIG), bad)
    with pytest.raises(CodecError, match="codec"):
        from_blob(blob, lay, max_payload_bytes=BIG, codec="int4")
    with pytest.raises(CodecError, match="block size"):
        from_blob(blob, lay, max_payload_bytes=BIG, block_size=32)
    with pytest.raises(CodecError, match="exceeds"):
        from_blob(blob, lay, max_payload_bytes=100)


@pytest.mark.parametrize("content_size", [True, False])
def test_zstd_bomb_is_refused(content_size: bool) -> None:
    d = {"w": torch.ones(64)}
    p = encode(d, "int8", 64)
    h = read_header(p)
    bomb = zstandard.ZstdCompressor(write_content_size=content_size).compress(bytes(64 << 20))
    assert len(bomb) < 10_000
    with pytest.raises(CodecError):
        from_blob(p[: h.header_len] + bomb, {"w": (64,)}, max_payload_bytes=BIG)


def test_short_and_corrupt_bodies_are_refused() -> None:
    d = {"w": torch.randn(256)}
    p = encode(d, "int8", 64)
    h = read_header(p)
    comp = zstandard.ZstdCompressor(write_content_size=False)
    for body in (comp.compress(p[h.header_len : -1]), b"not zstd at all", b"", to_blob(p)[h.header_len : -4]):
        with pytest.raises(CodecError):
            from_blob(p[: h.header_len] + body, {"w": (256,)}, max_payload_bytes=BIG)


def _body_patch(p: bytes, offset: int, new: bytes) -> bytes:
    h = read_header(p)
    at = h.header_len + offset
    return p[:at] + new + p[at + len(new) :]


def test_decode_rejects_values_encode_never_writes() -> None:
    lay = {"x": (4,)}
    i8 = encode({"x": torch.tensor([1.0, -2.0, 3.0, 0.5])}, "int8", 8)
    i4 = encode({"x": torch.tensor([1.0, -2.0, 3.0])}, "int4", 8)
    zero = encode({"x": torch.zeros(4)}, "int8", 8)
    f32 = encode({"x": torch.ones(4)}, "fp32", 8)
    bf = encode({"x": torch.ones(4)}, "bf16", 8)
    cases = {
        "NaN or Inf scale": (_body_patch(i8, 0, struct.pack("<f", float("nan"))), lay),
        "negative scale": (_body_patch(i8, 0, struct.pack("<f", -1.0)), lay),
        "below -127": (_body_patch(i8, 4, b"\x80"), lay),
        "below -7": (_body_patch(i4, 4, b"\x08"), {"x": (3,)}),
        "padding nibble": (_body_patch(i4, 5, b"\x13"), {"x": (3,)}),
        "scale is 0": (_body_patch(zero, 4, b"\x01"), lay),
        "NaN or Inf value": (_body_patch(f32, 0, struct.pack("<f", float("inf"))), lay),
        "Inf value": (_body_patch(bf, 0, b"\x80\x7f"), lay),
        "overflow": (_body_patch(i8, 0, struct.pack("<f", 3e38)), lay),
    }
    for what, (payload, lay_) in cases.items():
        with pytest.raises(CodecError, match="NaN or Inf" if what == "overflow" else what):
            decode(payload, lay_)


def test_header_defects_are_named() -> None:
    p = encode({"a": torch.ones(2), "b": torch.ones(3)}, "int8", 8)
    cases = {
        "bad magic": b"XXXX" + p[4:],
        "unsupported version": p[:4] + b"\x09" + p[5:],
        "unknown codec": p[:5] + b"\x09" + p[6:],
        "reserved": p[:6] + b"\x01" + p[7:],
        "block size": p[:8] + struct.pack("<I", 7) + p[12:],
        "tensor count": p[:12] + struct.pack("<I", 0) + p[16:],
        "not strictly sorted": p.replace(b"\x01\x00b", b"\x01\x00a", 1),
        "truncated": p[:20],
        "payload is": p + b"\x00",
    }
    for what, bad in cases.items():
        with pytest.raises(CodecError, match=what):
            decode(bad, {"a": (2,), "b": (3,)})
    fp = encode({"a": torch.ones(2)}, "fp32", 8)
    with pytest.raises(CodecError, match="block size 0"):
        read_header(fp[:8] + struct.pack("<I", 8) + fp[12:])


floats = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(floats, min_size=0, max_size=70),
    st.sampled_from(CODECS),
    st.sampled_from([8, 16, 64]),
)
def test_hypothesis_round_trip(values: list[float], codec: Codec, block: int) -> None:
    x = torch.tensor(values, dtype=torch.float32)
    p = encode({"x": x}, codec, block)
    assert encode({"x": x.clone()}, codec, block) == p
    lay = {"x": (len(values),)}
    y = decode(from_blob(to_blob(p), lay, max_payload_bytes=BIG), lay)["x"]
    if codec is Codec.FP32:
        assert torch.equal(y, x)
    elif codec is Codec.BF16:
        assert torch.equal(y, x.to(torch.bfloat16).float())
    else:
        qmax = 127 if codec is Codec.INT8 else 7
        assert bool(((y - x).abs() <= blockwise_bound(x, block, qmax)).all())


_SEED_T = {"a": torch.randn(5, generator=torch.Generator().manual_seed(1)), "b/c": torch.ones(2, 3)}
SEEDS = {c: encode(_SEED_T, c, 8) for c in CODECS}
SEED_LAYOUT = {"a": (5,), "b/c": (2, 3)}


def _only_codec_errors(fn, *args) -> None:
    """Only the codec's own error may come out; anything else fails the test."""
    with contextlib.suppress(CodecError):
        fn(*args)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(CODECS), st.data())
def test_fuzz_bit_flips_and_truncations(codec: Codec, data: st.DataObject) -> None:
    p = SEEDS[codec]
    bit = data.draw(st.integers(0, len(p) * 8 - 1))
    cut = data.draw(st.integers(0, len(p)))
    flipped = bytearray(p)
    flipped[bit // 8] ^= 1 << (bit % 8)
    blob = bytearray(to_blob(p))
    bbit = data.draw(st.integers(0, len(blob) * 8 - 1))
    blob[bbit // 8] ^= 1 << (bbit % 8)
    for payload in (bytes(flipped), p[:cut]):
        _only_codec_errors(decode, payload, SEED_LAYOUT)
        _only_codec_errors(to_blob, payload)
    for b in (bytes(blob), to_blob(p)[:cut]):
        _only_codec_errors(lambda x: decode(from_blob(x, SEED_LAYOUT, max_payload_bytes=BIG), SEED_LAYOUT), b)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(blob: bytes) -> None:
    for data in (blob, SEEDS[Codec.INT8][:16] + blob):
        _only_codec_errors(decode, data, SEED_LAYOUT)
        _only_codec_errors(lambda x: from_blob(x, SEED_LAYOUT, max_payload_bytes=BIG), data)
        _only_codec_errors(read_header, data)
