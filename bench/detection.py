"""Detection benchmark: does replay catch each host adversary, how often does it wrong an honest
host, and what does a verifier pay for it?

Four tables (all with the real committed loop, store, codec and `verifier.verify`, no chain):

1. per host adversary, the detection rate over seeded trials at the run defaults (H, k, s); per
   verifier adversary (collude), its verdict on its partner's fake next to an honest verifier's
   on the same job (an honest REJECT is what opens the chain's dispute, bench.collusion);
2. a lazy host faking half of its non-final segments: measured detection per outer step for
   several s, next to the exact prediction 1 − C(n−1−m, s−1)/C(n−1, s−1) (it never fakes the
   always-opened last segment) and the naive 1 − (1 − f)^s, with the replay cost of each s;
3. honest false rejections: bitwise (same environment) and tolerance mode with the host in a
   2-thread process and the verifier at 1 thread, thresholds (params and both moments) from
   `verifier.calibrate`; and a moment-steering host in tolerance mode, judged by the whole state
   and by the parameters alone (what the verifier compared before), and `budget_steer` (0.9 of
   every threshold at every boundary), judged by every check and by the group norms alone (what
   it compared before issue 23; how far it steers: `bench.steering`), and `budget_steer cancel`
   (issue 36: its moves cancelled by the always-opened last segment), judged under sampling
   segments with and without the drawn segments' residuals summed apart;
4. verification cost as a fraction of the host's inner loop on the default small GPT.

    .venv/bin/python -m bench.detection [--quick] [--only-adversaries]
    .venv/bin/python -m bench.detection --windows [--quick]   # sampling windows: bench.detection_windows

Prints the tables and writes bench/results/detection.json. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gonka_diloco.adversaries import resolve_host, resolve_verifier
from gonka_diloco.adversaries.hosts import MALFORMED_KINDS, LazyHost
from gonka_diloco.adversaries.lab import (
    HostRun,
    Lab,
    carried_optimizer,
    next_global,
    synthetic_corpus,
    tiny_config,
)
from nodekit.globalmodel import GlobalModel
from nodekit.statestore import StateStore
from protocol import codecs
from protocol.config import ModelSpec, Moments, ReplayMode, RunConfig, Sampling
from protocol.messages import EnvFingerprint, Reason
from replay.step import configure_determinism
from trainer.behaviour import HostBehaviour
from trainer.commit import TrainedStep
from verifier.calibrate import CONFIG_FIELDS, calibrate
from verifier.tolerance import (
    CUMULATIVE_CHECKS,
    Cumulative,
    group_mismatch,
    param_distance,
    tolerance_mismatch,
)
from verifier.verify import replay_segment, verify

A = "gonka1" + "a" * 38
B = "gonka1" + "b" * 38
CORPUS = "synthetic:40000:0"
RESULTS = Path(__file__).parent / "results" / "detection.json"


def seed_hex(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


def host_addr(i: int) -> str:
    return f"gonka1host{i:04d}"  # only the PRF sees it: any distinct string is a distinct host


# ---------------------------------------------------------------- 1. every adversary


ADVERSARIES: list[tuple[str, dict[str, Any]]] = [
    ("noise", {}), ("zero", {}), ("scaled", {}), ("sign_flip", {}), ("lazy", {"fraction": 0.5}),
    ("wrong_data", {}), ("stale", {}), ("copycat", {}), ("bad_tokens", {}),
    ("no_reveal", {"mode": "chain"}), ("no_reveal", {"mode": "serve"}), ("moment_steer", {}),
    ("budget_steer", {}), ("budget_steer", {"cancel": True}),
    *[("malformed", {"kind": k}) for k in MALFORMED_KINDS],
    ("withhold", {}), ("forge_result", {}), ("silent_after_accept", {}),
]  # fmt: skip
"""The last three train honestly (ACCEPT is the right verdict) and attack what follows: serving
their Δ and the result vote. Their row also says how often the verifier's accepting check left it
holding the exact committed Δ payload (what it then serves to every aggregator in the author's
place); the result vote is judged with real nodes (`tests/test_availability_nodes.py`)."""
SEEDED = {"noise", "lazy"}  # their contribution depends on a seed: retrained per trial


def adversary_table(cfg: RunConfig, trials: int, root: Path) -> list[dict[str, Any]]:
    lab = Lab(cfg, synthetic_corpus(), root)
    g0 = GlobalModel.from_module(lab.build()[0])
    stale = resolve_host("stale")
    step0 = {A: lab.train(stale, A, 0, g0), B: lab.train(HostBehaviour(), B, 0, g0)}
    g1 = next_global(g0, list(step0.values()), cfg)
    carried, prev = carried_optimizer(step0[A])
    peers = {"peer_payloads": {B: step0[B].contribution.payload}}

    def train(behaviour: HostBehaviour) -> HostRun:
        return lab.train(behaviour, A, 1, g1, carried, prev, extra=peers)

    rows = []
    for name, params in [("honest", {}), *ADVERSARIES]:
        label = name + "".join(f" {k}={v}" for k, v in params.items())
        fixed: HostRun | None = None
        reasons: dict[str, int] = {}
        holds = 0  # trials after which the verifier holds the committed Δ payload itself
        t0 = time.perf_counter()
        for t in range(trials):
            if name == "stale":
                behaviour: HostBehaviour = stale
            elif name in SEEDED:
                behaviour = resolve_host(name, {**params, "seed": t})
            else:
                behaviour = resolve_host(name, params)
            if fixed is None or name in SEEDED:
                run = train(behaviour)
                fixed = None if name in SEEDED else run
            else:
                run = fixed
            revealed = not (name == "no_reveal" and params.get("mode") == "chain")
            job = lab.job(run, 1, seed_hex("trial", t), revealed=revealed, with_proofs=True)
            ctx = lab.replay_context(g1)
            derived: list[bytes] = []
            ctx.on_derived = lambda _final, payload, kept=derived: kept.append(payload)
            out = verify(job, run.source(), ctx)
            reasons[out.reason.name] = reasons.get(out.reason.name, 0) + 1
            holds += bool(derived) and codecs.delta_hash(derived[0], cfg.state_chunk_bytes) == job.delta_hash
        expected = getattr(behaviour, "expected", ("ACCEPT",))
        caught = sum(n for r, n in reasons.items() if r != "ACCEPT")
        right = sum(n for r, n in reasons.items() if r in expected)
        rows.append({
            "behaviour": label, "trials": trials, "rejected": caught / trials, "right_reason": right / trials,
            "expected": list(expected), "reasons": reasons, "verifier_holds_delta": holds / trials,
            "seconds": round(time.perf_counter() - t0, 2),
        })  # fmt: skip
    rows.append({"behaviour": "equivocation", "trials": 0, "rejected": None, "right_reason": None,
                 "expected": ["chain: EQUIVOCATED"], "reasons": {}, "seconds": 0.0})  # fmt: skip
    rows.append(collude_row(lab, g1, train, trials))
    return rows


def collude_row(lab: Lab, g1: GlobalModel, train: Any, trials: int) -> dict[str, Any]:
    """The colluding verifier on its partner's fake (noise Δ): it accepts every time; an honest
    verifier on the same job rejects every time, and that REJECT (initial or audit) opens the dispute
    the verifier stake decides (bench.collusion measures how often an honest one is drawn)."""
    colluder = resolve_verifier("collude", {"partner": A})
    reasons: dict[str, int] = {}
    honest_rejects = 0
    t0 = time.perf_counter()
    for t in range(trials):
        run = train(resolve_host("noise", {"seed": t}))
        job = lab.job(run, 1, seed_hex("collude", t))

        def check(job: Any = job, run: HostRun = run) -> Any:
            return verify(job, run.source(), lab.replay_context(g1))

        out = colluder.decide(job, check)
        assert out is not None
        reasons[out.reason.name] = reasons.get(out.reason.name, 0) + 1
        honest_rejects += not check().accept
    return {
        "behaviour": "collude (verifier) on its partner's noise Δ", "trials": trials,
        "rejected": 1 - reasons.get("ACCEPT", 0) / trials,
        "right_reason": honest_rejects / trials, "expected": ["ACCEPT by it; an honest verifier rejects"],
        "reasons": reasons, "honest_verifier_rejected": honest_rejects / trials,
        "seconds": round(time.perf_counter() - t0, 2),
    }  # fmt: skip


# ---------------------------------------------------------------- 2. lazy host vs s


def hypergeometric_escape(n: int, m: int, s: int) -> float:
    """P(no faked segment among the s − 1 random ones), m faked of the n − 1 non-final segments."""
    return math.comb(n - 1 - m, s - 1) / math.comb(n - 1, s - 1)


def lazy_sweep(cfg: RunConfig, ss: list[int], seeds: int, challenges: int, root: Path) -> list[dict]:
    lab = Lab(cfg, synthetic_corpus(), root)
    g0 = GlobalModel.from_module(lab.build()[0])
    t0 = time.perf_counter()
    honest = lab.train(HostBehaviour(), A, 0, g0)
    host_seconds = time.perf_counter() - t0
    runs = [lab.train(LazyHost(0.5, seed=i), A, 0, g0) for i in range(seeds)]
    n = cfg.n_segments
    m = len(LazyHost(0.5).faked(cfg, A, 0))
    rows = []
    for s in ss:
        sub = dataclasses.replace(lab, cfg=cfg.model_copy(update={"sampled_segments": s}))
        caught = total = 0
        for i, run in enumerate(runs):
            for c in range(challenges):
                out = verify(sub.job(run, 0, seed_hex("lazy", s, i, c)), run.source(), sub.replay_context(g0))
                caught += out.reason is not Reason.ACCEPT
                total += 1
        verify_seconds = math.inf
        for rep in range(3):  # the best of three: the machine is shared
            t1 = time.perf_counter()
            ok = verify(sub.job(honest, 0, seed_hex("cost", s, rep)), honest.source(), sub.replay_context(g0))
            verify_seconds = min(verify_seconds, time.perf_counter() - t1)
            assert ok.accept, ok.detail
        rows.append({
            "H": cfg.inner_steps, "k": cfg.segment_len, "n_segments": n, "faked": m, "s": s, "trials": total,
            "detected": caught / total, "predicted_exact": 1 - hypergeometric_escape(n, m, s),
            "predicted_naive": 1 - 0.5**s, "replayed_steps_fraction": s * cfg.segment_len / cfg.inner_steps,
            "cost_fraction": verify_seconds / host_seconds,
        })  # fmt: skip
    return rows


# ---------------------------------------------------------------- 3. false rejections


def honest_bitwise(cfg: RunConfig, trials: int, root: Path) -> dict[str, Any]:
    lab = Lab(cfg, synthetic_corpus(), root)
    g0 = GlobalModel.from_module(lab.build()[0])
    rejected = 0
    for t in range(trials):
        run = lab.train(HostBehaviour(), host_addr(t), 0, g0)
        out = verify(lab.job(run, 0, seed_hex("honest", t)), run.source(), lab.replay_context(g0))
        rejected += not out.accept
    return {"mode": "bitwise (1 vs 1 thread)", "trials": trials, "false_rejections": rejected / trials}


def host_worker(job: dict[str, Any]) -> None:
    """In a separate process with `threads` threads: train honest and lazy hosts, dump them."""
    configure_determinism(job["threads"])
    cfg = RunConfig.model_validate(job["cfg"])
    root = Path(job["root"])
    lab = Lab(cfg, synthetic_corpus(), root)
    g0 = GlobalModel.from_module(lab.build()[0])
    out = []
    for t in range(job["trials"]):
        kinds = (("honest", HostBehaviour()), ("lazy", LazyHost(0.5, seed=t)),
                 ("moment_steer", resolve_host("moment_steer", {"seed": t})),
                 ("budget_steer", resolve_host("budget_steer", {"seed": t})),
                 ("budget_steer_update",
                  resolve_host("budget_steer", {"target": "update", "seed": t})),
                 ("budget_steer_cancel",
                  resolve_host("budget_steer", {"cancel": True, "seed": t})))  # fmt: skip
        for kind, behaviour in kinds:
            run = lab.train(behaviour, host_addr(t), 0, g0)
            c = run.contribution
            (root / f"{kind}-{t}.payload").write_bytes(c.payload)
            out.append({"kind": kind, "t": t, "host": run.address, "store": str(run.store.root),
                        "leaves": c.leaves, "root": c.trajectory_root, "delta_hash": c.delta_hash,
                        "final_optimizer_hash": c.final_optimizer_hash, "tokens": c.tokens,
                        "env": c.env.model_dump(), "base": c.base_model_hash})  # fmt: skip
    (root / "runs.json").write_text(json.dumps(out))


def _load_run(lab: Lab, r: dict[str, Any], root: Path) -> HostRun:
    payload = (root / f"{r['kind']}-{r['t']}.payload").read_bytes()
    c = TrainedStep(
        outer_step=0, base_model_hash=r["base"], leaves=r["leaves"], trajectory_root=r["root"], delta={},
        payload=payload, delta_hash=r["delta_hash"], codec=lab.cfg.codec,
        final_optimizer_hash=r["final_optimizer_hash"], tokens=r["tokens"], env=EnvFingerprint(**r["env"]),
        mean_loss=0.0, losses=[],
    )  # fmt: skip
    store = StateStore(r["store"])
    blobs = {c.delta_hash: payload}  # nodes serve the committed payload itself (as `Lab.train`)
    return HostRun(r["host"], HostBehaviour(), c, store, blobs, None, store.get(c.leaves[-1]))


def tolerance_cross_env(cfg: RunConfig, trials: int, calib_trials: int, root: Path) -> dict[str, Any]:
    k = cfg.segment_len
    fp32 = cfg.inner.model_copy(update={"moments": Moments.FP32})  # tolerance mode's moments (specs §6.2.1)
    cfg = cfg.model_copy(update={"inner": fp32})
    proposal = calibrate(cfg, CORPUS, ks=(k,), threads=(1, 2), trials=calib_trials, warmup=5)
    tau = proposal.rows[0].threshold  # per distance: the three groups, update, denominator
    fields = {CONFIG_FIELDS[g]: v for g, v in tau.items()}
    tcfg = cfg.model_copy(update={"replay_mode": ReplayMode.TOLERANCE, **fields})
    job = {"cfg": tcfg.model_dump(mode="json"), "root": str(root), "trials": trials, "threads": 2}
    (root / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-m", "bench.detection", "--host-worker", str(root / "job.json")],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    lab = Lab(tcfg, synthetic_corpus(), root)
    g0 = GlobalModel.from_module(lab.build()[0])
    counts = {"honest": [0, 0], "lazy": [0, 0], "moment_steer": [0, 0], "budget_steer": [0, 0],
              "budget_steer_update": [0, 0], "budget_steer_cancel": [0, 0]}  # fmt: skip
    dists: list[float] = []
    params_only_accepts = group_only_accepts = cancel_all_only_accepts = 0
    # the cancelling host attacks the always-opened last segment of sampling segments: judged there
    seg_lab = Lab(tcfg.model_copy(update={"sampling": Sampling.SEGMENTS}), synthetic_corpus(), root)
    for r in json.loads((root / "runs.json").read_text()):
        run = _load_run(lab, r, root)
        if r["kind"] == "lazy":  # open a faked segment: does tolerance mode still see it?
            segs = [min(LazyHost(0.5, seed=r["t"]).faked(tcfg, run.address, 0)), tcfg.n_segments - 1]
        else:
            segs = None
        judge_lab = seg_lab if r["kind"] == "budget_steer_cancel" else lab
        job = judge_lab.job(run, 0, seed_hex("tol", r["t"]), sampled=segs)
        out = verify(job, run.source(), judge_lab.replay_context(g0))
        counts[r["kind"]][0] += not out.accept
        counts[r["kind"]][1] += 1
        if r["kind"] == "lazy" and "distance" in out.detail:
            dists.append(float(out.detail.rsplit("distance ", 1)[1].split()[0]))
        if r["kind"] == "moment_steer":  # the old rule: parameters alone, every opened segment
            params_only_accepts += params_only_accept(job, run, lab, g0, tau["param"])
        if r["kind"] == "budget_steer":  # the rule before issue 23: group norms alone
            group_only_accepts += group_only_accept(job, run, lab, g0)
        if r["kind"] == "budget_steer_cancel":  # the drawn segments not summed apart (before issue 36)
            cancel_all_only_accepts += all_only_accept(job, run, seg_lab, g0)
    return {
        "mode": "tolerance (host 2 threads, verifier 1)", "k": k, "threshold": tau["param"],
        "threshold_exp_avg": tau["exp_avg"], "threshold_exp_avg_sq": tau["exp_avg_sq"],
        "calibrated_noise": proposal.rows[0].noise["param"],
        "calibrated_noise_exp_avg": proposal.rows[0].noise["exp_avg"],
        "calibrated_noise_exp_avg_sq": proposal.rows[0].noise["exp_avg_sq"],
        "calibration_trials": calib_trials,
        "calibration_share_differing": proposal.rows[0].noisy, "trials": counts["honest"][1],
        "false_rejections": counts["honest"][0] / counts["honest"][1],
        "lazy_detected_when_faked_segment_opened": counts["lazy"][0] / counts["lazy"][1],
        "lazy_min_distance": min(dists) if dists else None,
        "moment_steer_rejected": counts["moment_steer"][0] / counts["moment_steer"][1],
        "moment_steer_accepted_by_params_only": params_only_accepts / counts["moment_steer"][1],
        "threshold_update": tau["update"], "threshold_denominator": tau["denominator"],
        "calibrated_noise_update": proposal.rows[0].noise["update"],
        "calibrated_noise_denominator": proposal.rows[0].noise["denominator"],
        "budget_steer_rejected": counts["budget_steer"][0] / counts["budget_steer"][1],
        "budget_steer_accepted_by_group_norms": group_only_accepts / counts["budget_steer"][1],
        "budget_steer_update_rejected": counts["budget_steer_update"][0] / counts["budget_steer_update"][1],
        "threshold_cumulative": tau["cumulative"], "threshold_cumulative_update": tau["cumulative_update"],
        "calibrated_noise_cumulative": proposal.rows[0].noise["cumulative"],
        "calibrated_noise_cumulative_update": proposal.rows[0].noise["cumulative_update"],
        "budget_steer_cancel_rejected": counts["budget_steer_cancel"][0] / counts["budget_steer_cancel"][1],
        "budget_steer_cancel_accepted_without_drawn_apart":
            cancel_all_only_accepts / counts["budget_steer_cancel"][1],
    }  # fmt: skip


def params_only_accept(job: Any, run: HostRun, lab: Lab, g0: GlobalModel, tau: float) -> bool:
    """Would the previous rule (parameters only, every opened segment within `tau`) have accepted?"""
    ctx = lab.replay_context(g0)
    for o in job.openings:
        start, claim = run.store.get(o.start_leaf), run.store.get(o.end_leaf)
        end = replay_segment(job, ctx, start, o.segment)
        if not param_distance(end, claim, start) < tau:
            return False
    return True


def group_only_accept(job: Any, run: HostRun, lab: Lab, g0: GlobalModel) -> bool:
    """Would the rule before issue 23 (the group norms alone, every opened segment) have accepted?"""
    ctx = lab.replay_context(g0)
    for o in job.openings:
        start, claim = run.store.get(o.start_leaf), run.store.get(o.end_leaf)
        end = replay_segment(job, ctx, start, o.segment)
        if group_mismatch(end, claim, start, lab.cfg.tolerances) is not None:
            return False
    return True


def all_only_accept(job: Any, run: HostRun, lab: Lab, g0: GlobalModel) -> bool:
    """Would the summed-residual rule without the drawn segments and the last summed apart (issue 36)
    have accepted: every per-segment check, and the opened segments' sum alone?"""
    ctx = lab.replay_context(g0)
    total = Cumulative()
    for o in job.openings:
        start, claim = run.store.get(o.start_leaf), run.store.get(o.end_leaf)
        end = replay_segment(job, ctx, start, o.segment)
        if tolerance_mismatch(end, claim, start, lab.cfg.tolerances, lab.cfg.inner) is not None:
            return False
        total.add(end, claim, start, lab.cfg.inner)
    d = total.sets()["all"]
    return all(d[c] < lab.cfg.cumulative_tolerances[c] for c in CUMULATIVE_CHECKS)


