"""The devnet with each Δ codec (issue 26): an adversary rejected and the loss falling, per codec.

    .venv/bin/python -m bench.devnet_codec [--quick] [--cases int8:noise,sparse:ef_forge]
                                           [--outer-steps N] [--timeout S] [--keep DIR] [--name NAME]

Runs `gonka-diloco devnet --codec CODEC --adversary ADVERSARY --no-live` once per case, one after the
other (every node of a devnet shares this machine's cores, so two side by side would time each
other). The defaults are the two cases issue 26 asks for: int8 with the devnet's default adversary
(noise: a host that sends noise for its Δ) and sparse top-k with error feedback against `ef_forge`
(a host whose sparse payload and carried accumulator are not C(β·e + Δ), which a verifier replaying
the step must reject DELTA_MISMATCH). From each run's snapshot.json (the machine-readable state the
report.md is rendered from) it records the accepted/rejected counts, the adversary's outcome and
every verifier's reason for it per outer step, the validation loss per step, the Δ payload bytes per
host per step and the wall time; writes bench/results/devnet_codec.json. `--quick` runs 3 outer
steps instead of the devnet's 6. About 2 minutes per devnet on 2 loaded cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DEFAULT_CASES = "int8:noise,sparse:ef_forge"
QUICK_OUTER_STEPS = 3


def loadavg() -> str:
    """The 1, 5 and 15-minute load averages: wall times on a shared machine follow its load."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def parse_cases(text: str) -> list[tuple[str, str, str]]:
    """`CODEC:ADVERSARY[@TOML],…` as (codec, adversary, devnet TOML or "") triples; the adversary keeps
    any `:COUNT:k=v` tail. A TOML (DevnetConfig fields, e.g. `bench/devnet_sparse_issue26.toml`: the
    sparse outer step before issue 37) sets what the flags do not."""
    cases = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            part, _, toml = part.partition("@")
            codec, _, adversary = part.partition(":")
            cases.append((codec, adversary or "noise", toml))
    return cases


def devnet_command(
    codec: str, adversary: str, out_dir: str, outer_steps: int | None, toml: str = ""
) -> list[str]:
    cmd = [
        str(ROOT / ".venv" / "bin" / "gonka-diloco"),
        "devnet",
        "--codec",
        codec,
        "--adversary",
        adversary,
        "--no-live",
        "--out-dir",
        out_dir,
    ]
    cmd += ["--config", toml] if toml else []
    return cmd + (["--outer-steps", str(outer_steps)] if outer_steps is not None else [])


