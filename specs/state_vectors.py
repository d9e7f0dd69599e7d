"""Vectors of issue 35: int8 AdamW moments (`protocol.moments`, specs §6.2.1) and the transfer
coding of training-state chunks (`protocol.statecode`, specs §8.2).

Inputs are exact float32 bit patterns; outputs are what another implementation must compute:
the codes, scales and decoded values of the block-wise moment quantizer, and, per chunk of a small
state, its pieces and the transformed body the zstd frame carries (zstd's own bytes are not
fixed: any frame of that body is a valid coding, so one coding is given only to be decoded).
"""

from __future__ import annotations

from typing import Any

import torch

from protocol import moments as qm
from protocol.statecode import StateLayout, _forward, decode_chunk, encode_chunk
from protocol.tensors import canonical_bytes, specs_of


def _bits(t: torch.Tensor) -> list[str]:
    return [f"{int(b) & 0xFFFFFFFF:08x}" for b in t.reshape(-1).view(torch.int32).tolist()]


def _floats(bits: list[str]) -> torch.Tensor:
    return torch.tensor([int(b, 16) for b in bits], dtype=torch.int64).to(torch.int32).view(torch.float32)


def moment_input(n: int, signed: bool) -> torch.Tensor:
    """Exact values over ~40 octaves, with grid values, half-way points and zeros among them."""
    i = torch.arange(n, dtype=torch.int64)
    x = (((i * 37) % 101) - 50).to(torch.float32) / 64 * torch.pow(2.0, -(i % 40).to(torch.float32))
    x[::7] = 0.0
    x[5] = 1.0  # the first block's max: its codes are of the values themselves
    x[10], x[11], x[12] = qm.mag(3), (qm.mag(3) + qm.mag(4)) / 2, qm.mag(qm.M_TOP - 1) / 2  # grid, ties
    return x if signed else x.abs()


def moments_vectors() -> list[dict[str, Any]]:
    out = []
    m, v = moment_input(300, True), moment_input(300, False) * 0.5
    for label, x, signed in (("exp_avg", m, True), ("exp_avg_sq", v, False)):
        q, s = qm.quantize(x, signed)
        out.append({"label": label, "input": {"block": qm.BLOCK, "signed": signed, "x": _bits(x)},
                    "output": {"codes": [int(c) for c in q.tolist()], "scales": _bits(s),
                               "decoded": _bits(qm.dequantize(q, s))}})  # fmt: skip
    tiny = torch.where(torch.arange(300) % 3 == 0, torch.tensor(1e-12), torch.tensor(1.0))
    v2 = moment_input(300, False) * tiny  # every third second moment below the grid
    qm_, sm, qv, sv = qm.quantize_pair(m, v2)
    out.append({"label": "pair: exp_avg's code is 0 where exp_avg_sq's is",
                "input": {"m": _bits(m), "v": _bits(v2)},
                "output": {"m_codes": [int(c) for c in qm_.tolist()], "m_scales": _bits(sm),
                           "v_codes": [int(c) for c in qv.tolist()], "v_scales": _bits(sv)}})  # fmt: skip
    return out


def statecode_state() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A tiny int8 training state and G_n's parameters (exact values)."""
    i = torch.arange(40, dtype=torch.int64)
    base = {"b": ((i[:5] * 5 % 11) - 5).to(torch.float32) / 8,
            "w": ((i * 37 % 101) - 50).to(torch.float32) / 64}  # fmt: skip
    state = {
        "param/b": base["b"] + 1 / 1024,
        "param/w": base["w"] - ((i * 3 % 7) - 3).to(torch.float32) / 4096,
        "exp_avg_code/b": ((i[:5] * 29 % 255) - 127).to(torch.int8),
        "exp_avg_code/w": ((i * 29 % 255) - 127).to(torch.int8),
        "exp_avg_scale/b": torch.tensor([1 / 256]),
        "exp_avg_scale/w": torch.tensor([1 / 128]),
        "step": torch.tensor(12.0),
    }
    return state, base


def statecode_vectors() -> list[dict[str, Any]]:
    import numpy as np

    state, base = statecode_state()
    data = canonical_bytes(state)
    out = []
    for chunk_bytes in (256, 1 << 20):
        layout = StateLayout.of(specs_of(state), chunk_bytes)
        chunks = []
        for i in range(layout.n_chunks):
            a, b = layout.span(i)
            raw = np.frombuffer(data[a:b], dtype=np.uint8)
            pieces = layout.pieces(i)
            body = b"".join(_forward(raw[p.start : p.end], p, base).tobytes() for p in pieces)
            coded = encode_chunk(layout, i, data[a:b], base, level=3)
            assert decode_chunk(layout, i, coded, base) == data[a:b]
            chunks.append({"pieces": [[p.start, p.end, p.itemsize, p.base, p.first] for p in pieces],
                           "diff_body": body.hex(), "one_coding": coded.hex()})  # fmt: skip
        out.append({"label": f"chunk_bytes {chunk_bytes}",
                    "input": {"canonical": data.hex(), "chunk_bytes": chunk_bytes,
                              "base": {n: _bits(t) for n, t in sorted(base.items())}},
                    "output": {"chunks": chunks}})  # fmt: skip
    return out
