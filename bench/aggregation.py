"""Aggregation at large M (issue 26): does downloading the other M − 1 Δs fit beside training?

Every host downloads every accepted Δ and sums it into G_{n+1} itself, so its download grows as
(M − 1)·|Δ|. This prints `gonka-diloco plan`'s aggregation time (link-bound download, or decoding
into the running sum at the speed `bench.codecs` measured, whichever is longer) against the
training time of one outer step, at 30B on 8×H100 hosts at 1 Gbit/s (H = 500, the published
plan's k, s, v, m and economics), for int8 and the sparse codec (64 of 4096), from 16 to 4096
hosts; and the host count at which aggregation would reach half the training time — where a
sharded aggregation (each host reducing a slice) would start to pay (specs §4.1).

Run: `.venv/bin/python -m bench.aggregation` (machine constants from bench/results/*.json).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from gonka_diloco.plan import GPUS, Inputs, aggregate_seconds, run_delta_bytes, timeline
from gonka_diloco.plan_constants import load_constants
from protocol.config import Codec

HOSTS = (16, 64, 120, 256, 1024, 2048, 4096)
BASE = Inputs(params=30e9, gpu=GPUS["h100"], gpus_per_host=8, up=125e6, down=125e6, H=500, k=25, s=4, v=2,
              m=1, audit_p=0.1, auditors=1, host_stake=10_000.0, block_seconds=5.0)  # fmt: skip
"""The published plan's 30B row (README, `python -m bench.plan`), 16 hosts; M varies below."""


def row(i: Inputs, c: Any) -> dict[str, Any]:
    tl = timeline(i, c)
    agg = aggregate_seconds(i, c)
    return {"codec": i.codec.value, "hosts": i.hosts, "delta_bytes": run_delta_bytes(i, c),
            "download_bytes": (i.hosts - 1) * run_delta_bytes(i, c), "aggregate_s": agg, "train_s": tl.train,
            "aggregate_over_train": agg / tl.train}  # fmt: skip


def half_training_hosts(i: Inputs, c: Any) -> int:
    """The smallest M at which aggregation takes half the training time (bisection on M)."""
    lo, hi = 2, 1 << 20
    while lo < hi:
        mid = (lo + hi) // 2
        m = dataclasses.replace(i, hosts=mid)
        if aggregate_seconds(m, c) >= 0.5 * timeline(m, c).train:
            hi = mid
        else:
            lo = mid + 1
    return lo


def main(quick: bool = False) -> dict[str, Any]:
    from bench.sim import write_result

    c = load_constants()
    rows, half = [], {}
    for codec in (Codec.INT8, Codec.SPARSE):
        i = dataclasses.replace(BASE, codec=codec)
        rows += [row(dataclasses.replace(i, hosts=m), c) for m in HOSTS]
        half[codec.value] = half_training_hosts(i, c)
    result = {"quick": quick, "params": BASE.params, "link_bytes_per_s": BASE.down, "H": BASE.H,
              "codec_chunk": BASE.codec_chunk, "codec_topk": BASE.codec_topk, "rows": rows,
              "hosts_at_half_training": half,
              "decode_bytes_per_s": {k: c.codec_decode[k] for k in ("int8", "sparse")},
              "constants_source": c.sources.get("codec_speed", "default")}  # fmt: skip
    print(f"30B, 8×H100 hosts, 1 Gbit/s, H = {BASE.H}: aggregation (M − 1 Δs downloaded, or decoded) "
          "vs training")
    print("| codec | hosts | Δ per host | download per host | aggregation | training | aggregation ÷ train |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['codec']} | {r['hosts']} | {r['delta_bytes'] / 1e9:.3g} GB "
              f"| {r['download_bytes'] / 1e12:.3g} TB | {r['aggregate_s'] / 3600:.2f} h "
              f"| {r['train_s'] / 3600:.2f} h | {r['aggregate_over_train']:.1%} |")
    for k, m in half.items():
        print(f"{k}: aggregation reaches half the training time at M = {m} hosts")
    write_result("aggregation", result)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the same (it is arithmetic)")
    main(quick=ap.parse_args().quick)
