"""The state pipeline at the largest GPT this box holds: a chain, a host and a verifier, each its
own OS process over HTTP, for 2 outer steps with verification. Measures, per process and per step:

- peak RSS (VmHWM) ÷ the live training state (12 B/param);
- leaf hashing GB/s on all cores ÷ (cores × one core's raw SHA-256);
- the host's disk in states, its peak per outer step (sparse checkpoints, m = `checkpoint_every`);
- bytes the verifier downloads ÷ the states it cannot rebuild (the opened starts other than
  segment 0's);
- protocol overhead on the host's training thread: its time on boundaries (snapshots,
  backpressure waits, waiting for the last leaf and the final optimizer hash) ÷ the time in the
  inner steps themselves; beside it, everything else that thread does between the steps (loading
  G_n from disk, computing and encoding Δ: DiLoCo's own work, here read with chunk verification).

"Today's code" (the pipeline before issue 11) is given by construction where it cannot run: its
state store refused files over 2 GiB, it kept all H/k + 1 states, hashed on one thread and
downloaded s full states plus the Δ per contribution. Timing on a shared 2-core box is noisy.

Run: `.venv/bin/python -m bench.scale` (full, ~315M params, 3.8 GB state) or `--quick` (a few M
params). Phase lengths come from one inner step and one state hash timed here first (the box is
shared: a guess either wastes minutes or misses deadlines), with outer step 0 waiting for both
nodes to join (`min_hosts`, `min_verifiers`). Windows close early once their last message is in
(specs §2.3.1), so they are sized twice what the calibration predicts at no cost in wall time: the
box's load changes between the calibration and the run.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "model": {"n_layer": 4, "n_head": 4, "n_embd": 256, "block_size": 32},
        "chunk": 4 << 20,
        "block_interval": 0.5,
    },
    "full": {
        "model": {"n_layer": 16, "n_head": 16, "n_embd": 1280, "block_size": 32},
        "chunk": 64 << 20,
        "block_interval": 1.0,
    },
}
H, K, S, M, STEPS = 6, 2, 2, 2, 2
"""H inner steps, segments of k, s opened, every m-th boundary persisted, outer steps."""
OLD_STORE_CAP = 2 << 30
CALIBRATION = ("inner_step_s", "state_hash_s", "delta_s")


def _proc_status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def _reset_peak(pid: int) -> None:
    """Reset a process's VmHWM (its peak RSS) so the next reading is the peak of one interval."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def _phase(url: str) -> str:
    """The node's phase from its /status (TRAINING, COMMITTED, AGGREGATING, VERIFYING, ...)."""
    try:
        with urllib.request.urlopen(url + "/status", timeout=2) as r:
            return str(json.loads(r.read()).get("phase", "?"))
    except (OSError, ValueError):
        return "?"


