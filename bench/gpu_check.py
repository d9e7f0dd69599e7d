"""GPU checks (issue 12) in one time-boxed script: bitwise replay on the device, ≈1B-parameter
throughput with commitments on vs off, and device-vs-CPU honest replay noise.

How to run it on the GPU machine (a python3 with torch and numpy is all it needs: no install, no
network; it imports this repo's `replay.step`, `replay.device`, `replay.model`,
`trainer.sharded`, `protocol.tensors`, `protocol.chunks` and `protocol.envclass`, which need
nothing else), from the repo root:

    PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out $OUT/gpu_check.json

It prints progress and a table per section and rewrites the JSON after every section, so a
timeout still leaves what was measured. Default budget 420 s (`--budget`), under 8 minutes on one
H200 including CUDA start-up; give the run a timeout of ~540 s. Back here, copy the JSON to
`bench/results/gpu_check.json` and run `.venv/bin/python -m bench.report` (section 10 of
bench/RESULTS.md shows the GPU and the date).

On CPU (what the test runs, tiny sizes): `.venv/bin/python -m bench.gpu_check --device cpu`.
Without CUDA the sizes are always tiny and the JSON goes to `bench/results/gpu_check_cpu.json`.

Sections (each fails soft: an error is recorded and the next section runs; each checks the clock):

1. replay: a small GPT is warmed up on the device, then a k-step segment is trained; a second
   process (`--replay-worker`) loads the start state and replays the segment on the device. The
   end hashes must be equal, in fp32 and in bf16 autocast (math attention, the run default), and
   for information bf16 with the flash kernel. A replay that skips one step must differ (so the
   check can fail).
2. throughput: a ≈1B-parameter GPT (20 layers, width 2048, context 1024, batch 8, bf16, math
   attention) trained by `replay.step.train_steps`: tokens/s and MFU with commitments off, with
   boundary snapshots every k = 5 steps (`snapshot_to_host`: the device-side cost), and end to end
   with the boundary states hashed as `trainer.commit` does (one boundary worker, the chunked
   content hash of `protocol.chunks`: 64 MiB chunks on all cores), plus the hashing rate of one
   SHA-256 stream and of the chunked hash, and whether one boundary's hash keeps up with a segment.
   Flash attention with commitments off, for the price of the deterministic math kernel.
3. noise: from the same warm states, the device and the CPU each train k steps (k = 1, 2, 5, 10);
   per tensor group (params, exp_avg, exp_avg_sq) the relative distance ‖a − b‖ / ‖b − start‖ of
   the honest pair, against the signal of a skipped first step. The input of a tolerance
   calibration for the (device, CPU) class pair; `verifier calibrate --device-a/--device-b` runs
   the full one.
4. sharded: `trainer.sharded` (2 ranks as threads on the device: the ordered reduce-scatter, the
   norms, AdamW on each rank's tensors, the broadcasts; each rank's part of the chunked hash) against
   the unsharded step with 2 slices: equal hashes or not; the sharded step's time and each rank's
   share of the moments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: `python3 bench/gpu_check.py`
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from protocol import chunks  # noqa: E402
from protocol.envclass import replay_class  # noqa: E402
from protocol.tensors import StateKind, canonical_pieces, domain, tensor_hash_and_digests  # noqa: E402
from replay.device import (  # noqa: E402
    configure_determinism,
    env_facts,
    pinned_memory,
    resolve_device,
    snapshot_to_host,
)
from replay.model import GPT, GPTConfig  # noqa: E402
from replay.step import (  # noqa: E402
    load_training_state,
    make_optimizer,
    train_steps,
    training_hash,
    training_state,
)
from trainer.sharded import LocalGroup, ShardedState, ShardedStep, ShardPlan, make_shard_optimizer  # noqa: E402

RESULTS = ROOT / "bench" / "results"
INNER = SimpleNamespace(
    lr=4e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0, warmup_steps=0,
    decay_steps=0, min_lr_fraction=0.0, moments="fp32",
)  # fmt: skip
PEAK_BF16_TFLOPS = 989.4  # H100/H200 SXM dense bf16, vendor datasheet
GROUPS = ("param", "exp_avg", "exp_avg_sq")
SHARES = {"replay": 0.28, "throughput": 0.45, "noise": 0.22, "sharded": 0.05}

# sizes: (model config, batch, seq_len)
FULL = {
    "replay": (dict(n_layer=4, n_head=8, n_embd=512, block_size=256), 8, 256),
    "throughput": (dict(n_layer=20, n_head=16, n_embd=2048, block_size=1024), 8, 1024),
    "noise": (dict(n_layer=4, n_head=4, n_embd=128, block_size=128), 8, 128),
}
TINY = {
    "replay": (dict(n_layer=2, n_head=2, n_embd=32, block_size=32), 4, 32),
    "throughput": (dict(n_layer=2, n_head=2, n_embd=64, block_size=64), 4, 64),
    "noise": (dict(n_layer=2, n_head=2, n_embd=32, block_size=32), 4, 32),
}


class Clock:
    """A section's deadline; loops ask `left()` before each piece of work."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- data and models


