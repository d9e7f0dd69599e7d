"""Verification at devnet scale, old sampling against windows (issue 34): the same devnet run
twice, `--sampling segments` (every checker opens the same s segments) and `--sampling windows`
(each checker replays its own window of w segments from one downloaded state; the one whose
window ends at θ_H checks Δ against it, the others fetch the committed Δ to keep, specs §6), each
next to `gonka-diloco plan`'s prediction for the same small config.

    .venv/bin/python -m bench.verification [--quick] [--keep DIR]

Per run, from its snapshot.json and its nodes' logs (never from the markdown):
- bytes per node per outer step, up and down, by kind (the nodes' `/status` traffic counters);
- per check of an honest contribution: the bytes the verifier fetched for it (opened states, the
  carried optimizer state; the `fetched` log lines name the host) and the inner
  steps it replayed (its `verdict` line), averaged over outer steps ≥ 1 (step 0 starts from a fresh
  optimizer state, which nobody fetches) — next to the planner's `verifier_bytes_per_contribution`
  and replayed segments per check for the same config, and their ratio (the issue asks for 10%);
- detection: the share of outer steps in which each adversary was rejected, next to the planner's
  detection probability for it; collusion: a colluding verifier partnered with the lazy host;
- the swarm (specs §8.1): how many times per honest contribution its checkers fetched θ_H's
  parameters alone and its author uploaded them (chunks from the author in those fetches ÷ one
  fetch's chunks) — planned 0 since only the check that ends at θ_H checks Δ (a dispute panel
  still fetches them) — and all hosts' upload of opened states ÷ all verifiers' download of them;
- the transfer coding (specs §8.2): the state bytes fetched, how many came coded against G_n and
  what they decoded to (canonical ÷ coded: the ratio on the wire).

Writes bench/results/verification.json. A measurement, not a test: the devnets run one after the
other (they share this machine's cores), a few minutes each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.devnet_codec import loadavg
from bench.plan import log_events, run_devnet
from gonka_diloco.plan import Inputs, Pipeline, Sharding, verifier_bytes_per_contribution
from gonka_diloco.plan_constants import load_constants
from gonka_diloco.report import Snapshot, traffic_per_step
from protocol.collusion import Defense, window_pass_probability_keys
from protocol.config import RunConfig, Sampling
from protocol.inner import FP32_BYTES, state_bytes_per_param
from protocol.keys import test_wallet
from protocol.modelsize import model_size

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CHECK_KINDS = ("state", "optimizer", "error_feedback")
"""What a check downloads (the Δ is derived from θ_H in bitwise mode; aggregation's Δs and G are
counted in the traffic table, not per check)."""


def setting(sampling: Sampling, quick: bool) -> dict[str, Any]:
    """The devnet both runs share: n = 20 segments of k = 5 in blocks of w = 3 (B = 7), one initial
    checker and up to two auditors of three verifiers (one an accomplice of the host faking one
    segment), a lazy host faking half its segments and a host faking one."""
    return {
        "hosts": 5,
        "verifiers": 3,
        "outer_steps": 3 if quick else 6,
        "inner_steps": 100,
        "segment_len": 5,
        "sampled_segments": 3,
        "sampling": sampling.value,
        "window_segments": 3,
        "verifiers_per_contribution": 1,
        "state_chunk_bytes": 1 << 16,
        "adversaries": [{"behaviour": "lazy"}, {"behaviour": "one_fake"}],
        # host-4 (the one-segment faker, hosts are test wallets 1..5) has an accomplice among the
        # three verifiers: it accepts whatever it checks of its partner
        "verifier_adversaries": [
            {"behaviour": "collude", "params": {"partner": str(test_wallet(5).address())}}
        ],
        "block_interval": 0.5,
        "timeout": 1800.0,
    }


def per_check(folder: Path, honest: set[str], first_step: int = 1) -> dict[str, Any]:
    """Bytes fetched and inner steps replayed per check of an honest contribution, from the
    verifiers' `fetched` and `verdict` log lines (steps ≥ `first_step`)."""
    fetched: dict[tuple[str, str, int], int] = {}
    for node, events in log_events(folder, "fetched").items():
        for e in events:
            wanted = e.get("host") in honest and e.get("kind") in CHECK_KINDS
            if wanted and e.get("outer_step", -1) >= first_step:
                key = (node, e["host"], e["outer_step"])
                fetched[key] = fetched.get(key, 0) + int(e.get("bytes", 0))
    checks: dict[tuple[str, str, int], int] = {}
    for node, events in log_events(folder, "verdict").items():
        for e in events:
            if e.get("host") in honest and e.get("outer_step", -1) >= first_step:
                checks[(node, e["host"], e["outer_step"])] = int(e.get("replay_steps", 0))
    if not checks:
        return {"checks": 0}
    bytes_ = [fetched.get(key, 0) for key in checks]
    return {
        "checks": len(checks),
        "bytes_mean": statistics.fmean(bytes_),
        "replay_steps_mean": statistics.fmean(checks.values()),
    }


