"""Tolerance calibration: how far honest replays drift between environments, against attack signals.

Bitwise replay holds only within one environment (torch version, thread count). Tolerance mode
compares the whole end state, each tensor group g (parameters, exp_avg, exp_avg_sq) by
‖x_replay − x_claim‖ / ‖x_claim − x_start‖ and the moments in update space (`update`,
`denominator`: `verifier.update_space`), each against its own threshold, which must sit well above
honest cross-environment noise of that distance; an attack is seen when some distance exceeds its
threshold. Both grow with the segment length k, the noise faster (DESIGN §2), so this measures,
per k and distance:

- noise: the same segment from the same state run in two separate processes of different
  environments — thread counts, or devices (CPU vs GPU, GPU vs GPU: `devices`, i.e. two replay
  classes) — env A is the verifier, env B the host; its maximum over trials (the fresh state of a
  run's first segment, where AdamW's bias corrections are largest and the moments smallest, and
  `trials` warm states) and over every segment of the two whole trajectories below (H/k more
  honest samples each, states after many steps), because it is sporadic (many segments replay
  bit-identically across thread counts, a few do not), so a calibration needs enough samples to see
  it at all (`differs` reports the share that did; with the trials alone a calibration that saw no
  parameter noise proposed the floor and 2 of 20 honest 2-thread hosts were rejected, with the
  trajectories' segments 0 of 20: `bench.detection --only-tolerance`, RESULTS §3);
- skip: the host skipped one inner step of the segment (first or last, the smaller signal);
- swap: the host trained one inner step on another batch (first or last, the smaller signal);

and proposes τ_g = factor × noise_g per group at the largest k where both attacks still exceed the
threshold of some group. The checks over replayed segments together (`cumulative`,
`cumulative_update`: `verifier.tolerance.Cumulative`, specs §6.4) are measured the same way on whole
trajectories (`chains`: the fresh state and the last warm one): env B, the host, trains H/k
consecutive segments, env A replays each from B's boundary, and the noise is the largest
cumulative distance over every contiguous run of them and every set of every count m ≥ m₀ (beyond
`MAX_SUBSETS` per count: a fixed sample; one segment is its own per-segment check), m₀ the fewest
segments the run's rule ever sums (`RunConfig.summed_least`: a window of w = 3 → 3; sampling
segments → s − 1 or s, at least 2). The distances are normalized per √(Σ wᵢ²): honest residuals do
not align, so their value stays at or below the per-segment noise and falls as m grows, while a host
steering m boundaries the same way reaches √m times its per-boundary ratio. So one threshold serves
every set of m₀ or more (a window, a challenge's drawn segments, a dispute panel's windows), and
calibrating it on sets of m₀ rather than 2 tightens it by what honest noise loses from 2 to m₀
segments. The JSON records m₀ (`cumulative_least_segments`): `run create` refuses the thresholds
for a run whose rule sums fewer.
Each environment runs in its own process; states cross as safetensors files, never pickles.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from protocol.config import CUMULATIVE_RULE, Moments, RunConfig
from replay.data import Corpus, shakespeare_corpus
from replay.device import host_state, resolve_device
from replay.spec import build
from replay.step import (
    State,
    TrainJob,
    configure_determinism,
    load_training_state,
    make_optimizer,
    train_segment,
)
from replay.step import training_state as live_state
from verifier.tolerance import CUMULATIVE_CHECKS, PARAM, TOLERANCE_CHECKS, tolerance_distances
from verifier.update_space import bias_corrections

HOST = "calibration"
SWAP_HOST = "calibration-swapped"
FLOOR = 1e-7
"""Smallest threshold proposed: below it float32 rounding of the distance itself dominates."""
MAX_SUBSETS = 1000
"""Sets of m segments scored per count m and trajectory; beyond, a fixed sample of this many."""


CONFIG_FIELDS = {
    "param": "tolerance",
    "exp_avg": "tolerance_exp_avg",
    "exp_avg_sq": "tolerance_exp_avg_sq",
    "update": "tolerance_update",
    "denominator": "tolerance_denominator",
    "cumulative": "tolerance_cumulative",
    "cumulative_update": "tolerance_cumulative_update",
}
"""The RunConfig field of each distance's threshold."""