CORPUS_BYTES = 1 << 21


def corpus() -> Tensor:
    """Two MB of lower-case bytes from a fixed seed: the same in every process, nothing to download."""
    g = torch.Generator().manual_seed(12)
    return torch.randint(97, 123, (CORPUS_BYTES,), generator=g, dtype=torch.uint8)


def batches(text: Tensor, seed: int, first: int, n: int, b: int, t: int) -> Iterator[tuple[Tensor, Tensor]]:
    """(x, y) windows for steps first .. first+n-1 of stream `seed` (a PRF of (seed, step), CPU)."""
    for i in range(first, first + n):
        g = torch.Generator().manual_seed(seed * 1_000_003 + i)
        offsets = torch.randint(0, text.numel() - t - 1, (b,), generator=g)
        chunk = text[offsets[:, None] + torch.arange(t + 1)].long()
        yield chunk[:, :-1], chunk[:, 1:]


def numerics(precision: str, attention: str = "math") -> SimpleNamespace:
    return SimpleNamespace(precision=precision, tf32=False, attention=attention)


def build(config: dict[str, int], device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = GPT(GPTConfig(**config)).to(device)  # type: ignore[arg-type]
    return model, make_optimizer(model, INNER)  # type: ignore[arg-type]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- 1. replay


def replay_worker(job_path: str) -> None:
    """In a fresh process: replay every case of the job on its device, print one JSON line each."""
    job = json.loads(Path(job_path).read_text())
    device = configure_determinism(job["threads"], resolve_device(job["device"]))
    text = corpus()
    facts = env_facts(device)
    print(json.dumps({"env": facts, "replay_class": replay_class(facts)}), flush=True)
    for case in job["cases"]:
        try:
            model, opt = build(job["model"], device)
            load_training_state(model, opt, torch.load(case["start"], weights_only=True))  # our own file
            seg = batches(text, job["seed"], job["warmup"], job["k"], job["batch"], job["seq"])
            train_steps(model, opt, INNER, numerics(case["precision"], case["attention"]), seg)  # type: ignore[arg-type]
            line = {"case": case["name"], "hash": training_hash(training_state(model, opt, copy=True))}
        except Exception as e:  # the other cases still run
            line = {"case": case["name"], "error": f"{type(e).__name__}: {e}"[:300]}
        print(json.dumps(line), flush=True)


def section_replay(ctx: SimpleNamespace, clock: Clock) -> dict[str, Any]:
    config, b, t = ctx.sizes["replay"]
    k, warm, seed = 5, 3, 7
    cases = [("fp32", "math"), ("bf16", "math")] + ([("bf16", "flash")] if ctx.device.type == "cuda" else [])
    rows: list[dict[str, Any]] = []
    job_cases = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for precision, attention in cases:
            name = f"{precision}/{attention}"
            row: dict[str, Any] = {"case": name}
            rows.append(row)
            if clock.left() < 20:
                row["error"] = "skipped: out of time"
                continue
            try:
                num = numerics(precision, attention)
                model, opt = build(config, ctx.device)
                train_steps(model, opt, INNER, num, batches(ctx.text, seed, 0, warm, b, t))  # type: ignore[arg-type]
                start = training_state(model, opt, copy=True)
                path = Path(tmp) / f"{precision}-{attention}.pt"
                torch.save(start, path)
                t0 = time.perf_counter()
                losses = train_steps(model, opt, INNER, num, batches(ctx.text, seed, warm, k, b, t))  # type: ignore[arg-type]
                _sync(ctx.device)
                row["step_ms"] = round(1000 * (time.perf_counter() - t0) / k, 2)
                row["loss"] = round(losses[-1], 4)
                row["trained"] = training_hash(training_state(model, opt, copy=True))

                def replay(n: int, start: dict[str, Tensor] = start, num: Any = num) -> str:
                    m, o = build(config, ctx.device)
                    load_training_state(m, o, start)
                    train_steps(m, o, INNER, num, batches(ctx.text, seed, warm, n, b, t))  # type: ignore[arg-type]
                    return training_hash(training_state(m, o, copy=True))

                row["same_process_equal"] = replay(k) == row["trained"]
                row["skipped_step_differs"] = replay(k - 1) != row["trained"]  # the check can fail
                job_cases.append(
                    {"name": name, "precision": precision, "attention": attention, "start": str(path)}
                )
                del model, opt
            except Exception as e:  # e.g. no flash kernel for this GPU or dtype
                row["error"] = f"{type(e).__name__}: {e}"[:300]
        if job_cases and clock.left() > 10:
            job = {"device": str(ctx.device), "threads": ctx.threads, "model": config, "seed": seed,
                   "warmup": warm, "k": k, "batch": b, "seq": t, "cases": job_cases}  # fmt: skip
            job_path = Path(tmp) / "job.json"
            job_path.write_text(json.dumps(job))
            log(f"replaying {len(job_cases)} cases in a second process")
            try:
                proc = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--replay-worker", str(job_path)],
                    capture_output=True, text=True, timeout=max(5.0, clock.left()), check=False, cwd=ROOT,
                )  # fmt: skip
                stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as e:  # keep what the worker printed before
                raw = e.stdout or ""
                stdout, stderr, rc = raw.decode() if isinstance(raw, bytes) else raw, "timed out", -1
            lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
            child = next((x for x in lines if "env" in x), None)
            replays = {x["case"]: x for x in lines if "case" in x}
            for row in rows:
                got = replays.get(row["case"])
                if got is not None and "hash" in got:
                    row["other_process_equal"] = got["hash"] == row["trained"]
                elif got is not None:
                    row["error"] = f"replay worker: {got['error']}"
                elif "trained" in row:
                    row["error"] = f"replay worker exit {rc}: {stderr[-300:]}"
            same_class = child is not None and child["replay_class"] == ctx.replay_class
        else:
            same_class = None
    for row in rows:
        row.pop("trained", None)
    required = [r for r in rows if not r["case"].endswith("/flash")]
    ok = all(r.get("other_process_equal") and r.get("same_process_equal") and r.get("skipped_step_differs")
             for r in required)  # fmt: skip
    return {"ok": ok, "segment_steps": k, "model": config, "batch": b, "seq_len": t,
            "worker_same_replay_class": same_class, "cases": rows}  # fmt: skip