def swarm(
    folder: Path, snap: dict[str, Any], honest: set[str], params: int, first_step: int = 1
) -> dict[str, Any]:
    """Who uploaded the opened states (specs §8.1), per honest contribution (steps ≥ `first_step`):
    the state fetches of its checkers that took θ_H's parameters alone (fewer chunks than halfway
    between the parameters' share of a state, 4 of 12 or 6.03 B/param, and the whole state) and
    how many of their chunks came from its author, in units of one such fetch ("the author
    uploaded θ_H's parameters x times"); and, from the traffic table, every host's
    upload of states ÷ every verifier's download of them."""
    url = {n["address"]: n.get("url", "").rstrip("/") for n in snap["nodes"]}
    chunk = int(snap["config"].get("state_chunk_bytes", 1 << 26))
    per_param = state_bytes_per_param(RunConfig.model_validate(snap["config"]).inner.moments)
    n_state = -(-int(per_param * params) // chunk)  # the run's moments: int8 states are half fp32's
    whole = (1 + FP32_BYTES / per_param) / 2  # between θ_H's parameters' share of a state and all of it
    per: dict[tuple[str, int], list[int]] = {}  # (host, step) -> [fetches, chunks, author's chunks]
    wire = coded = raw = 0  # every state fetch: bytes on the wire, of them coded, what those decoded to
    for events in log_events(folder, "fetched").values():
        for e in events:
            if e.get("kind") == "state":
                wire += int(e.get("bytes", 0))
                coded += int(e.get("coded_bytes", 0))
                raw += int(e.get("coded_raw", 0))
            if (
                e.get("kind") != "state"
                or e.get("host") not in honest
                or e.get("outer_step", -1) < first_step
            ):
                continue
            got = {k.rstrip("/"): int(v) for k, v in (e.get("chunks_from") or {}).items()}
            total = sum(got.values())
            if not total or total >= whole * n_state:  # a whole state (a window's start), not θ_H's params
                continue
            row = per.setdefault((e["host"], e["outer_step"]), [0, 0, 0])
            row[0] += 1
            row[1] += total
            row[2] += got.get(url.get(e["host"], ""), 0)
    traffic = traffic_per_step(Snapshot.model_validate(snap))
    up = sum(t["up"].get("state", 0.0) for name, t in traffic.items() if name.startswith("host"))
    down = sum(t["down"].get("state", 0.0) for name, t in traffic.items() if name.startswith("verifier"))
    out: dict[str, Any] = {"hosts_state_up_per_step": up, "verifiers_state_down_per_step": down,
                           "up_over_down": up / down if down else None}  # fmt: skip
    # the transfer coding (specs §8.2): state bytes on the wire, those that came coded, and what
    # the coded ones decoded to (canonical): canonical ÷ coded is the ratio on these states
    out["state_wire_bytes"], out["coded_wire_bytes"], out["coded_canonical_bytes"] = wire, coded, raw
    out["coded_ratio"] = raw / coded if coded else None
    if per:
        rows = list(per.values())
        out["theta_h_fetches_per_contribution"] = statistics.fmean(r[0] for r in rows)
        out["author_uploads_theta_h_per_contribution"] = statistics.fmean(r[2] / (r[1] / r[0]) for r in rows)
    return out


def predicted(cfg: dict[str, Any], params: int, verifiers: int) -> dict[str, float]:
    """The planner's figures for this devnet's own config (its model, H, k, s, w, v, audits)."""
    auditors = min(cfg.get("audit_verifiers", 3), max(0, verifiers - cfg["verifiers_per_contribution"]))
    i = Inputs(
        params=float(params), hosts=1, verifier_nodes=verifiers, gpus_per_host=1, cpu_cores=1,
        H=cfg["inner_steps"], k=cfg["segment_len"], s=cfg["sampled_segments"],
        v=cfg["verifiers_per_contribution"], m=1, codec=cfg["codec"], pipeline=Pipeline.SPARSE,
        sharding=Sharding.NONE, audit_p=cfg.get("audit_bps", 10_000) / 10_000, auditors=max(1, auditors),
        chunk_bytes=cfg.get("state_chunk_bytes", 1 << 26),
        sampling=Sampling(cfg.get("sampling", "windows")), w=cfg.get("window_segments", 3),
        moments=RunConfig.model_validate(cfg).inner.moments,
    )  # fmt: skip
    from gonka_diloco import plan as pm

    d = Defense(i.v, cfg.get("audit_bps", 10_000), i.auditors)
    one = (  # one fake segment against 1 accomplice of the 3 verifier keys: exact (windows only)
        1.0 - window_pass_probability_keys(1, verifiers - 1, i.blocks, 1, d)
        if i.windowed and i.v + i.auditors <= i.blocks else pm.one_segment_detection(i)
    )  # fmt: skip
    return {
        "bytes_per_check": verifier_bytes_per_contribution(i, load_constants()),
        "replay_steps_per_check": pm.replay_segments_per_check(i) * i.k,
        "state_bytes": int(state_bytes_per_param(RunConfig.model_validate(cfg).inner.moments) * params),
        "caught_share": {"lazy": pm.lazy_detection(i, 0.5), "one_fake": one},
        # no check fetches θ_H's parameters: only the one ending at θ_H checks Δ (a panel would)
        "theta_h_fetches_per_contribution": 0.0,
        "author_uploads_theta_h_per_contribution": 0.0,
        "code_ratio": pm.code_ratio(i, load_constants()),
    }


def analyze(folder: Path, sampling: Sampling) -> dict[str, Any]:
    """One devnet's figures from its folder (snapshot.json and the nodes' logs)."""
    snap = json.loads((folder / "snapshot.json").read_text())
    hosts = [n for n in snap["nodes"] if n["role"] == "host"]
    honest = {n["address"] for n in hosts if n["behaviour"] == "honest"}  # as the logs name hosts
    adversaries = {n["name"]: n["behaviour"] for n in hosts if n["behaviour"] != "honest"}  # as the snapshot
    steps = max(1, sum(s["phase"] == "DONE" for s in snap["steps"]))
    params = model_size(RunConfig.model_validate(snap["config"]).model).params
    rejected = {name: sum(c["outcome"] == "rejected" for c in snap["contributions"] if c["host"] == name)
                for name in adversaries}  # fmt: skip
    return {
        "sampling": sampling.value,
        "folder": str(folder),
        "steps": steps,
        "traffic_per_step": traffic_per_step(Snapshot.model_validate(snap)),
        "measured": per_check(folder, honest),
        "swarm": swarm(folder, snap, honest, params),
        "caught_share": {adversaries[name]: n / steps for name, n in rejected.items()},
        "honest_accepted": sum(
            c["outcome"] == "accepted" and c["host"] not in adversaries for c in snap["contributions"]
        ),
        "params": params,
        "config": snap["config"],
        "failures": snap.get("failures", []),
    }


def run(sampling: Sampling, quick: bool, keep: Path | None, reuse: Path | None) -> dict[str, Any]:
    """Run the devnet (or, with `reuse`, read the newest one kept under reuse/<sampling>/runs)."""
    if reuse is not None:
        kept = (reuse / sampling.value / "runs").iterdir()
        runs = sorted(p for p in kept if p.is_dir() and p.name != "latest")
        return analyze(runs[-1], sampling)
    with tempfile.TemporaryDirectory(prefix="bench-verification-") as tmp:
        where = keep / sampling.value if keep is not None else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        _, folder = run_devnet(setting(sampling, quick), where, must_pass=False)  # fakes may pass: measured
        return analyze(folder, sampling)


def main(quick: bool = False) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 outer steps per devnet instead of 6")
    ap.add_argument("--keep", type=Path, default=None, help="keep the devnets' folders here")
    ap.add_argument("--reuse", type=Path, default=None, help="read the devnets a --keep run left there")
    args, _ = ap.parse_known_args()
    quick = quick or args.quick
    before = loadavg()
    runs = []
    for sampling in (Sampling.SEGMENTS, Sampling.WINDOWS):
        r = run(sampling, quick, args.keep, args.reuse)
        r["predicted"] = predicted(r["config"], r["params"], setting(sampling, quick)["verifiers"])
        m, p = r["measured"], r["predicted"]
        if m.get("checks"):
            r["ratio"] = {
                "bytes": m["bytes_mean"] / p["bytes_per_check"],
                "replay_steps": m["replay_steps_mean"] / p["replay_steps_per_check"],
            }
        runs.append(r)
        print(
            json.dumps(
                {k: r[k] for k in ("sampling", "measured", "predicted", "swarm", "caught_share")}, indent=1
            )
        )
    out = {
        "quick": quick,
        "command": ".venv/bin/python -m bench.verification" + (" --quick" if quick else ""),
        "utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg_before": before,
        "loadavg_after": loadavg(),
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "verification.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
