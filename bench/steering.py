"""Steering left in tolerance mode: how far a host spending a fraction of every threshold at every
boundary moves its accepted Δ, against honest 1- vs 2-thread noise (issue 23).

One host, T outer steps of a tiny GPT, every segment opened and replayed by a 1-thread verifier.
Thresholds from `verifier.calibrate` (1 vs 2 threads, the run's k, the fresh state and warm ones,
8× the noise). Per outer step, from the same start (G_n and the host's carried optimizer state):

- honest noise: the Δ an honest host trains with 2 threads (a separate process) against the Δ of
  1 thread, and whether the 1-thread verifier accepts the 2-thread host (false rejections);
- steering: `budget_steer` (every boundary moved by `fraction` of every threshold, one fixed way)
  against the honest 1-thread Δ from its own start; judged by the group norms alone (the checks
  before issue 23), by every per-segment check of specs §6 (those before §6.4) and by every
  check, the opened segments' summed residuals included (§6.4, thresholds 8× their honest noise
  over all opened segments, measured the same two ways). Targets: "group" (the group norms' budget,
  exp_avg spent where exp_avg_sq = 0: the issue's attack) and "update" (the strongest steering
  found within every check, on the free coordinates or on all of them, spending 0.9 of the
  cumulative thresholds too; `cumulative=False`: the strongest within the per-segment checks
  alone, which the cumulative ones reject).

Deviations are relative L2 ‖Δ_x − Δ_ref‖/‖Δ_ref‖ and cosine; drift is the global model's distance
from the honest run's, relative to how far the honest run moved from G_0.

    .venv/bin/python -m bench.steering [--quick] [--precision bf16]

Prints the table and writes bench/results/steering.json (steering_bf16.json for bf16).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from gonka_diloco.adversaries import resolve_host
from gonka_diloco.adversaries.lab import HostRun, Lab, next_global, synthetic_corpus, tiny_config
from nodekit.globalmodel import GlobalModel
from nodekit.statestore import StateStore
from protocol import codecs
from protocol.config import Codec, Numerics, Precision, ReplayMode, RunConfig
from protocol.messages import EnvFingerprint
from replay.step import configure_determinism, optimizer_hash
from trainer.behaviour import HostBehaviour
from trainer.commit import TrainedStep
from verifier.calibrate import CONFIG_FIELDS, FLOOR, calibrate
from verifier.tolerance import (
    CUMULATIVE_CHECKS,
    TOLERANCE_CHECKS,
    Cumulative,
    group_mismatch,
    tolerance_distances,
    tolerance_mismatch,
)
from verifier.verify import replay_segment, verify

HOST = "gonka1" + "s" * 38
CALIBRATION_HOSTS = [f"gonka1cal{i}" for i in range(3)]  # only the PRF sees them: distinct batches
JUDGED_HOSTS = [f"gonka1judged{i}" for i in range(2)]  # honest 2-thread runs judged, not calibrated on
FACTOR = 8.0
CORPUS = "synthetic:40000:0"
RESULTS = Path(__file__).parent / "results"
ATTACKS: list[dict[str, Any]] = [
    {"target": "group", "fraction": 0.5},
    {"target": "group", "fraction": 0.9},
    {"target": "update", "where": "free", "fraction": 0.9},
    {"target": "update", "where": "all", "fraction": 0.9},
    {"target": "update", "where": "along", "fraction": 0.9},
    {"target": "group", "fraction": 0.9, "params": False},  # the moments' channel alone ...
    {"target": "update", "where": "free", "fraction": 0.9, "params": False},  # ... before and after
    # the strongest steering within every per-segment check, blind to the cumulative ones (§6.4)
    {"target": "update", "where": "free", "fraction": 0.9, "cumulative": False},
]
Tensors = Mapping[str, torch.Tensor]
ALL_CHECKS = (*TOLERANCE_CHECKS, *CUMULATIVE_CHECKS)


def rel_l2(x: Tensors, ref: Tensors) -> float:
    num = sum(float((x[n].double() - ref[n].double()).square().sum()) for n in ref)
    den = sum(float(ref[n].double().square().sum()) for n in ref)
    return math.sqrt(num / den) if den else math.inf


def cosine(x: Tensors, ref: Tensors) -> float:
    dot = sum(float((x[n].double() * ref[n].double()).sum()) for n in ref)
    nx = math.sqrt(sum(float(x[n].double().square().sum()) for n in ref))
    nr = math.sqrt(sum(float(ref[n].double().square().sum()) for n in ref))
    return dot / (nx * nr) if nx and nr else math.nan


def drift(g: GlobalModel, honest: GlobalModel, g0: GlobalModel) -> float:
    moved = {n: honest.params[n] - g0.params[n] for n in g0.params}
    gap = {n: g.params[n] - honest.params[n] for n in g0.params}
    return rel_l2({n: gap[n] + moved[n] for n in moved}, moved)  # ‖gap‖ / ‖moved‖


def delta_of(run: HostRun, gm: GlobalModel) -> dict[str, torch.Tensor]:
    return codecs.decode(run.contribution.payload, gm.layout)


def segment_distances(lab: Lab, run: HostRun, outer: int, gm: GlobalModel) -> list[dict[str, float]]:
    """Every segment replayed by this process: the five distances of each claimed end, each with
    the cumulative distances of all segments together (`Cumulative`, every segment opened)."""
    cfg = lab.cfg
    job = lab.job(run, outer, "00" * 32, sampled=list(range(cfg.n_segments)))
    ctx = lab.replay_context(gm)
    out = []
    total = Cumulative()
    for o in job.openings:
        start, claim = run.store.get(o.start_leaf), run.store.get(o.end_leaf)
        end = replay_segment(job, ctx, start, o.segment)
        out.append(tolerance_distances(end, claim, start, cfg.inner))
        total.add(end, claim, start, cfg.inner)
    return [{**d, **total.distances()} for d in out]


def judge(lab: Lab, run: HostRun, outer: int, gm: GlobalModel) -> dict[str, Any]:
    """Every segment opened: the verdict of every check (specs §6), that of the group norms alone,
    and the largest distance ÷ threshold of each check over the segments."""
    cfg = lab.cfg
    job = lab.job(run, outer, "00" * 32, sampled=list(range(cfg.n_segments)))
    out = verify(job, run.source(), lab.replay_context(gm))
    ctx = lab.replay_context(gm)
    old_ok = seg_ok = True
    worst = dict.fromkeys(ALL_CHECKS, 0.0)
    total = Cumulative()
    for o in job.openings:
        start, claim = run.store.get(o.start_leaf), run.store.get(o.end_leaf)
        end = replay_segment(job, ctx, start, o.segment)
        old_ok &= group_mismatch(end, claim, start, cfg.tolerances) is None
        seg_ok &= tolerance_mismatch(end, claim, start, cfg.tolerances, cfg.inner) is None
        d = tolerance_distances(end, claim, start, cfg.inner)
        worst = {g: max(worst[g], d[g] / cfg.tolerances[g]) for g in TOLERANCE_CHECKS}
        total.add(end, claim, start, cfg.inner)
    cum, tau = total.distances(), cfg.cumulative_tolerances
    worst.update({g: cum[g] / tau[g] for g in CUMULATIVE_CHECKS})
    return {"new": out.accept, "reason": out.reason.name, "detail": out.detail, "old": old_ok,
            "segment": seg_ok, "worst": worst}  # fmt: skip


# ---------------------------------------------------------------- the 2-thread hosts (own process)


def _save_gm(gm: GlobalModel, path: Path) -> None:
    save_file({k: v.contiguous() for k, v in gm.to_tensors().items()}, str(path))


def _record(run: HostRun, n: int, prev: str | None, root: Path, tag: str) -> dict[str, Any]:
    c = run.contribution
    payload = root / f"{tag}-{n}.payload"
    payload.write_bytes(c.payload)
    return {"n": n, "host": run.address, "payload": str(payload), "store": str(run.store.root),
            "leaves": c.leaves, "root": c.trajectory_root, "delta_hash": c.delta_hash,
            "final_optimizer_hash": c.final_optimizer_hash, "tokens": c.tokens, "env": c.env.model_dump(),
            "base": c.base_model_hash, "prev": prev}  # fmt: skip


def worker(job: dict[str, Any]) -> None:
    """With `threads` threads: an honest contribution of `HOST` from each given start, and whole
    honest runs of `steps` outer steps from G_0 (one per address in `runs`), G_n saved per step."""
    configure_determinism(job["threads"])
    cfg = RunConfig.model_validate(job["cfg"])
    root = Path(job["root"])
    lab = Lab(cfg, synthetic_corpus(), root / "two")
    out: dict[str, Any] = {"starts": [], "runs": {}}
    for s in job["starts"]:
        gm = GlobalModel.from_tensors(load_file(s["gm"]))
        carried = load_file(s["opt"]) if s["opt"] else None
        run = lab.train(HostBehaviour(), HOST, s["n"], gm, carried, s["prev"])
        out["starts"].append(_record(run, s["n"], s["prev"], root, "two"))
    for i, host in enumerate(job["runs"]):
        own = Lab(cfg, synthetic_corpus(), root / f"run-{i}")
        gm = GlobalModel.from_tensors(load_file(job["g0"]))
        carried, prev, records = None, None, []
        for n in range(job["steps"]):
            _save_gm(gm, root / f"run-{i}-g{n}.st")
            run = own.train(HostBehaviour(), host, n, gm, carried, prev)
            records.append({**_record(run, n, prev, root, f"run-{i}"), "gm": str(root / f"run-{i}-g{n}.st")})
            gm = next_global(gm, [run], cfg)
            carried, prev = run.final_state, optimizer_hash(run.final_state)
        _save_gm(gm, root / f"run-{i}-g{job['steps']}.st")
        out["runs"][host] = {"steps": records, "final": str(root / f"run-{i}-g{job['steps']}.st")}
    (root / "two.json").write_text(json.dumps(out))


def load_run(lab: Lab, r: dict[str, Any]) -> HostRun:
    """A contribution the worker trained, as the verifier sees it."""
    payload = Path(r["payload"]).read_bytes()
    c = TrainedStep(
        outer_step=r["n"], base_model_hash=r["base"], leaves=r["leaves"], trajectory_root=r["root"], delta={},
        payload=payload, delta_hash=r["delta_hash"], codec=lab.cfg.codec,
        final_optimizer_hash=r["final_optimizer_hash"], tokens=r["tokens"], env=EnvFingerprint(**r["env"]),
        mean_loss=0.0, losses=[],
    )  # fmt: skip
    store = StateStore(r["store"])
    blobs = {c.delta_hash: payload}  # nodes serve the committed payload itself (as `Lab.train`)
    return HostRun(r["host"], HostBehaviour(), c, store, blobs, r["prev"], store.get(c.leaves[-1]))


def spawn_worker(cfg: RunConfig, root: Path, starts: list[dict[str, Any]], runs: list[str], steps: int,
                 g0: Path, threads: int = 2) -> dict[str, Any]:  # fmt: skip
    """`worker` in its own process (its thread count is the process's), its records back."""
    job = {"cfg": cfg.model_dump(mode="json"), "root": str(root), "threads": threads, "starts": starts,
           "runs": runs, "steps": steps, "g0": str(g0)}  # fmt: skip
    (root / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, "-m", "bench.steering", "--worker", str(root / "job.json")],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads((root / "two.json").read_text())


# ---------------------------------------------------------------- the benchmark


def run_setting(cfg: RunConfig, steps: int, calib_trials: int, root: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    k = cfg.segment_len
    # thresholds: 8× the honest 1- vs 2-thread noise, the larger of `verifier calibrate`'s (single
    # segments from warm states and the fresh one) and that of whole honest runs of other hosts
    # (T outer steps, every segment: they also see the states after outer steps, where the
    # parameters' noise, 0 in most segments and ~1e-6 in a few, shows up)
    proposal = calibrate(cfg, CORPUS, ks=(k,), threads=(1, 2), trials=calib_trials, warmup=5,
                         opened=cfg.n_segments)  # fmt: skip
    row = proposal.rows[0]
    base = cfg.model_copy(update={"replay_mode": ReplayMode.TOLERANCE,
                                  **{CONFIG_FIELDS[g]: v for g, v in row.threshold.items()}})  # fmt: skip
    lab = Lab(base, synthetic_corpus(), root / "one")
    g0 = GlobalModel.from_module(lab.build()[0])
    # the honest 1-thread run of HOST; its starts go to the 2-thread process
    honest_g, starts, honest_runs = [g0], [], []
    carried, prev = None, None
    for n in range(steps):
        gm = honest_g[-1]
        _save_gm(gm, root / f"g-{n}.st")
        opt = ""
        if carried is not None:
            opt = str(root / f"o-{n}.st")
            save_file({k_: v.contiguous() for k_, v in carried.items()}, opt)
        starts.append({"n": n, "gm": str(root / f"g-{n}.st"), "opt": opt, "prev": prev})
        run = lab.train(HostBehaviour(), HOST, n, gm, carried, prev)
        honest_runs.append(run)
        honest_g.append(next_global(gm, [run], base))
        carried, prev = run.final_state, optimizer_hash(run.final_state)
    two = spawn_worker(base, root, starts, [*CALIBRATION_HOSTS, HOST, *JUDGED_HOSTS], steps, root / "g-0.st")
    run_noise = dict.fromkeys(ALL_CHECKS, 0.0)
    for r in (r for h in CALIBRATION_HOSTS for r in two["runs"][h]["steps"]):
        gm = GlobalModel.from_tensors(load_file(r["gm"]))
        for d in segment_distances(lab, load_run(lab, r), r["n"], gm):
            run_noise = {g: max(run_noise[g], d[g]) for g in ALL_CHECKS}
    # and their Δ noise: each 2-thread step against 1 thread from the same start (G_n, carried state)
    cal_noise = []
    for h in CALIBRATION_HOSTS:
        carried = None
        for r in two["runs"][h]["steps"]:
            gm, run2 = GlobalModel.from_tensors(load_file(r["gm"])), load_run(lab, r)
            run1 = lab.train(HostBehaviour(), h, r["n"], gm, carried, r["prev"])
            d1, d2 = delta_of(run1, gm), delta_of(run2, gm)
            cal_noise.append({"host": h, "n": r["n"], "dev": rel_l2(d2, d1), "cos": cosine(d2, d1)})
            carried = run2.final_state
    tau = {g: max(row.threshold[g], FACTOR * run_noise[g], FLOOR) for g in ALL_CHECKS}
    tcfg = base.model_copy(update={CONFIG_FIELDS[g]: v for g, v in tau.items()})
    lab = Lab(tcfg, synthetic_corpus(), root / "one-t")
    # honest noise: HOST with 2 threads from the 1-thread run's starts, judged by this 1-thread verifier
    noise, accepted, worst_two = [], 0, dict.fromkeys(ALL_CHECKS, 0.0)
    for r in two["starts"]:
        n = r["n"]
        run2, d1 = load_run(lab, r), delta_of(honest_runs[n], honest_g[n])
        noise.append({"n": n, "dev": rel_l2(delta_of(run2, honest_g[n]), d1),
                      "cos": cosine(delta_of(run2, honest_g[n]), d1)})  # fmt: skip
        verdict = judge(lab, run2, n, honest_g[n])
        accepted += verdict["new"]
        worst_two = {g: max(worst_two[g], verdict["worst"][g]) for g in ALL_CHECKS}
    for h in JUDGED_HOSTS:  # whole 2-thread runs of other hosts, every segment, every outer step
        for r in two["runs"][h]["steps"]:
            verdict = judge(lab, load_run(lab, r), r["n"], GlobalModel.from_tensors(load_file(r["gm"])))
            accepted += verdict["new"]
            worst_two = {g: max(worst_two[g], verdict["worst"][g]) for g in ALL_CHECKS}
    own = two["runs"][HOST]["steps"]
    two_run = [GlobalModel.from_tensors(load_file(r["gm"])) for r in own[1:]]
    two_run.append(GlobalModel.from_tensors(load_file(two["runs"][HOST]["final"])))
    drift_noise = [drift(two_run[n], honest_g[n + 1], g0) for n in range(steps)]
    samples = noise + cal_noise  # every honest 2-thread step against 1 thread from its start
    max_noise = max(x["dev"] for x in samples)
    attacks = []
    for params in ATTACKS:
        adversary = resolve_host("budget_steer", params)
        gm, carried, prev = g0, None, None
        steps_out = []
        for n in range(steps):
            run = lab.train(adversary, HOST, n, gm, carried, prev)
            ref = lab.train(HostBehaviour(), HOST, n, gm, carried, prev)
            verdict = judge(lab, run, n, gm)
            d_att, d_ref = delta_of(run, gm), delta_of(ref, gm)
            gm = next_global(gm, [run], tcfg)
            carried, prev = run.final_state, optimizer_hash(run.final_state)
            steps_out.append({"n": n, "dev": rel_l2(d_att, d_ref), "cos": cosine(d_att, d_ref),
                              "drift": drift(gm, honest_g[n + 1], g0), "accepted_new": verdict["new"],
                              "accepted_old": verdict["old"], "accepted_segment": verdict["segment"],
                              "reason": verdict["reason"],
                              "worst": verdict["worst"]})  # fmt: skip
        new_ok = [s for s in steps_out if s["accepted_new"]]
        old_ok = [s for s in steps_out if s["accepted_old"]]
        seg_ok = [s for s in steps_out if s["accepted_segment"]]
        attacks.append({
            **params, "label": "budget_steer " + " ".join(f"{k_}={v}" for k_, v in params.items()),
            "accepted_new": len(new_ok), "accepted_old": len(old_ok), "accepted_segment": len(seg_ok),
            "steps": steps, "max_dev_accepted_segment": max((s["dev"] for s in seg_ok), default=None),
            "max_dev_accepted_new": max((s["dev"] for s in new_ok), default=None),
            "max_dev_accepted_old": max((s["dev"] for s in old_ok), default=None),
            "min_cos_accepted_new": min((s["cos"] for s in new_ok), default=None),
            "min_cos_accepted_old": min((s["cos"] for s in old_ok), default=None),
            "final_drift": steps_out[-1]["drift"], "per_step": steps_out,
        })  # fmt: skip
    return {
        "precision": str(cfg.numerics.precision), "H": cfg.inner_steps, "k": k,
        "segments_opened": cfg.n_segments, "outer_steps": steps, "model": cfg.model.config,
        "calibration_trials": calib_trials, "calibration_hosts": len(CALIBRATION_HOSTS), "thresholds": tau,
        "calibrated_noise": row.noise,
        "calibration_share_differing": row.noisy, "calibrate_thresholds": row.threshold,
        "run_noise": run_noise,
        "honest": {"per_step": noise, "calibration_hosts": cal_noise, "max_dev": max_noise,
                   "samples": len(samples), "nonzero": sum(x["dev"] > 0 for x in samples),
                   "min_cos": min(x["cos"] for x in samples),
                   "drift": drift_noise, "two_thread_accepted": accepted,
                   "two_thread_hosts": len(noise) + len(JUDGED_HOSTS) * steps,
                   "two_thread_worst_over_threshold": worst_two},
        "attacks": attacks, "seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip


def _fmt(x: float | None, pct: bool = True) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.4g}%" if pct else f"{x:.6f}"


def report(result: dict[str, Any]) -> None:
    h = result["honest"]
    print(f"\nsteering, {result['precision']}: tiny GPT, H={result['H']} k={result['k']}, all "
          f"{result['segments_opened']} segments opened, T={result['outer_steps']} outer steps; thresholds "
          + ", ".join(f"{g} {v:.2e}" for g, v in result["thresholds"].items()))  # fmt: skip
    print("  8× noise of `verifier calibrate` "
          + ", ".join(f"{g} {v:.2e}" for g, v in result["calibrate_thresholds"].items())
          + "; of whole honest runs "
          + ", ".join(f"{g} {FACTOR * v:.2e}" for g, v in result["run_noise"].items()))
    print(f"honest 1 vs 2 threads: Δ deviation max {_fmt(h['max_dev'])} over {h['samples']} host-steps "
          f"({h['nonzero']} not bitwise equal; cos ≥ {_fmt(h['min_cos'], False)}), "
          f"drift after T {_fmt(h['drift'][-1])}; 2-thread host accepted {h['two_thread_accepted']}/"
          f"{h['two_thread_hosts']}, worst distance/threshold "
          + ", ".join(f"{g} {v:.3f}" for g, v in h["two_thread_worst_over_threshold"].items()))  # fmt: skip
    print(f"{'attack':<72} {'old checks':>10} {'max Δ dev':>11} {'per segment':>11} {'max Δ dev':>11} "
          f"{'every check':>11} {'max Δ dev':>11} {'min cos':>9} {'× noise':>9} {'drift':>9}")  # fmt: skip
    for a in result["attacks"]:
        dev = a["max_dev_accepted_new"]
        times = "n/a" if dev is None or not h["max_dev"] else f"{dev / h['max_dev']:.3g}"
        cos = a["min_cos_accepted_new"] if a["accepted_new"] else a["min_cos_accepted_old"]
        old, seg = _fmt(a["max_dev_accepted_old"]), _fmt(a.get("max_dev_accepted_segment"))
        print(f"{a['label']:<72} {a['accepted_old']:>4}/{a['steps']:<5} {old:>11} "
              f"{a.get('accepted_segment', 0):>5}/{a['steps']:<5} {seg:>11} "
              f"{a['accepted_new']:>5}/{a['steps']:<5} {_fmt(dev):>11} {_fmt(cos, False):>9} {times:>9} "
              f"{_fmt(a['final_drift']):>9}")  # fmt: skip


def main(quick: bool, precision: str = "fp32") -> dict[str, Any]:
    configure_determinism(1)
    numerics = Numerics(precision=Precision(precision))
    # Δ in fp32: with the default int8 codec any move flips roundings of the quantized Δ (one
    # quantum each), which would measure the codec, not the steering
    cfg = tiny_config(inner_steps=20 if quick else 50, segment_len=5, sampled_segments=2, numerics=numerics,
                      codec=Codec.FP32)  # fmt: skip
    steps = 2 if quick else 4
    with tempfile.TemporaryDirectory(prefix="steering-") as tmp:
        result = {"quick": quick, "torch": torch.__version__,
                  **run_setting(cfg, steps, 8 if quick else 24, Path(tmp))}  # fmt: skip
    report(result)
    name = "steering" if precision == "fp32" else f"steering_{precision}"
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {path} ({result['seconds']} s)")
    return result


if __name__ == "__main__":
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--quick", action="store_true", help="H = 20, T = 2, fewer calibration trials")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker.read_text()))
    else:
        main(args.quick, args.precision)
