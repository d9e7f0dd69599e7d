"""Steering left in tolerance mode: how far a host spending a fraction of every threshold at every
boundary moves its accepted Δ, against honest 1- vs 2-thread noise (issues 23, 36).

One host, T outer steps of a tiny GPT (H = 50, k = 5: n = 10 segments), replayed by a 1-thread
verifier. Thresholds from `verifier.calibrate` (1 vs 2 threads, the run's k, the fresh state and
warm ones, 8× the noise) and from whole honest 2-thread runs of other hosts; the summed-residual
thresholds (specs §6.4) count-independent, the largest honest value over every set of two or more.
Each contribution is judged by `verifier.verify` under EVERY sample a check can get:

- sampling windows (the default): every aligned block of w = 3 segments, i.e. every checker's
  window ([0, 3), [3, 6), [6, 9), [9]); a contribution is *accepted* when every window accepts it
  (one rejecting checker opens a dispute, specs §2.5.3);
- sampling segments, s = 2 (the bench's) and s = 3: every challenge (s − 1 of segments 0 … n−2
  drawn, the last always), and the same verdicts under the rule before issue 36 (summed residuals
  of the opened segments over Σ wᵢ, thresholds 8× the honest noise of sets of s), recomputed from
  every segment's residuals. With s = 2 one drawn segment is held to its per-segment bound whatever
  the rule (specs §6.4); s = 3 is the smallest s where summing the drawn segments apart can bite.

Per outer step, from the same start (G_n and the host's carried optimizer state):

- honest noise: the Δ an honest host trains with 2 threads (a separate process) against the Δ of
  1 thread, and whether the 1-thread verifier accepts 2-thread hosts under every sample;
- steering: each adversary of the library (`budget_steer`: "group" spends the group norms' budgets,
  "update" the strongest steering known within every check, "cancel" the issue-36 move cancelled
  where a check sums) against the honest 1-thread Δ from its own start.

Deviations are relative L2 ‖Δ_x − Δ_ref‖/‖Δ_ref‖ and cosine; drift is the global model's distance
from the honest run's, relative to how far the honest run moved from G_0. The figure: the strongest
steering accepted under every sample, over the library, against the largest honest deviation.

    .venv/bin/python -m bench.steering [--quick] [--precision bf16]

Prints the tables and writes bench/results/steering.json (steering_bf16.json for bf16).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from gonka_diloco.adversaries import resolve_host
from gonka_diloco.adversaries.lab import HostRun, Lab, next_global, synthetic_corpus, tiny_config
from nodekit.globalmodel import GlobalModel
from nodekit.statestore import StateStore
from protocol import codecs
from protocol.config import Codec, InnerOptim, Moments, Numerics, Precision, ReplayMode, RunConfig, Sampling
from protocol.messages import EnvFingerprint
from protocol.prf import window, window_blocks
from replay.step import configure_determinism, optimizer_hash
from trainer.behaviour import HostBehaviour
from trainer.commit import TrainedStep
from verifier.calibrate import CONFIG_FIELDS, FLOOR, _residuals, calibrate, worst_summed
from verifier.job import window_replays
from verifier.tolerance import (
    CUMULATIVE_CHECKS,
    TOLERANCE_CHECKS,
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
MAX_SAMPLES = 64
"""Challenges judged per contribution under sampling segments; beyond, a fixed sample of them."""
ATTACKS: list[dict[str, Any]] = [
    {"target": "group", "fraction": 0.5},
    {"target": "group", "fraction": 0.9},
    {"target": "update", "where": "free", "fraction": 0.9},
    {"target": "update", "where": "all", "fraction": 0.9},
    {"target": "update", "where": "along", "fraction": 0.9},
    {"target": "group", "fraction": 0.9, "params": False},  # the moments' channel alone ...
    {"target": "update", "where": "free", "fraction": 0.9, "params": False},  # ... before and after
    # the strongest steering within every per-segment check, blind to the summed ones (§6.4)
    {"target": "update", "where": "free", "fraction": 0.9, "cumulative": False},
    # issue 36: one move δ at every boundary, cancelled where a check sums
    {"fraction": 0.9, "cancel": True},  # at θ_H, the segment every challenge opens
    {"fraction": 0.9, "cancel": "window"},  # at the end of every window
    # θ_H's whole per-segment budget, what a lone last window (n mod w = 1) alone holds it to
    {"target": "update", "where": "all", "fraction": 0.9, "lone": True},
]
"""The adversary library (`budget_steer` parameters). The "group" rows fail a per-segment check
whatever the sample, so only windows judge them."""
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


def samples(cfg: RunConfig) -> list[list[int]]:
    """Every sample a check can get: windows, each aligned block (a checker's window); segments,
    each challenge (s − 1 of segments 0 … n−2 and the last; `MAX_SUBSETS` of them with a fixed
    seed where there are more)."""
    n = cfg.n_segments
    if cfg.windowed:
        w = cfg.window_len
        return [window(b * w, n, w) for b in range(window_blocks(n, w))]
    drawn = list(itertools.combinations(range(n - 1), cfg.sampled_segments - 1))
    if len(drawn) > MAX_SAMPLES:
        step = len(drawn) / MAX_SAMPLES
        drawn = [drawn[int(i * step)] for i in range(MAX_SAMPLES)]
    return [[*d, n - 1] for d in drawn]


Segment = dict[str, Any]


def segment_records(lab: Lab, run: HostRun, outer: int, gm: GlobalModel) -> list[Segment]:
    """Every segment replayed by this process from the host's claimed start: its per-segment
    verdict and distances, and its residuals (`Cumulative`'s terms) for any summed set."""
    cfg = lab.cfg
    job = lab.job(run, outer, "00" * 32, sampled=list(range(cfg.n_segments)))
    ctx = lab.replay_context(gm)
    out = []
    for o in job.openings:
        start, claim = run.store.get(o.start_leaf), run.store.get(o.end_leaf)
        end = {k: v.clone() for k, v in replay_segment(job, ctx, start, o.segment).items()}
        r, du, moved, steps = _residuals(end, claim, start, cfg.inner)
        out.append({"ok": tolerance_mismatch(end, claim, start, cfg.tolerances, cfg.inner) is None,
                    "d": tolerance_distances(end, claim, start, cfg.inner),
                    "res": (r, du), "w": (moved, steps)})  # fmt: skip
    return out


def _ratio(segs: Sequence[Segment], ids: Sequence[int], rms: bool) -> dict[str, float]:
    out = {}
    for i, check in enumerate(CUMULATIVE_CHECKS):
        num = float(torch.stack([segs[j]["res"][i] for j in ids]).sum(0).norm()) if ids else 0.0
        ws = [segs[j]["w"][i] for j in ids]
        den = math.sqrt(sum(x * x for x in ws)) if rms else sum(ws)
        out[check] = 0.0 if num == 0 else (num / den if den else math.inf)
    return out


def replayed(cfg: RunConfig, sample: Sequence[int]) -> list[int]:
    """What a check of one sample replays (`verifier.job.window_replays` under windows)."""
    return window_replays(cfg, sample) if cfg.windowed else list(sample)


def summed_sets(cfg: RunConfig, sample: Sequence[int]) -> list[list[int]]:
    """The sets specs §6.4 sums for one sample: all it replays, and under sampling segments the
    drawn segments apart; each of two or more segments (one is its own per-segment check)."""
    last, full = cfg.n_segments - 1, replayed(cfg, sample)
    sets = [full] if cfg.windowed else [[j for j in full if j != last], full]
    return [x for x in sets if len(x) >= 2]


def sample_worst(cfg: RunConfig, segs: Sequence[Segment], sample: Sequence[int], tau: Mapping[str, float],
                 legacy: Mapping[str, float] | None = None) -> dict[str, float]:  # fmt: skip
    """Every distance ÷ threshold of one sample: the per-segment ones (largest over its segments)
    and the summed ones (largest over its sets; `legacy`: the rule before issue 36 instead)."""
    worst = {g: max(segs[j]["d"][g] / tau[g] for j in replayed(cfg, sample)) for g in TOLERANCE_CHECKS}
    worst.update(dict.fromkeys(CUMULATIVE_CHECKS, 0.0))  # a sample of one segment sums nothing
    if legacy is None:
        for ids in summed_sets(cfg, sample):
            d = _ratio(segs, ids, rms=True)
            worst.update({c: max(worst.get(c, 0.0), d[c] / tau[c]) for c in CUMULATIVE_CHECKS})
    else:
        d = _ratio(segs, sample, rms=False)
        worst.update({c: d[c] / legacy[c] for c in CUMULATIVE_CHECKS})
    return worst


def accepts(cfg: RunConfig, segs: Sequence[Segment], sample: Sequence[int],
            worst: Mapping[str, float]) -> bool:  # fmt: skip
    ok = all(segs[j]["ok"] for j in replayed(cfg, sample))
    return ok and all(worst[c] < 1.0 for c in CUMULATIVE_CHECKS)


def judge(lab: Lab, run: HostRun, outer: int, gm: GlobalModel, legacy: Mapping[str, float]) -> dict[str, Any]:
    """`verify` under every sample of the lab's sampling; the same from every segment's residuals
    (a cross-check), and, under sampling segments, under the rule before issue 36."""
    cfg = lab.cfg
    segs = segment_records(lab, run, outer, gm)
    verdicts, reasons, recomputed, old, worst = [], [], [], [], dict.fromkeys(ALL_CHECKS, 0.0)
    for sample in samples(cfg):
        kw: dict[str, Any] = {"window": sample} if cfg.windowed else {"sampled": sample}
        out = verify(lab.job(run, outer, "00" * 32, **kw), run.source(), lab.replay_context(gm))
        verdicts.append(out.accept)
        reasons.append(out.reason.name if out.accept else f"{out.reason.name}: {out.detail[:120]}")
        w = sample_worst(cfg, segs, sample, cfg.tolerances | cfg.cumulative_tolerances)
        worst = {g: max(worst[g], w[g]) for g in ALL_CHECKS}
        recomputed.append(accepts(cfg, segs, sample, w))
        if not cfg.windowed:
            old.append(accepts(cfg, segs, sample, sample_worst(cfg, segs, sample, cfg.tolerances, legacy)))
    return {"accepted": verdicts, "reasons": reasons, "recomputed_agrees": verdicts == recomputed,
            "legacy_accepted": old, "worst": worst}  # fmt: skip


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


def legacy_noise(segs: Sequence[Segment], s: int) -> dict[str, float]:
    """The rule before issue 36: the largest ‖Σ_S r‖ / Σ_S w over the sets S of s segments."""
    worst = dict.fromkeys(CUMULATIVE_CHECKS, 0.0)
    for sub in itertools.combinations(range(len(segs)), s):
        d = _ratio(segs, sub, rms=False)
        worst = {c: max(worst[c], d[c]) for c in CUMULATIVE_CHECKS}
    return worst


def count_curve(segs: Sequence[Segment]) -> dict[str, dict[str, list[float]]]:
    """Per check, the largest summed distance over the sets of m segments, m = 1 … n, divided by
    √(Σ wᵢ²) (`rms`, the rule since issue 36) and by Σ wᵢ (`sum`, before): which one an honest
    host's value does not depend on m for."""
    n = len(segs)
    out: dict[str, dict[str, list[float]]] = {}
    for i, check in enumerate(CUMULATIVE_CHECKS):
        x = torch.stack([s["res"][i] for s in segs])
        gram = (x @ x.T).tolist()
        w = [s["w"][i] for s in segs]
        rms, total = [0.0] * n, [0.0] * n
        for m in range(1, n + 1):
            for sub in itertools.combinations(range(n), m):
                num = math.sqrt(max(0.0, sum(gram[a][b] for a in sub for b in sub)))
                if num:
                    rms[m - 1] = max(rms[m - 1], num / math.sqrt(sum(w[a] ** 2 for a in sub)))
                    total[m - 1] = max(total[m - 1], num / sum(w[a] for a in sub))
        out[check] = {"rms": rms, "sum": total}
    return out


SAMPLINGS = {"windows": (Sampling.WINDOWS, None), "segments": (Sampling.SEGMENTS, 2),
             "segments_s3": (Sampling.SEGMENTS, 3)}  # fmt: skip
"""The samplings judged: windows (the default, w = 3), segments with the bench's s = 2 (one drawn
segment: any rule leaves it its per-segment bound, specs §6.4) and with s = 3 (two drawn)."""


def with_sampling(cfg: RunConfig, name: str) -> RunConfig:
    sampling, s = SAMPLINGS[name]
    return cfg.model_copy(update={"sampling": sampling, "sampled_segments": s or cfg.sampled_segments})


def summary(steps: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Outer steps accepted under every sample (verdicts in `key`), their largest Δ deviation."""
    every = [s for s in steps if s[key] and all(s[key])]
    judged = sum(len(s[key]) for s in steps)
    return {"accepted_every": len(every), "steps": len(steps),
            "samples_accepted": sum(sum(s[key]) for s in steps), "samples": judged,
            "max_dev_every": max((s["dev"] for s in every), default=None),
            "min_cos_every": min((s["cos"] for s in every), default=None)}  # fmt: skip


def run_setting(cfg: RunConfig, steps: int, calib_trials: int, root: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    k = cfg.segment_len
    # thresholds: 8× the honest 1- vs 2-thread noise, the larger of `verifier calibrate`'s (single
    # segments from warm states and the fresh one; the summed checks on two whole trajectories) and
    # that of whole honest runs of other hosts (T outer steps, every segment and every set of them:
    # they also see the states after outer steps)
    # the summed thresholds hold for sets of the run's fewest summed segments or more
    # (`RunConfig.summed_least`): one calibration per count the samplings need
    by_count = {with_sampling(cfg, name).summed_least: with_sampling(cfg, name) for name in SAMPLINGS}
    leasts = sorted(by_count)
    proposals = {m: calibrate(by_count[m], CORPUS, ks=(k,), threads=(1, 2), trials=calib_trials, warmup=5)
                 for m in leasts}  # fmt: skip
    row = proposals[cfg.summed_least].rows[0]
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
    by_least = {m: dict.fromkeys(CUMULATIVE_CHECKS, 0.0) for m in leasts}  # whole runs, sets of ≥ m
    ss = sorted({s_ for _, s_ in SAMPLINGS.values() if s_})
    legacy = {s_: dict.fromkeys(CUMULATIVE_CHECKS, 0.0) for s_ in ss}  # the rule before issue 36, per s
    curve = {c: {"rms": [0.0] * cfg.n_segments, "sum": [0.0] * cfg.n_segments} for c in CUMULATIVE_CHECKS}
    for r in (r for h in CALIBRATION_HOSTS for r in two["runs"][h]["steps"]):
        gm = GlobalModel.from_tensors(load_file(r["gm"]))
        segs = segment_records(lab, load_run(lab, r), r["n"], gm)
        for c, by in count_curve(segs).items():
            curve[c] = {k: [max(a, b) for a, b in zip(curve[c][k], v, strict=True)] for k, v in by.items()}
        run_noise = {g: max(run_noise[g], *(x["d"][g] for x in segs)) for g in TOLERANCE_CHECKS} | {
            c: run_noise[c] for c in CUMULATIVE_CHECKS}  # fmt: skip
        for m in leasts:
            whole = _whole_run_cumulative(segs, m)
            by_least[m] = {c: max(by_least[m][c], whole[c]) for c in CUMULATIVE_CHECKS}
        for s_ in ss:
            old = legacy_noise(segs, s_)
            legacy[s_] = {c: max(legacy[s_][c], old[c]) for c in CUMULATIVE_CHECKS}
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
    run_noise.update(by_least[cfg.summed_least])
    per_segment = {g: max(row.threshold[g], FACTOR * run_noise[g], FLOOR) for g in TOLERANCE_CHECKS}
    taus = {m: per_segment | {c: max(proposals[m].rows[0].threshold[c], FACTOR * by_least[m][c], FLOOR)
                              for c in CUMULATIVE_CHECKS}
            for m in leasts}  # fmt: skip
    tau = taus[cfg.summed_least]
    legacy_tau = {s_: {c: max(FACTOR * v, FLOOR) for c, v in by.items()} for s_, by in legacy.items()}
    tcfg = base.model_copy(update={CONFIG_FIELDS[g]: v for g, v in tau.items()})

    def thresholded(name: str) -> RunConfig:
        scfg = with_sampling(tcfg, name)
        return scfg.model_copy(update={CONFIG_FIELDS[g]: v for g, v in taus[scfg.summed_least].items()})

    labs = {name: Lab(thresholded(name), synthetic_corpus(), root / f"one-{name}") for name in SAMPLINGS}
    # honest noise: HOST with 2 threads from the 1-thread run's starts, and whole 2-thread runs of
    # other hosts, judged by this 1-thread verifier under every sample of both samplings
    noise = []
    honest_judged: dict[str, list[dict[str, Any]]] = {name: [] for name in SAMPLINGS}
    judged = [(load_run(lab, r), r["n"], honest_g[r["n"]]) for r in two["starts"]]
    judged += [(load_run(lab, r), r["n"], GlobalModel.from_tensors(load_file(r["gm"])))
               for h in JUDGED_HOSTS for r in two["runs"][h]["steps"]]  # fmt: skip
    for r in two["starts"]:
        n = r["n"]
        run2, d1 = load_run(lab, r), delta_of(honest_runs[n], honest_g[n])
        noise.append({"n": n, "dev": rel_l2(delta_of(run2, honest_g[n]), d1),
                      "cos": cosine(delta_of(run2, honest_g[n]), d1)})  # fmt: skip
    for name, slab in labs.items():
        for run2, n, gm in judged:
            old_tau = legacy_tau.get(slab.cfg.sampled_segments, {})
            honest_judged[name].append(judge(slab, run2, n, gm, old_tau))
    own = two["runs"][HOST]["steps"]
    two_run = [GlobalModel.from_tensors(load_file(r["gm"])) for r in own[1:]]
    two_run.append(GlobalModel.from_tensors(load_file(two["runs"][HOST]["final"])))
    drift_noise = [drift(two_run[n], honest_g[n + 1], g0) for n in range(steps)]
    samples_all = noise + cal_noise  # every honest 2-thread step against 1 thread from its start
    max_noise = max(x["dev"] for x in samples_all)
    samplings: dict[str, Any] = {}
    for name, slab in labs.items():
        windowed = slab.cfg.windowed
        attacks = []
        for params in ATTACKS:
            if not windowed and params.get("target") == "group":
                continue  # fails a per-segment check whatever the sample (windows judge it)
            adversary = resolve_host("budget_steer", params)
            gm, carried, prev = g0, None, None
            steps_out = []
            for n in range(steps):
                run = slab.train(adversary, HOST, n, gm, carried, prev)
                ref = slab.train(HostBehaviour(), HOST, n, gm, carried, prev)
                verdict = judge(slab, run, n, gm, legacy_tau.get(slab.cfg.sampled_segments, {}))
                d_att, d_ref = delta_of(run, gm), delta_of(ref, gm)
                gm = next_global(gm, [run], tcfg)
                carried, prev = run.final_state, optimizer_hash(run.final_state)
                steps_out.append({"n": n, "dev": rel_l2(d_att, d_ref), "cos": cosine(d_att, d_ref),
                                  "drift": drift(gm, honest_g[n + 1], g0), **verdict})  # fmt: skip
            label = "budget_steer " + " ".join(f"{k_}={v}" for k_, v in params.items())
            before = None if windowed else summary(steps_out, "legacy_accepted")
            attacks.append({**params, "label": label, **summary(steps_out, "accepted"), "legacy": before,
                            "recomputed_agrees": all(s["recomputed_agrees"] for s in steps_out),
                            "final_drift": steps_out[-1]["drift"], "per_step": steps_out})  # fmt: skip
        hj = honest_judged[name]
        best = max((a for a in attacks if a["max_dev_every"] is not None), key=lambda a: a["max_dev_every"],
                   default=None)  # fmt: skip
        samplings[name] = {
            "samples": samples(slab.cfg), "attacks": attacks, "summed_least": slab.cfg.summed_least,
            "thresholds": {g: v for g, v in taus[slab.cfg.summed_least].items()},
            "honest_accepted_every": sum(all(j["accepted"]) for j in hj), "honest_contributions": len(hj),
            "honest_samples_accepted": sum(sum(j["accepted"]) for j in hj),
            "honest_samples": sum(len(j["accepted"]) for j in hj),
            "honest_worst_over_threshold": {g: max(j["worst"][g] for j in hj) for g in ALL_CHECKS},
            "honest_legacy_accepted_every": None if windowed else sum(all(j["legacy_accepted"]) for j in hj),
            "s": None if windowed else slab.cfg.sampled_segments,
            "recomputed_agrees": all(j["recomputed_agrees"] for j in hj),
            "strongest": None if best is None else {"label": best["label"], "dev": best["max_dev_every"],
                                                    "times_noise": best["max_dev_every"] / max_noise},
        }  # fmt: skip
    return {
        "precision": str(cfg.numerics.precision), "H": cfg.inner_steps, "k": k, "s": cfg.sampled_segments,
        "w": cfg.window_len, "n_segments": cfg.n_segments, "outer_steps": steps, "model": cfg.model.config,
        "calibration_trials": calib_trials, "calibration_hosts": len(CALIBRATION_HOSTS), "thresholds": tau,
        "summed_least": cfg.summed_least, "run_noise_by_least": {str(m): v for m, v in by_least.items()},
        "calibrate_cumulative_by_least": {str(m): {c: p.rows[0].threshold[c] for c in CUMULATIVE_CHECKS}
                                          for m, p in proposals.items()},
        "cumulative_rule": "root-sum-square", "legacy_thresholds": {str(k): v for k, v in legacy_tau.items()},
        "calibrated_noise": row.noise, "calibration_share_differing": row.noisy,
        "calibrate_thresholds": row.threshold, "run_noise": run_noise,
        "legacy_noise": {str(k): v for k, v in legacy.items()},
        "honest_count_curve": curve,
        "honest": {"per_step": noise, "calibration_hosts": cal_noise, "max_dev": max_noise,
                   "samples": len(samples_all), "nonzero": sum(x["dev"] > 0 for x in samples_all),
                   "min_cos": min(x["cos"] for x in samples_all), "drift": drift_noise},
        "samplings": samplings, "seconds": round(time.perf_counter() - t0, 1),
    }  # fmt: skip


def _whole_run_cumulative(segs: Sequence[Segment], least: int = 2) -> dict[str, float]:
    """`verifier.calibrate.cumulative_noise` (sets of `least` or more) from the residuals already computed."""
    return {c: worst_summed([x["res"][i] for x in segs], [x["w"][i] for x in segs], least)
            for i, c in enumerate(CUMULATIVE_CHECKS)}  # fmt: skip


def _fmt(x: float | None, pct: bool = True) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.4g}%" if pct else f"{x:.6f}"


def report(result: dict[str, Any]) -> None:
    h = result["honest"]
    print(f"\nsteering, {result['precision']}: tiny GPT, H={result['H']} k={result['k']} (n = "
          f"{result['n_segments']}), T={result['outer_steps']} outer steps; thresholds "
          + ", ".join(f"{g} {v:.2e}" for g, v in result["thresholds"].items())
          + "; before issue 36 (Σ w, sets of s) "
          + "; ".join(f"s = {s_}: " + ", ".join(f"{g} {v:.2e}" for g, v in by.items())
                      for s_, by in result["legacy_thresholds"].items()))  # fmt: skip
    for c, by in result["honest_count_curve"].items():
        rms, total = (" ".join(f"{v:.2e}" for v in by[k]) for k in ("rms", "sum"))
        print(f"honest {c}, largest over sets of m = 1 … n: over √(Σ w²) {rms}; over Σ w {total}")
    print(f"honest 1 vs 2 threads: Δ deviation max {_fmt(h['max_dev'])} over {h['samples']} host-steps "
          f"({h['nonzero']} not bitwise equal; cos ≥ {_fmt(h['min_cos'], False)}), drift after T "
          f"{_fmt(h['drift'][-1])}")  # fmt: skip
    for name, sm in result["samplings"].items():
        print(f"\nsampling {name}: samples {sm['samples']}; honest 2-thread hosts accepted under every "
              f"sample {sm['honest_accepted_every']}/{sm['honest_contributions']} "
              f"({sm['honest_samples_accepted']}/{sm['honest_samples']} samples), worst distance/threshold "
              + ", ".join(f"{g} {v:.3f}" for g, v in sm["honest_worst_over_threshold"].items()))  # fmt: skip
        print(f"{'attack':<64} {'every sample':>12} {'samples':>9} {'max Δ dev':>11} {'× noise':>9} "
              f"{'before 36':>10} {'max Δ dev':>11} {'drift':>10}")  # fmt: skip
        for a in sm["attacks"]:
            dev, old = a["max_dev_every"], a["legacy"]
            times = "n/a" if dev is None else f"{dev / h['max_dev']:.3g}"
            old_txt = "" if old is None else f"{old['accepted_every']}/{old['steps']} "
            old_txt += "" if old is None else _fmt(old["max_dev_every"])
            print(f"{a['label']:<64} {a['accepted_every']:>6}/{a['steps']:<5} {a['samples_accepted']:>4}/"
                  f"{a['samples']:<4} {_fmt(dev):>11} {times:>9} {old_txt:>22} "
                  f"{_fmt(a['final_drift']):>10}")  # fmt: skip
        st = sm["strongest"]
        if st:
            print(f"strongest accepted under every sample: {st['label']}, {_fmt(st['dev'])} = "
                  f"{st['times_noise']:.3g}× honest noise")  # fmt: skip


def main(quick: bool, precision: str = "fp32") -> dict[str, Any]:
    configure_determinism(1)
    numerics = Numerics(precision=Precision(precision))
    # Δ in fp32: with the default int8 codec any move flips roundings of the quantized Δ (one
    # quantum each), which would measure the codec, not the steering
    # and fp32 moments: tolerance mode's (its thresholds are calibrated on float32 moments)
    cfg = tiny_config(inner_steps=20 if quick else 50, segment_len=5, sampled_segments=2, numerics=numerics,
                      codec=Codec.FP32, window_segments=3,
                      inner=InnerOptim(moments=Moments.FP32))  # fmt: skip
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
