"""Host utilization and wall-clock to the same loss, with and without the overlapped schedule (issue 16).

Runs the real devnet (chain, hosts, verifier: separate processes over HTTP) twice on the same
settings, `overlap = "none"` then `overlap = "delayed"` (specs/protocol.md §2.2.1), with one
sign-flipping host among them, and phases sized to compute: the train phase is H inner steps at
the step time measured here (one thread, scaled by the processes that share this machine's cores,
plus a margin), the verification windows cover the verifier's replays. Then, from the nodes' own
logs and the chain:

- utilization of each honest host = training seconds ÷ wall seconds, over the span from its first
  training start to its last training end ("span"), and to the run's last adopted result ("run");
- wall-clock to the same loss: seconds from the first training start until the global validation
  loss first reaches the sequential run's final loss, in each mode, and their ratio;
- the adversary rejected in every step and the loss falling, in both modes.

    .venv/bin/python -m bench.overlap [--quick] [--steps 5] [--inner-steps 100]

Writes bench/results/overlap.json. About 5 minutes on a loaded 2-core machine (`--quick`: ~3).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).parent / "results" / "overlap.json"
HOSTS, VERIFIERS = 3, 1  # two honest hosts and one sign-flipper; one verifier
ADVERSARY = "sign_flip"
BLOCK_S = 0.25
CHECKPOINT_EVERY = 1  # hosts persist every boundary (tiny model): a reveal recomputes nothing
OUTER_LR, OUTER_MOMENTUM = 0.5, 0.0
"""Both modes: with DiLoCo's Nesterov momentum 0.9 the one-step-delayed outer step diverges here
(val loss 2.92 → 5.9 in six steps of the in-process check; 2.92 → 4.99 in this devnet); momentum
0 is stable for both (see the closing note of issue 16)."""
MARGIN = 1.25  # train phase = H contended steps + 25%: hosts neither wait long nor miss the deadline


def _time_steps(
    cfg_json: str, barrier: Any = None, out: Any = None, steps: int = 20, rounds: int = 1
) -> float:
    """Seconds per inner step of the devnet's model on one thread. As a worker process: set up and
    warm up, then `rounds` times: wait for the others at `barrier` and time (so no worker times
    another's start-up), putting each figure on `out`."""
    from gonka_diloco.devnet import model_spec, run_config
    from gonka_diloco.devnet_config import DevnetConfig
    from trainer.data import shakespeare_corpus
    from trainer.spec import build_model
    from trainer.step import configure_determinism, make_optimizer, train_segment

    configure_determinism(1)
    cfg = DevnetConfig.model_validate_json(cfg_json)
    rc = run_config(cfg)
    corpus = shakespeare_corpus()
    model = build_model(model_spec(cfg))
    opt = make_optimizer(model, rc.inner)
    host = "gonka1" + "q" * 38
    train_segment(model, opt, rc, corpus, host, 0, 0, 2)  # warm-up
    seconds = 0.0
    for r in range(rounds):
        if barrier is not None:
            barrier.wait()
        t = time.perf_counter()
        train_segment(model, opt, rc, corpus, host, 0, 1 + r, steps)
        seconds = (time.perf_counter() - t) / steps
        if out is not None:
            out.put(seconds)
    return seconds


def step_seconds(cfg: Any) -> tuple[float, float]:
    """(alone, contended): seconds per inner step on one thread by itself, and the median while
    every host and verifier of the devnet computes at once on this machine's cores (an upper
    bound: the verifier replays a tenth of what the hosts train)."""
    import multiprocessing

    text = cfg.model_dump_json()
    alone = min(_time_steps(text) for _ in range(2))
    ctx = multiprocessing.get_context("spawn")
    workers = HOSTS + VERIFIERS
    barrier, out = ctx.Barrier(workers), ctx.Queue()
    rounds = 3  # the machine's other load comes and goes: the median of 3 rounds × every worker
    procs = [ctx.Process(target=_time_steps, args=(text, barrier, out, 20, rounds)) for _ in range(workers)]
    for p in procs:
        p.start()
    times = sorted(out.get(timeout=300) for _ in range(workers * rounds))
    for p in procs:
        p.join()
    return alone, times[len(times) // 2]


def sized(args: argparse.Namespace) -> tuple[Any, dict[str, float]]:
    """The devnet config with phases sized to the measured compute: the train phase fits H steps
    at the contended step time with a 25% margin plus the commit's slack blocks (phase_sizing);
    reveal and verify fit the host's recomputation and the verifier's replays."""
    from gonka_diloco.devnet_config import AdversarySpec, DevnetConfig, PhaseSeconds

    base = DevnetConfig(
        hosts=HOSTS, verifiers=VERIFIERS, adversaries=[AdversarySpec(behaviour=ADVERSARY)],
        inner_steps=args.inner_steps, segment_len=5, sampled_segments=2, block_interval=BLOCK_S,
        live=False, timeout=400.0, checkpoint_every=CHECKPOINT_EVERY, outer_lr=OUTER_LR,
        outer_momentum=OUTER_MOMENTUM,
    )  # fmt: skip
    from gonka_diloco.phase_sizing import COMMIT_SLACK_BLOCKS, train_phase_seconds

    alone, t = step_seconds(base)
    k, s = base.segment_len, base.sampled_segments
    # the devnet's own sizing rule (gonka_diloco.phase_sizing) at the contended step time
    train = train_phase_seconds(args.inner_steps, t, margin=MARGIN) + COMMIT_SLACK_BLOCKS * BLOCK_S
    recompute = s * (CHECKPOINT_EVERY - 1) * k * t  # opened boundaries rebuilt from sparse checkpoints
    replay = HOSTS * s * k * t  # the verifier replays every opened segment (v = 1)
    phases = PhaseSeconds(
        join=2.0, train=train, reveal=max(2.0, 1.5 * recompute + 1.0), verify=max(2.0, 1.5 * replay + 1.0),
        escalation=2.0, result=2.0, audit=1.5, confirm=1.5,
    )  # fmt: skip
    sizing = {"step_s_alone": alone, "step_s_contended": t, "train_s": train, "reveal_s": phases.reveal,
              "verify_s": phases.verify}  # fmt: skip
    return base.model_copy(update={"phases": phases}), sizing


def events(folder: Path, node: str) -> list[dict[str, Any]]:
    out = []
    for line in (folder / "logs" / f"{node}.log").read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and "ts" in e:
            out.append(e)
    return out


def measure(folder: Path, snap: Any) -> dict[str, Any]:
    """Utilization, the loss curve over wall time, and the adversary's outcomes, from one run."""
    honest = [n.name for n in snap.nodes if n.role == "host" and n.behaviour == "honest"]
    per_host = {}
    start = None
    curve: list[tuple[float, float]] = []  # (ts, val loss) of each adopted G, from host-0's log
    for name in honest:
        ev = events(folder, name)
        trained = [e for e in ev if e["event"] == "trained"]
        applied = [e for e in ev if e["event"] == "outer_step_applied"]
        busy = sum(e["seconds"] for e in trained)
        first = trained[0]["ts"] - trained[0]["seconds"]
        span = trained[-1]["ts"] - first
        run = max(e["ts"] for e in applied) - first
        per_host[name] = {"training_s": busy, "span_s": span, "run_s": run,
                          "utilization_span": busy / span, "utilization_run": busy / run,
                          "steps_trained": len(trained)}  # fmt: skip
        if name == honest[0]:
            start = first
            curve = [(e["ts"] - first, e["val_loss"]) for e in applied]
    adversary = [c.outcome for c in snap.contributions if c.host == f"host-{HOSTS - 1}"]  # the last host
    losses = [v for _, v in curve]
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(curve)]
    return {
        "period_s": sum(gaps) / len(gaps) if gaps else None,  # seconds between adopted results
        "hosts": per_host,
        "utilization_span": min(h["utilization_span"] for h in per_host.values()),
        "utilization_run": min(h["utilization_run"] for h in per_host.values()),
        "val_loss_curve": [{"t_s": round(t, 2), "val_loss": v} for t, v in curve],
        "adversary_outcomes": adversary,
        "adversary_always_rejected": bool(adversary) and all(o == "rejected" for o in adversary),
        "loss_falls": len(losses) >= 2 and losses[-1] < losses[0],
        "steps_done": len([s for s in snap.steps if s.phase == "DONE"]),
        "wall_s": snap.wall_s,
        "failures": snap.failures,
        "first_train_ts": start,
    }


def time_to(curve: list[dict[str, float]], target: float) -> float | None:
    """Seconds from the first training start until the adopted G's val loss is ≤ target."""
    return next((p["t_s"] for p in curve if p["val_loss"] <= target), None)


def render(d: dict[str, Any]) -> list[str]:
    """RESULTS.md lines (bench.report): one row per mode, then the two ratios and the goals."""
    st = d["settings"]
    out = [
        f"Devnet: {st['hosts']} hosts (one `{st['adversary']}`), {st['verifiers']} verifier, H = "
        f"{st['inner_steps']}, blocks of {st['block_s']} s, train phase {st['train_s']:.1f} s (H × "
        f"{st['step_s_contended']:.3f} s contended step × {st['margin']} + 2 blocks), outer lr "
        f"{st['outer_lr']}, momentum {st['outer_momentum']}; {st['cores']} cores shared by every node. "
        f"`{d['command']}`.",
        "",
        "| overlap | outer steps | s / outer step | utilization (span) | utilization (run) "
        "| train-phase fill | s to loss ≤ target | adversary | val loss |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in ("none", "delayed"):
        r = d[mode]
        curve = r["val_loss_curve"]
        t = d["time_to_target_s"][mode]
        adv = "rejected every step" if r["adversary_always_rejected"] else ", ".join(r["adversary_outcomes"])
        period = f"{r['period_s']:.1f}" if r.get("period_s") else "-"
        out.append(
            f"| {mode} | {len(curve)} | {period} | {r['utilization_span']:.0%} | {r['utilization_run']:.0%} "
            f"| {r.get('train_phase_fill', 0):.0%} | {f'{t:.1f}' if t is not None else 'never'} | {adv} "
            f"| {curve[0]['val_loss']:.3f} → {curve[-1]['val_loss']:.3f} |"
        )
    sp, ps = d.get("speedup_to_same_loss"), d.get("step_period_speedup")
    goals = {k: "met" if v else "NOT met" for k, v in d["goals"].items()}
    same = f"{sp:.2f}×" if sp else "not reached"
    out += [
        "",
        f"Target loss {d['target_val_loss']:.3f} (the sequential run's last). Seconds per outer step: "
        f"{ps:.2f}× fewer with overlap; wall-clock to the same loss: {same} (goal ≥ 1.5×: "
        f"**{goals['speedup_ge_1.5']}**); utilization with overlap ≥ 80%: "
        f"**{goals['utilization_delayed_ge_0.8']}**.",
        "",
    ]
    return out


def main(quick: bool = False) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer, shorter steps")
    ap.add_argument("--steps", type=int, default=0, help="outer steps of the sequential run (3; quick 2)")
    ap.add_argument("--extra", type=int, default=2, help="more outer steps for the overlapped run")
    ap.add_argument("--inner-steps", type=int, default=0, help="H (80; quick 60)")
    args, _ = ap.parse_known_args()  # under `python -m bench` its own flags are in argv too
    quick = quick or args.quick
    args.steps = args.steps or (2 if quick else 3)
    args.inner_steps = args.inner_steps or (60 if quick else 80)
    torch.set_num_threads(1)
    from gonka_diloco.devnet import run_devnet
    from protocol.config import Overlap

    cfg, sizing = sized(args)
    print(f"sizing: {json.dumps({k: round(v, 3) for k, v in sizing.items()})}", flush=True)
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp:
        for mode, steps in (("none", args.steps), ("delayed", args.steps + args.extra)):
            folder = Path(tmp) / mode
            t0 = time.perf_counter()
            run_cfg = cfg.model_copy(update={"overlap": Overlap(mode), "outer_steps": steps})
            snap = run_devnet(run_cfg, folder, echo=lambda s: None)
            runs[mode] = measure(folder, snap)
            r = runs[mode]
            adv = "rejected every step" if r["adversary_always_rejected"] else r["adversary_outcomes"]
            curve = r["val_loss_curve"]
            print(f"{mode:>8}: {steps} steps in {time.perf_counter() - t0:.0f} s; utilization span "
                  f"{r['utilization_span']:.0%}, run {r['utilization_run']:.0%}; adversary {adv}; "
                  f"val loss {curve[0]['val_loss']:.3f} -> {curve[-1]['val_loss']:.3f}",
                  flush=True)  # fmt: skip
            for failure in r["failures"]:
                print(f"  FAILURE: {failure}", flush=True)
    target = runs["none"]["val_loss_curve"][-1]["val_loss"]
    t_none = time_to(runs["none"]["val_loss_curve"], target)
    t_delayed = time_to(runs["delayed"]["val_loss_curve"], target)
    speedup = t_none / t_delayed if t_none and t_delayed else None
    p_none, p_delayed = runs["none"]["period_s"], runs["delayed"]["period_s"]
    train_s = cfg.phases.train
    for mode in ("none", "delayed"):  # how full hosts kept the train phase (the sizing's margin)
        hosts = runs[mode]["hosts"].values()
        runs[mode]["train_phase_fill"] = min(h["training_s"] / h["steps_trained"] / train_s for h in hosts)
    out = {
        "settings": {"hosts": HOSTS, "verifiers": VERIFIERS, "adversary": ADVERSARY, "block_s": BLOCK_S,
                     "outer_lr": OUTER_LR, "outer_momentum": OUTER_MOMENTUM, "margin": MARGIN,
                     "inner_steps": args.inner_steps, "steps_none": args.steps,
                     "steps_delayed": args.steps + args.extra, "cores": os.cpu_count(), **sizing},
        "none": runs["none"],
        "delayed": runs["delayed"],
        "target_val_loss": target,
        "time_to_target_s": {"none": t_none, "delayed": t_delayed},
        "speedup_to_same_loss": speedup,
        "step_period_speedup": p_none / p_delayed if p_none and p_delayed else None,
        "goals": {"utilization_delayed_ge_0.8": runs["delayed"]["utilization_span"] >= 0.8,
                  "speedup_ge_1.5": speedup is not None and speedup >= 1.5},
        "command": ".venv/bin/python -m bench.overlap" + (" --quick" if quick else ""),
        "quick": quick,
    }  # fmt: skip
    print(f"\n{'':>10}{'util (span)':>13}{'util (run)':>12}{'t to loss':>11}")
    for mode in ("none", "delayed"):
        t = out["time_to_target_s"][mode]
        print(f"{mode:>10}{runs[mode]['utilization_span']:>13.0%}{runs[mode]['utilization_run']:>12.0%}"
              f"{(f'{t:.1f} s' if t is not None else 'never'):>11}")  # fmt: skip
    if out["step_period_speedup"]:
        print(f"seconds per outer step: none {p_none:.1f}, delayed {p_delayed:.1f} "
              f"({out['step_period_speedup']:.2f}x); hosts filled {runs['delayed']['train_phase_fill']:.0%} "
              f"of the {train_s:.1f} s train phase")  # fmt: skip
    print(f"same loss ({target:.3f}) reached {speedup:.2f}x faster with overlap" if speedup else
          f"the overlapped run did not reach the sequential run's final loss {target:.3f}")  # fmt: skip
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
