"""Hashing throughput: `tensor_hash` of a ~100 MB training state on one thread vs raw hashlib.

Run: `.venv/bin/python -m bench.hashing` (add `--quick` for a 20 MB state).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import torch

from protocol.tensors import StateKind, canonical_bytes, tensor_hash

RESULTS = Path(__file__).parent / "results" / "hashing.json"


def training_state(total_bytes: int, width: int = 1024) -> dict[str, torch.Tensor]:
    """param / exp_avg / exp_avg_sq per layer plus a step counter, like the trainer's flat state."""
    g = torch.Generator().manual_seed(0)
    per_layer = 3 * 4 * width * width  # three fp32 (width x width) tensors
    state: dict[str, torch.Tensor] = {"step": torch.tensor(42.0)}
    for i in range(max(1, total_bytes // per_layer)):
        for kind in ("param", "exp_avg", "exp_avg_sq"):
            state[f"{kind}/h.{i}.w"] = torch.randn(width, width, generator=g)
    return state


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(quick: bool = False) -> dict:
    torch.set_num_threads(1)
    state = training_state((20 if quick else 100) << 20)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    joined = canonical_bytes(state)
    repeats = 3 if quick else 5
    t_hash = best_of(lambda: tensor_hash(state, StateKind.TRAINING), repeats)
    t_raw = best_of(lambda: hashlib.sha256(joined).digest(), repeats)
    t_bytes = best_of(lambda: canonical_bytes(state), repeats)
    result = {
        "state_bytes": nbytes,
        "tensors": len(state),
        "threads": 1,
        "tensor_hash_gb_s": nbytes / t_hash / 1e9,
        "hashlib_sha256_gb_s": len(joined) / t_raw / 1e9,
        "ratio_vs_hashlib": (nbytes / t_hash) / (len(joined) / t_raw),
        "canonical_bytes_gb_s": nbytes / t_bytes / 1e9,
        "quick": quick,
    }
    print(f"| what (state {nbytes / 1e6:.0f} MB, {len(state)} tensors, 1 thread) | GB/s |")
    print("|---|---|")
    print(f"| tensor_hash (streams tensor memory) | {result['tensor_hash_gb_s']:.2f} |")
    print(f"| hashlib.sha256 on the same bytes | {result['hashlib_sha256_gb_s']:.2f} |")
    print(f"| canonical_bytes (joined copy) | {result['canonical_bytes_gb_s']:.2f} |")
    print(f"ratio tensor_hash / hashlib = {result['ratio_vs_hashlib']:.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    main(quick=ap.parse_args().quick)
