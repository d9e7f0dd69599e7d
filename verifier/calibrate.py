"""Tolerance calibration: how far honest replays drift between environments, against attack signals.

Bitwise replay holds only within one environment (torch version, thread count). Tolerance mode
compares ‖θ_replay − θ_claim‖ / ‖θ_claim − θ_start‖ with a threshold, which must sit well above
honest cross-environment noise yet below what one skipped step or one swapped batch does. Both
grow with the segment length k, the noise faster (DESIGN §2), so this measures, per k:

- noise: the same segment from the same state run in two separate processes of different
  environments — thread counts, or devices (CPU vs GPU, GPU vs GPU: `devices`, i.e. two replay
  classes) — env A is the verifier, env B the host; its maximum over trials, because it is
  sporadic (many segments replay bit-identically across thread counts, a few do not), so a
  calibration needs enough trials to see it at all (`differs` reports the share that did);
- skip: the host skipped one inner step of the segment (first or last, the smaller signal);
- swap: the host trained one inner step on another batch (first or last, the smaller signal);

and proposes τ = factor × noise at the largest k where both signals still exceed τ.
Each environment runs in its own process; states cross as safetensors files, never pickles.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from protocol.config import RunConfig
from trainer.data import Corpus, shakespeare_corpus
from trainer.device import host_state, resolve_device
from trainer.spec import build
from trainer.step import State, configure_determinism, load_training_state, make_optimizer, train_segment
from trainer.step import training_state as live_state
from verifier.verify import param_distance

HOST = "calibration"
SWAP_HOST = "calibration-swapped"
FLOOR = 1e-7
"""Smallest threshold proposed: below it float32 rounding of the distance itself dominates."""


class CalibrationError(RuntimeError):
    """A worker process failed or produced nothing usable."""


@dataclass(frozen=True)
class Row:
    k: int
    noise: float  # max over trials
    skip: float  # min over trials and positions
    swap: float
    threshold: float  # max(factor × noise, FLOOR)
    ok: bool  # both signals above the threshold
    noisy: float = 1.0  # share of trials whose replays differed at all (1-vs-2-thread noise is sporadic)


@dataclass(frozen=True)
class Proposal:
    k: int | None  # the largest k at which both attacks exceed the threshold; None: none does
    tolerance: float | None
    factor: float
    rows: list[Row]


def propose(ks: Sequence[int], noise: Sequence[float], skip: Sequence[float], swap: Sequence[float],
            factor: float = 8.0, noisy: Sequence[float] | None = None) -> Proposal:  # fmt: skip
    """Pure: the table and the proposal from measured distances (one value per k)."""
    rows = []
    shares = noisy if noisy is not None else [1.0] * len(ks)
    for k, n, a, b, q in zip(ks, noise, skip, swap, shares, strict=True):
        tau = max(factor * n, FLOOR)
        rows.append(Row(k, n, a, b, tau, min(a, b) > tau, q))
    good = [r for r in rows if r.ok]
    best = max(good, key=lambda r: r.k) if good else None
    return Proposal(best.k if best else None, best.threshold if best else None, factor, rows)


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
    """From `start`, run (host, first inner step, steps) pieces in order; the params at the end."""
    built = build(cfg.model)
    built.module.to(device)
    opt = make_optimizer(built.module, cfg.inner)
    load_training_state(built.module, opt, start)
    for host, first, n in plan:
        if n:
            train_segment(built.module, opt, cfg, data, host, outer, first, n, loss_fn=built.loss_fn)
    params = {k: v for k, v in live_state(built.module, opt).items() if k.startswith("param/")}
    return host_state(params)


def worker(job: dict[str, Any]) -> None:
    """Run in a fresh process: every requested trajectory under this process's thread count."""
    device = configure_determinism(job["threads"], resolve_device(job.get("device", "cpu")))
    cfg = RunConfig.model_validate(job["cfg"])
    data = _corpus(job["corpus"])
    out: dict[str, torch.Tensor] = {}
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


def _spawn(job: dict[str, Any], workdir: Path) -> dict[str, torch.Tensor]:
    path = workdir / f"job-{job['threads']}-{job['device'].replace(':', '')}-{int(job['attacks'])}.json"
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
    `threads[0]`), the host's (`devices[1]`, `threads[1]`). The run config's numerics apply to both."""
    if not ks or min(ks) < 1 or trials < 1:
        raise ValueError("need ks >= 1 and trials >= 1")
    configure_determinism(threads[0])
    data = _corpus(corpus)
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        work = Path(tmp)
        starts: list[str] = []
        built = build(cfg.model)
        opt = make_optimizer(built.module, cfg.inner)
        for t in range(trials):  # warm states: moments are not zero, as in a real segment
            train_segment(built.module, opt, cfg, data, HOST, 1000 + t, 0, warmup, loss_fn=built.loss_fn)
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
        noise, skip, swap, noisy = [], [], [], []
        for k in ks:
            n_k, skip_k, swap_k, seen = 0.0, math.inf, math.inf, 0
            for t in range(trials):
                start = {k2: v for k2, v in load_file(starts[t]).items() if k2.startswith("param/")}
                ref = _slice(a, f"{t}/{k}/honest/")
                d = param_distance(ref, _slice(b, f"{t}/{k}/honest/"), start)
                n_k, seen = max(n_k, d), seen + (d > 0)
                for pos in ("first", "last"):
                    skip_k = min(skip_k, param_distance(ref, _slice(a, f"{t}/{k}/skip_{pos}/"), start))
                    swap_k = min(swap_k, param_distance(ref, _slice(a, f"{t}/{k}/swap_{pos}/"), start))
            noise.append(n_k)
            skip.append(skip_k)
            swap.append(swap_k)
            noisy.append(seen / trials)
    return propose(ks, noise, skip, swap, factor, noisy)


def table(p: Proposal, envs: tuple[int | str, int | str] = (1, 2)) -> str:
    """`envs`: thread counts, or any two environment labels (`"cuda x1"`)."""
    a, b = (f"{e} threads" if isinstance(e, int) else e for e in envs)
    lines = [
        f"honest noise between {a} and {b} vs. attack signals (relative distance)",
        f"{'k':>4} {'noise':>10} {'differs':>8} {'skip 1 step':>12} {'swap 1 batch':>13} {'threshold':>10}"
        "  ok",
    ]
    for r in p.rows:
        ok = "yes" if r.ok else "no"
        signals = f"{r.skip:>12.2e} {r.swap:>13.2e}"
        lines.append(f"{r.k:>4} {r.noise:>10.2e} {r.noisy:>8.0%} {signals} {r.threshold:>10.2e}  {ok}")
    if p.k is None:
        lines.append(f"no k keeps both attacks above {p.factor:g}× the noise: use bitwise mode or shorter k")
    else:
        lines.append(f"proposal: segment_len k = {p.k}, tolerance = {p.tolerance:.2e} ({p.factor:g}× noise)")
    return "\n".join(lines)


def to_json(p: Proposal) -> dict[str, Any]:
    """Strict JSON: an infinite signal (skipping the only step of k = 1) is written as null."""

    def clean(row: Row) -> dict[str, Any]:
        finite = lambda v: not isinstance(v, float) or math.isfinite(v)  # noqa: E731
        return {k: v if finite(v) else None for k, v in asdict(row).items()}

    return {"k": p.k, "tolerance": p.tolerance, "factor": p.factor, "rows": [clean(r) for r in p.rows]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="calibration worker (internal)")
    parser.add_argument("--worker", type=Path, required=True)
    args = parser.parse_args()
    worker(json.loads(args.worker.read_text()))
