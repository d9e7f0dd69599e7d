"""The chain on CometBFT: a 4-validator localnet next to the embedded node, under the same load.

Three figures, each beside the embedded engine's measured in the same invocation:
- committed signed tx/s: `bench.chain_tps`'s load (pre-signed bank sends from 16 accounts, one
  ordered stream per account, signatures checked), the streams spread over the validators' REST
  routes, from the first broadcast until the last tx is in a committed block;
- blocks per second of an idle chain at the devnet's block interval (CometBFT's `timeout_commit`
  is the interval; the rest is the consensus rounds and the app's FinalizeBlock and Commit);
- the wall time of a whole `gonka-diloco devnet` on each engine with the same configuration.
Run: `.venv/bin/python -m bench.chain_bft` (the devnet's defaults, with a 60 s join window) or
`--quick` (a 1-layer GPT, 3 outer steps); `--parts throughput` or `--parts devnet` reruns one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.chain_tps import presign
from bench.chain_tps import run as tps_run
from chain.abci.cometbft import Localnet, ensure_binary, version, write_localnet
from chain.cli import Engine, NodeProcess
from chain.node import dev_genesis

RESULTS = Path(__file__).parent / "results" / "chain_bft.json"
PARTS = ("throughput", "devnet")
ENGINES = ("embedded", "cometbft")
FULL_TOML = "[phases]\njoin = 60.0\n"
"""The full run is `make devnet`'s defaults with a longer join window: on a shared 2-core machine
the nodes' start (torch import) can take longer than the default 25 s, for either engine."""
API = "/inference/diloco/v1"
VALIDATORS = 4
QUICK_FLAGS = [
    "--hosts", "3", "--verifiers", "2", "--adversary", "noise", "--outer-steps", "3", "-H", "10", "-k", "5",
    "-s", "1", "-v", "1", "--model-size", "tiny", "--block-interval", "0.25",
]  # fmt: skip
QUICK_TOML = "batch_size = 4\nseq_len = 32\n[phases]\njoin = 20.0\ntrain = 3.0\nreveal = 2.0\n"
QUICK_TOML += "verify = 3.0\nresult = 3.0\n"
"""The quick devnet: a 1-layer GPT, H = 10, three outer steps (as the devnet tests run it)."""


def start_localnet(folder: Path, block_interval: float) -> tuple[Localnet, list[NodeProcess]]:
    net = write_localnet(folder, VALIDATORS, genesis=dev_genesis(), block_interval=block_interval)
    procs = []
    try:
        for v in net.validators:
            procs.append(
                NodeProcess(
                    folder / v.home,
                    block_interval=block_interval,
                    port=None,
                    engine=Engine.COMETBFT,
                    log_path=folder / f"{v.name}.log",
                )
            )
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return net, procs


def block_rate(url: str, n_blocks: int) -> dict[str, float]:
    """Blocks per second over the next `n_blocks`, by the clock here and by the blocks' own times."""
    with httpx.Client(base_url=url, timeout=60) as http:
        start = http.get(f"{API}/status").json()["height"]
        first = http.get(f"{API}/blocks/{start + 1}", params={"wait": 30}).json()
        t0 = time.perf_counter()
        times = [int(first["header"]["time_ns"])]
        for h in range(start + 2, start + 2 + n_blocks):
            times.append(int(http.get(f"{API}/blocks/{h}", params={"wait": 30}).json()["header"]["time_ns"]))
        elapsed = time.perf_counter() - t0
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    return {
        "idle_blocks": n_blocks,
        "blocks_per_s": round(n_blocks / elapsed, 2),
        "median_block_s": round(statistics.median(gaps), 3),
        "max_block_s": round(max(gaps), 3),
    }


def tps_and_rate(
    engine: str, folder: Path, streams: list[list[bytes]], interval: float, n_blocks: int
) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    if engine == "embedded":
        node = NodeProcess(folder / "chain", block_interval=interval)
        procs, urls = [node], [node.url]
    else:
        net, procs = start_localnet(folder / "localnet", interval)
        urls = net.rest_urls
    try:
        rate = block_rate(urls[0], n_blocks)
        tps = tps_run(urls, streams)
    finally:
        for p in procs:
            p.stop()
    label = "embedded (1 process)" if engine == "embedded" else f"cometbft ({VALIDATORS} validators)"
    return {"engine": label, "block_interval": interval, **rate, **tps}


def devnet_wall(engine: str, folder: Path, quick: bool) -> dict[str, Any]:
    """One whole `gonka-diloco devnet`, as a user runs it; wall time of the command."""
    argv = [sys.executable, "-m", "gonka_diloco.cli", "devnet", "--no-live", "--out-dir", str(folder)]
    argv += ["--engine", engine] + (["--validators", str(VALIDATORS)] if engine == "cometbft" else [])
    config = folder / "devnet.toml"
    folder.mkdir(parents=True, exist_ok=True)
    config.write_text(QUICK_TOML if quick else FULL_TOML)
    argv += ["--config", str(config), *(QUICK_FLAGS if quick else [])]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    snapshots = sorted(folder.glob("*/snapshot.json"))
    snap = json.loads(snapshots[-1].read_text()) if snapshots else {}
    return {
        "engine": engine,
        "validators": VALIDATORS if engine == "cometbft" else 1,
        "wall_s": round(wall, 1),
        "run_wall_s": round(snap.get("wall_s") or 0.0, 1),
        "exit_code": done.returncode,
        "blocks": (snap.get("chain") or {}).get("height"),
        "outer_steps": sum(s.get("phase") == "DONE" for s in snap.get("steps", [])),
        "failures": "; ".join(snap.get("failures", []))[:300] or "none",
    }


def main(quick: bool = False, parts: tuple[str, ...] = PARTS) -> None:
    """Both parts by default; `--parts` reruns one and keeps the other's last figures."""
    binary = ensure_binary()
    interval = 0.5  # the devnet's default block interval
    result: dict[str, Any] = {}
    if set(parts) != set(PARTS) and RESULTS.exists():
        result = json.loads(RESULTS.read_text())
    result.update(quick=quick, cometbft=version(binary), accounts=16)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "throughput" in parts:
            n_txs = 600 if quick else 3000
            streams = presign(n_txs, 16)
            tps = [tps_and_rate(e, root / e, streams, interval, 10 if quick else 30) for e in ENGINES]
            result.update(
                txs=n_txs,
                throughput=tps,
                committed_tps_cometbft_over_embedded=round(
                    tps[1]["committed_tps"] / tps[0]["committed_tps"], 3
                ),
            )
        if "devnet" in parts:
            result["devnet"] = [devnet_wall(e, root / f"devnet-{e}", quick) for e in ENGINES]
    for row in result.get("throughput", []):
        print(
            f"{row['engine']:<24} {row['committed_tps']:>8} tx/s committed  "
            f"{row['blocks_per_s']:>5} blocks/s at a {interval} s interval"
        )
    for row in result.get("devnet", []):
        status = f"exit {row['exit_code']}  {row['failures']}"
        print(f"devnet --engine {row['engine']:<9} {row['wall_s']:>7} s  {status}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default=",".join(PARTS), help="throughput, devnet (comma-separated)")
    args = ap.parse_args()
    main(quick=args.quick, parts=tuple(p.strip() for p in args.parts.split(",") if p.strip()))