class CalibrationError(RuntimeError):
    """A worker process failed or produced nothing usable."""


Groups = Mapping[str, float]
"""One value per distance (`verifier.tolerance.TOLERANCE_CHECKS`); a bare float means parameters."""


@dataclass(frozen=True)
class Row:
    k: int
    noise: dict[str, float]  # per group: max over trials
    skip: dict[str, float]  # per group: min over trials and positions
    swap: dict[str, float]
    threshold: dict[str, float]  # per group: max(factor × noise, FLOOR)
    ok: bool  # each attack exceeds the threshold of some group
    noisy: float = 1.0  # share of trials whose replays differed at all (1-vs-2-thread noise is sporadic)
    summed_least: int = 2  # the summed-residual noise is over sets of this many segments or more


@dataclass(frozen=True)
class Proposal:
    k: int | None  # the largest k at which both attacks exceed some threshold; None: none does
    tolerances: dict[str, float] | None  # per group, the run config's tolerance* fields
    factor: float
    rows: list[Row]

    @property
    def summed_least(self) -> int:
        """The fewest segments the proposed summed-residual thresholds hold for (the chosen k's
        `RunConfig.summed_least`): a run whose rule sums fewer needs thresholds calibrated for them."""
        return next((r.summed_least for r in self.rows if r.k == self.k), 2)

    @property
    def tolerance(self) -> float | None:
        """The parameters' threshold (RunConfig.tolerance)."""
        return None if self.tolerances is None else self.tolerances["param"]

    def run_config_fields(self) -> dict[str, float]:
        """`tolerance`, `tolerance_exp_avg`, `tolerance_exp_avg_sq`, `tolerance_update`,
        `tolerance_denominator`, `tolerance_cumulative`, `tolerance_cumulative_update` as RunConfig
        takes them (those measured)."""
        t = self.tolerances or {}
        return {CONFIG_FIELDS[g]: v for g, v in t.items() if g in CONFIG_FIELDS}


def _groups(x: float | Groups) -> dict[str, float]:
    return {"param": float(x)} if isinstance(x, int | float) else dict(x)


def _seen(signal: dict[str, float], threshold: dict[str, float]) -> bool:
    return any(signal.get(g, 0.0) > t for g, t in threshold.items())


def propose(ks: Sequence[int], noise: Sequence[float | Groups], skip: Sequence[float | Groups],
            swap: Sequence[float | Groups], factor: float = 8.0,
            noisy: Sequence[float] | None = None,
            leasts: Sequence[int] | None = None) -> Proposal:  # fmt: skip
    """Pure: the table and the proposal from measured distances (one value, or one per group, per k;
    `leasts`: per k, the fewest segments its summed-residual noise was measured over)."""
    rows = []
    shares = noisy if noisy is not None else [1.0] * len(ks)
    least = leasts if leasts is not None else [2] * len(ks)
    for k, n, a, b, q, m in zip(ks, noise, skip, swap, shares, least, strict=True):
        n_g, a_g, b_g = _groups(n), _groups(a), _groups(b)
        tau = {g: max(factor * v, FLOOR) for g, v in n_g.items()}
        rows.append(Row(k, n_g, a_g, b_g, tau, _seen(a_g, tau) and _seen(b_g, tau), q, m))
    good = [r for r in rows if r.ok]
    best = max(good, key=lambda r: r.k) if good else None
    return Proposal(best.k if best else None, dict(best.threshold) if best else None, factor, rows)


# ---------------------------------------------------------------- the worker (one environment)


