"""How long the command line takes to answer bad input (issue 27: every config check was ~14 s).

Each command below is the real `gonka-diloco` executable in a fresh process, given a config that
the file alone shows to be wrong; the figure is the wall time until it exits with its one-line
error (median of `--repeats`). The point is the order of work, not the machine: a config must be
parsed and validated before torch, transformers or the node are imported.

    .venv/bin/python -m bench.cli_startup [--repeats 5] [--before PATH]

`--before PATH` runs the same commands against another checkout (PYTHONPATH=PATH), e.g. a clone of
the commit before a change, next to this one, alternating, so both see the same load. Writes
bench/results/cli_startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
BIN = Path(sys.executable).parent / "gonka-diloco"

BAD_RUN = 'inner_steps = 10\nsegment_len = 3\n[model]\nfactory = "trainer.model:small_gpt"\n'
BAD_NODE = (
    'chain_url = "http://127.0.0.1:9"\nrun_id = 1\ndata_dir = "d"\nlistne = "x"\n[key]\ntest_index = 1\n'
)
COMMANDS = {
    "run create --dry-run (bad run.toml)": ["run", "create", "{run}", "--dry-run"],
    "host run (bad host.toml)": ["host", "run", "-c", "{node}"],
    "verifier run (bad verifier.toml)": ["verifier", "run", "-c", "{node}"],
    "--help": ["--help"],
    "--version": ["--version"],
}


def once(argv: list[str], pythonpath: str | None, cwd: Path) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    done = subprocess.run([str(BIN), *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    return time.perf_counter() - t0, done.returncode


def main(repeats: int, before: str | None) -> dict[str, object]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "run.toml").write_text(BAD_RUN)
        (root / "node.toml").write_text(BAD_NODE)
        for name, template in COMMANDS.items():
            argv = [a.format(run=root / "run.toml", node=root / "node.toml") for a in template]
            now, then, codes = [], [], set()
            for _ in range(repeats):
                if before:
                    then.append(once(argv, before, root)[0])
                seconds, code = once(argv, None, root)
                now.append(seconds)
                codes.add(code)
            row = {"command": name, "seconds": statistics.median(now), "exit": sorted(codes)}
            if before:
                row["seconds_before"] = statistics.median(then)
            rows.append(row)
            was = f" (before {row['seconds_before']:.2f} s)" if before else ""
            print(f"{name}: {row['seconds']:.2f} s{was}", flush=True)
    label = None
    if before:
        git = ["git", "-C", before, "log", "-1", "--format=%h"]
        sha = subprocess.run(git, capture_output=True, text=True)
        label = f"commit {sha.stdout.strip() or '?'} (a clone on PYTHONPATH)"
    result = {"repeats": repeats, "before": label, "load_average": os.getloadavg()[0], "rows": rows}
    (RESULTS / "cli_startup.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--before", help="another checkout to time next to this one (PYTHONPATH)")
    args = ap.parse_args()
    main(args.repeats, args.before)
