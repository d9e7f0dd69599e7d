"""Codec table on a real pseudo-gradient: bytes, ratio vs fp32, relative L2 error, encode/decode MB/s.

Δ = θ_0 − θ_H of the project's small GPT after H AdamW steps on Shakespeare (seeded init, seeded
batches). If the trainer is not importable, a seeded GPT-shaped random Δ is used and labelled
"synthetic". Encode = `encode` + `to_blob`; decode = `from_blob` + `decode` (the transport path).
Baseline: per-tensor uint8 (one scale and zero-point per tensor, INTELLECT-1 style) + zstd.

Run: `.venv/bin/python -m bench.codecs` (add `--quick` for fewer steps).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import zstandard

from protocol.codecs import decode, encode, from_blob, to_blob
from protocol.config import Codec

RESULTS = Path(__file__).parent / "results" / "codecs.json"
BLOCK = 256


def real_delta(steps: int) -> tuple[dict[str, torch.Tensor], str]:
    from trainer.data import shakespeare_corpus, windows
    from trainer.model import lm_loss, small_gpt

    model = small_gpt(seed=0)
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    tokens = shakespeare_corpus().train
    g = torch.Generator().manual_seed(1)
    seq = model.config.block_size
    opt = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.1, betas=(0.9, 0.95))
    for _ in range(steps):
        off = torch.randint(0, tokens.numel() - seq - 1, (8,), generator=g)
        x, y = windows(tokens, off.tolist(), seq)
        loss = lm_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    n = sum(p.numel() for p in start.values())
    label = f"real: small GPT ({n / 1e6:.2f}M params), {steps} AdamW steps on Shakespeare"
    label += f", final loss {loss.item():.3f}"
    return {k: start[k] - p.detach() for k, p in model.named_parameters()}, label


def synthetic_delta() -> tuple[dict[str, torch.Tensor], str]:
    g = torch.Generator().manual_seed(0)
    shapes = {"wte": (256, 128), "wpe": (128, 128), "lm_head": (256, 128)}
    for i in range(4):
        shapes |= {f"h.{i}.attn": (384, 128), f"h.{i}.proj": (128, 128), f"h.{i}.fc": (512, 128),
                   f"h.{i}.fc_proj": (128, 512), f"h.{i}.ln": (128,)}
    delta = {k: torch.randn(s, generator=g) * 1e-3 for k, s in shapes.items()}
    return delta, "synthetic: seeded random GPT-shaped"


def rel_l2(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    num = sum(float((a[k] - b[k]).double().pow(2).sum()) for k in a)
    den = sum(float(b[k].double().pow(2).sum()) for k in a)
    return (num / den) ** 0.5


def per_tensor_uint8(d: dict[str, torch.Tensor]) -> bytes:
    """One float32 scale and zero-point per tensor (sorted names): what block-wise scales improve on."""
    parts = []
    for _, x in sorted(d.items()):
        lo, hi = x.min(), x.max()
        scale = (hi - lo) / 255 if hi > lo else torch.tensor(1.0)
        q = torch.round((x - lo) / scale).clamp(0, 255).to(torch.uint8)
        parts += [torch.stack([scale, lo]).float().numpy().tobytes(), q.numpy().tobytes()]
    return b"".join(parts)


def per_tensor_uint8_decode(data: bytes, layout: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    out, pos = {}, 0
    for k, shape in sorted(layout.items()):
        scale, lo = torch.frombuffer(bytearray(data[pos : pos + 8]), dtype=torch.float32)
        n = torch.Size(shape).numel()
        q = torch.frombuffer(bytearray(data[pos + 8 : pos + 8 + n]), dtype=torch.uint8)
        out[k] = (q.float() * scale + lo).reshape(shape)
        pos += 8 + n
    return out


def timed(fn, repeats: int) -> tuple[float, object]:
    best, res = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = fn()
        best = min(best, time.perf_counter() - t0)
    return best, res


def main(quick: bool = False) -> dict:
    torch.set_num_threads(1)
    try:
        d, label = real_delta(10 if quick else 40)
    except ImportError:
        d, label = synthetic_delta()
    layout = {k: tuple(v.shape) for k, v in d.items()}
    fp32_bytes = 4 * sum(v.numel() for v in d.values())
    mb = fp32_bytes / 1e6
    repeats = 2 if quick else 5
    rows = []
    for codec in Codec:
        t_enc, blob = timed(lambda c=codec: to_blob(encode(d, c, BLOCK)), repeats)
        payload = encode(d, codec, BLOCK)
        t_dec, out = timed(lambda b=blob: decode(from_blob(b, layout, max_payload_bytes=1 << 31), layout),
                           repeats)
        rows.append({"codec": codec.value, "payload_bytes": len(payload), "blob_bytes": len(blob),
                     "ratio_vs_fp32": fp32_bytes / len(blob), "rel_l2_error": rel_l2(out, d),
                     "encode_mb_s": mb / t_enc, "decode_mb_s": mb / t_dec})
    zc, zd = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
    t_enc, blob = timed(lambda: zc.compress(per_tensor_uint8(d)), repeats)
    t_dec, out = timed(lambda: per_tensor_uint8_decode(zd.decompress(blob), layout), repeats)
    rows.append({"codec": "uint8 per-tensor (baseline)", "payload_bytes": len(per_tensor_uint8(d)),
                 "blob_bytes": len(blob), "ratio_vs_fp32": fp32_bytes / len(blob),
                 "rel_l2_error": rel_l2(out, d), "encode_mb_s": mb / t_enc, "decode_mb_s": mb / t_dec})
    print(f"Δ: {label}; block size {BLOCK}; fp32 = {fp32_bytes:,} bytes; 1 thread")
    print("| codec | payload bytes | blob bytes (zstd) | ratio vs fp32 | rel. L2 error "
          "| encode MB/s | decode MB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['codec']} | {r['payload_bytes']:,} | {r['blob_bytes']:,} | {r['ratio_vs_fp32']:.2f}x "
              f"| {r['rel_l2_error']:.2e} | {r['encode_mb_s']:.0f} | {r['decode_mb_s']:.0f} |")
    result = {"delta": label, "block_size": BLOCK, "fp32_bytes": fp32_bytes, "quick": quick, "rows": rows}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    main(quick=ap.parse_args().quick)