def _corpus(spec: str) -> Corpus:
    """'shakespeare' or 'synthetic:<n>:<seed>' (tests): rebuilt identically in every process."""
    if spec == "shakespeare":
        return shakespeare_corpus()
    _, n, seed = spec.split(":")
    g = torch.Generator().manual_seed(int(seed))
    text = torch.randint(97, 123, (int(n),), generator=g).to(torch.uint8)
    return Corpus(text, text[: int(n) // 10].clone(), "synthetic")


Plan = Sequence[tuple[str, int, int]]


def _run(cfg: RunConfig, data: Corpus, start: State, plan: Plan, outer: int, device: torch.device) -> State:
    """From `start`, run (host, first inner step, steps) pieces in order; the state at the end."""
    built = build(cfg.model)
    built.module.to(device)
    opt = make_optimizer(built.module, cfg.inner)
    load_training_state(built.module, opt, start)
    for host, first, n in plan:
        if n:
            job = TrainJob(cfg, data, host, outer, loss_fn=built.loss_fn)
            train_segment(job, built.module, opt, first, n)
    return host_state(dict(live_state(built.module, opt)))  # a host copy: a GPU replay's too


def worker(job: dict[str, Any]) -> None:
    """Run in a fresh process: every requested trajectory under this process's thread count."""
    device = configure_determinism(job["threads"], resolve_device(job.get("device", "cpu")))
    cfg = RunConfig.model_validate(job["cfg"])
    data = _corpus(job["corpus"])
    out: dict[str, torch.Tensor] = {}
    if "chains" in job:
        _chain_worker(job, cfg, data, device)
        return
    for t, start_path in enumerate(job["starts"]):
        start = load_file(start_path)
        s0, outer = job["first_inner"], t
        for k in job["ks"]:
            plans: dict[str, list[tuple[str, int, int]]] = {"honest": [(HOST, s0, k)]}
            if job["attacks"]:
                for name, p in (("first", 0), ("last", k - 1)):
                    rest = (HOST, s0 + p + 1, k - p - 1)
                    plans[f"skip_{name}"] = [(HOST, s0, p), rest]
                    plans[f"swap_{name}"] = [(HOST, s0, p), (SWAP_HOST, s0 + p, 1), rest]
            for variant, plan in plans.items():
                for name, v in _run(cfg, data, start, plan, outer, device).items():
                    out[f"{t}/{k}/{variant}/{name}"] = v
    save_file(out, job["out"])


def _chain_worker(job: dict[str, Any], cfg: RunConfig, data: Corpus, device: torch.device) -> None:
    """Whole trajectories (chain c, segment length k, outer step `outer`): with no `bank`, train
    H/k consecutive segments from the chain's start, each end saved as `c/k/j/…` (j = 1…n); with
    a `bank` (the host's), replay every segment j from the bank's boundary j − 1 instead."""
    bank = load_file(job["bank"]) if job.get("bank") else None
    out: dict[str, torch.Tensor] = {}
    for c, chain in enumerate(job["chains"]):
        first = load_file(chain["start"])
        for k in job["ks"]:
            cur = first
            for j in range(max(1, cfg.inner_steps // k)):
                if bank is not None and j:
                    cur = _slice(bank, f"{c}/{k}/{j}/")
                cur = _run(cfg, data, cur, [(HOST, j * k, k)], chain["outer"], device)
                for name, v in cur.items():
                    out[f"{c}/{k}/{j + 1}/{name}"] = v
    save_file(out, job["out"])


def _spawn(job: dict[str, Any], workdir: Path) -> dict[str, torch.Tensor]:
    tag = "chain" if "chains" in job else int(job["attacks"])
    path = workdir / f"job-{job['threads']}-{job['device'].replace(':', '')}-{tag}.json"
    path.write_text(json.dumps(job))
    env = {**os.environ, "OMP_NUM_THREADS": str(job["threads"])}
    proc = subprocess.run(
        [sys.executable, "-m", "verifier.calibrate", "--worker", str(path)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if proc.returncode != 0 or not Path(job["out"]).is_file():
        raise CalibrationError(
            f"worker ({job['device']}, {job['threads']} threads) failed: {proc.stderr[-2000:]}"
        )
    return load_file(job["out"])


def _slice(bank: dict[str, torch.Tensor], prefix: str) -> State:
    return {k[len(prefix) :]: v for k, v in bank.items() if k.startswith(prefix)}


def _residuals(replay: State, claim: State, start: State, inner: Any) -> tuple[Tensor, Tensor, float, float]:
    """One segment's residual vectors (params, next update: `Cumulative`'s terms) and normalizers."""
    params = sorted(k for k in claim if k.startswith(PARAM))
    r = torch.cat([(claim[k].double() - replay[k].double()).reshape(-1) for k in params])
    moved = math.sqrt(sum(float((claim[k].double() - start[k].double()).square().sum()) for k in params))
    bc1, bc2 = bias_corrections(float(replay["step"]), inner)

    def upd(st: State, name: str) -> Tensor:
        m, v = st["exp_avg/" + name].double(), st["exp_avg_sq/" + name].double()
        return (m / (bc1 * ((v / bc2).sqrt() + inner.eps))).reshape(-1)

    names = sorted(k[len("exp_avg/") :] for k in claim if k.startswith("exp_avg/"))
    ur = torch.cat([upd(replay, n) for n in names])
    du = torch.cat([upd(claim, n) for n in names]) - ur
    return r, du, moved, float(ur.norm())


def summed_sets(n: int, least: int = 2) -> Iterator[Tensor]:
    """The sets of n consecutive segments whose summed residuals calibration scores, as 0/1 rows in
    batches: every contiguous run of `least` or more (a window, a trajectory's tail), and for every
    count m ≥ `least` every set of m (a challenge's drawn segments, a panel's windows), or
    `MAX_SUBSETS` of them drawn with a fixed seed where there are more. (A set of one is its
    segment's own check; `least` is the run's `RunConfig.summed_least`, 2 unless told.)"""
    least = max(2, least)
    runs = [list(range(a, b)) for a in range(n) for b in range(a + least, n + 1)]
    rng = random.Random(0)
    others: list[Sequence[int]] = []
    for m in range(least, n):
        if math.comb(n, m) <= MAX_SUBSETS:
            others.extend(itertools.combinations(range(n), m))
        else:
            others.extend(sorted(rng.sample(range(n), m)) for _ in range(MAX_SUBSETS))
    sets = [*runs, *others]
    for a in range(0, len(sets), 4096):
        rows = torch.zeros(len(sets[a : a + 4096]), n, dtype=torch.float64)
        for i, sub in enumerate(sets[a : a + 4096]):
            rows[i, list(sub)] = 1.0
        yield rows


def worst_summed(vectors: Sequence[Tensor], weights: Sequence[float], least: int = 2) -> float:
    """The largest ‖Σ_S r_i‖ / √(Σ_S w_i²) over every summed set (`summed_sets`, of `least` or more)
    of consecutive segments' residual vectors r_i and movements w_i, from the residuals' Gram matrix."""
    x = torch.stack(list(vectors))
    gram = x @ x.T
    w2 = torch.tensor(list(weights), dtype=torch.float64).square()
    worst = 0.0
    for rows in summed_sets(len(weights), least):  # nothing for one segment
        num = ((rows @ gram) * rows).sum(1).clamp_min(0.0)
        val = torch.where(num == 0, torch.zeros_like(num), num.sqrt() / (rows @ w2).sqrt())
        worst = max(worst, float(val.max()))
    return worst


def segment_noise(segments: Sequence[tuple[State, State, State]], inner: Any) -> tuple[dict[str, float], int]:
    """The largest per-segment distances (`tolerance_distances`) over the given (replay, claim,
    start) segments, and how many differed at all: a whole trajectory's segments are honest noise
    samples like the trials', from states far into training."""
    worst = dict.fromkeys(TOLERANCE_CHECKS, 0.0)
    differed = 0
    for seg in segments:
        d = tolerance_distances(*seg, inner)
        worst = {g: max(worst[g], d[g]) for g in TOLERANCE_CHECKS}
        differed += any(v > 0 for v in d.values())
    return worst, differed


def cumulative_noise(
    segments: Sequence[tuple[State, State, State]], inner: Any, least: int = 2
) -> dict[str, float]:
    """The largest `Cumulative` distances over every summed set (`summed_sets`) of `least` or more
    of the given consecutive (replay, claim, start) segments of one trajectory. Normalized per
    √(Σ wᵢ²), honest values fall as the count grows (specs §6.4), so one threshold holds for every
    set of `least` or more: the run's smallest summed set (`RunConfig.summed_least`)."""
    res = [_residuals(*seg, inner) for seg in segments]
    return {
        "cumulative": worst_summed([r[0] for r in res], [r[2] for r in res], least),
        "cumulative_update": worst_summed([r[1] for r in res], [r[3] for r in res], least),
    }


def calibrate(
    cfg: RunConfig,
    corpus: str = "shakespeare",
    ks: Sequence[int] = (1, 2, 5, 10, 20, 50),
    threads: tuple[int, int] = (1, 2),
    trials: int = 8,
    warmup: int = 10,
    factor: float = 8.0,
    devices: tuple[str, str] = ("cpu", "cpu"),
) -> Proposal:
    """Measure noise and signals for every k; the verifier's environment is (`devices[0]`,
    `threads[0]`), the host's (`devices[1]`, `threads[1]`). The run config's numerics apply to both.
    Trials: the fresh state (step 0, the start of every run) and `trials` warm states. The checks
    over replayed segments together (count-independent) are calibrated on two whole trajectories of
    H/k segments per k (from the fresh state and the last warm one), over every set of them."""
    if not ks or min(ks) < 1 or trials < 1:
        raise ValueError("need ks >= 1 and trials >= 1")
    if cfg.inner.moments is not Moments.FP32:  # what tolerance mode runs with (specs §6.2.1)
        raise ValueError(f"tolerance calibration needs inner.moments = 'fp32' (this config has "
                         f"{cfg.inner.moments.value!r}): tolerance mode runs with float32 moments")
    configure_determinism(threads[0])
    data = _corpus(corpus)
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        work = Path(tmp)
        starts: list[str] = []
        built = build(cfg.model)
        opt = make_optimizer(built.module, cfg.inner)
        for t in range(trials + 1):  # the fresh state, then warm ones (moments not zero)
            if t:
                job = TrainJob(cfg, data, HOST, 1000 + t, loss_fn=built.loss_fn)
                train_segment(job, built.module, opt, 0, warmup)
            path = work / f"start-{t}.safetensors"
            state = live_state(built.module, opt, copy=True)
            save_file({k: v.contiguous() for k, v in state.items()}, str(path))
            starts.append(str(path))
        base = {"cfg": cfg.model_dump(mode="json"), "corpus": corpus, "starts": starts, "ks": list(ks),
                "first_inner": warmup}  # fmt: skip
        a = _spawn({**base, "threads": threads[0], "device": devices[0], "attacks": True,
                    "out": str(work / "a.st")}, work)  # fmt: skip
        b = _spawn({**base, "threads": threads[1], "device": devices[1], "attacks": False,
                    "out": str(work / "b.st")}, work)  # fmt: skip
        chains: list[dict[str, Any]] = [
            {"start": starts[0], "outer": 2000}, {"start": starts[-1], "outer": 2001}
        ]  # fmt: skip
        chain_b = {**base, "chains": chains, "threads": threads[1], "device": devices[1], "attacks": False,
                   "out": str(work / "chain-b.st")}  # fmt: skip
        cb = _spawn(chain_b, work)
        ca = _spawn({**chain_b, "threads": threads[0], "device": devices[0], "bank": chain_b["out"],
                     "out": str(work / "chain-a.st")}, work)  # fmt: skip
        noise: list[Groups] = []
        skip: list[Groups] = []
        swap: list[Groups] = []
        noisy: list[float] = []
        groups, inner = TOLERANCE_CHECKS, cfg.inner
        leasts: list[int] = []
        for k in ks:
            leasts.append(cfg.model_copy(update={"segment_len": k}).summed_least)
            n_k = dict.fromkeys(groups, 0.0)
            seen_chain = [0, 0]  # the chains' segments that differed at all, of those replayed
            skip_k, swap_k = dict.fromkeys(groups, math.inf), dict.fromkeys(groups, math.inf)
            seen = 0
            for t in range(len(starts)):
                start = load_file(starts[t])
                ref = _slice(a, f"{t}/{k}/honest/")
                d = tolerance_distances(ref, _slice(b, f"{t}/{k}/honest/"), start, inner)
                n_k = {g: max(n_k[g], d[g]) for g in groups}
                seen += any(v > 0 for v in d.values())
                for pos in ("first", "last"):
                    ds = tolerance_distances(ref, _slice(a, f"{t}/{k}/skip_{pos}/"), start, inner)
                    dw = tolerance_distances(ref, _slice(a, f"{t}/{k}/swap_{pos}/"), start, inner)
                    skip_k = {g: min(skip_k[g], ds[g]) for g in groups}
                    swap_k = {g: min(swap_k[g], dw[g]) for g in groups}
            for c, chain in enumerate(chains):  # whole trajectories: replayed segments together
                first = load_file(chain["start"])
                segs = []
                for j in range(1, max(1, cfg.inner_steps // k) + 1):
                    seg_start = first if j == 1 else _slice(cb, f"{c}/{k}/{j - 1}/")
                    segs.append((_slice(ca, f"{c}/{k}/{j}/"), _slice(cb, f"{c}/{k}/{j}/"), seg_start))
                each, differed = segment_noise(segs, inner)  # honest segments too: more samples
                n_k = {**n_k, **{g: max(n_k[g], each[g]) for g in groups}}
                seen_chain = [seen_chain[0] + differed, seen_chain[1] + len(segs)]
                dc = cumulative_noise(segs, inner, leasts[-1])
                n_k = {**n_k, **{g: max(n_k.get(g, 0.0), dc[g]) for g in CUMULATIVE_CHECKS}}
            noise.append(n_k)
            skip.append(skip_k)
            swap.append(swap_k)
            noisy.append((seen + seen_chain[0]) / (len(starts) + seen_chain[1]))
    return propose(ks, noise, skip, swap, factor, noisy, leasts)


def table(p: Proposal, envs: tuple[int | str, int | str] = (1, 2)) -> str:
    """`envs`: thread counts, or any two environment labels (`"cuda x1"`)."""
    a, b = (f"{e} threads" if isinstance(e, int) else e for e in envs)
    lines = [
        f"honest noise between {a} and {b} vs. attack signals (relative distance)",
        f"{'k':>4} {'group':>17} {'noise':>10} {'differs':>8} {'skip 1 step':>12} {'swap 1 batch':>13} "
        f"{'threshold':>10}  ok",
    ]
    for r in p.rows:
        ok = "yes" if r.ok else "no"
        for i, g in enumerate(r.noise):
            k, share, mark = (f"{r.k:>4}", f"{r.noisy:>8.0%}", ok) if i == 0 else (" " * 4, " " * 8, "")
            signals = f"{r.skip.get(g, math.nan):>12.2e} {r.swap.get(g, math.nan):>13.2e}"
            lines.append(f"{k} {g:>17} {r.noise[g]:>10.2e} {share} {signals} {r.threshold[g]:>10.2e}  {mark}")
    best = next((r for r in p.rows if r.k == p.k), None)
    unseen = [g for g, v in best.noise.items() if v == 0.0] if best is not None and best.noisy > 0 else []
    if unseen:  # sporadic noise no sample happened to show: the floor would reject honest hosts
        lines.append(f"warning: no honest noise seen in {', '.join(unseen)} at k = {p.k} while other groups "
                     "differed: those thresholds are the floor; measure more (--trials, a larger max k)")
    if p.k is None or p.tolerances is None:
        lines.append(f"no k keeps both attacks above {p.factor:g}× the noise: use bitwise mode or shorter k")
    else:
        fields = ", ".join(f"{name} = {v:.2e}" for name, v in p.run_config_fields().items())
        lines.append(f"proposal: segment_len k = {p.k}, {fields} ({p.factor:g}× noise; the summed ones "
                     f"for sets of {p.summed_least} segments or more)")
    return "\n".join(lines)


def _finite(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    return None if isinstance(v, float) and not math.isfinite(v) else v


def to_json(p: Proposal) -> dict[str, Any]:
    """Strict JSON: an infinite signal (skipping the only step of k = 1) is written as null."""
    return {
        "k": p.k,
        "tolerance": p.tolerance,
        "tolerances": p.tolerances,
        "run_config": p.run_config_fields(),
        "cumulative_rule": CUMULATIVE_RULE,  # what its summed-residual thresholds mean (specs §6.4)
        "cumulative_least_segments": p.summed_least,  # ... and the fewest segments they hold for
        "factor": p.factor,
        "rows": [_finite(asdict(r)) for r in p.rows],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="calibration worker (internal)")
    parser.add_argument("--worker", type=Path, required=True)
    args = parser.parse_args()
    worker(json.loads(args.worker.read_text()))
