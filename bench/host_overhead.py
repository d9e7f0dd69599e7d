"""Host protocol overhead: plain inner loop vs committed loop (hash + save every k steps, encode Δ).

Default model (what trains meaningfully on 2 CPU cores): 4 layers, 4 heads, width 128, context
128, batch 16, 1 training thread (the committed environment), H = 50, k = 5. Plain and committed
runs are interleaved in one process so drift in machine load hits both alike.

    .venv/bin/python -m bench.host_overhead [--reps 3] [--hosts 8]

Prints a table and writes bench/results/host_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from nodekit.statestore import StateStore, clone_state
from protocol.codecs import encode, to_blob
from protocol.config import Codec, ModelSpec, RunConfig
from replay.data import shakespeare_corpus
from replay.spec import build_model
from replay.step import (
    TrainJob,
    configure_determinism,
    load_training_state,
    make_optimizer,
    train_segment,
    training_hash,
    training_state,
)
from trainer.commit import CommitJob, param_tensors, run_committed

MODEL = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128}
RESULTS = Path(__file__).parent / "results" / "host_overhead.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hosts", type=int, default=8, help="N in the data-parallel ring all-reduce")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    configure_determinism(args.threads)
    corpus = shakespeare_corpus()
    spec = ModelSpec(factory="trainer.model:small_gpt", config=MODEL)
    cfg = RunConfig(
        model=spec, dataset_manifest_hash=corpus.manifest_hash, initial_model_hash="0" * 64,
        inner_steps=50, segment_len=5, batch_size=16, seq_len=128, threads=args.threads,
    )  # fmt: skip
    host = "gonka1" + "q" * 38
    model = build_model(spec)
    opt = make_optimizer(model, cfg.inner)
    n_params = sum(p.numel() for p in model.parameters())
    g0 = param_tensors(model)
    start = training_state(model, opt, copy=True)

    plain_s: list[float] = []
    committed_s: list[float] = []
    contribution = None
    with tempfile.TemporaryDirectory() as tmp:
        store = StateStore(tmp)
        train_segment(TrainJob(cfg, corpus, host, 0), model, opt, 0, 2)  # warm-up, not timed
        for rep in range(args.reps):
            load_training_state(model, opt, start)
            t = time.perf_counter()
            train_segment(TrainJob(cfg, corpus, host, 0), model, opt, 0, cfg.inner_steps)
            plain_s.append(time.perf_counter() - t)

            load_training_state(model, opt, start)
            t = time.perf_counter()
            job = CommitJob(cfg, corpus, host, rep, start_params=g0, base_model_hash="0" * 64, store=store)
            contribution = run_committed(job, model, opt)
            committed_s.append(time.perf_counter() - t)
            print(f"rep {rep}: plain {plain_s[-1]:.2f}s  committed {committed_s[-1]:.2f}s")
        # the boundary work alone, measured directly (the interleaved ratio is noisy on shared cores)
        n_b = cfg.n_segments + 1
        t = time.perf_counter()
        snaps = [clone_state(training_state(model, opt)) for _ in range(n_b)]
        clone_s = time.perf_counter() - t
        t = time.perf_counter()
        for i, snap in enumerate(snaps):
            store.put_hashed(snap, 99, training_hash({**snap, "step": snap["step"] + i}))
        hash_save_s = time.perf_counter() - t
    assert contribution is not None
    t = time.perf_counter()
    encode(contribution.delta, cfg.codec, cfg.codec_block_size)
    encode_s = time.perf_counter() - t

    plain, committed = statistics.median(plain_s), statistics.median(committed_s)
    overhead = committed / plain - 1
    n = args.hosts
    dp_bytes = int(2 * (n - 1) / n * 4 * n_params * cfg.inner_steps)
    blobs = {c.value: len(to_blob(encode(contribution.delta, c, cfg.codec_block_size))) for c in Codec}

    print(f"\nmodel {MODEL}, {n_params:,} params, H={cfg.inner_steps}, k={cfg.segment_len}, "
          f"batch {cfg.batch_size}x{cfg.seq_len}, threads {args.threads}")  # fmt: skip
    print(f"{'loop':<12}{'median s':>10}{'steps/s':>10}")
    print(f"{'plain':<12}{plain:>10.3f}{cfg.inner_steps / plain:>10.2f}")
    print(f"{'committed':<12}{committed:>10.3f}{cfg.inner_steps / committed:>10.2f}")
    print(f"overhead (interleaved wall clock): {overhead:+.2%} (goal <= 3%)")
    on_path = (clone_s + encode_s) / plain
    print(
        f"boundary work per outer step: snapshot copies {clone_s:.3f}s + encode {encode_s:.3f}s on the "
        f"training thread = {on_path:.2%}; hash+save {hash_save_s:.3f}s on the worker thread "
        f"(= {hash_save_s / plain:.2%} if it were serial)\n"
    )
    print(f"{'Δ codec':<10}{'blob bytes':>14}{'vs DP ring':>12}")
    for name, size in blobs.items():
        print(f"{name:<10}{size:>14,}{dp_bytes / size:>11.0f}x")
    print(f"{'DP ring':<10}{dp_bytes:>14,}   (N={n}, fp32 grads every step)")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "model": MODEL, "params": n_params, "inner_steps": cfg.inner_steps, "segment_len": cfg.segment_len,
        "batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "threads": args.threads,
        "torch": torch.__version__, "plain_s": plain_s, "committed_s": committed_s,
        "overhead": overhead, "snapshot_s": clone_s, "encode_s": encode_s,
        "hash_save_s": hash_save_s, "critical_path_overhead": on_path,
        "blob_bytes": blobs, "dp_ring_bytes": dp_bytes, "dp_hosts": n,
        "mean_loss": contribution.mean_loss,
    }, indent=2) + "\n")  # fmt: skip
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
