"""Fetch time with a slow holder listed first, against honest holders only (issue 22).

    .venv/bin/python -m bench.fetch_slow_holder [--repeats 5] [--chunks 16]

One object of `chunks` chunks of 64 kB, fetched over real HTTP (nodekit.serve's app in a server
thread) by the nodes' `BlobClient`, from two honest holders, then with a third holder listed first
that serves correct bytes slowly (1 kB per 0.5 s: above the rate floor, so only hedging helps) and
with one that trickles (one byte per 0.2 s: below the floor, dropped by the clock). Median and
max wall seconds per case, and what a holder that keeps its chunks would have cost; writes
bench/results/fetch_slow_holder.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from gonka_diloco.adversaries.holders import SlowHolder
from nodekit.fetch import BlobClient
from nodekit.objects import Kind, ObjectRef, TransferPolicy
from nodekit.serve import BlobCatalog, BytesObject, ServerThread, build_app
from nodekit.store import BytesSink
from protocol.codecs import delta_hash

CHUNK = 64 << 10
RESULTS = Path(__file__).parent / "results"


def serve(h: str, o: BytesObject) -> ServerThread:
    catalog = BlobCatalog(CHUNK)
    catalog.publish("delta", h, o)
    return ServerThread(build_app(catalog, dict)).start()


def timed_fetch(ref: ObjectRef, urls: list[str], policy: TransferPolicy) -> tuple[float, dict[str, int]]:
    with BlobClient([], timeout=5, retries=0, policy=policy) as client:
        t0 = time.monotonic()
        sink = BytesSink(ref.length)
        report = client.fetch(ref, sink, urls)
        return time.monotonic() - t0, dict(report.chunks_from)


def main(argv: list[str] | None = None) -> dict[str, object]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=16)
    args = ap.parse_args(argv)
    data = bytes((i * 7) % 251 for i in range(args.chunks * CHUNK))
    ref = ObjectRef(Kind.DELTA, delta_hash(data, CHUNK), len(data), CHUNK)
    honest = [serve(ref.hash, BytesObject(data, CHUNK)) for _ in range(2)]
    slow = serve(ref.hash, SlowHolder(data, CHUNK, step=1024, delay=0.5))
    trickle = serve(ref.hash, SlowHolder(data, CHUNK, step=1, delay=0.2))
    policy = TransferPolicy(min_bytes_per_s=10_000.0, base_s=2.0)  # floor 10 kB/s after 2 s
    cases = {
        "honest holders only": [h.url for h in honest],
        "slow holder first (1 kB / 0.5 s, above the floor)": [slow.url, *(h.url for h in honest)],
        "trickling holder first (1 B / 0.2 s, below the floor)": [trickle.url, *(h.url for h in honest)],
    }
    out: dict[str, object] = {
        "chunks": args.chunks, "chunk_bytes": CHUNK, "repeats": args.repeats,
        "policy": {"min_bytes_per_s": 10_000.0, "base_s": 2.0}, "cases": {},
    }  # fmt: skip
    try:
        for name, urls in cases.items():
            times, froms = [], {}
            for _ in range(args.repeats):
                s, froms = timed_fetch(ref, urls, policy)
                times.append(s)
            row = {"median_s": statistics.median(times), "max_s": max(times),
                   "chunks_from_first_listed": froms.get(urls[0], 0)}  # fmt: skip
            out["cases"][name] = row  # type: ignore[index]
            print(f"{name}: median {row['median_s']:.3f} s, max {row['max_s']:.3f} s, "
                  f"{row['chunks_from_first_listed']}/{args.chunks} chunks from the first listed", flush=True)
    finally:
        for t in (*honest, slow, trickle):
            t.stop()
    kept = CHUNK / 1024 * 0.5  # seconds one chunk takes from the slow holder, were it kept there
    out["slow_holder_keeping_one_chunk_s"] = kept
    print(f"(a chunk left with the slow holder would take {kept:.0f} s; with the trickler "
          f"{CHUNK * 0.2:.0f} s)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fetch_slow_holder.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