# ---------------------------------------------------------------- 4. cost on the default model


def cost_row(cfg: RunConfig, root: Path, repeats: int = 3) -> dict[str, Any]:
    lab = Lab(cfg, synthetic_corpus(), root)
    g0 = GlobalModel.from_module(lab.build()[0])
    t0 = time.perf_counter()
    run = lab.train(HostBehaviour(), A, 0, g0)
    host_seconds = time.perf_counter() - t0
    ctx = lab.replay_context(g0)
    best = math.inf
    replay = 0.0
    for i in range(repeats):
        t1 = time.perf_counter()
        out = verify(lab.job(run, 0, seed_hex("cost", i)), run.source(), ctx)
        if time.perf_counter() - t1 < best:
            best, replay = time.perf_counter() - t1, out.replay_seconds
        assert out.accept, out.detail
    return {
        "model": cfg.model.config or "small_gpt defaults", "H": cfg.inner_steps, "k": cfg.segment_len,
        "s": cfg.sampled_segments, "host_seconds": round(host_seconds, 3), "verify_seconds": round(best, 3),
        "replay_seconds": round(replay, 3), "cost_fraction": best / host_seconds,
        "replayed_steps_fraction": cfg.sampled_segments * cfg.segment_len / cfg.inner_steps,
    }  # fmt: skip


