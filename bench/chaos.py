"""Chaos devnets over several seeds (issue 22): how often a run of random SIGKILLs and restarts
still ends on one model with every store intact.

    .venv/bin/python -m bench.chaos [--runs 5] [--seed 0] [--kills 4] [--gap 1 5] [--down 0.2 3] [--keep DIR]

Seeds `seed`, `seed + 1`, … each drive one `gonka_diloco.devnet_chaos.chaos_run` (the test's
driver and checks, nothing else). Prints passed/total and each failure's seed, kills and cause,
and writes bench/results/chaos.json (`--name NAME`: NAME.json, e.g. chaos_hard for a harsher
plan). `--seed N --runs 1` reruns one failing plan; `--keep DIR`
keeps every run's folder (node logs) there, else only failed runs' folders are kept, in a
temporary directory whose path is printed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from gonka_diloco.devnet_chaos import chaos_run

RESULTS = Path(__file__).parent / "results"


def log(line: str) -> None:
    """The kills as they happen (the devnet's own start-up lines are left out)."""
    if line.startswith("chaos:"):
        print(f"  {line}", flush=True)


def main(
    runs: int = 5,
    seed: int = 0,
    kills: int = 4,
    keep: Path | None = None,
    gap_s: tuple[float, float] = (1.0, 5.0),
    down_s: tuple[float, float] = (0.2, 3.0),
    name: str = "chaos",
) -> dict[str, Any]:
    base = keep or Path(tempfile.mkdtemp(prefix="chaos-"))
    rows = []
    for s in range(seed, seed + runs):
        folder = base / f"seed-{s}"
        r = chaos_run(s, folder, kills=kills, gap_s=gap_s, down_s=down_s, log=log)
        rows.append(r.to_json())
        print(f"seed {s}: {'ok' if r.ok else 'FAILED'} in {r.wall_s:.0f}s, {len(r.kills)} kills", flush=True)
        if not r.ok:
            print(r.summary(), flush=True)
        elif keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    passed = sum(row["ok"] for row in rows)
    out = {
        "passed": passed,
        "total": len(rows),
        "seeds": [seed, seed + runs - 1],
        "kills_per_run": kills,
        "gap_s": list(gap_s),
        "down_s": list(down_s),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"chaos: {passed}/{len(rows)} passed; results in {RESULTS / f'{name}.json'}; runs under {base}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="first seed")
    ap.add_argument("--kills", type=int, default=4, help="kills per run (fewer if the run ends first)")
    ap.add_argument("--gap", type=float, nargs=2, default=(1.0, 5.0), help="seconds before each kill")
    ap.add_argument("--down", type=float, nargs=2, default=(0.2, 3.0), help="seconds each victim is down")
    ap.add_argument("--name", default="chaos", help="results file bench/results/NAME.json")
    ap.add_argument("--keep", type=Path, default=None, help="keep every run's folder here")
    a = ap.parse_args()
    out = main(a.runs, a.seed, a.kills, a.keep, tuple(a.gap), tuple(a.down), a.name)
    raise SystemExit(0 if out["passed"] == a.runs else 1)