# ---------------------------------------------------------------- 2. throughput


CHUNK_BYTES = chunks.DEFAULT_CHUNK_BYTES


def chunked_hash(state: Any) -> str:
    """A boundary leaf exactly as `trainer.commit` computes it: the chunked content hash
    (`protocol.chunks`), chunks hashed on the process-wide pool (one thread per core)."""
    return tensor_hash_and_digests(state, StateKind.TRAINING, CHUNK_BYTES)[0]


def one_stream_s(state: dict[str, Tensor]) -> float:
    """Seconds for the same chunk digests on one thread (one SHA-256 stream's rate)."""
    t0 = time.perf_counter()
    chunks.hash_stream(domain(StateKind.TRAINING), canonical_pieces(state), CHUNK_BYTES, parallel=False)
    return time.perf_counter() - t0


class Boundaries:
    """What `trainer.commit.run_committed` does at a boundary: snapshot on the training thread, the
    rest on a worker; at most `in_flight` snapshots alive (host memory), older ones awaited first."""

    def __init__(self, work: Callable[[Any], Any], in_flight: int = 2) -> None:
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="boundary")
        self.work = work
        self.pending: deque[Any] = deque()
        self.in_flight = in_flight
        self.wait_s = 0.0

    def __call__(self, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        while len(self.pending) >= self.in_flight:
            t0 = time.perf_counter()
            self.pending.popleft().result()
            self.wait_s += time.perf_counter() - t0
        snap = snapshot_to_host(training_state(model, opt), opt)
        self.pending.append(self.pool.submit(self.work, snap))

    def drain(self) -> None:
        while self.pending:
            self.pending.popleft().result()
        self.pool.shutdown()


def section_throughput(ctx: SimpleNamespace, clock: Clock) -> dict[str, Any]:
    config, b, t = ctx.sizes["throughput"]
    k = 5
    steps = ctx.steps
    log(f"building the throughput GPT {config} on {ctx.device}")
    t0 = time.perf_counter()
    model, opt = build(config, ctx.device)
    n_params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - t0
    cfg = GPTConfig(**config)  # type: ignore[arg-type]
    flops_per_token = 6 * n_params + 12 * cfg.n_layer * t * cfg.n_embd
    state_bytes = 12 * n_params
    out: dict[str, Any] = {"ok": False, "n_params": n_params, "model": config, "batch": b, "seq_len": t,
                           "precision": "bf16", "segment_steps": k, "steps_timed": steps,
                           "state_gb": round(state_bytes / 1e9, 3), "build_s": round(build_s, 1),
                           "peak_tflops_assumed": ctx.peak_tflops, "runs": []}  # fmt: skip
    stream = 0

    def timed(name: str, num: SimpleNamespace, boundary: Boundaries | None) -> dict[str, Any] | None:
        """One timed run; an error (out of memory, no kernel) is recorded and the next run goes on."""
        est = out.get("off_step_s", 2.0) * steps * 1.5 + (30 if boundary else 5)
        if clock.left() < est:
            out["runs"].append({"run": name, "skipped": f"needs ~{est:.0f}s, {clock.left():.0f}s left"})
            return None
        try:
            return _timed(name, num, boundary)
        except Exception as e:
            out["runs"].append({"run": name, "error": f"{type(e).__name__}: {e}"[:300]})
            log(f"{name}: {type(e).__name__}: {e}")
            return None

    def _timed(name: str, num: SimpleNamespace, boundary: Boundaries | None) -> dict[str, Any]:
        nonlocal stream
        stream += 1
        _sync(ctx.device)
        t0 = time.perf_counter()
        for seg in range(steps // k):
            if boundary is not None:
                boundary(model, opt)
            train_steps(model, opt, INNER, num, batches(ctx.text, stream, seg * k, k, b, t))  # type: ignore[arg-type]
        if boundary is not None:
            boundary(model, opt)
        _sync(ctx.device)
        train_s = time.perf_counter() - t0
        if boundary is not None:
            boundary.drain()
        total_s = time.perf_counter() - t0
        tokens = steps * b * t
        row = {"run": name, "train_s": round(train_s, 3), "total_s": round(total_s, 3),
               "tokens_per_s": round(tokens / total_s), "step_ms": round(1000 * total_s / steps, 1),
               "mfu": round(flops_per_token * tokens / total_s / (ctx.peak_tflops * 1e12), 4)}  # fmt: skip
        if boundary is not None:
            row["blocked_on_boundaries_s"] = round(boundary.wait_s, 3)
        out["runs"].append(row)
        log(f"{name}: {row['tokens_per_s']} tokens/s, MFU {row['mfu']:.1%}, {row['step_ms']} ms/step")
        return row

    bf16 = numerics("bf16", "math")
    train_steps(model, opt, INNER, bf16, batches(ctx.text, 0, 0, 2, b, t))  # type: ignore[arg-type]  # warm-up
    _sync(ctx.device)
    off = timed("commitments off", bf16, None)
    if off is None:
        return out
    out["off_step_s"] = off["step_ms"] / 1000
    if ctx.device.type == "cuda":
        out["max_memory_gb"] = round(torch.cuda.max_memory_allocated(ctx.device) / 1e9, 2)
    cores = os.cpu_count() or 1
    try:  # host buffers for two snapshots in flight (a node allocates them once per run); the hash rate
        t1 = time.perf_counter()
        first = [snapshot_to_host(training_state(model, opt), opt) for _ in range(2)]
        snap = first[0].wait()
        first[1].wait()
        del first
        out["first_snapshots_s"] = round(time.perf_counter() - t1, 2)
        single = one_stream_s(snap)
        t1 = time.perf_counter()
        chunked_hash(snap)
        par = time.perf_counter() - t1
        del snap
        out["hash_single_gb_s"] = round(state_bytes / single / 1e9, 3)
        out["hash_chunked_gb_s"] = round(state_bytes / par / 1e9, 3)
        out["hash_chunked_threads"] = cores
        out["chunk_mib"] = CHUNK_BYTES >> 20
        out["hash_chunked_efficiency"] = round(single / par / cores, 3)  # of cores × one stream
        segment_s = k * out["off_step_s"]
        out["hash_single_keeps_up"] = single <= segment_s
        out["hash_chunked_keeps_up"] = par <= segment_s
        log(
            f"hashing {out['state_gb']} GB: {out['hash_single_gb_s']} GB/s as one stream, "
            f"{out['hash_chunked_gb_s']} GB/s chunked on {cores} cores; a segment trains in {segment_s:.2f}s"
        )
    except Exception as e:
        out["hash_error"] = f"{type(e).__name__}: {e}"[:300]
    copy = timed("snapshots only (device side)", bf16, Boundaries(lambda s: s.wait()))
    hashed = timed(
        f"commitments on (chunked hash, {cores} cores, as trainer.commit)", bf16, Boundaries(chunked_hash)
    )
    for name, row in (("snapshots", copy), ("hashed", hashed)):
        if row is not None:
            out[f"overhead_{name}"] = round(row["total_s"] / off["total_s"] - 1, 4)
    if ctx.device.type == "cuda":
        timed("commitments off, flash attention", numerics("bf16", "flash"), None)
    out["ok"] = copy is not None and hashed is not None
    return out


# ---------------------------------------------------------------- 3. noise


def _group_distance(a: dict[str, Tensor], b: dict[str, Tensor], start: dict[str, Tensor]) -> dict[str, float]:
    """Per group: ‖a − b‖ / ‖b − start‖ in float64 (a: the replay, b: the claim)."""
    out = {}
    for g in GROUPS:
        num = den = 0.0
        for key, claim in b.items():
            if key.split("/", 1)[0] != g:
                continue
            c = claim.double()
            num += float((a[key].double() - c).square().sum())
            den += float((c - start[key].double()).square().sum())
        out[g] = (num**0.5 / den**0.5) if den > 0 else (0.0 if num == 0 else float("inf"))
    return out


def _trajectory(
    run: SimpleNamespace,
    device: torch.device,
    threads: int,
    start: dict[str, Tensor],
    first: int,
    keep: set[int],
) -> dict[int, dict[str, Tensor]]:
    """From `start`, steps on batches `first`, `first`+1, …: host copies of the state after each
    step count in `keep` (0 = the start itself)."""
    torch.set_num_threads(threads)
    model, opt = build(run.config, device)
    load_training_state(model, opt, start)
    out = {0: start} if 0 in keep else {}
    n = max(keep)
    for j, xy in enumerate(batches(run.text, run.seed, first, n, run.b, run.t), start=1):
        train_steps(model, opt, INNER, run.num, [xy])  # type: ignore[arg-type]
        if j in keep:
            out[j] = training_state(model, opt, copy=True)
    return out


def section_noise(ctx: SimpleNamespace, clock: Clock) -> dict[str, Any]:
    config, b, t = ctx.sizes["noise"]
    ks = [1, 2, 5] if ctx.tiny else [1, 2, 5, 10]
    warm = 3 if ctx.tiny else 10
    ref = torch.device("cpu")
    ref_threads = ctx.ref_threads
    rows: list[dict[str, Any]] = []
    out: dict[str, Any] = {"ok": False, "model": config, "batch": b, "seq_len": t, "host": str(ctx.device),
                           "host_threads": ctx.threads, "verifier": "cpu", "verifier_threads": ref_threads,
                           "trials": 0, "rows": rows}  # fmt: skip
    for precision in ("fp32", "bf16"):
        num = numerics(precision)
        noise = {k: dict.fromkeys(GROUPS, 0.0) for k in ks}
        skip = {k: dict.fromkeys(GROUPS, float("inf")) for k in ks}
        trials = 0
        for trial in range(ctx.trials):
            if clock.left() < 15:
                break
            try:
                seed = 100 + trial
                torch.set_num_threads(ref_threads)
                m, o = build(config, ref)
                train_steps(m, o, INNER, num, batches(ctx.text, seed, 0, warm, b, t))  # type: ignore[arg-type]
                start = training_state(m, o, copy=True)
                run = SimpleNamespace(config=config, text=ctx.text, seed=seed, b=b, t=t, num=num)
                host = _trajectory(run, ctx.device, ctx.threads, start, warm, set(ks))
                mine = _trajectory(run, ref, ref_threads, start, warm, set(ks))
                # the host skipped the first step of the segment: it trained on the batches after it
                skipped = _trajectory(run, ctx.device, ctx.threads, start, warm + 1, {k - 1 for k in ks})
            except Exception as e:  # recorded; the measured trials stay
                out.setdefault("errors", []).append(
                    f"{precision} trial {trial}: {type(e).__name__}: {e}"[:300]
                )
                continue
            for k in ks:
                d = _group_distance(mine[k], host[k], start)
                s = _group_distance(skipped[k - 1], host[k], start)
                for g in GROUPS:
                    noise[k][g] = max(noise[k][g], d[g])
                    skip[k][g] = min(skip[k][g], s[g])
            trials += 1
        out["trials"] = max(out["trials"], trials)
        for k in ks if trials else []:
            for g in GROUPS:
                n, s = noise[k][g], skip[k][g]
                rows.append({"precision": precision, "k": k, "group": g, "trials": trials, "noise_max": n,
                             "skip_min": s, "signal_over_noise": (s / n) if n > 0 else None})  # fmt: skip
    torch.set_num_threads(ctx.threads)
    out["ok"] = bool(rows) and out["trials"] > 0
    return out


# ---------------------------------------------------------------- driver


# ---------------------------------------------------------------- 4. sharded (phase-2 prototype)


def section_sharded(ctx: SimpleNamespace, clock: Clock) -> dict[str, Any]:
    """`trainer.sharded` (ranks as threads on this device) against the unsharded step with the same
    slice count: equal hashes mean the per-tensor kernels (norms, AdamW) do not depend on which other
    tensors share their launch, on this device too; the ranks' collective chunked hash is checked
    against the whole state's."""
    config, b, t = ctx.sizes["replay"]
    world, steps, seed = 2, 3, 11
    num = numerics("fp32")
    ref_model, ref_opt = build(config, ctx.device)
    t0 = time.perf_counter()
    train_steps(ref_model, ref_opt, INNER, num, batches(ctx.text, seed, 0, steps, b, t), world)  # type: ignore[arg-type]
    _sync(ctx.device)
    ref_s = time.perf_counter() - t0
    want = chunked_hash(training_state(ref_model, ref_opt, copy=True))
    n_moments = 2 * sum(p.numel() for p in ref_model.parameters())
    del ref_model, ref_opt
    train, boundary = LocalGroup(world), LocalGroup(world)
    models = [build(config, ctx.device)[0] for _ in range(world)]
    plan = ShardPlan.of(models[0], world)
    results: list[Any] = [None] * world
    errors: list[str] = []

    def rank(r: int) -> None:
        try:
            opt = make_shard_optimizer(models[r], plan, r, INNER)  # type: ignore[arg-type]
            step = ShardedStep(plan, train.member(r))
            t0 = time.perf_counter()
            data = batches(ctx.text, seed, 0, steps, b, t)
            train_steps(models[r], opt, INNER, num, data, world, exchange=step)  # type: ignore[arg-type]
            _sync(ctx.device)
            seconds = time.perf_counter() - t0
            state = ShardedState(plan, models[r], boundary.member(r))
            local = snapshot_to_host(state.local(models[r], opt)).wait()
            h, _ = state.hash(local, StateKind.TRAINING, CHUNK_BYTES)
            moments = sum(v.numel() for k, v in local.items() if k.startswith("exp_avg"))
            results[r] = (h, seconds, moments)
        except Exception as e:
            errors.append(f"rank {r}: {type(e).__name__}: {e}"[:300])
            train.barrier.abort()
            boundary.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=max(1.0, clock.left()))
    if errors or any(th.is_alive() for th in threads):
        return {"ok": False, "error": "; ".join(errors) or "ranks did not finish in time"}
    equal = all(h == want for h, _, _ in results)
    return {"ok": equal, "world": world, "steps": steps, "equal_to_unsharded": equal,
            "unsharded_s": round(ref_s, 3), "sharded_s": round(max(s for _, s, _ in results), 3),
            "max_moment_share": round(max(m for *_, m in results) / n_moments, 3)}  # fmt: skip


SECTIONS: dict[str, Callable[[SimpleNamespace, Clock], dict[str, Any]]] = {
    "replay": section_replay,
    "throughput": section_throughput,
    "noise": section_noise,
    "sharded": section_sharded,
}


def _print_section(name: str, res: dict[str, Any]) -> None:
    rows = res.get("cases") or res.get("runs") or res.get("rows") or []
    scalars = {k: v for k, v in res.items() if not isinstance(v, list | dict)}
    print(f"\n== {name}: " + ", ".join(f"{k}={v}" for k, v in scalars.items()), flush=True)
    if rows:
        cols = list(dict.fromkeys(c for r in rows for c in r))
        print(" | ".join(cols))
        for r in rows:
            print(
                " | ".join(
                    f"{r.get(c):.3g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols
                )
            )
    sys.stdout.flush()


def run(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (always on without CUDA)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for all sections together")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--steps", type=int, default=10, help="timed steps per throughput run (multiple of 5)")
    ap.add_argument("--trials", type=int, default=3, help="start states per noise measurement")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of the device runs")
    ap.add_argument("--ref-threads", type=int, default=0, help="CPU reference threads (0: 2 on cpu, else 1)")
    ap.add_argument("--peak-tflops", type=float, default=PEAK_BF16_TFLOPS)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--replay-worker", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.replay_worker:
        replay_worker(args.replay_worker)
        return {}
    t_start = time.monotonic()
    device = configure_determinism(args.threads, resolve_device(args.device))
    tiny = args.tiny or device.type != "cuda"
    facts = env_facts(device)
    out_path = args.out or RESULTS / ("gpu_check.json" if device.type == "cuda" else "gpu_check_cpu.json")
    ctx = SimpleNamespace(
        device=device, threads=args.threads, tiny=tiny, sizes=TINY if tiny else FULL, text=corpus(),
        steps=max(5, args.steps - args.steps % 5) if not tiny else 5, trials=args.trials if not tiny else 1,
        ref_threads=args.ref_threads or (2 if device.type == "cpu" else 1), peak_tflops=args.peak_tflops,
        replay_class=replay_class(facts),
    )  # fmt: skip
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": str(device),
        "gpu": facts.get("gpu_name", "none"),
        "tiny": tiny,
        "quick": tiny,
        "budget_s": args.budget,
        "env": facts,
        "replay_class": ctx.replay_class,
        "command": "python3 bench/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    log(f"device {device} ({result['gpu']}), torch {torch.__version__}, class {ctx.replay_class[:12]}, "
        f"{'tiny' if tiny else 'full'} sizes, budget {args.budget:.0f}s")  # fmt: skip
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    for i, name in enumerate(wanted):
        if name not in SECTIONS:
            result[name] = {"ok": False, "error": "unknown section"}
            continue
        left = args.budget - (time.monotonic() - t_start)
        share = SHARES[name] / sum(SHARES[n] for n in wanted[i:] if n in SHARES)
        clock = Clock(max(0.0, left * share))
        log(f"section {name}: {clock.left():.0f}s")
        t0 = time.monotonic()
        try:
            res = SECTIONS[name](ctx, clock)
        except Exception as e:  # fail soft: record it, run the next section
            res = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-2000:],
            }
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        res["seconds"] = round(time.monotonic() - t0, 1)
        result[name] = res
        result["pinned_memory"] = pinned_memory()
        result["elapsed_s"] = round(time.monotonic() - t_start, 1)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
        _print_section(name, res)
    log(f"done in {result.get('elapsed_s')}s; wrote {out_path}")
    return result


def main(quick: bool = False) -> None:
    """`python -m bench` entry: the full check where CUDA is, tiny sizes on CPU."""
    run(["--tiny"] if quick else [])


if __name__ == "__main__":
    run()
