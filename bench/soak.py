"""Soak (issue 22): the suite from fresh clones and the devnet in every overlap mode, under load.

    .venv/bin/python -m bench.soak [--suites 3] [--devnets 5] [--modes none,eager] [--burners 2]
                                   [--outer-steps N] [--timeout S] [--name soak]
    make soak ARGS="--suites 1 --devnets 2"

The defaults are the issue's goal: 3 fresh-clone suites and 5 devnets per mode, each beside 2 CPU
burners (processes spinning on a core) so that the machine is as loaded as a busy CI box. A suite
run is `git clone` of the committed HEAD into a temporary folder and `make test` there (it builds
its own .venv from pip's cache, as a new user's clone does). A devnet run is
`gonka-diloco devnet --overlap MODE --no-live` from this checkout. Prints passed/total per kind
and, for each failure, the cause read from its output (pytest's FAILED lines with their first
error line; the devnet's FAIL lines and the node log lines that say why); writes
bench/results/soak.json. Nothing is retried: a failure is a bug to find.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
NODE_ERRORS = ("outer_step_failed", "verify_error", "reveal_refused", "commit_refused", "Traceback")
"""Node log events (and Python's traceback header) that name why a devnet run went wrong."""
MAX_CAUSE_LINES = 8


@dataclass
class SoakRun:
    kind: str  # "suite" or "devnet:<mode>"
    ok: bool
    wall_s: float
    causes: list[str] = field(default_factory=list)
    pytest_s: float | None = None  # a suite's own "N passed in X s" (the wall also counts the venv)
    test_s: float | None = None  # a suite's `make test` after its install: ruff, mypy and pytest


def pytest_seconds(output: str) -> float | None:
    """The seconds in pytest's last summary line ("1173 passed in 486.93s (0:08:06)")."""
    found = re.findall(r"^=*\s*\d+ (?:passed|failed).* in ([0-9.]+)s", output, re.MULTILINE)
    return float(found[-1]) if found else None


def pytest_causes(output: str) -> list[str]:
    """Each `FAILED`/`ERROR` line of pytest's short summary, with the first `E ` line of the run
    (the assertion or exception that failed); a timeout or crash without a summary says so."""
    failed = [ln.strip() for ln in output.splitlines() if re.match(r"^(FAILED|ERROR) ", ln)]
    first_e = next((ln.strip() for ln in output.splitlines() if ln.startswith("E ")), None)
    if not failed:
        tail = [ln for ln in output.strip().splitlines() if ln.strip()][-1:] or ["no output"]
        return [f"no pytest summary: {tail[0].strip()}"]
    return failed[:MAX_CAUSE_LINES] + ([first_e] if first_e else [])


def devnet_causes(output: str, logs: dict[str, str]) -> list[str]:
    """The devnet's `FAIL …` lines, then each node log line that carries an error event, named by
    its log file (the first few of each)."""
    causes = [ln.strip() for ln in output.splitlines() if ln.strip().startswith(("FAIL", "error:"))]
    for name in sorted(logs):
        hits = [ln.strip() for ln in logs[name].splitlines() if any(e in ln for e in NODE_ERRORS)]
        causes += [f"{name}: {ln[:300]}" for ln in hits[:3]]
    return causes[:MAX_CAUSE_LINES] or ["exit status non-zero, no FAIL line and no node error logged"]


def burners(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def suite_run(timeout: float) -> SoakRun:
    """`make test` in a fresh clone: first `make venv cometbft` (the install: counted in the wall
    only), then `make test` itself, timed apart with pytest's own seconds, since the suite's goal
    (issue 36: under 12 min on 2 cores) is about those."""
    t0 = time.perf_counter()
    test_s: float | None = None
    with tempfile.TemporaryDirectory(prefix="soak-suite-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        try:
            setup = subprocess.run(["make", "venv", "cometbft"], cwd=clone, capture_output=True, text=True,
                                   timeout=timeout)  # fmt: skip
            out, ok = setup.stdout + setup.stderr, setup.returncode == 0
            if ok:
                t1 = time.perf_counter()
                p = subprocess.run(["make", "test"], cwd=clone, capture_output=True, text=True,
                                   timeout=timeout)  # fmt: skip
                test_s = time.perf_counter() - t1
                out, ok = p.stdout + p.stderr, p.returncode == 0
        except subprocess.TimeoutExpired as e:
            out, ok = f"{e.stdout or ''}\ntimed out after {timeout:.0f}s", False
    return SoakRun("suite", ok, time.perf_counter() - t0, [] if ok else pytest_causes(str(out)),
                   pytest_seconds(str(out)), test_s)  # fmt: skip


def devnet_run(mode: str, outer_steps: int | None, timeout: float) -> SoakRun:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="soak-devnet-") as tmp:
        cmd = [str(ROOT / ".venv" / "bin" / "gonka-diloco"), "devnet", "--overlap", mode, "--no-live",
               "--out-dir", tmp]  # fmt: skip
        if outer_steps is not None:
            cmd += ["--outer-steps", str(outer_steps)]
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            out, ok = p.stdout + p.stderr, p.returncode == 0
        except subprocess.TimeoutExpired as e:
            out, ok = f"{e.stdout or ''}\nFAIL timed out after {timeout:.0f}s", False
        logs = {} if ok else {str(f.relative_to(tmp)): f.read_text(errors="replace")
                              for f in Path(tmp).rglob("*.log")}  # fmt: skip
    causes = [] if ok else devnet_causes(str(out), logs)
    return SoakRun(f"devnet:{mode}", ok, time.perf_counter() - t0, causes)


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suites", type=int, default=3, help="fresh-clone `make test` runs (goal: 3 of 3)")
    ap.add_argument("--devnets", type=int, default=5, help="devnet runs per mode (goal: 5 of 5)")
    ap.add_argument("--modes", default="none,eager", help="overlap modes, comma-separated")
    ap.add_argument("--burners", type=int, default=2, help="CPU burner processes beside every run")
    ap.add_argument("--outer-steps", type=int, default=None, help="devnet outer steps (its default)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    ap.add_argument("--name", default="soak", help="results file: bench/results/NAME.json")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    runs: list[SoakRun] = []
    load = burners(args.burners)
    try:
        for i in range(args.suites):
            runs.append(suite_run(args.timeout))
            r = runs[-1]
            print(f"suite {i + 1}/{args.suites}: {'ok' if r.ok else 'FAILED'} {r.wall_s:.0f}s, pytest "
                  f"{r.pytest_s or float('nan'):.0f}s of `make test` {r.test_s or float('nan'):.0f}s",
                  flush=True)  # fmt: skip
        for mode in modes:
            for i in range(args.devnets):
                runs.append(devnet_run(mode, args.outer_steps, args.timeout))
                r = runs[-1]
                print(f"devnet {mode} {i + 1}/{args.devnets}: {'ok' if r.ok else 'FAILED'} {r.wall_s:.0f}s",
                      flush=True)  # fmt: skip
    finally:
        for b in load:
            b.kill()
    from rich.console import Console
    from rich.table import Table

    title = f"soak, {args.burners} burners"
    table = Table("kind", "passed", "wall s (each)", "causes of failures", title=title)
    summary: dict[str, dict[str, int]] = {}
    for kind in dict.fromkeys(r.kind for r in runs):
        rs = [r for r in runs if r.kind == kind]
        summary[kind] = {"passed": sum(r.ok for r in rs), "total": len(rs)}
        causes = "\n".join(c for r in rs for c in r.causes)
        walls = " ".join(f"{r.wall_s:.0f}" for r in rs)
        table.add_row(kind, f"{summary[kind]['passed']}/{len(rs)}", walls, causes)
    Console().print(table)
    out = {"settings": vars(args), "summary": summary, "runs": [asdict(r) for r in runs]}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
