"""Codec table on a real pseudo-gradient: bytes, ratio vs fp32, relative L2 error, encode/decode MB/s.

Δ = θ_0 − θ_H of the project's small GPT after H AdamW steps on Shakespeare (seeded init, seeded
batches). If the trainer is not importable, a seeded GPT-shaped random Δ is used and labelled
"synthetic". Encode = `encode` + `to_blob`; decode = `from_blob` + `decode` (the transport path).
Baseline: per-tensor uint8 (one scale and zero-point per tensor, INTELLECT-1 style) + zstd.

The sparse codec (specs §4.1) at several densities: its payload is what nodes serve (no zstd);
encode = `encode` (top-k, 2-bit values, packing), decode = adding one payload into a running sum
(`SparseAccumulator.add`, what aggregation does), both per fp32 MB of Δ on one core. Its
rel. L2 error is that of one C(Δ) against Δ: error feedback carries the rest to later steps,
so the number that matters is `bench.convergence --only sparse`. The 2-bit value levels are
chosen here: a one-host error-feedback run records the accumulators a = e + Δ it compresses, and
each candidate quantizer of the kept entries is scored by its error on them.

Run: `.venv/bin/python -m bench.codecs` (add `--quick` for fewer steps).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import zstandard

from protocol.codecs import decode, encode, from_blob, payload_len, to_blob
from protocol.config import Codec

RESULTS = Path(__file__).parent / "results" / "codecs.json"
BLOCK = 256


def real_delta(steps: int) -> tuple[dict[str, torch.Tensor], str]:
    from replay.data import shakespeare_corpus, windows
    from replay.model import lm_loss, small_gpt

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


SPARSE_SETTINGS = [(4096, 32), (4096, 64), (4096, 128), (1024, 16), (256, 4)]
RECOMMENDED = (4096, 64)


def sparse_rows(d: dict[str, torch.Tensor], repeats: int) -> list[dict]:
    """One row per (chunk, k): bytes, ratio vs fp32 and vs int8, error of one C(Δ), speeds."""
    from protocol.outer import SparseAccumulator

    layout = {k: tuple(v.shape) for k, v in d.items()}
    fp32 = 4 * sum(v.numel() for v in d.values())
    mb = fp32 / 1e6
    int8 = len(to_blob(encode(d, Codec.INT8, BLOCK)))
    rows = []
    for chunk, k in SPARSE_SETTINGS:
        t_enc, payload = timed(lambda c=chunk, kk=k: encode(d, Codec.SPARSE, c, kk), repeats)

        def add_into_sum(p: bytes = payload, c: int = chunk, kk: int = k) -> None:
            acc = SparseAccumulator(layout, {"h": 1}, chunk=c, topk=kk)
            acc.add("h", p)

        t_sum, _ = timed(add_into_sum, repeats)
        t_dec, out = timed(lambda p=payload: decode(p, layout), repeats)
        kept = sum(float(out[n].double().square().sum()) for n in d)
        energy = sum(float(v.double().square().sum()) for v in d.values())
        name = "sparse" if (chunk, k) == RECOMMENDED else f"sparse {k}/{chunk}"
        size = len(payload)
        zipped = len(zstandard.ZstdCompressor(level=3).compress(payload))
        rows.append({
            "codec": name, "chunk": chunk, "topk": k, "density": k / chunk, "payload_bytes": size,
            "blob_bytes": zipped, "ratio_vs_fp32": fp32 / size, "ratio_vs_int8": int8 / size,
            "rel_l2_error": rel_l2(out, d), "kept_energy": kept / energy, "encode_mb_s": mb / t_enc,
            "decode_mb_s": mb / t_sum, "dense_decode_mb_s": mb / t_dec,
            "payload_len_exact": payload_len(Codec.SPARSE, chunk, layout, k) == size,
        })  # fmt: skip
    return rows


def large_tensor_speed(repeats: int, n: int = 1 << 24) -> dict:
    """Encode and decode-into-sum of the recommended setting on one 64 MB fp32 tensor (seeded,
    Laplace-like): the per-tensor costs of a small model's many tiny tensors gone, as at 30B.
    `gonka-diloco plan` takes the sparse decode speed from here."""
    from protocol.outer import SparseAccumulator

    chunk, k = RECOMMENDED
    g = torch.Generator().manual_seed(3)
    x = {"w": torch.randn(n, generator=g) * torch.rand(n, generator=g)}
    mb = 4 * n / 1e6
    t_enc, payload = timed(lambda: encode(x, Codec.SPARSE, chunk, k), repeats)

    def add() -> None:
        SparseAccumulator({"w": (n,)}, {"h": 1}, chunk=chunk, topk=k).add("h", payload)

    t_sum, _ = timed(add, repeats)
    return {"elements": n, "chunk": chunk, "topk": k, "encode_mb_s": mb / t_enc, "decode_mb_s": mb / t_sum}


def large_layout_rows() -> list[dict]:
    """Exact sparse payload sizes (`payload_len`, from the layout alone) of the Llama presets built
    on the meta device: what the ratio is once headers and short tensors no longer matter."""
    out = []
    try:
        from replay.hf import llama, spec_config
    except ImportError:
        return out
    for preset in ("125m", "1b"):
        with torch.device("meta"):
            model = llama(**spec_config("llama", preset))
        layout = {n: tuple(p.shape) for n, p in model.named_parameters()}
        n = sum(p.numel() for p in model.parameters())
        int8 = payload_len(Codec.INT8, BLOCK, layout)
        for chunk, k in SPARSE_SETTINGS:
            size = payload_len(Codec.SPARSE, chunk, layout, k)
            out.append({"model": f"llama {preset}", "params": n, "chunk": chunk, "topk": k,
                        "payload_bytes": size, "ratio_vs_fp32": 4 * n / size, "ratio_vs_int8": int8 / size})
    return out


QUANTIZERS = {
    "protocol: ±s·{31/32, 33/32}, split at s = mean": (0.96875, 1.03125, "mean"),
    "±s·{15/16, 17/16}": (0.9375, 1.0625, "mean"),
    "±s·{7/8, 5/4}": (0.875, 1.25, "mean"),
    "±s, 1 bit": (1.0, 1.0, "mean"),
    "±absmax·{0.4, 0.8}, split at 0.6": (0.4, 0.8, "max"),
    "two scales per chunk (64 more bits)": (0.0, 0.0, "two"),
}


def quantizer_error(sel: torch.Tensor, lo: float, hi: float, kind: str) -> float:
    """Relative L2 error of one quantizer on the kept entries (rows = chunks, k each)."""
    m, sign = sel.abs(), torch.sign(sel)
    if kind == "mean":
        mu = m.mean(1, keepdim=True)
        q = torch.where(m >= mu, hi, lo) * mu
    elif kind == "max":
        mx = m.amax(1, keepdim=True)
        q = torch.where(m >= 0.6 * mx, hi, lo) * mx
    else:
        mu = m.mean(1, keepdim=True)
        low = m < mu
        a = torch.where(low, m, 0).sum(1, keepdim=True) / low.sum(1, keepdim=True).clamp(min=1)
        b = torch.where(~low, m, 0).sum(1, keepdim=True) / (~low).sum(1, keepdim=True).clamp(min=1)
        q = torch.where(low, a, b)
    return float((sign * q - sel).norm() / sel.norm())


def ef_regime(outer_steps: int, inner_steps: int) -> dict:
    """One host, SparseLoCo's loop at the recommended density (e ← a − C(a), θ ← θ_start − C(a)):
    the accumulators the codec actually sees, and each quantizer's error on their kept entries."""
    from protocol.errorfeedback import EFConfig, ef_step
    from replay.data import shakespeare_corpus, windows
    from replay.model import lm_loss, small_gpt

    chunk, k = RECOMMENDED
    model = small_gpt(seed=0)
    tokens = shakespeare_corpus().train
    g = torch.Generator().manual_seed(1)
    seq = model.config.block_size
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    e = None
    errors: dict[str, list[float]] = {q: [] for q in QUANTIZERS}
    for _ in range(outer_steps):
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        for _ in range(inner_steps):
            off = torch.randint(0, tokens.numel() - seq - 1, (8,), generator=g)
            x, y = windows(tokens, off.tolist(), seq)
            loss = lm_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        delta = {n: start[n] - p.detach() for n, p in model.named_parameters()}
        rows = []
        for n, dl in delta.items():
            a = (dl + e[n] if e is not None else dl).reshape(-1)
            full = a.numel() // chunk
            if full:
                blocks = a[: full * chunk].view(full, chunk)
                rows.append(blocks.gather(1, blocks.abs().topk(k, dim=1).indices))
        sel = torch.cat(rows)
        for q, (lo, hi, kind) in QUANTIZERS.items():
            errors[q].append(quantizer_error(sel, lo, hi, kind))
        payload, e = ef_step(e, delta, EFConfig(chunk, k, 1.0))
        sent = decode(payload, {n: tuple(t.shape) for n, t in delta.items()})
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(start[n] - sent[n])
    return {"outer_steps": outer_steps, "inner_steps": inner_steps, "chunk": chunk, "topk": k,
            "final_loss": float(loss.detach()),
            "quantizers": {q: {"mean_rel_l2": sum(v) / len(v), "per_step": v} for q, v in errors.items()}}


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
    for codec in (c for c in Codec if c is not Codec.SPARSE):
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
    rows += sparse_rows(d, repeats)
    speed = large_tensor_speed(2 if quick else 3)
    for r in rows:
        if r["codec"] == "sparse":  # the planner's figures: per fp32 byte, without tiny-tensor overheads
            r["encode_mb_s_small_tensors"] = r["encode_mb_s"]
            r["decode_mb_s_small_tensors"] = r["decode_mb_s"]
            r["encode_mb_s"], r["decode_mb_s"] = speed["encode_mb_s"], speed["decode_mb_s"]
    print(f"Δ: {label}; block size {BLOCK}; fp32 = {fp32_bytes:,} bytes; 1 thread")
    print("| codec | payload bytes | blob bytes (zstd) | ratio vs fp32 | rel. L2 error "
          "| encode MB/s | decode MB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['codec']} | {r['payload_bytes']:,} | {r['blob_bytes']:,} | {r['ratio_vs_fp32']:.2f}x "
              f"| {r['rel_l2_error']:.2e} | {r['encode_mb_s']:.0f} | {r['decode_mb_s']:.0f} |")
    large = large_layout_rows()
    print("\nsparse payload sizes from the layout alone (payload_len):")
    for r in large:
        print(f"  {r['model']} ({r['params'] / 1e6:.0f}M) {r['topk']}/{r['chunk']}: {r['payload_bytes']:,} "
              f"bytes, {r['ratio_vs_fp32']:.1f}x vs fp32, {r['ratio_vs_int8']:.1f}x vs int8")
    regime = ef_regime(3 if quick else 8, 10 if quick else 20)
    print(f"\n2-bit levels on the error-feedback accumulators ({regime['outer_steps']} outer steps of "
          f"{regime['inner_steps']}, top-{regime['topk']} of {regime['chunk']}):")  # fmt: skip
    for q, v in regime["quantizers"].items():
        print(f"  {q}: mean rel. L2 error {v['mean_rel_l2']:.4f}")
    print(f"\nsparse {RECOMMENDED[1]}/{RECOMMENDED[0]} on one {4 * speed['elements'] / 1e6:.0f} MB tensor, "
          f"one core: encode {speed['encode_mb_s']:.0f} MB/s, decode into a running sum "
          f"{speed['decode_mb_s']:.0f} MB/s (fp32 MB of Δ)")
    result = {"delta": label, "block_size": BLOCK, "fp32_bytes": fp32_bytes, "quick": quick, "rows": rows,
              "sparse_layouts": large, "sparse_levels": regime, "sparse_large_tensor": speed}  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    main(quick=ap.parse_args().quick)