def summarize(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What the issue asks to see of one devnet, from its snapshot.json: no markdown is parsed."""
    hosts = [n for n in snapshot["nodes"] if n["role"] == "host"]
    adversaries = sorted(n["name"] for n in hosts if n["behaviour"] != "honest")
    contribs = snapshot["contributions"]
    honest = [c for c in contribs if c["host"] not in adversaries]
    adv = [c for c in contribs if c["host"] in adversaries]
    losses = [
        s["val_loss"]
        for s in sorted(snapshot["steps"], key=lambda s: s["index"])
        if s.get("val_loss") is not None
    ]
    bytes_honest = [c["delta_bytes"] for c in honest if c.get("delta_bytes")]
    return {
        "codec": snapshot["config"]["codec"],
        "codec_topk": snapshot["config"].get("codec_topk"),
        "codec_ef_decay": snapshot["config"].get("codec_ef_decay"),  # omitted at the default
        "outer": snapshot["config"].get("outer"),
        "codec_block_size": snapshot["config"].get("codec_block_size"),
        "adversaries": {n["name"]: n["behaviour"] for n in hosts if n["behaviour"] != "honest"},
        "outer_steps_done": sum(s["phase"] == "DONE" for s in snapshot["steps"]),
        "accepted": sum(c["outcome"] == "accepted" for c in contribs),
        "rejected": sum(c["outcome"] == "rejected" for c in contribs),
        "honest_accepted": sum(c["outcome"] == "accepted" for c in honest),
        "honest_total": len(honest),
        "adversary_rejected": sum(c["outcome"] == "rejected" for c in adv),
        "adversary_total": len(adv),
        "adversary_outcomes": [
            {
                "host": c["host"],
                "outer_step": c["outer_step"],
                "outcome": c["outcome"],
                "reasons": c["reasons"],
                "delta_bytes": c.get("delta_bytes"),
            }
            for c in sorted(adv, key=lambda c: (c["outer_step"], c["host"]))
        ],
        "val_loss": losses,
        "delta_bytes_per_host_step": {
            "median": median(bytes_honest) if bytes_honest else None,
            "min": min(bytes_honest, default=None),
            "max": max(bytes_honest, default=None),
        },
        "sit_outs": len(snapshot.get("sit_outs", [])),  # a host that missed a window: load shows here
        "run_wall_s": snapshot.get("wall_s"),
        "failures": snapshot.get("failures", []),
    }


def run_case(
    codec: str, adversary: str, outer_steps: int | None, timeout: float, keep: Path | None, toml: str = ""
) -> dict[str, Any]:
    """One devnet; PASS is the devnet's own verdict (exit status 0: it passed every check)."""
    with tempfile.TemporaryDirectory(prefix="bench-devnet-codec-") as tmp_dir:
        out_dir = str(keep or tmp_dir)
        cmd = devnet_command(codec, adversary, out_dir, outer_steps, toml)
        known = set(Path(out_dir).iterdir()) if Path(out_dir).exists() else set()
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            rc, tail = p.returncode, (p.stdout + p.stderr).strip().splitlines()[-5:]
        except subprocess.TimeoutExpired:
            rc, tail = None, [f"timed out after {timeout:.0f}s"]
        wall = time.perf_counter() - t0
        runs = sorted(set(Path(out_dir).iterdir()) - known)
        snap = runs[-1] / "snapshot.json" if runs else None
        shown = [".venv/bin/gonka-diloco", *(a for a in cmd[1:] if a not in ("--out-dir", out_dir))]
        result: dict[str, Any] = {
            "case": f"{codec}:{adversary}" + (f"@{toml}" if toml else ""),
            "command": " ".join(shown),
            "exit_status": rc,
            "passed": rc == 0,
            "wall_s": round(wall, 1),
        }
        if snap is not None and snap.exists():
            result.update(summarize(json.loads(snap.read_text())))
        else:
            result["error"] = "no snapshot.json: " + " | ".join(tail)
        if rc != 0:
            result["output_tail"] = tail
    return result


def main(quick: bool = False) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_OUTER_STEPS} outer steps per devnet")
    ap.add_argument("--cases", default=DEFAULT_CASES, help="CODEC:ADVERSARY, comma-separated")
    ap.add_argument("--outer-steps", type=int, default=None, help="outer steps per devnet (its default, 6)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per devnet")
    ap.add_argument("--keep", type=Path, default=None, help="keep the devnets' folders here")
    ap.add_argument("--name", default="devnet_codec", help="results file: bench/results/NAME.json")
    args, _ = ap.parse_known_args()  # under `python -m bench` its own flags are in argv too
    quick = quick or args.quick
    outer = args.outer_steps if args.outer_steps is not None else (QUICK_OUTER_STEPS if quick else None)
    before = loadavg()
    print(f"load average before: {before} (the machine is shared)", flush=True)
    cases = []
    for codec, adversary, toml in parse_cases(args.cases):
        r = run_case(codec, adversary, outer, args.timeout, args.keep, toml)
        cases.append(r)
        loss = r.get("val_loss") or []
        print(
            f"{r['case']}: {'PASS' if r['passed'] else 'FAIL'} in {r['wall_s']:.0f}s, "
            f"accepted/rejected {r.get('accepted')}/{r.get('rejected')}, adversary rejected "
            f"{r.get('adversary_rejected')}/{r.get('adversary_total')}, loss "
            f"{loss[0] if loss else '?'} -> {loss[-1] if loss else '?'}, Δ bytes "
            f"{(r.get('delta_bytes_per_host_step') or {}).get('median')}",
            flush=True,
        )
    after = loadavg()
    print(f"load average after: {after}")
    cmd = ".venv/bin/python -m bench.devnet_codec" + (" --quick" if quick else "")
    if args.cases != DEFAULT_CASES:
        cmd += f" --cases {args.cases}"
    if args.outer_steps is not None:
        cmd += f" --outer-steps {args.outer_steps}"
    out = {
        "quick": quick,
        "command": cmd,
        "utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_before": before,
        "loadavg_after": after,
        "outer_steps": outer,
        "cases": cases,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{args.name}.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
