"""Host utilization and wall-clock to the same loss, with and without the overlapped schedule (issue 16).

Runs the real devnet (chain, hosts, verifier: separate processes over HTTP) twice on the same
settings, `overlap = "none"` then the overlapped schedule (`--overlap eager`, the only one since
issue 22 removed `delayed`; specs/protocol.md §2.2.1), with one sign-flipping
host among them, and phases sized per mode to the compute its hosts see: the hosts' H steps timed
while they all train at once (and, overlapped, the verifier replays its share beside them), the
margin covering the noise of those timings (`phase_sizing.noise_margin`), and the post-training
phases sized to the verifier's replays (overlapped: they must fit in the next train phase,
D ≤ T + 1). Then, from the nodes' own logs and the chain:

- utilization of each honest host = training seconds ÷ wall seconds, over the span from its first
  training start to its last training end ("span"), and to the run's last adopted result ("run");
- where each honest host's wall time goes per outer step (`WHERE`), and its missed deadlines;
- wall-clock to the same loss: seconds from the first training start until the global validation
  loss first reaches the sequential run's final loss, in each mode, and their ratio;
- the adversary rejected in every step and the loss falling, in both modes.

    .venv/bin/python -m bench.overlap [--quick] [--overlap eager] [--keep DIR]

Writes bench/results/overlap.json. About 7 minutes on a loaded 2-core machine (`--quick`: ~5).
The machine is shared with other work: the load average before and after is recorded.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).parent / "results" / "overlap.json"
HOSTS, VERIFIERS = 3, 1  # two honest hosts and one sign-flipper; one verifier
ADVERSARY = "sign_flip"
BLOCK_S = 0.25
CHECKPOINT_EVERY = 1  # hosts persist every boundary (tiny model): a reveal recomputes nothing
OUTER = {"eager": (0.7, 0.9)}
"""Outer lr and momentum of both runs, by the overlapped mode compared: eager keeps DiLoCo's
0.7 / 0.9 (bench §1d). (The removed delayed schedule needed momentum 0 here: with 0.9 it diverged,
val loss 2.92 → 4.99 in this devnet.)"""
EARLY_CLOSE_MARGIN = 4.0
"""With early close (specs §2.3.1) a window ends when its last message is in (a result round when a
majority agrees), so its length costs nothing when everyone is on time: the margin only has to
cover load that arrives after the timing probes — a host's tail of the previous step (outer step,
evaluation) competing with its training, other work on this shared machine — and a generous one
keeps hosts from missing deadlines (at 2.5 both honest hosts missed a commit by one block, and at
a 1.5 s result window one host's tail came 1.7 s late: no majority, the step closed unchanged)."""
ROUNDS = 4
"""Rounds of contended timing per mode: × 3 hosts, 12 samples of the noise the margin must cover."""
TX_S = 0.75  # a tx seen and included: three blocks
REVEAL_S = 3.0
"""Reveal: see the challenge, read the opened boundaries, send the tx — while the host trains the
next step (overlapped). On the loaded machine 0.75 s was missed by a host, and 2.0 s by both
honest hosts at the last step of the full run of 2026-12-01 (ErrLateReveal by 2 blocks)."""
FETCH_S = 0.5  # the verifier fetching a contribution's openings and Δ from its host (local HTTP)
RESULT_S = 1.5  # hosts fetch the accepted Δs, apply the outer step and send the result (≈ 0.3 s seen)


def _time_steps(
    cfg_json: str, barrier: Any = None, out: Any = None, steps: int = 20, rounds: int = 1, role: str = "host"
) -> float:
    """Seconds per inner step of the devnet's model on one thread. As a worker process: set up and
    warm up, then `rounds` times: wait for the others at `barrier` and time `steps` steps (so no
    worker times another's start-up), putting (role, seconds per step) on `out`."""
    from gonka_diloco.devnet import model_spec, run_config
    from gonka_diloco.devnet_config import DevnetConfig
    from replay.data import shakespeare_corpus
    from replay.spec import build_model
    from replay.step import TrainJob, configure_determinism, make_optimizer, train_segment

    configure_determinism(1)
    cfg = DevnetConfig.model_validate_json(cfg_json)
    rc = run_config(cfg)
    corpus = shakespeare_corpus()
    model = build_model(model_spec(cfg))
    opt = make_optimizer(model, rc.inner)
    host = "gonka1" + "q" * 38
    train_segment(TrainJob(rc, corpus, host, 0), model, opt, 0, 2)  # warm-up
    seconds = 0.0
    for r in range(rounds):
        if barrier is not None:
            barrier.wait()
        t = time.perf_counter()
        train_segment(TrainJob(rc, corpus, host, 0), model, opt, 1 + r, steps)
        seconds = (time.perf_counter() - t) / steps
        if out is not None:
            out.put((role, seconds))
    return seconds


def contended_samples(cfg: Any, overlapped: bool, rounds: int = ROUNDS) -> dict[str, list[float]]:
    """Seconds per inner step as the devnet's nodes see it, `rounds` times: every host trains its
    H steps at once (the step opens for all of them in one block) while, in an overlapped run, the
    verifier replays its share of the previous step beside them (HOSTS · s · k steps with v = 1).
    In a sequential run the verifier replays after the train phase, while the hosts wait: it is
    timed alone. Returns {"host": one figure per host and round, "verifier": one per round}."""
    replay = HOSTS * cfg.sampled_segments * cfg.segment_len
    hosts = [("host", cfg.inner_steps)] * HOSTS
    if overlapped:
        return _timed(cfg, [*hosts, ("verifier", replay)], rounds)
    return {
        "host": _timed(cfg, hosts, rounds)["host"],
        "verifier": _timed(cfg, [("verifier", replay)], rounds)["verifier"],
    }


def _timed(cfg: Any, roles: list[tuple[str, int]], rounds: int) -> dict[str, list[float]]:
    """One spawned worker per (role, steps), all starting each round together."""
    import multiprocessing

    text = cfg.model_dump_json()
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(len(roles)), ctx.Queue()
    procs = [
        ctx.Process(target=_time_steps, args=(text, barrier, out, steps, rounds, role))
        for role, steps in roles
    ]
    for p in procs:
        p.start()
    samples: dict[str, list[float]] = {"host": [], "verifier": []}
    for _ in range(len(roles) * rounds):
        role, seconds = out.get(timeout=600)
        samples[role].append(seconds)
    for p in procs:
        p.join()
    return samples


def sized(args: argparse.Namespace, overlapped: bool) -> tuple[Any, dict[str, Any]]:
    """The devnet config with phases sized to the compute this mode's hosts actually see:

    - train = H × the median contended step time × the margin that covers the measured noise
      (`phase_sizing.noise_margin`: the slowest round, and median + 3σ) + the commit's slack
      blocks (`phase_sizing`);
    - reveal covers the host's recomputation of opened boundaries (none: every boundary is
      checkpointed) and its tx; verify the verifier's replays at its own contended step time and
      noise margin, plus fetching; result the outer step's computation and its tx;
    - overlapped: the post-training span D (reveal + verify + result + 2 blocks) must fit in the
      next train phase (D ≤ T + 1, §2.2.1), or hosts wait for steps to open; `fits` says whether."""
    from gonka_diloco.devnet_config import AdversarySpec, DevnetConfig, PhaseSeconds
    from gonka_diloco.phase_sizing import (
        COMMIT_SLACK_BLOCKS,
        noise_margin,
        overlapped_period_blocks,
        post_training_blocks,
        train_phase_seconds,
    )

    base = DevnetConfig(
        hosts=HOSTS, verifiers=VERIFIERS, adversaries=[AdversarySpec(behaviour=ADVERSARY)],
        inner_steps=args.inner_steps, segment_len=5, sampled_segments=2, block_interval=BLOCK_S,
        live=False, timeout=400.0, checkpoint_every=CHECKPOINT_EVERY, outer_lr=OUTER[args.overlap][0],
        outer_momentum=OUTER[args.overlap][1], early_close=args.early_close,
    )  # fmt: skip
    samples = contended_samples(base, overlapped)
    t = statistics.median(samples["host"])
    margin = noise_margin(samples["host"])
    if args.early_close:  # a window is only an upper bound (§2.3.1): room for load that comes later
        margin = max(margin, EARLY_CLOSE_MARGIN)
    k, s = base.segment_len, base.sampled_segments
    train = train_phase_seconds(args.inner_steps, t, margin=margin) + COMMIT_SLACK_BLOCKS * BLOCK_S
    # the verifier replays every opened segment (v = 1), at its own contended step time and noise
    tv, mv = statistics.median(samples["verifier"]), noise_margin(samples["verifier"])
    if args.early_close:
        mv = max(mv, EARLY_CLOSE_MARGIN)
    replay = HOSTS * s * k * tv * mv
    recompute = s * (CHECKPOINT_EVERY - 1) * k * t * margin  # opened boundaries rebuilt from checkpoints
    slack = EARLY_CLOSE_MARGIN if args.early_close else 1.0  # an upper bound costs nothing (§2.3.1)
    phases = PhaseSeconds(
        join=2.0, train=train, reveal=(recompute + REVEAL_S) * slack, verify=replay + FETCH_S + TX_S,
        escalation=2.0, result=RESULT_S * slack, audit=1.5, confirm=1.5,
    )  # fmt: skip
    cfg = base.model_copy(update={"phases": phases})
    blocks = {name: cfg.blocks(getattr(phases, name)) for name in ("train", "reveal", "verify", "result")}
    post = post_training_blocks(blocks["reveal"], blocks["verify"], blocks["result"])
    sizing = {
        "step_s_contended": t, "step_s_samples": [round(x, 4) for x in samples["host"]], "margin": margin,
        "verifier_step_s": tv, "verifier_margin": mv, "train_s": train, "reveal_s": phases.reveal,
        "verify_s": phases.verify, "result_s": phases.result, "train_blocks": blocks["train"],
        "post_train_blocks": post, "fits": post <= blocks["train"] + 1,
        "period_blocks_predicted": overlapped_period_blocks(blocks["train"], post) if overlapped
        else blocks["train"] + 1 + post,
    }  # fmt: skip
    return cfg, sizing


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


WHERE = ("to_start", "training", "commit", "idle_to_deadline", "after_deadline")
"""Where a host's wall time per outer step goes: from the step's opening block until it trains
(seeing the step open, loading G and the optimizer state), training, committing (trained → tx in
a block), idle until the commit deadline's block, and from then until the next step opens (one
block when overlapped and D ≤ T + 1; the whole verification when sequential). A step trained
before it opened (`next_start_state`) counts a negative `to_start`."""


def block_times(folder: Path) -> dict[int, float]:
    """Wall time of each block, from the chain's log."""
    return {e["height"]: e["ts"] for e in events(folder, "chain") if e["event"] == "block"}


def breakdown(ev: list[dict[str, Any]], snap: Any, bt: dict[int, float], train_blocks: int) -> dict[str, Any]:
    """One host's seconds per outer step by `WHERE`, over the steps it trained that have a next
    step, and its missed commit deadlines (a commit after the deadline's block, or a step sat out)."""
    starts = {s.index: s.train_start for s in snap.steps if s.train_start is not None}
    # the step's actual commit deadline (earlier than train_start + T when the window closed early)
    closes = {s.index: s.commit_deadline for s in snap.steps if s.commit_deadline is not None}
    trained = {e["outer_step"]: e for e in ev if e["event"] == "trained"}
    committed = {e["outer_step"]: e for e in ev if e["event"] == "committed"}
    sat_out = {e["outer_step"] for e in ev if e["event"] == "sitting_out"}
    totals = dict.fromkeys(WHERE, 0.0)
    counted, missed = 0, 0
    for n, t in sorted(trained.items()):
        deadline = bt.get(closes.get(n, starts.get(n, -1) + train_blocks))
        c = committed.get(n)
        if c is None:  # trained, but the commit did not make it into a block by the deadline
            missed += 1
            continue
        if deadline is None:
            continue
        if n + 1 not in starts or starts[n + 1] not in bt:
            continue
        opened, next_open = bt[starts[n]], bt[starts[n + 1]]
        start = t["ts"] - t["seconds"]
        totals["to_start"] += start - opened
        totals["training"] += t["seconds"]
        totals["commit"] += c["ts"] - t["ts"]
        totals["idle_to_deadline"] += max(0.0, deadline - c["ts"])
        totals["after_deadline"] += next_open - max(deadline, c["ts"])
        counted += 1
    per_step = {k: v / counted for k, v in totals.items()} if counted else {}
    return {"per_step_s": per_step, "steps": counted, "missed": missed + len(sat_out - set(trained))}


def measure(folder: Path, snap: Any) -> dict[str, Any]:
    """Utilization, where the time goes, the loss curve over wall time, missed deadlines and the
    adversary's outcomes, from one run."""
    honest = [n.name for n in snap.nodes if n.role == "host" and n.behaviour == "honest"]
    train_blocks = json.loads((folder / "run.json").read_text())["phases"]["train_blocks"]
    bt = block_times(folder)
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
                          "steps_trained": len(trained),
                          "trained_ahead": sum(bool(e.get("ahead")) for e in trained),
                          **breakdown(ev, snap, bt, train_blocks)}  # fmt: skip
        if name == honest[0]:
            start = first
            curve = [(e["ts"] - first, e["val_loss"]) for e in applied]
    adversary = [c.outcome for c in snap.contributions if c.host == f"host-{HOSTS - 1}"]  # the last host
    honest_rows = [c for c in snap.contributions if c.host in honest]
    losses = [v for _, v in curve]
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(curve)]
    post = [s.done_height - (s.commit_deadline or s.train_start + train_blocks) for s in snap.steps
            if s.done_height is not None and s.train_start is not None]  # fmt: skip
    where = {
        k: statistics.mean(h["per_step_s"][k] for h in per_host.values() if h["per_step_s"]) for k in WHERE
    }
    return {
        "period_s": sum(gaps) / len(gaps) if gaps else None,  # seconds between adopted results
        "hosts": per_host,
        "utilization_span": min(h["utilization_span"] for h in per_host.values()),
        "utilization_run": min(h["utilization_run"] for h in per_host.values()),
        "where_s": where,  # mean seconds per outer step of the honest hosts, by WHERE
        "post_train_blocks": post,  # D of each closed step
        "train_blocks": train_blocks,
        "missed_deadlines": sum(h["missed"] for h in per_host.values()),
        "missed_reveals": sum(c.outcome == "missing_reveal" for c in honest_rows),
        "honest_contributions": len(honest_rows),
        "honest_accepted": sum(c.outcome == "accepted" for c in honest_rows),
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
    """RESULTS.md lines (bench.report): one row per mode, where the hosts' time goes, then the two
    ratios and the goals."""
    st, modes = d["settings"], d.get("modes", ["none", "delayed"])  # older results: delayed (removed)
    sz = d.get("sizing", {})
    out = [
        f"Devnet: {st['hosts']} hosts (one `{st['adversary']}`), {st['verifiers']} verifier, H = "
        f"{st['inner_steps']}, blocks of {st['block_s']} s, outer lr {st['outer_lr']}, momentum "
        f"{st['outer_momentum']}, windows {'closing early' if st.get('early_close') else 'fixed'} "
        f"(specs §2.3.1); {st['cores']} cores shared by every node and by other work on the "
        f"machine (load average {d.get('loadavg_before', '?')} before, {d.get('loadavg_after', '?')} after). "
        f"`{d['command']}`.",
        "",
        "Phases sized per mode to the compute its hosts see (the hosts training at once, and in the "
        "overlapped mode the verifier replaying its share beside them; the margin covers the noise "
        "of those timings: the slowest round and median + 3σ):",
        "",
        "| overlap | contended step | margin | train phase | reveal / verify / result | D ≤ T + 1 |",
        "|---|---|---|---|---|---|",
    ]
    for mode in modes:
        z = sz.get(mode)
        if z:
            out.append(
                f"| {mode} | {z['step_s_contended']:.3f} s | {z['margin']:.2f} | {z['train_s']:.1f} s "
                f"({z['train_blocks']} blocks) | {z['reveal_s']:.1f} / {z['verify_s']:.1f} / "
                f"{z['result_s']:.1f} s "
                f"| {'yes' if z['fits'] else 'no'} (D = {z['post_train_blocks']}) |"
            )
    out += [
        "",
        "| overlap | outer steps | s / outer step | utilization (span) | utilization (run) "
        "| train-phase fill | missed deadlines | s to loss ≤ target | adversary | val loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        r = d[mode]
        curve = r["val_loss_curve"]
        t = d["time_to_target_s"][mode]
        adv = "rejected every step" if r["adversary_always_rejected"] else ", ".join(r["adversary_outcomes"])
        period = f"{r['period_s']:.1f}" if r.get("period_s") else "-"
        reveals = r.get("missed_reveals", sum("was missing_reveal" in f for f in r["failures"]))
        out.append(
            f"| {mode} | {len(curve)} | {period} | {r['utilization_span']:.0%} | {r['utilization_run']:.0%} "
            f"| {r.get('train_phase_fill', 0):.0%} | {r.get('missed_deadlines', '-')} commit, "
            f"{reveals} reveal "
            f"| {f'{t:.1f}' if t is not None else 'never'} | {adv} "
            f"| {curve[0]['val_loss']:.3f} → {curve[-1]['val_loss']:.3f} |"
        )
    if all("where_s" in d[m] for m in modes):
        out += [
            "",
            "Where an honest host's wall time goes, seconds per outer step (from the nodes' logs and "
            "the chain's block times): step open → training starts (seeing it, loading G and the "
            "optimizer; negative: trained before the step opened), training, commit (tx in a block), "
            "idle until the commit deadline, deadline → next step opens.",
            "",
            "| overlap | to start | training | commit | idle to deadline | deadline → next open |",
            "|---|---|---|---|---|---|",
        ]
        for mode in modes:
            w = d[mode]["where_s"]
            out.append(f"| {mode} | " + " | ".join(f"{w[k]:.2f}" for k in WHERE) + " |")
    sp, ps = d.get("speedup_to_same_loss"), d.get("step_period_speedup")
    goals = {k: "met" if v else "NOT met" for k, v in d["goals"].items()}
    same = f"{sp:.2f}×" if sp else "not reached"
    mode = modes[-1]
    util_goal = goals.get(f"utilization_{mode}_ge_0.8", "?")
    out += [
        "",
        f"Target loss {d['target_val_loss']:.3f} (the sequential run's last). Seconds per outer step: "
        f"{ps:.2f}× fewer with overlap; wall-clock to the same loss: {same} (goal ≥ 1.5×: "
        f"**{goals['speedup_ge_1.5']}**); utilization with overlap ≥ 80%: **{util_goal}**.",
        "",
    ]
    ahead = {h: r for h, r in d[mode]["hosts"].items() if "trained_ahead" in r}
    if ahead:
        out += [
            "Steps an honest host trained before they opened (the chain's `next_start_state` had fixed "
            "their start: specs §2.2.1): "
            + ", ".join(f"{h} {r['trained_ahead']} of {r['steps_trained']}" for h, r in ahead.items())
            + ". A step's start is fixed once the step two before it is done, so hosts train ahead "
            "when training takes longer than the post-training phases (D ≤ T).",
            "",
        ]
    busy = {m: d[m].get("cpu_busy") for m in modes}
    if busy["none"] is not None:
        out += [
            f"The machine's cores were busy {busy['none']:.0%} of the sequential run and "
            f"{busy[mode] or 0:.0%} of the overlapped one (`/proc/stat`, from the first training to "
            "the last G, other work on the machine included). Every node runs on these same cores, so "
            "here the overlapped schedule mostly trades idle time for contention: the verifier's "
            "replays and each host's tail run beside training instead of after it.",
            "",
        ]
    return out


def loadavg() -> str:
    """The 1, 5 and 15-minute load averages (the machine is shared: they say how loaded it was)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


class CpuSampler:
    """The machine's CPU time, sampled from /proc/stat every `every` s on a side thread.

    On this box every node of the devnet (chain, hosts, verifier) shares the same cores, so what an
    overlapped schedule gains is bounded by what the sequential one leaves idle, less the busy time
    that is not work (nodes polling the chain, waiting loops). `busy(t0, t1)` is the busy fraction
    of all cores over [t0, t1] (wall clock), other work on the machine included."""

    def __init__(self, every: float = 0.25) -> None:
        self.samples: list[tuple[float, int, int]] = []  # (time.time(), busy jiffies, all jiffies)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    @staticmethod
    def read() -> tuple[int, int] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def _run(self, every: float) -> None:
        while not self._stop.is_set():
            if (got := self.read()) is not None:
                self.samples.append((time.time(), *got))
            self._stop.wait(every)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def busy(self, t0: float, t1: float) -> float | None:
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2 or inside[-1][2] == inside[0][2]:
            return None
        return (inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2])


def overlapped_modes() -> list[str]:
    """The overlapped schedules this build of the protocol has (`--overlap` choices)."""
    from protocol.config import Overlap

    return [o.value for o in Overlap if o is not Overlap.NONE]


def main(quick: bool = False) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer, shorter steps")
    ap.add_argument("--steps", type=int, default=0, help="outer steps of the sequential run (3; quick 2)")
    ap.add_argument("--extra", type=int, default=2, help="more outer steps for the overlapped run")
    ap.add_argument("--inner-steps", type=int, default=0, help="H (80; quick 60)")
    ap.add_argument(
        "--overlap", choices=overlapped_modes(), default="eager", help="the overlapped schedule"
    )
    ap.add_argument("--keep", type=Path, default=None, help="keep the devnets' folders (logs) here")
    ap.add_argument("--name", default="overlap", help="results/<name>.json (a setting beside the default)")
    ap.add_argument("--early-close", action=argparse.BooleanOptionalAction, default=True,
                    help="both runs close a phase window once all it waits for is in (specs §2.3.1)")
    args, _ = ap.parse_known_args()  # under `python -m bench` its own flags are in argv too
    quick = quick or args.quick
    args.steps = args.steps or (2 if quick else 3)
    args.inner_steps = args.inner_steps or (60 if quick else 80)
    torch.set_num_threads(1)
    from gonka_diloco.devnet import run_devnet
    from protocol.config import Overlap

    before = loadavg()
    print(f"load average before: {before} (the machine is shared)", flush=True)
    modes = ["none", args.overlap]
    runs: dict[str, Any] = {}
    sizings: dict[str, dict[str, Any]] = {}
    cfgs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp_dir:
        tmp = args.keep or tmp_dir
        for mode, steps in ((modes[0], args.steps), (modes[1], args.steps + args.extra)):
            cfg, sizing = sized(args, overlapped=mode != "none")
            sizings[mode], cfgs[mode] = sizing, cfg
            print(
                f"{mode:>8} sizing: {json.dumps(sizing, default=str)}",
                flush=True,
            )
            folder = Path(tmp) / mode
            t0 = time.perf_counter()
            run_cfg = cfg.model_copy(update={"overlap": Overlap(mode), "outer_steps": steps})
            with CpuSampler() as cpu:
                snap = run_devnet(run_cfg, folder, echo=lambda s: None)
            runs[mode] = measure(folder, snap)
            r = runs[mode]
            span = (r["first_train_ts"], r["first_train_ts"] + r["val_loss_curve"][-1]["t_s"])
            r["cpu_busy"] = cpu.busy(*span)  # the machine's cores, from the first training to the last G
            adv = "rejected every step" if r["adversary_always_rejected"] else r["adversary_outcomes"]
            curve = r["val_loss_curve"]
            print(f"{mode:>8}: {steps} steps in {time.perf_counter() - t0:.0f} s; utilization span "
                  f"{r['utilization_span']:.0%}, run {r['utilization_run']:.0%}; missed deadlines "
                  f"{r['missed_deadlines']}; adversary {adv}; val loss {curve[0]['val_loss']:.3f} -> "
                  f"{curve[-1]['val_loss']:.3f}; D {r['post_train_blocks']} blocks "
                  f"(T = {r['train_blocks']})",
                  flush=True)  # fmt: skip
            print(
                "          where (s/step): " + ", ".join(f"{k} {v:.2f}" for k, v in r["where_s"].items()),
                flush=True,
            )
            for failure in r["failures"]:
                print(f"  FAILURE: {failure}", flush=True)
    after = loadavg()
    over = modes[1]
    target = runs["none"]["val_loss_curve"][-1]["val_loss"]
    t_none = time_to(runs["none"]["val_loss_curve"], target)
    t_over = time_to(runs[over]["val_loss_curve"], target)
    speedup = t_none / t_over if t_none and t_over else None
    p_none, p_over = runs["none"]["period_s"], runs[over]["period_s"]
    for mode in modes:  # how full hosts kept the train phase (the sizing's margin)
        hosts = runs[mode]["hosts"].values()
        train_s = cfgs[mode].phases.train
        runs[mode]["train_phase_fill"] = min(h["training_s"] / h["steps_trained"] / train_s for h in hosts)
    out = {
        "settings": {"hosts": HOSTS, "verifiers": VERIFIERS, "adversary": ADVERSARY, "block_s": BLOCK_S,
                     "outer_lr": OUTER[over][0], "outer_momentum": OUTER[over][1], "rounds": ROUNDS,
                     "early_close": args.early_close,
                     "inner_steps": args.inner_steps, "steps_none": args.steps,
                     f"steps_{over}": args.steps + args.extra, "cores": os.cpu_count()},
        "modes": modes,
        "sizing": sizings,
        **{mode: runs[mode] for mode in modes},
        "target_val_loss": target,
        "time_to_target_s": {"none": t_none, over: t_over},
        "speedup_to_same_loss": speedup,
        "step_period_speedup": p_none / p_over if p_none and p_over else None,
        "goals": {f"utilization_{over}_ge_0.8": runs[over]["utilization_span"] >= 0.8,
                  "speedup_ge_1.5": speedup is not None and speedup >= 1.5,
                  "no_missed_deadlines": all(runs[m]["missed_deadlines"] + runs[m]["missed_reveals"] == 0
                                             for m in modes)},
        "loadavg_before": before,
        "loadavg_after": after,
        "command": ".venv/bin/python -m bench.overlap" + (" --quick" if quick else "")
        + (f" --steps {args.steps}" if args.steps != (2 if quick else 3) else "")
        + (f" --extra {args.extra}" if args.extra != 2 else "")
        + (f" --inner-steps {args.inner_steps}" if args.inner_steps != (60 if quick else 80) else "")
        + (f" --name {args.name}" if args.name != "overlap" else "")
        + (f" --overlap {over}" if over != "eager" else "")
        + ("" if args.early_close else " --no-early-close"),
        "quick": quick,
    }  # fmt: skip
    print(f"\n{'':>10}{'util (span)':>13}{'util (run)':>12}{'t to loss':>11}{'missed':>8}")
    for mode in modes:
        t = out["time_to_target_s"][mode]
        print(f"{mode:>10}{runs[mode]['utilization_span']:>13.0%}{runs[mode]['utilization_run']:>12.0%}"
              f"{(f'{t:.1f} s' if t is not None else 'never'):>11}"
              f"{runs[mode]['missed_deadlines']:>8}")  # fmt: skip
    if out["step_period_speedup"]:
        print(f"seconds per outer step: none {p_none:.1f}, {over} {p_over:.1f} "
              f"({out['step_period_speedup']:.2f}x); hosts filled {runs[over]['train_phase_fill']:.0%} "
              f"of the {cfgs[over].phases.train:.1f} s train phase")  # fmt: skip
    if runs["none"].get("cpu_busy") is not None:
        print(f"cores busy: none {runs['none']['cpu_busy']:.0%}, {over} {runs[over]['cpu_busy'] or 0:.0%}")
    ahead = {h: (r["trained_ahead"], r["steps_trained"]) for h, r in runs[over]["hosts"].items()}
    print("steps trained before they opened (next_start_state): "
          + ", ".join(f"{h} {a} of {n}" for h, (a, n) in ahead.items()))  # fmt: skip
    print(f"same loss ({target:.3f}) reached {speedup:.2f}x faster with overlap" if speedup else
          f"the overlapped run did not reach the sequential run's final loss {target:.3f}")  # fmt: skip
    print(f"load average after: {after}")
    path = RESULTS.with_name(f"{args.name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
