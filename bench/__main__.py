"""Run every benchmark: `.venv/bin/python -m bench [--quick] [--only a,b]`. Add your module to BENCHES.

A module that is missing or fails is reported and the others still run; `bench.report` then
rebuilds bench/RESULTS.md from whatever results exist. Exit status 1 if any module failed.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time
import traceback

# Order matters: bench.communication reads bench.convergence's results.
BENCHES = [
    "bench.hashing",
    "bench.codecs",
    "bench.statecode",  # issue 35: opened training states coded against G_n (before bench.plan reads it)
    "bench.aggregation",  # issue 26: plan's aggregation vs training at large M (reads codecs.json)
    "bench.host_overhead",
    "bench.convergence",
    "bench.overlap_convergence",  # issue 16: overlap none vs eager on the convergence setting
    "bench.communication",
    "bench.attack",
    "bench.overlap_detection",  # issue 16: detection and false rejection, sequential vs eager
    "bench.detection",
    "bench.collusion",
    "bench.chain_tps",
    "bench.chain_sim",
    "bench.scale",
    "bench.chain_bft",
    "bench.overlap",  # devnets with and without the overlapped schedule (~5 min)
    "bench.devnet_codec",  # issue 26: a devnet per Δ codec (int8, sparse), adversary rejected (~4 min)
    "bench.gpu_check",  # the full check on a GPU machine; tiny sizes on CPU (results/gpu_check_cpu.json)
    "bench.plan",  # last: it reads detection.json (and scale.json) and the constants the others wrote
]


def run_one(name: str, quick: bool) -> str:
    """'ok', 'missing: …' or 'failed: …'. Modules without a `quick` parameter run their defaults."""
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        return f"missing: {e}"
    main = module.main
    argv = sys.argv
    try:
        if "quick" in inspect.signature(main).parameters:
            main(quick=quick)
        else:
            sys.argv = [name]  # its own argparse must not see our flags
            main()
    except Exception as e:  # reported below; the other benchmarks still run
        traceback.print_exc()
        return f"failed: {type(e).__name__}: {e}"
    except SystemExit as e:
        if e.code not in (0, None):
            return f"failed: exit {e.code}"
    finally:
        sys.argv = argv
    return "ok"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller inputs, for a smoke run")
    ap.add_argument("--only", default="", help="comma-separated module names, e.g. convergence,attack")
    args = ap.parse_args()
    only = {f"bench.{n.strip().removeprefix('bench.')}" for n in args.only.split(",") if n.strip()}
    status = {}
    for name in BENCHES:
        if only and name not in only:
            continue
        print(f"\n## {name}", flush=True)
        t0 = time.perf_counter()
        status[name] = run_one(name, args.quick)
        print(f"## {name}: {status[name]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    from bench.report import main as report

    report(quick=args.quick)
    print("\n| benchmark | status |\n|---|---|")
    for name, s in status.items():
        print(f"| {name} | {s} |")
    if any(s.startswith("failed") for s in status.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
