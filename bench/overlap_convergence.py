"""Convergence cost of the overlapped schedule (issue 16): overlap "none" vs "eager" at equal compute.

On the convergence benchmark's settings (`bench.convergence`: the same model, data, hosts, H,
int8 Δs, every contribution replay-verified), the same `bench.sim.run_diloco` runs as `none`
(step n+1 starts from G_{n+1}) and as `eager` (`Overlap.EAGER`: step n+1 trains while step n is
verified and aggregated, from G_n moved by the host's own step n Δ; its accepted Δs then update
G_{n+1}), plus research variants of eager. All do the same M·H·T inner steps. Reported: the final
validation loss of each and the relative difference to `none` (goal ≤ 1%). The one-step-delayed
schedule without the stand-in ("delayed") was measured here (+92%, bench/RESULTS.md §1d) and
removed from the protocol (issue 22); it no longer runs.

Wall-clock to the same loss comes from a per-step time model whose inputs are printed: a step
trains `train_s` seconds and then spends `post_s` seconds in commit, challenge, reveal,
verification, finalization and the result vote. Without overlap the G after n steps exists after
n·(train + post); with the overlapped schedule one step trains while the previous is checked, so the
period is max(train, post) and the G after n steps exists after (n − 1)·max(train, post) + train +
post. The research contenders `eager_c<c>` need step n − 1's result after c of step n's training, so
their period is max(train, post + (1 − c)·train). The steps each schedule needs come from its own
loss curve (linear between outer steps).

Run: `.venv/bin/python -m bench.overlap_convergence [--quick] [--train-s 1.6 --post-s 17.9]`
→ bench/results/overlap_convergence.json; `--only eager_a1,...` runs just those contenders
and merges them into the existing results of the same setting.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from bench.convergence import setting_tag
from bench.sim import RESULTS_DIR, Setup, run_jobs, write_result

DEVNET_TRAIN_S = 1.6
"""Seconds a devnet host trains per outer step (issue 16's measurement in `make devnet`)."""
DEVNET_STEP_S = 19.5
"""Seconds of one whole devnet outer step without overlap (the same measurement)."""


def setup_for(quick: bool) -> Setup:
    """The convergence benchmark's first setting (its quick one with --quick)."""
    if quick:
        return Setup(hosts=4, inner_steps=10, outer_steps=6, eval_batches=8)
    return Setup(hosts=8, inner_steps=50, outer_steps=24)


Contender = tuple[str, int, float, float, bool, bool]


def contenders(quick: bool) -> list[Contender]:
    """(name, outer delay, outer lr, outer momentum, verified, carry optimizer).

    An outer delay of 1 is the eager schedule (specs §2.2.1) or one of its research variants; 0 is
    `none`. The extra runs are unverified: honest contributions replay bitwise and are all accepted
    (the verified runs show it), so verification changes no loss and only lengthens the benchmark."""
    rows: list[Contender] = [("none", 0, 0.7, 0.9, True, False), ("eager", 1, 0.7, 0.9, True, True)]
    if quick:
        return rows
    return [*rows, *(r for r in REMEDIES if r[0] in FULL_REMEDIES)]


REMEDIES: list[Contender] = [
    ("eager_a1", 1, 0.7, 0.9, True, True),  # α = 1: the host's deviation grows ×lr·(1+μ) per step
    ("eager_a1_mu0.8", 1, 0.7, 0.8, False, True),
    ("eager_a0.5", 1, 0.7, 0.9, False, True),
    ("eager_a0.65", 1, 0.7, 0.9, False, True),
    ("eager_a0.75", 1, 0.7, 0.9, False, True),
    ("eager_a0.85", 1, 0.7, 0.9, False, True),
    ("eager_lr0.5", 1, 0.5, 0.9, False, True),  # lr·(1+μ) < 1: α = 1 and the deviation is damped
    ("eager_mu0.8", 1, 0.7, 0.8, False, True),  # α = 0.794
    # research: the stand-in rebased on the base, G_{n−1} − θ_H (needs the host's previous start)
    ("eager_rebase", 1, 0.7, 0.9, False, True),
    ("eager_rebase_a1", 1, 0.7, 0.9, False, True),
    # research: the last known mean Δ as a stand-in shared by every host (no own Δ in any start)
    ("eager_inmean", 1, 0.7, 0.9, False, True),
    # research: Δ measured from G (the endpoint), i.e. the host's Δ plus G_latest − its start
    ("eager_end", 1, 0.7, 0.9, False, True),
    # research: the step n − 1 result applied mid-step — at inner step c·H the host moves by
    # G_{n−1} − its eager start and trains on (so the post-training phases must end within c·H)
    *((f"eager_c{c}", 1, 0.7, 0.9, False, True) for c in ("0.1", "0.25", "0.5", "0.75", "0.9", "0.96")),
    # (the removed delayed schedule's remedies, delayed_mu* / delayed_lr*: bench/RESULTS.md §1d)
]
"""Every variant `--only` may name; the full run's default list is `FULL_REMEDIES`."""
FULL_REMEDIES = ("eager_a1",)


def research_options(name: str) -> dict[str, Any]:
    """`bench.sim.run_diloco` options of the research contenders, from their names."""
    out: dict[str, Any] = {}
    if m := re.search(r"_in([a-z]+)", name):
        out["stand_in"] = m[1]
    if name.startswith("eager_end"):
        out["endpoint"] = True
    if m := re.search(r"_c([0-9.]+)$", name):
        out["correct_at"] = float(m[1])
    return out


def or_never(x: float | None, fmt: str) -> str:
    """A time-model figure, or "never" for a contender that does not reach the target loss."""
    return "never" if x is None else format(x, fmt)


def steps_to_reach(curve: list[dict[str, Any]], target: float) -> float | None:
    """Fractional outer steps until the validation loss first reaches `target` (linear between
    evaluated steps); None if it never does."""
    prev = None
    for point in curve:
        step, loss = point["outer_step"], point["val_loss"]
        if loss <= target:
            if prev is None or prev[1] == loss:
                return float(step)
            s0, l0 = prev
            return s0 + (l0 - target) / (l0 - loss) * (step - s0)
        prev = (step, loss)
    return None


def period(train_s: float, post_s: float, c: float) -> float:
    """Seconds per outer step when step n − 1's result is needed after c of step n's training
    (c = 1: the overlapped schedules; c = 0: sequential): the host waits for what is left of it."""
    return max(train_s, post_s + (1.0 - c) * train_s)


def wall_seconds(steps: float, train_s: float, post_s: float, overlapped: bool, c: float = 1.0) -> float:
    """When the global model after `steps` outer steps exists, by the per-step time model above."""
    if steps <= 0:
        return 0.0
    if not overlapped:
        return steps * (train_s + post_s)
    return (steps - 1) * period(train_s, post_s, c) + train_s + post_s


def time_model(
    curves: dict[str, list[dict[str, Any]]],
    finals: dict[str, float],
    name: str,
    train_s: float,
    post_s: float,
) -> dict[str, Any]:
    """Wall time for `none` and for the overlapped contender `name` to reach the loss both reach
    (the `*_delayed` keys name the overlapped side: the results files' historical schema)."""
    target = max(finals["none"], finals[name])
    s_none, s_del = steps_to_reach(curves["none"], target), steps_to_reach(curves[name], target)
    assert s_none is not None and s_del is not None  # both end at or below the larger final loss
    t_none = wall_seconds(s_none, train_s, post_s, overlapped=False)
    c = research_options(name).get("correct_at", 1.0)  # the mid-step dial's wait (1: none)
    t_del = wall_seconds(s_del, train_s, post_s, overlapped=True, c=c)
    return {
        "train_s": train_s, "post_s": post_s, "target_loss": target,
        "steps_none": s_none, "steps_delayed": s_del, "wall_none_s": t_none, "wall_delayed_s": t_del,
        "speedup": t_none / t_del if t_del else None,
        "utilization_none": train_s / (train_s + post_s),
        "utilization_delayed": train_s / period(train_s, post_s, c),
    }  # fmt: skip


def scenarios(train_s: float, post_s: float) -> list[tuple[str, float, float]]:
    """The time model's inputs: as given (default: the devnet as issue 16 measured it), and the
    same post-training phases with the train phase sized to cover them (phases sized to compute)."""
    return [
        ("given", train_s, post_s),
        ("train phase = post-training phases", post_s, post_s),
    ]


def main(
    quick: bool = False,
    train_s: float = DEVNET_TRAIN_S,
    post_s: float = DEVNET_STEP_S - DEVNET_TRAIN_S,
    only: list[str] | None = None,
) -> dict[str, Any]:
    """Run every contender, or with `only` just those named, merged into the existing results of
    the same setting (so a remedy can be added without rerunning the rest)."""
    setup = setup_for(quick)
    tag = setting_tag(setup)
    table = {c[0]: c for c in [*contenders(quick), *REMEDIES]}
    chosen = [table[n] for n in only] if only else contenders(quick)
    jobs = []
    for name, delay, olr, mu, verify, _carry in chosen:
        s = {**setup.to_json(), "outer_lr": olr, "outer_momentum": mu}
        jobs.append({"label": f"{tag}/{name}", "kind": "diloco", "setup": s, "verify": verify,
                     "eager": bool(delay), "eager_rebase": name.startswith("eager_rebase"),
                     "eager_scale": float(m[1]) if (m := re.search(r"_a([0-9.]+)(?:_|$)", name)) else None,
                     **research_options(name)})  # fmt: skip
    fresh = {c[0]: r for c, r in zip(chosen, run_jobs(jobs, per_child=1), strict=True)}
    named = {}
    if only:  # read after the runs: another invocation may have written its results meanwhile
        path = RESULTS_DIR / ("overlap_convergence.json" if quick else "overlap_convergence.full.json")
        old = json.loads(path.read_text()) if path.exists() else {}
        if old.get("setup") == setup.to_json():
            named = {r["label"].split("/", 1)[1]: r for r in old.get("runs", [])}
    named.update(fresh)
    order = [c for c in table.values() if c[0] in named]
    return summarize(setup, quick, [(c, named[c[0]]) for c in order], train_s, post_s)


def merge(paths: list[str], quick: bool, train_s: float, post_s: float) -> dict[str, Any]:
    """The current results with the runs of other results files of the same setting added (an
    `--only` run that finished while another invocation was still writing)."""
    setup = setup_for(quick)
    table = {c[0]: c for c in [*contenders(quick), *REMEDIES]}
    current = RESULTS_DIR / ("overlap_convergence.json" if quick else "overlap_convergence.full.json")
    named: dict[str, dict[str, Any]] = {}
    for path in [str(current), *paths]:
        d = json.loads(Path(path).read_text())
        if d.get("setup") != setup.to_json():
            raise SystemExit(f"{path}: another setting ({d.get('setup')}), not merged")
        named.update({r["label"].split("/", 1)[1]: r for r in d.get("runs", [])})
    order = [c for c in table.values() if c[0] in named]
    return summarize(setup, quick, [(c, named[c[0]]) for c in order], train_s, post_s)


def summarize(
    setup: Setup, quick: bool, done: list[tuple[Contender, dict[str, Any]]], train_s: float, post_s: float
) -> dict[str, Any]:
    """Rows, the loss gap to `none`, the time model; written to overlap_convergence(.full).json."""
    runs = [r for _, r in done]
    rows, curves, finals = [], {}, {}
    for (name, delay, olr, mu, verify, carry), r in done:
        row: dict[str, Any] = {"contender": name, "outer_delay": delay, "outer_lr": olr, "outer_momentum": mu,
                               "verified": verify, "carry_optimizer": carry}  # fmt: skip
        if "error" in r:
            rows.append({**row, "error": r["error"][-600:]})
            continue
        curves[name], finals[name] = r["curve"], r["final_val_loss"]
        rows.append({**row, "final_val_loss": r["final_val_loss"], "verdicts": r.get("verdicts"),
                     "wall_s": r.get("wall_s")})  # fmt: skip
    result: dict[str, Any] = {"quick": quick, "setup": setup.to_json(), "rows": rows, "runs": runs,
                              "time_model_inputs": {"train_s": train_s, "post_s": post_s,
                                                    "devnet_train_s": DEVNET_TRAIN_S,
                                                    "devnet_step_s": DEVNET_STEP_S}}  # fmt: skip
    if "none" in finals:
        for row in rows:
            if "final_val_loss" in row:
                row["loss_vs_none_pct"] = 100 * (row["final_val_loss"] / finals["none"] - 1)
                row["within_1pct"] = (
                    abs(row["loss_vs_none_pct"]) <= 1.0 or row["final_val_loss"] < finals["none"]
                )
        overlapped = [n for n in finals if n != "none"]
        result["time_model"] = [
            {"contender": n, "scenario": label, **time_model(curves, finals, n, tr, po)}
            for n in overlapped
            for label, tr, po in scenarios(train_s, post_s)
        ]
        # the removed delayed schedule (historical results only; the keys below are report.py's)
        plain = next((r for r in rows if r["contender"] == "delayed" and "final_val_loss" in r), None)
        passing = [r["contender"] for r in rows if r["contender"] != "none" and r.get("within_1pct")]
        at = {r["contender"]: research_options(r["contender"]).get("correct_at") for r in rows}
        dial = sorted((at[r["contender"]], r["loss_vs_none_pct"]) for r in rows
                      if at[r["contender"]] is not None and "loss_vs_none_pct" in r)  # fmt: skip
        result["goal"] = {
            "plain_delayed_within_1pct": bool(plain and plain["within_1pct"]),
            "delayed_variants_within_1pct": passing,
            "mid_step_result_dial": dial,  # (c, loss vs none %): research, not a protocol schedule
        }
    write_result("overlap_convergence", result)
    print_result(result)
    return result


def print_result(result: dict[str, Any]) -> None:
    st = result["setup"]
    print(f"\nM={st['hosts']} H={st['inner_steps']} T={st['outer_steps']}, same inner-step compute per host")
    print("| contender | delay | outer lr/μ | final val loss | vs none |\n|---|---|---|---|---|")
    for r in result["rows"]:
        if "error" in r:
            print(f"| {r['contender']} | {r['outer_delay']} | | error: {r['error'][:80]} | |")
            continue
        vs = f"{r['loss_vs_none_pct']:+.2f}%" if "loss_vs_none_pct" in r else ""
        print(f"| {r['contender']} | {r['outer_delay']} | {r['outer_lr']:g}/{r['outer_momentum']:g} "
              f"| {r['final_val_loss']:.4f} | {vs} |")  # fmt: skip
    ti = result["time_model_inputs"]
    print(f"time model inputs: train_s={ti['train_s']:g} post_s={ti['post_s']:g} (devnet per issue 16: "
          f"{ti['devnet_train_s']:g} s training of a {ti['devnet_step_s']:g} s step)")  # fmt: skip
    print("| contender | scenario | train s | post s | target loss | steps none / overlapped "
          "| wall none / overlapped | speedup |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for t in result.get("time_model", []):
        num = or_never
        print(f"| {t['contender']} | {t['scenario']} | {t['train_s']:g} | {t['post_s']:g} "
              f"| {t['target_loss']:.4f} | {num(t['steps_none'], '.2f')} / {num(t['steps_delayed'], '.2f')} "
              f"| {num(t['wall_none_s'], '.0f')} s / {num(t['wall_delayed_s'], '.0f')} s "
              f"| {num(t['speedup'], '.2f')}× |")  # fmt: skip


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--train-s", type=float, default=DEVNET_TRAIN_S, help="time model: training s per step")
    ap.add_argument("--post-s", type=float, default=DEVNET_STEP_S - DEVNET_TRAIN_S,
                    help="time model: commit..result s per step (after training)")  # fmt: skip
    ap.add_argument("--only", default="", help="comma-separated contenders, merged into the existing results")
    ap.add_argument("--merge", action="append", default=[], help="add the runs of this results file")
    args = ap.parse_args()
    only = [n for n in args.only.split(",") if n] or None
    if args.merge:
        merge(args.merge, args.quick, args.train_s, args.post_s)
    else:
        main(quick=args.quick, train_s=args.train_s, post_s=args.post_s, only=only)
