"""Canonical tensor form: uniqueness, hashing by kind, and a decoder that only raises its own error."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.tensors import (
    StateKind,
    TensorFormatError,
    canonical_bytes,
    decode_canonical,
    domain,
    hash_canonical,
    tensor_digest,
    tensor_hash,
)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=g).to(dtype)


def state() -> dict[str, torch.Tensor]:
    return {"param/w": sample(torch.float32, (4, 3)), "exp_avg/w": sample(torch.bfloat16, (4, 3), 1),
            "step": torch.tensor(7.0)}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_layout_is_exactly_as_specified() -> None:
    data = canonical_bytes({"b": torch.tensor([1.0, -2.0]), "a": torch.tensor([[3]], dtype=torch.int32)})
    expected = (
        b"GDTS" + bytes([1, 0, 0, 0]) + struct.pack("<I", 2)
        + struct.pack("<H", 1) + b"a" + bytes([6, 2]) + struct.pack("<QQQ", 1, 1, 4)
        + struct.pack("<H", 1) + b"b" + bytes([1, 1]) + struct.pack("<QQ", 2, 8)
        + struct.pack("<i", 3) + struct.pack("<ff", 1.0, -2.0)
    )
    assert data == expected
    # one chunk: SHA-256(prefix ‖ domain ‖ c ‖ L ‖ SHA-256(0x00 ‖ bytes)), protocol/chunks.py
    c = 1 << 20
    tree = hashlib.sha256(b"\x00" + expected).digest()
    want = hashlib.sha256(
        b"gonka-diloco/chunked/v1\x00" + domain(StateKind.MODEL) + struct.pack("<QQ", c, len(expected)) + tree
    ).hexdigest()
    assert tensor_hash({"b": torch.tensor([1.0, -2.0]), "a": torch.tensor([[3]], dtype=torch.int32)},
                       StateKind.MODEL, c) == want


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(dtype: torch.dtype) -> None:
    tensors = {"x": sample(dtype, (3, 5)), "scalar": sample(dtype, ()), "empty": sample(dtype, (0, 4))}
    data = canonical_bytes(tensors)
    back = decode_canonical(data)
    assert same(back, tensors)
    assert canonical_bytes(back) == data


def test_hash_ignores_insertion_order_memory_layout_and_grad() -> None:
    s = state()
    w = s["param/w"]
    reordered = {"step": s["step"], "exp_avg/w": s["exp_avg/w"], "param/w": w.t().contiguous().t()}
    assert not reordered["param/w"].is_contiguous()
    assert tensor_hash(reordered, StateKind.TRAINING) == tensor_hash(s, StateKind.TRAINING)
    s_grad = dict(s, **{"param/w": w.clone().requires_grad_()})
    assert tensor_hash(s_grad, StateKind.TRAINING) == tensor_hash(s, StateKind.TRAINING)


def test_hash_separates_kinds_and_matches_byte_form() -> None:
    s = state()
    hashes = {tensor_hash(s, k) for k in StateKind}
    assert len(hashes) == len(StateKind)
    for k in StateKind:
        assert hash_canonical(canonical_bytes(s), k) == tensor_hash(s, k)
        assert tensor_digest(s, k).hex() == tensor_hash(s, k)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.update({"param/w": s["param/w"].clone().fill_(9.0)}),
        lambda s: s.update({"param/w": s["param/w"].reshape(3, 4)}),
        lambda s: s.update({"param/w": s["param/w"].double()}),
        lambda s: s.update({"step": torch.tensor(8.0)}),
        lambda s: s.update({"param/v": s.pop("param/w")}),
        lambda s: s.pop("step"),
        lambda s: s.update({"extra": torch.zeros(0)}),
    ],
)
def test_any_change_changes_the_hash(change) -> None:
    s = state()
    before = tensor_hash(s, StateKind.TRAINING)
    change(s)
    assert tensor_hash(s, StateKind.TRAINING) != before


def test_bf16_and_negative_zero_are_hashed_by_bits() -> None:
    a = {"x": torch.tensor([0.0])}
    b = {"x": torch.tensor([-0.0])}
    assert tensor_hash(a, StateKind.MODEL) != tensor_hash(b, StateKind.MODEL)
    x = torch.tensor([1.0, 2.5], dtype=torch.bfloat16)
    assert canonical_bytes({"x": x})[-4:] == x.view(torch.int16).numpy().astype("<i2").tobytes()


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"": torch.zeros(1)},
        {"x": [1.0]},
        {"x": torch.zeros(2, dtype=torch.complex64)},
        {"\ud800": torch.zeros(1)},
        {"x" * 1025: torch.zeros(1)},
        {1: torch.zeros(1)},
        [("x", torch.zeros(1))],
    ],
)
def test_encoder_rejects_bad_sets(bad) -> None:
    with pytest.raises(TensorFormatError):
        canonical_bytes(bad)


def _rewrite(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new):]


def test_decoder_rejects_each_kind_of_defect() -> None:
    good = canonical_bytes({"a": torch.ones(2), "b": torch.zeros(1, dtype=torch.uint8)})
    assert decode_canonical(good)
    name_b = good.index(b"\x01\x00b")
    cases = {
        "bad magic": _rewrite(good, 0, b"XXXX"),
        "unsupported version": _rewrite(good, 4, b"\x02"),
        "reserved": _rewrite(good, 6, b"\x01"),
        "empty tensor set": _rewrite(good, 8, struct.pack("<I", 0)),
        "truncated": good[:-1],
        "trailing": good + b"\x00",
        "duplicate": _rewrite(good, name_b + 2, b"a"),
        "not sorted": _rewrite(_rewrite(good, 14, b"c"), name_b + 2, b"b"),
        "unknown dtype": _rewrite(good, 15, b"\x63"),
        "data bytes": _rewrite(good, 25, struct.pack("<Q", 4)),
    }
    for message, data in cases.items():
        with pytest.raises(TensorFormatError, match=message):
            decode_canonical(data)
    with pytest.raises(TensorFormatError, match="limit"):
        decode_canonical(good, max_bytes=len(good) - 1)
    with pytest.raises(TensorFormatError, match="limit"):
        decode_canonical(good, max_tensors=1)
    with pytest.raises(TensorFormatError, match="bool"):
        decode_canonical(canonical_bytes({"m": torch.tensor([True])})[:-1] + b"\x02")


def test_decoder_refuses_a_huge_declared_shape_without_allocating() -> None:
    data = bytearray(canonical_bytes({"a": torch.ones(1)}))
    # shape (2**40,) with a matching nbytes: the header is self-consistent, the data is missing
    data[17:25] = struct.pack("<Q", 1 << 40)
    data[25:33] = struct.pack("<Q", 4 << 40)
    with pytest.raises(TensorFormatError, match="exceeds the input size"):
        decode_canonical(bytes(data))


dtype_st = st.sampled_from(DTYPES)
shape_st = st.lists(st.integers(0, 4), max_size=3).map(tuple)
names_st = st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4, unique=True)


@settings(max_examples=60, deadline=None)
@given(names_st, st.data())
def test_round_trip_random_sets(names: list[str], data: st.DataObject) -> None:
    tensors = {}
    for n in names:
        try:
            n.encode()
        except UnicodeEncodeError:
            continue
        tensors[n] = sample(data.draw(dtype_st), data.draw(shape_st), data.draw(st.integers(0, 99)))
    if not tensors:
        return
    encoded = canonical_bytes(tensors)
    assert same(decode_canonical(encoded), tensors)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_only_raise_format_error(blob: bytes) -> None:
    for data in (blob, b"GDTS\x01\x00\x00\x00" + blob):
        try:
            out = decode_canonical(data)
        except TensorFormatError:
            continue
        assert canonical_bytes(out) == data  # whatever decodes is canonical


SEED = canonical_bytes(
    {"a": torch.arange(3, dtype=torch.int16), "b/c": torch.ones(2, 2, dtype=torch.bfloat16)}
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(SEED) * 8 - 1), st.integers(0, len(SEED)))
def test_fuzz_bit_flips_and_truncation(bit: int, cut: int) -> None:
    flipped = bytearray(SEED)
    flipped[bit // 8] ^= 1 << (bit % 8)
    for data in (bytes(flipped), SEED[:cut]):
        try:
            out = decode_canonical(data)
        except TensorFormatError:
            continue
        assert canonical_bytes(out) == data


def test_accepts_numpy_backed_and_noncontiguous_views() -> None:
    base = torch.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    view = base[:, ::2]
    assert decode_canonical(canonical_bytes({"v": view}))["v"].tolist() == view.tolist()
