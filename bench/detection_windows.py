"""Detection under sampling windows (issue 34): `python -m bench.detection --windows [--quick]`.

Two tables, with the real committed loop, store, codec and `verifier.verify` (no chain; the chain's
side is `bench.collusion --windows`):

1. every host adversary of `bench.detection`'s table, and an honest host, at its H = 50, k = 5 and
   RunConfig's w = 3, v = 4, p = 1, a = 3 (n = 10, B = 4 blocks: the 7 slots cover every block). Per
   trial a fresh challenge draws the v + a slots' windows (`protocol.prf.draw_windows`) and each
   drawn block's checker replays its window and checks Δ against θ_H; the outer step is caught when
   an initial slot rejects, or, audited (`protocol.prf.audited`), an audit slot does. Reported per
   outer step and per check, with the reasons seen;
2. `one_fake` and `lazy` (f = 0.5) at the issue's H = 500, k = 5, w = 3 (n = 100, B = 34 > 7
   slots): their measured detection per outer step next to the planner's `lazy_detection` /
   `one_segment_detection` (`gonka_diloco.plan`), split into caught by the initial slots and by the
   audit (`lazy_cheat`). Each host (one per seed) has every block's window replayed once; in bitwise
   mode a window's verdict does not depend on which slot or challenge asks for it, so each of many
   challenges is then judged from those verdicts by the chain's rule over its drawn slots (and a few
   challenges per host are re-verified end to end, `spot_checks_agree`). An honest host rides along.

Writes bench/results/detection_windows.json; bench/results/detection.json (sampling segments) stays.
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.detection import ADVERSARIES, SEEDED, A, B, seed_hex
from gonka_diloco.adversaries import resolve_host, resolve_verifier
from gonka_diloco.adversaries.lab import (
    HostRun,
    Lab,
    carried_optimizer,
    next_global,
    synthetic_corpus,
    tiny_config,
)
from gonka_diloco.plan import Inputs, lazy_cheat, lazy_detection, one_segment_detection
from nodekit.globalmodel import GlobalModel
from protocol.config import RunConfig
from protocol.prf import audited, draw_windows, window, window_blocks
from replay.step import configure_determinism
from trainer.behaviour import HostBehaviour
from verifier.verify import verify

RESULTS = Path(__file__).parent / "results" / "detection_windows.json"
ACCEPT = "ACCEPT"


def outer_step(cfg: RunConfig, host: str, challenge: str, verdicts: dict[int, str]) -> tuple[bool, bool, str]:
    """The chain's rule (specs §2.5) over one challenge's slots, given each drawn block's verdict:
    (caught by an initial slot, caught by the audit, the first reject's reason or ACCEPT)."""
    starts = draw_windows(challenge, host, cfg.n_segments, cfg.window_len, cfg.checker_slots)
    v = cfg.verifiers_per_contribution
    first = [verdicts[s] for s in starts[:v] if verdicts[s] != ACCEPT]
    if first:
        return True, False, first[0]
    if not audited(challenge, host, cfg.audit_bps):
        return False, False, ACCEPT
    later = [verdicts[s] for s in starts[v:] if verdicts[s] != ACCEPT]
    return False, bool(later), later[0] if later else ACCEPT


def check_windows(lab: Lab, run: HostRun, step: int, challenge: str, gm: GlobalModel, revealed: bool = True,
                  starts: list[int] | None = None) -> dict[int, str]:  # fmt: skip
    """Each distinct drawn block's checker (or every block's, `starts`), verified for real."""
    cfg = lab.cfg
    n, w = cfg.n_segments, cfg.window_len
    if starts is None:
        starts = list(dict.fromkeys(draw_windows(challenge, run.address, n, w, cfg.checker_slots)))
    ctx = lab.replay_context(gm)
    out = {}
    for s in starts:
        job = lab.job(run, step, challenge, revealed=revealed, window=window(s, n, w))
        out[s] = verify(job, run.source(), ctx).reason.name
    return out


# ---------------------------------------------------------------- 1. every adversary


def adversary_table(cfg: RunConfig, trials: int, root: Path) -> list[dict[str, Any]]:
    """`bench.detection.adversary_table`'s hosts (step 1, after a step 0 that gives `stale` and
    `copycat` something to reuse), judged per outer step under windows."""
    lab = Lab(cfg, synthetic_corpus(), root)
    g0 = GlobalModel.from_module(lab.build()[0])
    stale = resolve_host("stale")
    step0 = {A: lab.train(stale, A, 0, g0), B: lab.train(HostBehaviour(), B, 0, g0)}
    g1 = next_global(g0, list(step0.values()), cfg)
    carried, prev = carried_optimizer(step0[A])
    peers = {"peer_payloads": {B: step0[B].contribution.payload}}
    rows = []
    for name, params in [("honest", {}), *ADVERSARIES]:
        label = name + "".join(f" {k}={v}" for k, v in params.items())
        fixed: HostRun | None = None
        checks: dict[str, int] = {}
        caught = first = right = 0
        t0 = time.perf_counter()
        for t in range(trials):
            if name == "stale":
                behaviour: HostBehaviour = stale
            elif name in SEEDED:
                behaviour = resolve_host(name, {**params, "seed": t})
            else:
                behaviour = resolve_host(name, params)
            if fixed is None or name in SEEDED:
                run = lab.train(behaviour, A, 1, g1, carried, prev, extra=peers)
                fixed = None if name in SEEDED else run
            else:
                run = fixed
            challenge = seed_hex("windows", t)
            revealed = not (name == "no_reveal" and params.get("mode") == "chain")
            verdicts = check_windows(lab, run, 1, challenge, g1, revealed)
            for r in verdicts.values():
                checks[r] = checks.get(r, 0) + 1
            by_first, by_audit, reason = outer_step(cfg, A, challenge, verdicts)
            caught += by_first or by_audit
            first += by_first
            right += reason in getattr(behaviour, "expected", (ACCEPT,))
        expected = getattr(behaviour, "expected", (ACCEPT,))
        n_checks = sum(checks.values())
        rows.append({
            "behaviour": label, "trials": trials, "rejected": caught / trials,
            "rejected_by_initial_slots": first / trials, "right_reason": right / trials,
            "expected": list(expected), "checks": n_checks,
            "checks_rejecting": 1 - checks.get(ACCEPT, 0) / n_checks, "reasons": checks,
            "seconds": round(time.perf_counter() - t0, 2),
        })  # fmt: skip
    rows.append(collude_row(lab, g1, carried, prev, peers, trials))
    return rows


def collude_row(
    lab: Lab, g1: GlobalModel, carried: Any, prev: str, peers: dict, trials: int
) -> dict[str, Any]:
    """The colluding verifier holding slot 0 on its partner's noise Δ: it accepts unchecked; an
    honest checker of the same window rejects (every window checks Δ), and opens the dispute."""
    colluder = resolve_verifier("collude", {"partner": A})
    cfg = lab.cfg
    n, w = cfg.n_segments, cfg.window_len
    reasons: dict[str, int] = {}
    honest_rejects = 0
    t0 = time.perf_counter()
    for t in range(trials):
        run = lab.train(resolve_host("noise", {"seed": t}), A, 1, g1, carried, prev, extra=peers)
        challenge = seed_hex("windows collude", t)
        slot0 = draw_windows(challenge, A, n, w, cfg.checker_slots)[0]
        job = lab.job(run, 1, challenge, window=window(slot0, n, w))

        def check(job: Any = job, run: HostRun = run) -> Any:
            return verify(job, run.source(), lab.replay_context(g1))

        out = colluder.decide(job, check)
        assert out is not None
        reasons[out.reason.name] = reasons.get(out.reason.name, 0) + 1
        honest_rejects += not check().accept
    return {
        "behaviour": "collude (verifier, slot 0) on its partner's noise Δ", "trials": trials,
        "rejected": 1 - reasons.get(ACCEPT, 0) / trials, "right_reason": honest_rejects / trials,
        "expected": ["ACCEPT by it; an honest checker of its window rejects"], "reasons": reasons,
        "honest_verifier_rejected": honest_rejects / trials, "seconds": round(time.perf_counter() - t0, 2),
    }  # fmt: skip


# ---------------------------------------------------------------- 2. one_fake and lazy vs the planner


def planner_inputs(cfg: RunConfig) -> Inputs:
    return Inputs(H=cfg.inner_steps, k=cfg.segment_len, w=cfg.window_segments,
                  v=cfg.verifiers_per_contribution, audit_p=cfg.audit_bps / 10_000,
                  auditors=cfg.audit_verifiers)  # fmt: skip


HOSTS: list[tuple[str, dict[str, Any]]] = [("honest", {}), ("one_fake", {}), ("lazy", {"fraction": 0.5})]


def planner_row(cfg: RunConfig, name: str, faked: int) -> dict[str, float]:
    """The planner's figures for a host faking `faked` of n segments (0: honest)."""
    i = planner_inputs(cfg)
    if name == "honest":
        return {"predicted": 0.0, "predicted_initial": 0.0, "predicted_audit": 0.0}
    f = faked / cfg.n_segments
    cheat = lazy_cheat(i, f)
    caught = one_segment_detection(i) if name == "one_fake" else lazy_detection(i, f)
    return {
        "predicted": caught,
        "predicted_initial": cheat.caught_first,
        "predicted_audit": cheat.caught_audit,
    }


def fake_sweep(cfg: RunConfig, seeds: int, challenges: int, spot: int, root: Path) -> list[dict[str, Any]]:
    lab = Lab(cfg, synthetic_corpus(), root)
    g0 = GlobalModel.from_module(lab.build()[0])
    n, w = cfg.n_segments, cfg.window_len
    every = [b * w for b in range(window_blocks(n, w))]
    rows = []
    for name, params in HOSTS:
        caught = first = audit = total = agree = spots = 0
        faked_blocks: list[int] = []
        t0 = time.perf_counter()
        for i in range(1 if name == "honest" else seeds):
            behaviour = HostBehaviour() if name == "honest" else resolve_host(name, {**params, "seed": i})
            run = lab.train(behaviour, A, 0, g0)
            verdicts = check_windows(lab, run, 0, seed_hex("all", name, i), g0, starts=every)
            faked_blocks.append(sum(r != ACCEPT for r in verdicts.values()))
            for c in range(challenges):
                challenge = seed_hex("windows sweep", name, i, c)
                by_first, by_audit, _ = outer_step(cfg, A, challenge, verdicts)
                caught += by_first or by_audit
                first += by_first
                audit += by_audit
                total += 1
                if c < spot:  # the same challenge verified end to end, window by window
                    again = check_windows(lab, run, 0, challenge, g0)
                    agree += all(verdicts[s] == r for s, r in again.items())
                    spots += 1
        faked = 0 if name == "honest" else len(behaviour.faked(cfg, A, 0))  # type: ignore[attr-defined]
        rows.append({
            "behaviour": name + "".join(f" {k}={v}" for k, v in params.items()), "H": cfg.inner_steps,
            "k": cfg.segment_len, "w": w, "n_segments": n, "blocks": len(every), "faked_segments": faked,
            "blocks_rejected": sorted(set(faked_blocks)), "hosts": len(faked_blocks), "trials": total,
            "detected": caught / total, "detected_initial": first / total, "detected_audit": audit / total,
            **planner_row(cfg, name, faked), "spot_checks": spots, "spot_checks_agree": agree,
            "seconds": round(time.perf_counter() - t0, 1),
        })  # fmt: skip
    return rows


# ---------------------------------------------------------------- main


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def report(result: dict[str, Any]) -> None:
    d = result["detection_config"]
    print(f"\n1. under windows: tiny GPT, H={d['H']} k={d['k']} w={d['w']} (B={d['blocks']}) v={d['v']} "
          f"p={d['p']} a={d['a']}, seeded challenges")  # fmt: skip
    for r in result["adversaries"]:
        print(f"  {r['behaviour']:<48} {r['trials']:>3}  caught {pct(r['rejected']):>6}  "
              f"right {pct(r['right_reason']):>6}  checks rejecting {pct(r.get('checks_rejecting')):>6}  "
              f"{r['reasons']}")  # fmt: skip
    print("\n2. detection per outer step vs the planner (lazy_detection / one_segment_detection)")
    for r in result["sweep"]:
        print(f"  {r['behaviour']:<20} H={r['H']} B={r['blocks']} faked={r['faked_segments']:>3} "
              f"{r['trials']:>6} trials: {pct(r['detected']):>6} (planner {pct(r['predicted']):>6}); "
              f"initial {pct(r['detected_initial'])} ({pct(r['predicted_initial'])}), "
              f"audit {pct(r['detected_audit'])} ({pct(r['predicted_audit'])}); "
              f"spot checks {r['spot_checks_agree']}/{r['spot_checks']}")  # fmt: skip


def main(quick: bool) -> dict[str, Any]:
    configure_determinism(1)
    trials = 5 if quick else 20
    det_cfg = tiny_config(inner_steps=20 if quick else 50, segment_len=5, sampled_segments=2)
    sweep_cfg = tiny_config(inner_steps=100 if quick else 500, segment_len=5, sampled_segments=2)
    seeds, challenges, spot = (3, 200, 1) if quick else (12, 500, 2)
    result: dict[str, Any] = {
        "quick": quick, "torch": torch.__version__, "machine": platform.machine(), "sampling": "windows",
        "detection_config": {"H": det_cfg.inner_steps, "k": det_cfg.segment_len, "w": det_cfg.window_len,
                             "blocks": window_blocks(det_cfg.n_segments, det_cfg.window_len),
                             "v": det_cfg.verifiers_per_contribution, "p": det_cfg.audit_bps / 10_000,
                             "a": det_cfg.audit_verifiers},
        "sweep_config": {"seeds": seeds, "challenges_per_host": challenges, "spot_checks_per_host": spot},
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="detection-windows-") as tmp:
        t0 = time.perf_counter()
        result["adversaries"] = adversary_table(det_cfg, trials, Path(tmp) / "adv")
        result["adversaries_seconds"] = round(time.perf_counter() - t0, 1)
        result["sweep"] = fake_sweep(sweep_cfg, seeds, challenges, spot, Path(tmp) / "sweep")
        result["seconds"] = round(time.perf_counter() - t0, 1)
    report(result)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {RESULTS} ({result['seconds']} s)")
    return result