# ---------------------------------------------------------------- main


GROUP_SUFFIXES = (("param", ""), ("exp_avg", "_exp_avg"), ("exp_avg_sq", "_exp_avg_sq"),
                  ("update", "_update"), ("denominator", "_denominator"), ("cumulative", "_cumulative"),
                  ("cumulative_update", "_cumulative_update"))  # fmt: skip


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def report(result: dict[str, Any]) -> None:
    def table(title: str, head: list[str], rows: list[list[Any]]) -> None:
        widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
        print(f"\n{title}")
        for row in [head, *rows]:
            pairs = enumerate(zip(row, widths, strict=True))
            print("  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in pairs))

    d = result["detection_config"]
    table(
        f"1. detection per outer step: tiny GPT, H={d['H']} k={d['k']} s={d['s']} v=1, seeded trials",
        ["behaviour", "trials", "rejected", "right reason", "verifier holds Δ", "reasons seen"],
        [[r["behaviour"], r["trials"], pct(r["rejected"]), pct(r["right_reason"]),
          pct(r.get("verifier_holds_delta")), r["reasons"] or r["expected"]] for r in result["adversaries"]],
    )  # fmt: skip
    table(
        "2. lazy host faking half of its non-final segments: detection per outer step vs s (tiny GPT)",
        ["H", "k", "s", "trials", "detected", "exact pred.", "1-(1-f)^s", "replayed steps", "cost"],
        [[r["H"], r["k"], r["s"], r["trials"], pct(r["detected"]), pct(r["predicted_exact"]),
          pct(r["predicted_naive"]), pct(r["replayed_steps_fraction"]), pct(r["cost_fraction"])]
         for r in result["lazy_sweep"]],
    )  # fmt: skip
    table(
        "3. honest false rejections (and tolerance mode's view of a faked segment)",
        ["mode", "trials", "false rejections", "threshold", "noise", "lazy caught", "lazy min dist"],
        [[r["mode"], r["trials"], pct(r["false_rejections"]), f"{r.get('threshold', 0):.2e}",
          f"{r.get('calibrated_noise', 0):.2e}", pct(r.get("lazy_detected_when_faked_segment_opened")),
          f"{r.get('lazy_min_distance') or 0:.2e}"] for r in result["honest"]],
    )  # fmt: skip
    tol = [r for r in result["honest"] if "moment_steer_rejected" in r]
    table(
        "3b. tolerance mode, per check (the three groups, the moments in update space), and steering hosts",
        ["check", "noise", "threshold", "moment_steer rejected", "accepted by params only"],
        [[g, f"{r.get('calibrated_noise' + suffix, 0):.2e}", f"{r.get('threshold' + suffix, 0):.2e}",
          pct(r["moment_steer_rejected"]), pct(r["moment_steer_accepted_by_params_only"])]
         for r in tol for g, suffix in GROUP_SUFFIXES],
    )  # fmt: skip
    table(
        "3c. budget_steer (0.9 of every threshold at every boundary, one way), tolerance mode",
        ["target", "rejected", "accepted by the group norms alone"],
        [row for r in tol if "budget_steer_rejected" in r for row in (
            ["group (exp_avg where exp_avg_sq = 0)", pct(r["budget_steer_rejected"]),
             pct(r["budget_steer_accepted_by_group_norms"])],
            ["update (within every check: bench.steering)", pct(r["budget_steer_update_rejected"]), "n/a"])],
    )  # fmt: skip
    table(
        "3d. budget_steer cancel (δ at every boundary, −(s−1)·δ at θ_H), tolerance mode, sampling segments "
        "(s = 2 holds the drawn segment to its per-segment bound by any rule; tolerance runs sample "
        "windows since issue 36: bench.steering)",
        ["rejected", "accepted without the drawn segments summed apart (before issue 36)"],
        [[pct(r["budget_steer_cancel_rejected"]), pct(r["budget_steer_cancel_accepted_without_drawn_apart"])]
         for r in tol if "budget_steer_cancel_rejected" in r],
    )  # fmt: skip
    table(
        "4. one verifier's cost vs the host's inner loop on the default small GPT",
        ["H", "k", "s", "host s", "verify s", "replay s", "cost", "s*k/H"],
        [[r["H"], r["k"], r["s"], r["host_seconds"], r["verify_seconds"], r["replay_seconds"],
          pct(r["cost_fraction"]), pct(r["replayed_steps_fraction"])] for r in result["cost"]],
    )  # fmt: skip


def main(quick: bool, only_adversaries: bool = False, only_tolerance: bool = False) -> dict[str, Any]:
    """`only_adversaries`: recompute table 1 alone (a new adversary's row) and keep the other
    tables of the last run in the results file (their own `quick` flag and timings stay);
    `only_tolerance` likewise for table 3's tolerance-mode row (3b, 3c)."""
    configure_determinism(1)
    trials = 20
    # The adversary table runs at the devnet's short outer step (H=50, k=5, s=2) so 20 trials per
    # behaviour stay affordable; the cost table adds the run config's defaults (H=500, k=5, s=8).
    defaults = RunConfig.model_fields
    h, k, s = (defaults[f].default for f in ("inner_steps", "segment_len", "sampled_segments"))
    det_cfg = tiny_config(inner_steps=20 if quick else 50, segment_len=5, sampled_segments=2)
    sweep_cfg = tiny_config(inner_steps=100 if quick else 500, segment_len=5, sampled_segments=2)
    small = ModelSpec(factory="trainer.model:small_gpt")
    cost_cfgs = [
        tiny_config(model=small, batch_size=8, seq_len=64, inner_steps=50, segment_len=5, sampled_segments=2)
    ]
    if not quick:
        at_defaults = {"inner_steps": h, "segment_len": k, "sampled_segments": s}
        cost_cfgs.append(cost_cfgs[0].model_copy(update=at_defaults))
    result: dict[str, Any] = {"quick": quick, "torch": torch.__version__, "machine": platform.machine(),
                              "detection_config": {"H": det_cfg.inner_steps, "k": det_cfg.segment_len,
                                                    "s": det_cfg.sampled_segments}}  # fmt: skip
    if only_adversaries or only_tolerance:
        last = json.loads(RESULTS.read_text())
        if last.get("quick") != quick or last.get("detection_config") != result["detection_config"]:
            raise SystemExit(f"{RESULTS} was written with another configuration: run it whole")
        with tempfile.TemporaryDirectory(prefix="detection-") as tmp:
            t0 = time.perf_counter()
            if only_adversaries:
                last["adversaries"] = adversary_table(det_cfg, trials, Path(tmp) / "adv")
                last["adversaries_seconds"] = round(time.perf_counter() - t0, 1)
                what = f"table 1 recomputed in {last['adversaries_seconds']} s"
            else:
                (Path(tmp) / "tol").mkdir()
                row = tolerance_cross_env(det_cfg, trials, 12 if quick else 24, Path(tmp) / "tol")
                last["honest"] = [r for r in last["honest"] if "threshold" not in r] + [row]
                last["tolerance_seconds"] = round(time.perf_counter() - t0, 1)
                what = f"the tolerance row recomputed in {last['tolerance_seconds']} s"
        report(last)
        RESULTS.write_text(json.dumps(last, indent=2))
        print(f"\nwrote {RESULTS} ({what})")
        return last
    with tempfile.TemporaryDirectory(prefix="detection-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        result["adversaries"] = adversary_table(det_cfg, trials, root / "adv")
        seeds, challenges = (10, 4) if quick else (20, 10)
        result["lazy_sweep"] = lazy_sweep(sweep_cfg, [2, 4, 6, 8], seeds, challenges, root / "sweep")
        result["honest"] = [honest_bitwise(det_cfg, trials, root / "honest")]
        (root / "tol").mkdir()
        result["honest"].append(tolerance_cross_env(det_cfg, trials, 12 if quick else 24, root / "tol"))
        result["cost"] = [cost_row(c, root / f"cost{i}") for i, c in enumerate(cost_cfgs)]
        result["seconds"] = round(time.perf_counter() - t0, 1)
    report(result)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {RESULTS} ({result['seconds']} s)")
    return result


if __name__ == "__main__":
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--quick", action="store_true", help="smaller H and fewer sweep trials")
    parser.add_argument(
        "--only-adversaries",
        action="store_true",
        help="recompute table 1 only, keeping the other tables of the last results file",
    )
    parser.add_argument(
        "--only-tolerance",
        action="store_true",
        help="recompute table 3's tolerance-mode row only, keeping the other tables of the last results file",
    )
    parser.add_argument(
        "--windows",
        action="store_true",
        help="sampling windows (issue 34): bench.detection_windows, its own results file",
    )
    parser.add_argument("--host-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.host_worker:
        host_worker(json.loads(args.host_worker.read_text()))
    elif args.windows:
        from bench import detection_windows

        detection_windows.main(args.quick)
    else:
        main(args.quick, args.only_adversaries, args.only_tolerance)
