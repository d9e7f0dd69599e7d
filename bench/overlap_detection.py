"""Detection and false rejection with the overlapped schedule on (issue 16): unchanged?

The attack benchmark's setting (`bench.attack`: 8 hosts, the last 2 consistent liars submitting a
bad Δ — noise, ×10, sign flip, "a little is enough" — whose last leaf claims θ_H = start − Δ_bad)
runs with every contribution replay-verified by `verifier.verify`, once sequentially and once with
`overlap = "eager"` (two steps in flight; each host's start is built on its own previous Δ,
specs §2.2.1, and verified against that start). Per schedule: the share of the liars'
contributions rejected (detection), the honest contributions not accepted (false rejection), and
the children the parent rule dropped.

    .venv/bin/python -m bench.overlap_detection [--quick]

Writes bench/results/overlap_detection.json.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.aggregators import ATTACKS
from bench.sim import Setup, run_jobs, write_result

ADVERSARIES = 2
SCHEDULES = {"none": {}, "eager": {"eager": True}}


def setup_for(quick: bool) -> Setup:
    if quick:
        return Setup(hosts=8, inner_steps=10, outer_steps=3, eval_batches=4)
    return Setup(hosts=8, inner_steps=20, outer_steps=6, eval_batches=8)


def rates(verdicts: dict[str, int]) -> dict[str, Any]:
    """Detection and false rejection from the simulator's `role:REASON` verdict counts."""
    adv = {k.split(":", 1)[1]: v for k, v in verdicts.items() if k.startswith("adversary:")}
    honest = {k.split(":", 1)[1]: v for k, v in verdicts.items() if k.startswith("honest:")}
    n_adv, n_honest = sum(adv.values()), sum(honest.values())
    return {
        "adversary_contributions": n_adv,
        "adversary_rejected": n_adv - adv.get("ACCEPT", 0),
        "detection": (n_adv - adv.get("ACCEPT", 0)) / n_adv if n_adv else None,
        "honest_contributions": n_honest,
        "honest_not_accepted": n_honest - honest.get("ACCEPT", 0),
        "false_rejection": (n_honest - honest.get("ACCEPT", 0)) / n_honest if n_honest else None,
        "parent_not_accepted": adv.get("PARENT_NOT_ACCEPTED", 0) + honest.get("PARENT_NOT_ACCEPTED", 0),
        "by_reason": {"adversary": adv, "honest": honest},
    }


def main(quick: bool = False) -> dict[str, Any]:
    setup = setup_for(quick)
    jobs = [
        {"label": f"{attack}/{name}", "kind": "diloco", "setup": setup.to_json(), "attack": attack,
         "adversaries": ADVERSARIES, "verify": True, **extra}
        for attack in ATTACKS
        for name, extra in SCHEDULES.items()
    ]  # fmt: skip
    runs = run_jobs(jobs, per_child=1)
    rows = []
    for job, r in zip(jobs, runs, strict=True):
        attack, schedule = job["label"].split("/")
        if "error" in r:
            rows.append({"attack": attack, "schedule": schedule, "error": r["error"][-400:]})
            continue
        rows.append({"attack": attack, "schedule": schedule, **rates(r["verdicts"]),
                     "final_val_loss": r["final_val_loss"]})  # fmt: skip
    ok = [r for r in rows if "error" not in r]
    same = all(
        r["detection"] == 1.0 and r["false_rejection"] == 0.0 for r in ok
    ) and len(ok) == len(rows)
    command = ".venv/bin/python -m bench.overlap_detection" + (" --quick" if quick else "")
    result = {"quick": quick, "setup": setup.to_json(), "adversaries": ADVERSARIES, "rows": rows,
              "unchanged": same, "runs": runs, "command": command}  # fmt: skip
    write_result("overlap_detection", result)
    print(f"\nM={setup.hosts} H={setup.inner_steps} T={setup.outer_steps}, {ADVERSARIES} consistent liars")
    print("| attack | schedule | detection | false rejection | parent rule drops |\n|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['attack']} | {r['schedule']} | error: {r['error'][:60]} | | |")
            continue
        liars = f"{r['adversary_rejected']}/{r['adversary_contributions']}"
        honest = f"{r['honest_not_accepted']}/{r['honest_contributions']}"
        print(f"| {r['attack']} | {r['schedule']} | {liars} | {honest} | {r['parent_not_accepted']} |")
    print(f"detection 100% and no false rejection in both schedules: {same}")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    main(ap.parse_args().quick)