def _du(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:
            pass
    return total


def hashing(state_bytes: int) -> dict[str, Any]:
    """Leaf hashing on all cores (chunked, threads) vs one core's raw SHA-256 of the same bytes."""
    from protocol.tensors import StateKind, canonical_bytes, tensor_hash

    n = max(1, min(state_bytes, 1 << 30) // 4 // 3)
    g = torch.Generator().manual_seed(0)
    state = {f"{k}/w": torch.randn(n, generator=g) for k in ("param", "exp_avg", "exp_avg_sq")}
    cores = os.cpu_count() or 1
    chunk = max(1 << 20, min(64 << 20, (3 * 4 * n) // (4 * cores)))
    data = canonical_bytes(state)
    best_par, best_one = float("inf"), float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        tensor_hash(state, StateKind.TRAINING, chunk)
        best_par = min(best_par, time.perf_counter() - t0)
        t0 = time.perf_counter()
        hashlib.sha256(data).digest()
        best_one = min(best_one, time.perf_counter() - t0)
    par, one = len(data) / best_par / 1e9, len(data) / best_one / 1e9
    return {
        "bytes": len(data), "cores": cores, "chunk_bytes": chunk, "all_cores_gb_s": round(par, 3),
        "one_core_sha256_gb_s": round(one, 3), "ratio": round(par / (cores * one), 3),
        "today_ratio": round(1 / cores, 3),  # one SHA-256 stream on one thread
    }  # fmt: skip


def calibrate(model: torch.nn.Module, state_bytes: int) -> tuple[float, float, float]:
    """(seconds of one inner step, seconds to hash one training state on all cores, seconds of the
    Δ work: G_n's params read twice with each chunk checked on one thread, Δ encoded), measured
    now on this model: what the phase lengths are sized from."""
    from protocol.codecs import encode_pieces
    from protocol.config import Codec, InnerOptim, Numerics
    from protocol.tensors import StateKind, tensor_hash
    from replay.step import make_optimizer, train_steps

    opt = make_optimizer(model, InnerOptim())
    x = torch.zeros((1, 16), dtype=torch.long)
    times = []
    for _ in range(2):  # the first allocates the gradients
        t0 = time.perf_counter()
        train_steps(model, opt, InnerOptim(), Numerics(), [(x, x)])
        times.append(time.perf_counter() - t0)
    state = {n: p.detach() for n, p in model.named_parameters()}
    t0 = time.perf_counter()
    tensor_hash(state, StateKind.TRAINING, 64 << 20)
    param_bytes = 4 * sum(t.numel() for t in state.values())
    per_byte = (time.perf_counter() - t0) / param_bytes
    t0 = time.perf_counter()
    hashlib.sha256(memoryview(next(iter(state.values())).numpy()).cast("B")).digest()
    one_core = (time.perf_counter() - t0) / (4 * next(iter(state.values())).numel())
    t0 = time.perf_counter()
    layout = {n: tuple(t.shape) for n, t in state.items()}
    b"".join(encode_pieces(sorted(state.items()), layout, Codec.INT8, 256))
    delta_s = time.perf_counter() - t0 + 2 * one_core * param_bytes
    del opt, state
    return times[-1], per_byte * state_bytes, delta_s


def run(quick: bool, folder: Path) -> dict[str, Any]:
    from chain.client import HttpChainClient
    from gonka_diloco.devnet import node_toml
    from gonka_diloco.procs import NodeProcess, Supervisor, python_cli
    from nodekit.globalmodel import GlobalModel
    from nodekit.objects import Kind, ObjectPolicy
    from protocol.config import ModelSpec, Phases, RunConfig, Stake
    from protocol.keys import test_wallet
    from protocol.messages import MsgCreateRun
    from replay.data import shakespeare_manifest
    from replay.spec import build_model

    preset = PRESETS["quick" if quick else "full"]
    spec = ModelSpec(factory="trainer.model:small_gpt", config={**preset["model"], "seed": 0})
    model = build_model(spec)
    params = sum(p.numel() for p in model.parameters())
    chunk = preset["chunk"]
    g0 = GlobalModel.from_module(model, chunk).hash
    _, manifest = shakespeare_manifest()
    from protocol.config import InnerOptim
    from protocol.inner import state_bytes_per_param

    # a training state at the run's moments (the default's: int8, 6.03 B/param; fp32's are 12)
    measured = calibrate(model, int(state_bytes_per_param(InnerOptim().moments) * params))
    print(f"calibration: inner step {measured[0]:.2f} s, state hash {measured[1]:.2f} s, "
          f"Δ work {measured[2]:.2f} s", flush=True)  # fmt: skip
    # in a node the boundary worker's hashing and writing, the other node and other tenants share
    # the two cores (one 315M run: 3.8 s per inner step here on a quiet box, 12.5 s in the host;
    # on a loaded box the calibration itself is slow), and the phases end at their deadlines: margins
    # cost wall time, too little misses the commit
    step_s, io_s, delta_s = (f * x for f, x in zip((1.3, 1.3, 2.5), measured, strict=True))
    bi = preset["block_interval"]
    n_seg = H // K

    def blocks(seconds: float) -> int:  # windows close early (specs §2.3.1): a generous bound costs
        return max(3, int(2.0 * seconds / bi) + 1)  # nothing; at ×1.2 a loaded run missed a commit

    # what each node does in each phase (see the module doc of trainer.commit / verifier.verify)
    train_s = H * step_s + delta_s + 2 * io_s + n_seg * max(0.0, io_s - K * step_s)  # + hashing lags
    reveal_s = K * step_s + 2 * io_s  # at most one opened start recomputed, hashed and written
    verify_s = S * K * step_s + 2 * S * io_s + delta_s  # fetch + hash starts, hash ends, Δ
    result_s = 3 * io_s + delta_s  # G_n read, Δ decoded, G_{n+1} computed, hashed and written

    cfg = RunConfig(
        name="scale", model=spec, dataset_manifest_hash=manifest.manifest_hash(), initial_model_hash=g0,
        inner_steps=H, segment_len=K, sampled_segments=S, batch_size=1, seq_len=16, data_shards=2,
        state_chunk_bytes=chunk, max_outer_steps=STEPS, threads=1,
        phases=Phases(
            join_blocks=3, min_hosts=1, min_verifiers=1,  # step 0 opens once both have joined
            train_blocks=blocks(15 + train_s), reveal_blocks=blocks(10 + reveal_s),
            verify_blocks=blocks(15 + verify_s), escalation_blocks=blocks(15 + verify_s),
            result_blocks=blocks(10 + result_s), epoch_length=1_000_000, early_close=True,
        ),
        stake=Stake(min_host_stake=1, min_verifier_stake=1),
    )  # fmt: skip
    objects = ObjectPolicy.of(model, cfg)
    state_len = objects.length(Kind.STATE)
    del model
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # give the model's pages back before the nodes start
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    sup = Supervisor()
    procs: dict[str, NodeProcess] = {}
    samples: dict[str, list[tuple[float, int, int]]] = {"host": [], "verifier": []}
    by_phase: dict[str, dict[str, int]] = {"host": {}, "verifier": {}}
    disk: list[tuple[float, int, int]] = []
    stop = threading.Event()
    try:
        argv = python_cli("chain", "start", "--home", str(folder / "chain"), "--port", "0",
                          "--block-interval", str(bi))  # fmt: skip
        chain = NodeProcess("chain", argv, folder / "chain.log", env=env)
        sup.add(chain)
        chain.start()
        url = chain.wait_listening(120)
        client = HttpChainClient(url)
        authority = test_wallet(0)
        client.broadcast(authority, [MsgCreateRun(creator=str(authority.address()), config=cfg)])
        run_id = int(client.query("runs")["runs"][-1]["run_id"])
        for name, role, index, extra in (
            ("host", "host", 1, {"checkpoint_every": M}),
            ("verifier", "verifier", 2, {}),
        ):
            home = folder / name
            home.mkdir(parents=True, exist_ok=True)
            fields = {"chain_url": url, "run_id": run_id, "data_dir": str(home), "listen": "127.0.0.1:0",
                      "stake": 1000, "threads": 1, **extra}  # fmt: skip
            (home / f"{role}.toml").write_text(node_toml(fields, {"test_index": index}))
            procs[name] = NodeProcess(name, python_cli(role, "run", "--config", str(home / f"{role}.toml")),
                                      folder / f"{name}.log", env=env)  # fmt: skip
            sup.add(procs[name])
            procs[name].start()
        urls = {name: p.wait_listening(300) for name, p in procs.items()}
        last_phase = {name: "STARTING" for name in procs}

        def sample() -> None:
            """Every 0.25 s: each node's phase and its peak RSS since the last sample (VmHWM, then
            reset), attributed to the phases seen at both ends of the interval."""
            while not stop.wait(0.25):
                t = time.monotonic()
                for name, p in procs.items():
                    if p.pid:
                        ph = _phase(urls[name])
                        st = _proc_status(p.pid)
                        _reset_peak(p.pid)
                        if st:
                            samples[name].append((t, st.get("VmRSS", 0), st.get("VmHWM", 0)))
                            for label in {last_phase[name], ph}:
                                by_phase[name][label] = max(by_phase[name].get(label, 0), st.get("VmHWM", 0))
                        last_phase[name] = ph
                store = folder / "host" / "store"
                states = sum(p.stat().st_size for p in store.glob("*/*.state") if p.exists())
                disk.append((t, _du(store), states))

        threading.Thread(target=sample, daemon=True).start()
        t0 = time.monotonic()
        deadline = t0 + (600 if quick else 3600)
        while time.monotonic() < deadline:
            r = client.run(run_id)
            if r["status"] != "active" and r["phase"] == "DONE":
                break
            if not all(p.alive for p in procs.values()):
                raise RuntimeError(f"a node died: {[n for n, p in procs.items() if not p.alive]}")
            time.sleep(1)
        else:
            raise RuntimeError("the run did not finish in time")
        time.sleep(3)  # the last aggregation
        peaks = {name: max((s[2] for s in samples[name]), default=0) for name in procs}
        for name, p in procs.items():  # the final word on peaks, read before the processes go
            if p.pid:
                peaks[name] = max(peaks[name], _proc_status(p.pid).get("VmHWM", 0))
        wall = time.monotonic() - t0
        steps = [client.outer_step(run_id, n) for n in range(STEPS)]
        host_addr = str(test_wallet(1).address())
        challenges = [client.query("challenges", run_id=run_id, step=n)["challenges"] for n in range(STEPS)]
    finally:
        stop.set()
        sup.close()

    def events(name: str) -> list[dict[str, Any]]:
        out = []
        for line in (folder / f"{name}.log").read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict):
                out.append(e)
        return out

    host_ev, ver_ev = events("host"), events("verifier")
    trained = [e for e in host_ev if e.get("event") == "trained"]
    train_s = sum(e["seconds"] for e in trained)
    boundary_s = sum(e.get("boundary_seconds", 0.0) for e in trained)
    steps_s = sum(e.get("step_seconds", 0.0) for e in trained)  # the inner steps alone
    protocol_s = sum(e.get("protocol_seconds", 0.0) for e in trained)  # all the rest
    waits: dict[str, float] = {}  # boundary_s by cause (trainer.boundaries.WAIT_CAUSES)
    for e in trained:
        for k, v in (e.get("boundary_waits") or {}).items():
            waits[k] = round(waits.get(k, 0.0) + v, 3)
    per_step = []
    today_down = S * state_len + objects.length(Kind.DELTA)  # s full states and the Δ, every time
    for n in range(STEPS):
        segs = next((c["segments"] for c in challenges[n] if c["host"] == host_addr), [])
        cannot = len([s for s in segs if s != 0])  # the issue's definition: opened starts but segment 0's
        fetched = [e for e in ver_ev if e.get("event") == "fetched" and e.get("outer_step") == n]
        by_kind: dict[str, int] = {}
        for e in fetched:
            by_kind[e["kind"]] = by_kind.get(e["kind"], 0) + int(e["bytes"])
        down = sum(by_kind.values())
        # disk: the host's store during this step (from its open to its done height, by sample time)
        per_step.append({
            "outer_step": n, "opened": segs, "outcome": steps[n]["outcomes"].get(host_addr),
            "verifier_bytes": down, "verifier_bytes_by_kind": json.dumps(by_kind),
            "states_not_rebuildable": cannot,
            "download_ratio": round(down / (cannot * state_len), 3) if cannot else None,
            "today_download_ratio": round(today_down / (cannot * state_len), 3) if cannot else None,
        })  # fmt: skip
    peak_disk = max((d for _, d, _ in disk), default=0)
    peak_states = max((st for _, _, st in disk), default=0)
    live = 12 * params
    rss = {
        name: {"peak_rss_gb": round(peaks[name] / 1e9, 3), "ratio": round(peaks[name] / live, 3)}
        for name in peaks
    }
    dls = [p["download_ratio"] for p in per_step if p["download_ratio"] is not None]
    return {
        "quick": quick,
        "params": params,
        "model": preset["model"],
        "state_bytes": state_len,
        "chunk_bytes": chunk,
        "H": H, "k": K, "s": S, "m": M, "outer_steps": STEPS,
        "accepted": [s["outcomes"].get(host_addr) for s in steps],
        "host_peak_rss_ratio": rss["host"]["ratio"],
        "verifier_peak_rss_ratio": rss["verifier"]["ratio"],
        "rss": [{"process": k, **v} for k, v in rss.items()],
        "peak_rss_ratio_by_phase": {
            name: {ph: round(v / live, 3) for ph, v in sorted(by_phase[name].items(), key=lambda kv: -kv[1])}
            for name in by_phase
        },
        "host_disk_peak_states": round(peak_disk / state_len, 2),
        "disk_states": round(peak_disk / state_len, 2),
        "verifier_download_ratio": max(dls) if dls else None,
        "host_disk_peak_training_states": round(peak_states / state_len, 2),
        "disk_goal_states": n_seg / M + S + 3,
        "today_disk_states": n_seg + 1 + 2,  # every boundary kept until DONE, plus G_n, G_n+1, optimizer
        "protocol_overhead": round(boundary_s / steps_s, 4) if steps_s else None,
        "training_thread_other_overhead": round((protocol_s - boundary_s) / steps_s, 4) if steps_s else None,
        "train_seconds": round(train_s, 1),
        "inner_step_seconds": round(steps_s, 1),
        "protocol_seconds": round(protocol_s, 2),
        "boundary_seconds": round(boundary_s, 2),
        "boundary_seconds_by_cause": waits,
        "calibration": {k: round(x, 2) for k, x in zip(CALIBRATION, measured, strict=True)},
        "phases": cfg.phases.model_dump(),
        "per_step": per_step,
        "today_runs_at_all": state_len <= OLD_STORE_CAP,
        "wall_seconds": round(wall, 1),
        "noise": "shared 2-core machine: timing figures vary with the other tenants' load",
    }  # fmt: skip


def main(quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        result = run(quick, Path(tmp))
    result["hashing"] = hashing(result["state_bytes"])
    result["hash_efficiency"] = result["hashing"]["ratio"]  # the key bench.plan and plan_constants read
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=2) + "\n"
    (RESULTS / "scale.json").write_text(text)
    if not quick:
        (RESULTS / "scale.full.json").write_text(text)
    for line in render(result):
        print(line)
    return result


def render(d: dict[str, Any]) -> list[str]:
    ps = d["per_step"]
    dl = [p["download_ratio"] for p in ps if p["download_ratio"] is not None]
    old_dl = [p["today_download_ratio"] for p in ps if p["today_download_ratio"] is not None]
    today = "runs" if d["today_runs_at_all"] else "cannot run: state > 2 GiB store cap (opened states 404)"
    rows = [
        ("peak RSS ÷ live training state, host", "≤ 2.0", d["host_peak_rss_ratio"], "n/a (not run)"),
        ("peak RSS ÷ live training state, verifier", "≤ 2.0", d["verifier_peak_rss_ratio"], "n/a (not run)"),
        ("leaf hashing, all cores ÷ (cores × 1-core SHA-256)", "≥ 0.8",
         d.get("hash_efficiency", d.get("hashing_ratio")), d["hashing"]["today_ratio"]),
        ("host disk per outer step, in states (peak; all objects)", f"≤ {d['disk_goal_states']:g}",
         d["host_disk_peak_states"], d["today_disk_states"]),
        ("… of which training states (boundaries)", f"≤ {d['disk_goal_states'] - 3:g}",
         d["host_disk_peak_training_states"], d["today_disk_states"] - 2),
        ("verifier bytes ÷ states it cannot rebuild", "≤ 1.05", max(dl) if dl else "none needed",
         max(old_dl) if old_dl else "n/a"),
        ("protocol overhead on the training thread", "≤ 3%",
         f"{100 * d['protocol_overhead']:.2f}%" if d["protocol_overhead"] is not None else "n/a", "n/a"),
    ]  # fmt: skip
    out = [
        f"GPT {d['params'] / 1e6:.0f}M params, state {d['state_bytes'] / 1e9:.2f} GB, chunks "
        f"{d['chunk_bytes'] >> 20} MiB, H={d['H']} k={d['k']} s={d['s']} m={d['m']}, "
        f"{d['outer_steps']} outer steps, outcomes {d['accepted']}; today's code: {today}",
        "",
        "| figure | goal | ours | today's code |",
        "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {e} |" for a, b, c, e in rows],
        "",
        f"({d['noise']}; train {d['train_seconds']} s, boundaries {d['boundary_seconds']} s, wall "
        f"{d['wall_seconds']} s)",
    ]
    if "protocol_seconds" in d:  # results from before the per-step split lack these
        rest = d["protocol_seconds"] - d["boundary_seconds"]
        out[-1] = out[-1][:-1] + (f"; inner steps alone {d['inner_step_seconds']} s, the rest between steps "
                                  f"(loading G_n, computing and encoding Δ) {rest:.1f} s)")  # fmt: skip
    if d.get("boundary_seconds_by_cause"):
        causes = ", ".join(f"{k} {v} s" for k, v in d["boundary_seconds_by_cause"].items() if v)
        out.append(f"Boundary time by cause (`trainer.boundaries.WAIT_CAUSES`): {causes}.")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    main(quick=ap.parse_args().quick)
    sys.exit(0)
