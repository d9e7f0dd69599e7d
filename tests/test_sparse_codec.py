"""The sparse codec (specs §4.1): exact bytes against an independent reference, tie-breaks, the
short last chunk, exact sizes, thread-count determinism, and a decoder that only raises CodecError."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import codecs
from protocol.codecs import (
    SPARSE_HI,
    SPARSE_LO,
    CodecError,
    decode,
    encode,
    iter_sparse,
    payload_len,
    read_header,
)
from protocol.config import Codec

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (np.float32(SPARSE_LO), np.float32(SPARSE_HI))


# ---------------------------------------------------------------- an independent reference


def _pack(values: list[int], bits: int) -> bytes:
    acc, pos = 0, 0
    for v in values:
        acc |= v << pos
        pos += bits
    return acc.to_bytes(-(-pos // 8), "little") if pos else b""


def ref_body(x: torch.Tensor, chunk: int, k: int) -> tuple[bytes, dict[int, np.float32]]:
    """specs §4.1 in plain Python: (body bytes, position -> decoded value)."""
    vals = [np.float32(v) for v in x.reshape(-1).tolist()]
    bits = max(1, (chunk - 1).bit_length())
    scales, idxs, codes, decoded = [], [], [], {}
    for start in range(0, len(vals), chunk):
        ch = vals[start : start + chunk]
        kk = k if len(ch) == chunk else -(-k * len(ch) // chunk)
        kept = sorted(sorted(range(len(ch)), key=lambda j: (-abs(float(ch[j])), j))[:kk])
        acc = np.float32(0.0)
        for j in kept:
            acc = np.float32(acc + np.float32(abs(ch[j])))
        s = np.float32(acc / np.float32(kk))
        scales.append(s)
        for j in kept:
            hi = int(s > 0 and abs(ch[j]) >= s)
            neg = int(s > 0 and ch[j] < 0)
            idxs.append(j)
            codes.append(neg << 1 | hi)
            level = np.float32(s * LEVELS[hi])
            decoded[start + j] = np.float32(-level) if neg else level
    body = b"".join(struct.pack("<f", float(s)) for s in scales) + _pack(idxs, bits) + _pack(codes, 2)
    return body, decoded


def body_of(payload: bytes) -> bytes:
    return payload[read_header(payload).header_len :]


# values with many exact ties (multiples of 1/8), zeros and signed zeros
_tied = st.sampled_from([0.0, -0.0, 0.125, -0.125, 0.25, -0.5, 0.5, 1.0, -1.0, 3.0, -3.0])


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 70),
    st.sampled_from([8, 9, 16, 33]),
    st.data(),
)
def test_bytes_match_the_reference(n: int, chunk: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, chunk))
    floats = st.floats(-1e3, 1e3, allow_nan=False, width=32)
    values = data.draw(st.lists(st.one_of(_tied, floats), min_size=n, max_size=n))
    x = torch.tensor(values, dtype=torch.float32)
    payload = encode({"x": x}, Codec.SPARSE, chunk, k)
    want, decoded = ref_body(x, chunk, k)
    assert body_of(payload) == want
    out = decode(payload, {"x": (n,)})["x"]
    for j in range(n):
        expect = decoded.get(j, np.float32(0.0))
        assert out[j].item() == float(expect) and (j in decoded or not torch.signbit(out[j]))
    assert len(payload) == payload_len(Codec.SPARSE, chunk, {"x": (n,)}, k)


def test_layout_by_hand() -> None:
    # chunk 8, k 2: keeps index 1 (3.0) and 7 (5.0); s = (3 + 5) / 2 = 4; 3 < s: low, 5 ≥ s: high
    x = torch.tensor([0.0, 3.0, -1.0, 2.0, 0.0, 0.0, 0.0, 5.0])
    p = encode({"x": x}, "sparse", 8, 2)
    h = read_header(p)
    assert (h.codec, h.block_size, h.topk) == (Codec.SPARSE, 8, 2)
    assert p[5] == 5 and struct.unpack("<H", p[6:8]) == (2,)  # codec u8 = 5, then k as u16
    # scale 4.0 | indices 1, 7 in 3 bits LSB first: 1,0,0,1,1,1 → 0x39 | codes 0b00, 0b01 → 0x04
    assert body_of(p) == struct.pack("<f", 4.0) + bytes([0x39, 0x04])
    assert decode(p, {"x": (8,)})["x"].tolist() == [0, 4 * 0.96875, 0, 0, 0, 0, 0, 4 * 1.03125]


def test_ties_break_to_the_lower_index_and_sign_does_not_matter() -> None:
    x = torch.tensor([1.0, -1.0] * 8)
    out = decode(encode({"x": x}, "sparse", 16, 5), {"x": (16,)})["x"]
    assert torch.nonzero(out).reshape(-1).tolist() == [0, 1, 2, 3, 4]
    assert out[:5].tolist() == [1.03125, -1.03125, 1.03125, -1.03125, 1.03125]  # |x| = s: high


def test_short_last_chunk_keeps_ceil_k_l_over_c() -> None:
    x = torch.arange(1.0, 41.0)  # 2 full chunks of 16 (k = 4) and 8 elements: ceil(4 · 8 / 16) = 2
    entries = dict(iter_sparse(encode({"x": x}, "sparse", 16, 4), {"x": (40,)}))["x"]
    assert entries.positions.tolist() == [12, 13, 14, 15, 28, 29, 30, 31, 38, 39]
    assert codecs.sparse_counts(40, 16, 4) == (2, 2, 10)
    assert codecs.sparse_counts(1, 4096, 64) == (0, 1, 1)  # one element keeps itself


def test_zero_chunks_and_default_topk() -> None:
    x = torch.cat([torch.zeros(16), torch.tensor([1e-45, -1e-45] + [0.0] * 14)])
    p = encode({"x": x, "e": torch.zeros(0, 3)}, "sparse", 16)  # k = max(1, 16 // 64) = 1
    assert read_header(p).topk == 1
    out = decode(p, {"x": (32,), "e": (0, 3)})
    assert out["x"][:16].abs().sum() == 0 and not torch.signbit(out["x"][:16]).any()
    assert out["x"][16].item() > 0 and out["e"].shape == (0, 3)
    assert codecs.default_topk(4096) == 64 and codecs.default_topk(256) == 4


def test_overflow_and_bad_parameters_are_codec_errors() -> None:
    with pytest.raises(CodecError, match="too large"):
        encode({"x": torch.full((8,), 3e38)}, "sparse", 8, 8)
    with pytest.raises(CodecError, match="NaN"):
        encode({"x": torch.tensor([1.0, float("nan")])}, "sparse", 8, 1)
    with pytest.raises(CodecError, match="topk"):
        encode({"x": torch.ones(8)}, "sparse", 8, 9)
    with pytest.raises(CodecError, match="exceeds"):
        encode({"x": torch.ones(8)}, "sparse", 1 << 17, 1)
    with pytest.raises(CodecError, match="takes no topk"):
        encode({"x": torch.ones(8)}, "int8", 8, 2)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=6),
        st.lists(st.integers(0, 40), min_size=0, max_size=3).map(tuple),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from([(8, 1), (8, 8), (64, 3), (4096, 64), (100, 7)]),
)
def test_payload_len_is_exact(layout: dict[str, tuple[int, ...]], ck: tuple[int, int]) -> None:
    chunk, k = ck
    g = torch.Generator().manual_seed(0)
    tensors = {n: torch.randn(s, generator=g) for n, s in layout.items()}
    p = encode(tensors, "sparse", chunk, k)
    assert len(p) == payload_len("sparse", chunk, layout, k)
    assert p[: read_header(p).header_len] == codecs.payload_header("sparse", chunk, layout, k)
    dense = decode(p, layout)
    for name, e in iter_sparse(p, layout):
        flat = dense[name].reshape(-1)
        assert torch.equal(flat[e.positions], e.values)
        assert int(torch.count_nonzero(flat)) <= e.positions.numel()


_CHILD = textwrap.dedent(
    """
    import hashlib, sys, torch
    torch.set_num_threads(int(sys.argv[1]))
    from protocol.codecs import encode, decode
    g = torch.Generator().manual_seed(0)
    x = {"a": torch.randn(500, 700, generator=g), "b": torch.randint(-3, 4, (100_001,), generator=g).float()}
    p = encode(x, "sparse", 4096, 64)
    d = decode(p, {n: tuple(t.shape) for n, t in x.items()})
    print(torch.get_num_threads(), hashlib.sha256(p).hexdigest(),
          hashlib.sha256(b"".join(d[n].numpy().tobytes() for n in sorted(d))).hexdigest())
    """
)


def test_encoding_is_bitwise_identical_across_thread_counts_in_separate_processes() -> None:
    out = {}
    for threads in (1, 2):
        res = subprocess.run([sys.executable, "-c", _CHILD, str(threads)], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert res.returncode == 0, res.stderr
        got, *digests = res.stdout.split()
        assert int(got) == threads
        out[threads] = digests
    assert out[1] == out[2]


# ---------------------------------------------------------------- malformed payloads


_T = {"v": torch.linspace(1, 2, 5), "w": torch.linspace(-1, 1, 40), "z": torch.zeros(9)}
_L = {n: tuple(t.shape) for n, t in _T.items()}
_P = encode(_T, "sparse", 16, 3)
# v: 1 chunk of 5 (k 1: one 4-bit index, 4 padding bits); w: chunks 16, 16, 8 (k 3, 3, 2 = 8 kept);
# z: 1 chunk of 9 (k 2, scale 0: its 2 codes must be 0, 4 padding bits after them)


def _span(name: str) -> tuple[int, int]:
    return read_header(_P).spans()[name]


def _patched(offset: int, data: bytes) -> bytes:
    return _P[:offset] + data + _P[offset + len(data) :]


_V_INDEX = read_header(_P).spans()["v"][0] + 4


def _w_indices() -> int:
    return _span("w")[0] + 4 * 3


def _bad_indices(idx: list[int]) -> bytes:
    """w's index stream (4 bits each) replaced, codes kept."""
    return _patched(_w_indices(), _pack(idx, 4))


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (_P[:-1], "payload is"),
        (_P + b"\0", "payload is"),
        (_patched(6, struct.pack("<H", 0)), "topk 0"),
        (_patched(6, struct.pack("<H", 17)), "topk 17"),
        (_patched(8, struct.pack("<I", 1 << 17)), "sparse chunk"),
        (_patched(_span("w")[0], struct.pack("<f", float("nan"))), "NaN or Inf scale"),
        (_patched(_span("w")[0], struct.pack("<f", -1.0)), "negative scale"),
        (_patched(_span("w")[0], struct.pack("<f", -0.0)), "negative scale"),
        (_patched(_span("w")[0], struct.pack("<f", 3.4e38)), "NaN or Inf value"),
        (_bad_indices([3, 2, 5, 0, 1, 2, 0, 1]), "strictly increasing"),
        (_bad_indices([1, 1, 5, 0, 1, 2, 0, 1]), "strictly increasing"),
        (_bad_indices([1, 2, 5, 0, 1, 2, 0, 8]), "outside its chunk"),  # the last chunk is 8 long
        (_patched(_V_INDEX, bytes([_P[_V_INDEX] | 0x80])), "padding bits after the indices"),
        (_patched(_span("z")[1] - 1, bytes([0x01])), "scale is 0"),
        (_patched(_span("z")[1] - 1, bytes([0x10])), "padding bits after the codes"),
    ],
)
def test_malformed_payloads_are_named_errors(payload: bytes, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        decode(payload, _L)
    with pytest.raises(CodecError):
        list(iter_sparse(payload, _L))


def test_dense_payload_with_a_topk_is_refused() -> None:
    p = bytearray(encode(_T, "int8", 16))
    p[6:8] = struct.pack("<H", 3)
    with pytest.raises(CodecError, match="reserved"):
        decode(bytes(p), _L)
    with pytest.raises(CodecError, match="expected a sparse payload"):
        list(iter_sparse(encode(_T, "int8", 16), _L))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_fuzz_decoder_only_raises_codec_error(data: st.DataObject) -> None:
    p = bytearray(_P)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(p) - 1))
        p[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(p)))
    blob = bytes(p[:cut]) if data.draw(st.booleans()) else bytes(p)
    try:
        out = decode(blob, _L)
    except CodecError:
        return
    assert all(bool(torch.isfinite(t).all()) for t in out.values())
    assert sum(int(torch.count_nonzero(t)) for t in out.values()) <= 11  # never more than it keeps


def test_the_planner_counts_exactly_what_payload_len_gives() -> None:
    """`gonka-diloco plan --codec sparse` sizes a Δ by the layout rule; whole chunks: exact."""
    from gonka_diloco.plan import Constants, delta_bytes, sparse_bytes_per_param

    layout = {"a": (4096 * 300,), "b": (8192, 4096)}
    n = 4096 * 300 + 8192 * 4096
    body = payload_len("sparse", 4096, layout, 64) - len(codecs.payload_header("sparse", 4096, layout, 64))
    assert body == n * sparse_bytes_per_param(4096, 64) == delta_bytes(n, Codec.SPARSE, Constants(), 4096, 64)
    assert round(4 / sparse_bytes_per_param(4096, 64), 1) == 141.2
