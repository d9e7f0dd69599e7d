"""Under attack: 25% of hosts adversarial, robust aggregation vs replay verification.

M = 8 hosts, the last 2 (sorted order) adversarial; all 8 train honestly, then the adversaries
submit a bad Δ (noise, ×10, sign flip, "a little is enough") as CONSISTENT liars: their last
trajectory leaf claims θ_H = G − Δ_bad, so only replaying the last segment can tell.
Contenders per attack: (d) mean, (e) coordinate-wise median, (f) trimmed mean (f = 2),
(g) centered clipping, all over every decoded Δ; (h) ours: every contribution replay-verified
by `verifier.verify`, `outer_update` over the accepted ones. References: all 8 honest (no
attack) and the 6 honest hosts alone ("honest-only"; (h) should reproduce it bit for bit).

Run: `.venv/bin/python -m bench.attack [--quick]` → bench/results/attack.json.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.aggregators import AGGREGATORS, ATTACKS
from bench.sim import Setup, run_jobs, write_result

ADVERSARIES = 2
CONTENDERS = [*AGGREGATORS, "ours_verified"]
ROBUST = ("median", "trimmed_mean", "centered_clipping")


def setup_for(quick: bool) -> Setup:
    if quick:
        return Setup(hosts=8, inner_steps=10, outer_steps=4, eval_batches=8)
    return Setup(hosts=8, inner_steps=50, outer_steps=12)


def jobs_for(setup: Setup) -> list[dict[str, Any]]:
    s = setup.to_json()
    jobs: list[dict[str, Any]] = [
        {"label": "reference/all_honest", "kind": "diloco", "setup": s},
        {"label": "reference/honest_only", "kind": "diloco", "setup": s, "adversaries": ADVERSARIES,
         "exclude_adversaries": True},
    ]  # fmt: skip
    for attack in ATTACKS:
        for agg in AGGREGATORS:
            jobs.append({"label": f"{attack}/{agg}", "kind": "diloco", "setup": s, "aggregator": agg,
                         "attack": attack, "adversaries": ADVERSARIES})  # fmt: skip
        jobs.append({"label": f"{attack}/ours_verified", "kind": "diloco", "setup": s, "attack": attack,
                     "adversaries": ADVERSARIES, "verify": True})  # fmt: skip
    return jobs


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by = {r["label"]: r for r in runs}
    ref = by["reference/honest_only"].get("final_val_loss")
    ref_all = by["reference/all_honest"].get("final_val_loss")
    table: dict[str, dict[str, Any]] = {}
    goals: dict[str, Any] = {}
    for attack in ATTACKS:
        row: dict[str, Any] = {}
        for c in CONTENDERS:
            r = by[f"{attack}/{c}"]
            if "error" in r or ref is None:
                row[c] = {"error": r.get("error", "no reference")[-400:]}
                continue
            lf = r["final_val_loss"]
            row[c] = {"final_val_loss": lf, "vs_honest_only_pct": 100 * (lf / ref - 1)}
            if c == "ours_verified":
                row[c]["verdicts"] = r["verdicts"]
                row[c]["same_model_as_honest_only"] = (
                    r["final_global_hash"] == by["reference/honest_only"].get("final_global_hash")
                )
                row[c]["verify_time_fraction"] = r["verify_time_fraction"]
        table[attack] = row
        ours, mean = row["ours_verified"], row["mean"]
        if "final_val_loss" in ours and "final_val_loss" in mean:
            robust = [row[c].get("vs_honest_only_pct") for c in ROBUST]
            goals[attack] = {
                "ours_within_1pct": abs(ours["vs_honest_only_pct"]) <= 1.0,
                "mean_gap_pct": mean["vs_honest_only_pct"],
                "robust_gaps_pct": robust,
            }
    return {"honest_only": ref, "all_honest": ref_all, "table": table, "goals": goals}


def _cell(v: dict[str, Any]) -> str:
    if "final_val_loss" not in v:
        return "error"
    return f"{v['final_val_loss']:.4f} ({v['vs_honest_only_pct']:+.2f}%)"


def main(quick: bool = False) -> dict[str, Any]:
    setup = setup_for(quick)
    runs = run_jobs(jobs_for(setup))
    summary = summarize(runs)
    result = {"quick": quick, "setup": setup.to_json(), "adversaries": ADVERSARIES, **summary, "runs": runs}
    print(f"\nM={setup.hosts} ({ADVERSARIES} adversarial) H={setup.inner_steps} T={setup.outer_steps}; "
          f"honest-only {summary['honest_only']:.4f}, all 8 honest {summary['all_honest']:.4f}")  # fmt: skip
    print("| attack | " + " | ".join(CONTENDERS) + " |")
    print("|---|" + "---|" * len(CONTENDERS))
    for attack, row in summary["table"].items():
        cells = [_cell(row[c]) for c in CONTENDERS]
        print(f"| {attack} | " + " | ".join(cells) + " |")
    write_result("attack", result)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    main(quick=ap.parse_args().quick)
