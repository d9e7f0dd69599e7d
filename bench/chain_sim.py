"""The state machine alone: many hosts and verifiers running honest outer steps, no node, no signatures.

Measures what a block costs the chain node: the module (begin_block + its messages + end_block),
the app hash (cached digests: only what changed is re-hashed), and persistence (`chain.store`
writing the rows the block changed into SQLite, synchronous=FULL), per block and per outer step,
so a reader sees that the cost is flat in history. It also times what a restart costs (rows back
to a state, app hash from cold) and, for a before/after under the same load, every 10th block
the previous persistence (the whole canonical JSON, `json_*`; today's faster serializer, so it
understates the old cost). Each outer step runs the defaults' audit lottery (half of the accepted
contributions, one stake-weighted auditor each). Run: `.venv/bin/python -m bench.chain_sim` (1,000 hosts,
100 verifiers, 20 outer steps) or `--quick`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from cosmpy.crypto.address import Address

from chain import queries
from chain.app import BlockResult
from chain.genesis import Genesis, genesis_state
from chain.module import BlockContext, TxContext, begin_block, end_block, process_msg
from chain.params import ZERO_HASH
from chain.state import ChainState, app_hash, state_from_json, state_to_json
from chain.store import Store
from protocol import merkle
from protocol.config import Codec, ModelSpec, Phases, RunConfig, Stake
from protocol.messages import (
    EnvFingerprint,
    MsgCommitPseudoGradient,
    MsgCreateRun,
    MsgJoinRun,
    MsgRevealContribution,
    MsgSubmitOuterResult,
    MsgSubmitVerdict,
    Reason,
    Role,
    SegmentOpening,
)

RESULTS = Path(__file__).parent / "results" / "chain_sim.json"
SAMPLE_EVERY = 10
IDLE_TAIL = 5
GNK = 1_000_000_000


def _addr(name: str) -> str:
    return str(Address(hashlib.sha256(name.encode()).digest()[:20], prefix="gonka"))


def _h(*parts: object) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()


class Driver:
    """Delivers blocks and records the module, app-hash and persistence time of each."""

    def __init__(self, state: ChainState, store: Store) -> None:
        self.state, self.height, self.prev = state, 0, ZERO_HASH
        self.store = store
        store.init_genesis(state, "{}")
        store.load_state()
        self.module_s: list[float] = []
        self.hash_s: list[float] = []
        self.persist_s: list[float] = []
        self.cpu_s: list[float] = []  # CPU time of the whole block: immune to other processes' load
        self.cpu_parts: list[tuple[float, float, float]] = []  # (module, app hash, persist) CPU s
        self.persist_bytes: list[int] = []
        self.persist_rows: list[int] = []
        self.outer: list[int] = []  # the run's current outer step at each block
        self.sampled: list[tuple[float, float]] = []  # (app_hash s, whole-JSON hash s) at the same block
        self.json_persist_s: list[float] = []  # the old way: state_to_json of everything
        self.msgs = 0

    def block(self, msgs: list[Any]) -> None:
        h = self.height + 1
        ctx = BlockContext(height=h, time_ns=h, prev_block_hash=self.prev)
        c0, t0 = time.process_time(), time.perf_counter()
        begin_block(self.state, ctx)
        for i, m in enumerate(msgs):
            process_msg(self.state, m, TxContext(height=h, time_ns=h, tx_hash=_h(h, i), signer=m.creator))
        end_block(self.state, ctx)
        t1, c1 = time.perf_counter(), time.process_time()
        digest = app_hash(self.state)
        t2, c2 = time.perf_counter(), time.process_time()
        block_hash = hashlib.sha256(h.to_bytes(8, "big") + digest).hexdigest()
        header = {"height": h, "app_hash": digest.hex(), "prev_block_hash": self.prev, "time_ns": h}
        stats = self.store.commit_block(
            BlockResult(header=header, hash=block_hash, txs=[], results=[], events=[]), self.state
        )
        t3, c3 = time.perf_counter(), time.process_time()
        self.cpu_s.append(c3 - c0)
        self.cpu_parts.append((c1 - c0, c2 - c1, c3 - c2))
        self.module_s.append(t1 - t0)
        self.hash_s.append(t2 - t1)
        self.persist_s.append(t3 - t2)
        self.persist_bytes.append(stats.bytes)
        self.persist_rows.append(stats.rows)
        run = self.state.runs.get(1)
        self.outer.append(run.current_step if run else 0)
        if h % SAMPLE_EVERY == 0:
            t4 = time.perf_counter()
            text = state_to_json(self.state)
            t5 = time.perf_counter()
            hashlib.sha256(text.encode()).digest()
            self.sampled.append((self.hash_s[-1], time.perf_counter() - t5))
            self.json_persist_s.append(t5 - t4)
        self.msgs += len(msgs)
        self.height, self.prev = h, block_hash

    def total_ms(self, i: int) -> float:
        return 1000 * (self.module_s[i] + self.hash_s[i] + self.persist_s[i])

    def until(self, height: int) -> None:
        while self.height < height - 1:
            self.block([])


HISTORY_EXTRA = 2000
"""The history probe: sealed outer steps added behind the run's own 20, to show what history costs an
idle block's module + app hash (the only per-block term that visits every step: one cached digest
each)."""


def _idle_hash_cpu_ms(state: ChainState, height: int, blocks: int = 20) -> float:
    """Median CPU ms of an idle block's begin_block + end_block + app hash."""
    times = []
    for h in range(height + 1, height + 1 + blocks):
        ctx = BlockContext(height=h, time_ns=h, prev_block_hash=_h("probe", h))
        c0 = time.process_time()
        begin_block(state, ctx)
        end_block(state, ctx)
        app_hash(state)
        times.append(1000 * (time.process_time() - c0))
    return statistics.median(times)


def history_probe(state: ChainState, height: int) -> tuple[float, float]:
    """(idle block CPU ms with the run's history, and with HISTORY_EXTRA more sealed steps). The
    extra steps are the last sealed step's object under new keys (its digest is cached, as every
    sealed step's is); the state is not persisted afterwards."""
    before = _idle_hash_cpu_ms(state, height)
    run = state.runs[1]
    sealed_step = run.steps[max(run.steps)]
    for k in range(max(run.steps) + 1, max(run.steps) + 1 + HISTORY_EXTRA):
        run.steps[k] = sealed_step
    app_hash(state)  # the one pass that sees the new keys
    return before, _idle_hash_cpu_ms(state, height + 100)


def simulate(n_hosts: int, n_verifiers: int, outer_steps: int, folder: Path) -> dict[str, Any]:
    authority = _addr("authority")
    hosts = [_addr(f"host{i}") for i in range(n_hosts)]
    verifiers = [_addr(f"verifier{i}") for i in range(n_verifiers)]
    genesis = Genesis(
        authority=authority,
        accounts={a: 1000 * GNK for a in [authority, *hosts, *verifiers]},
        reward_pool=10**9 * GNK,
    )
    config = RunConfig(
        model=ModelSpec(factory="trainer.model:tiny", config={"param_count": 1000}),
        dataset_manifest_hash=_h("data"),
        initial_model_hash=_h("g", 0),
        inner_steps=10,
        segment_len=2,
        sampled_segments=2,
        verifiers_per_contribution=3,
        codec=Codec.INT8,
        max_outer_steps=outer_steps,
        phases=Phases(join_blocks=1, train_blocks=2, reveal_blocks=2, verify_blocks=2, result_blocks=2),
        stake=Stake(min_host_stake=GNK, min_verifier_stake=GNK),
    )
    leaves = {
        h: [hashlib.sha256(f"{h}:{i}".encode()).digest() for i in range(config.n_segments + 1)] for h in hosts
    }
    root = {h: merkle.merkle_root(leaves[h]).hex() for h in hosts}
    env = EnvFingerprint(torch_version="2.13.0", threads=1)
    d = Driver(genesis_state(genesis), Store(folder / "chain.sqlite"))
    d.block([MsgCreateRun(creator=authority, config=config)])
    d.block(
        [MsgJoinRun(creator=a, run_id=1, role=Role.HOST, endpoint="http://h", stake=GNK) for a in hosts]
        + [
            MsgJoinRun(creator=a, run_id=1, role=Role.VERIFIER, endpoint="http://v", stake=GNK)
            for a in verifiers
        ]
    )
    for n in range(outer_steps):
        step = queries.outer_step(d.state, 1)
        d.until(step["train_start"])
        base = step["base_model_hash"]
        d.block(
            [
                MsgCommitPseudoGradient(
                    creator=h,
                    run_id=1,
                    outer_step=n,
                    base_model_hash=base,
                    trajectory_root=root[h],
                    leaf_count=config.n_segments + 1,
                    delta_hash=_h("d", h, n),
                    final_optimizer_hash=_h("o", h, n),
                    codec=config.codec,
                    tokens=config.tokens_per_outer_step,
                    env=env,
                )
                for h in hosts
            ]
        )
        d.until(step["challenge_height"] + 1)
        challenges = queries.challenges(d.state, 1)["challenges"]
        reveals = []
        for c in challenges:
            lv = leaves[c["host"]]
            openings = [
                SegmentOpening(
                    segment=j,
                    start_leaf=lv[j].hex(),
                    end_leaf=lv[j + 1].hex(),
                    proof=[p.hex() for p in merkle.pair_proof(lv, j)],
                )
                for j in c["segments"]
            ]
            reveals.append(
                MsgRevealContribution(creator=c["host"], run_id=1, outer_step=n, openings=openings)
            )
        d.block(reveals)
        d.block(
            [
                MsgSubmitVerdict(
                    creator=v,
                    run_id=1,
                    outer_step=n,
                    host=c["host"],
                    reason=Reason.ACCEPT,
                    evidence_hash=_h("e", v, c["host"]),
                )
                for c in challenges
                for v in c["verifiers"]
            ]
        )
        d.until(step["verify_deadline"] + 1)
        answered = False
        while (info := queries.outer_step(d.state, 1))["phase"] != "AWAITING_RESULT":
            audits = []
            if info["audit_seed"] is not None and not answered:  # the drawn auditors accept
                answered = True
                audits = [
                    MsgSubmitVerdict(creator=v, run_id=1, outer_step=n, host=c["host"], reason=Reason.ACCEPT,
                                     evidence_hash=_h("a", v, c["host"]))
                    for c in queries.challenges(d.state, 1)["challenges"] if c["audited"]
                    for v, r in c["verifier_rounds"].items() if r == info["round"]
                ]  # fmt: skip
            d.block(audits)
        d.block(
            [
                MsgSubmitOuterResult(creator=h, run_id=1, outer_step=n, model_hash=_h("g", n + 1))
                for h in hosts[: n_hosts // 2 + 1]
            ]
        )
    assert queries.run(d.state, 1)["status"] == "finished"
    idle_from = len(d.module_s)
    for _ in range(IDLE_TAIL):  # idle blocks with the whole history behind them
        d.block([])
    idle = range(idle_from, len(d.module_s))
    busy = [m for m in d.module_s if m > 0.001]
    t0 = time.perf_counter()
    text = state_to_json(d.state)
    t1 = time.perf_counter()
    restored = state_from_json(text)
    t2 = time.perf_counter()
    cold = app_hash(restored)
    t3 = time.perf_counter()
    assert cold == app_hash(d.state) == app_hash(d.state, cached=False), "cached app hash went stale"
    d.store.close()
    reopened = Store(folder / "chain.sqlite")
    t4 = time.perf_counter()
    loaded, header, _ = reopened.load_state()  # rows -> state, app hash from cold, checked
    t5 = time.perf_counter()
    reopened.close()
    assert header is not None and app_hash(loaded) == cold and loaded == d.state
    idle_hash_history, idle_hash_more_history = history_probe(d.state, d.height)
    per_step: dict[int, list[float]] = {}
    cpu_step: dict[int, list[float]] = {}
    for i, step in enumerate(d.outer):
        per_step.setdefault(step, []).append(d.total_ms(i))
        cpu_step.setdefault(step, []).append(1000 * d.cpu_s[i])
    first, last = min(per_step), max(per_step)
    cpu_means = [statistics.mean(cpu_step[s]) for s in sorted(cpu_step)]
    busy_blocks = [i for i in range(len(d.module_s)) if d.persist_rows[i] > 2]  # messages or phase work
    totals = [d.total_ms(i) for i in range(len(d.module_s))]
    db_bytes = sum(p.stat().st_size for p in folder.iterdir())
    return {
        "hosts": n_hosts,
        "verifiers": n_verifiers,
        "outer_steps": outer_steps,
        "blocks": d.height,
        "messages": d.msgs,
        "node_ms_per_block_mean": statistics.mean(totals),
        "node_ms_per_block_median": statistics.median(totals),
        "node_ms_per_block_max": max(totals),
        "node_ms_per_block_first_outer_step": statistics.mean(per_step[first]),
        "node_ms_per_block_last_outer_step": statistics.mean(per_step[last]),
        "node_ms_per_block_last_over_first": statistics.mean(per_step[last])
        / statistics.mean(per_step[first]),
        "blocks_per_outer_step_last": len(per_step[last]),
        "node_ms_per_busy_block_mean": statistics.mean(d.total_ms(i) for i in busy_blocks),
        "node_cpu_ms_per_busy_block_mean": 1000 * statistics.mean(d.cpu_s[i] for i in busy_blocks),
        "node_cpu_ms_per_busy_block_max": 1000 * max(d.cpu_s[i] for i in busy_blocks),
        "busy_blocks": len(busy_blocks),
        "node_cpu_ms_per_block_mean": 1000 * statistics.mean(d.cpu_s),
        "node_cpu_ms_per_block_outer_step_min": min(cpu_means),
        "node_cpu_ms_per_block_outer_step_max": max(cpu_means),
        "node_cpu_ms_last5_over_first5_outer_steps": statistics.mean(cpu_means[-5:])
        / statistics.mean(cpu_means[:5]),
        "node_cpu_ms_per_block_first_outer_step": statistics.mean(cpu_step[first]),
        "node_cpu_ms_per_block_last_outer_step": statistics.mean(cpu_step[last]),
        "cpu_ms_mean_module": 1000 * statistics.mean(p[0] for p in d.cpu_parts),
        "cpu_ms_mean_app_hash": 1000 * statistics.mean(p[1] for p in d.cpu_parts),
        "cpu_ms_mean_persist": 1000 * statistics.mean(p[2] for p in d.cpu_parts),
        "idle_block_after_history_ms": statistics.median(d.total_ms(i) for i in idle),
        "idle_block_after_history_cpu_ms": statistics.median(1000 * d.cpu_s[i] for i in idle),
        "idle_block_hash_cpu_ms_after_history": idle_hash_history,
        f"idle_block_hash_cpu_ms_after_{HISTORY_EXTRA}_more_steps": idle_hash_more_history,
        "idle_block_after_history_persist_ms": statistics.median(1000 * d.persist_s[i] for i in idle),
        "module_s_total": sum(d.module_s),
        "module_ms_per_msg": 1000 * sum(d.module_s) / d.msgs,
        "module_ms_per_block_mean": 1000 * statistics.mean(d.module_s),
        "module_ms_per_block_max": 1000 * max(d.module_s),
        "module_ms_per_busy_block_median": 1000 * statistics.median(busy) if busy else 0.0,
        "app_hash_ms_mean": 1000 * statistics.mean(d.hash_s),
        "app_hash_ms_median": 1000 * statistics.median(d.hash_s),
        "app_hash_ms_max": 1000 * max(d.hash_s),
        "app_hash_ms_last": 1000 * d.hash_s[-1],
        "app_hash_cold_ms": 1000 * (t3 - t2),
        "persist_ms_mean": 1000 * statistics.mean(d.persist_s),
        "persist_ms_median": 1000 * statistics.median(d.persist_s),
        "persist_ms_max": 1000 * max(d.persist_s),
        "persist_ms_last": 1000 * d.persist_s[-1],
        "persist_bytes_per_block_mean": statistics.mean(d.persist_bytes),
        "persist_bytes_per_block_max": max(d.persist_bytes),
        "persist_bytes_idle_block_median": statistics.median(
            b for b, r in zip(d.persist_bytes, d.persist_rows, strict=True) if r <= 1
        ),
        "persist_rows_per_block_mean": statistics.mean(d.persist_rows),
        "restart_load_ms": 1000 * (t5 - t4),
        "db_bytes": db_bytes,
        "sampled_blocks": len(d.sampled),
        "sampled_app_hash_ms_mean": 1000 * statistics.mean(a for a, _ in d.sampled),
        "sampled_json_hash_ms_mean": 1000 * statistics.mean(j for _, j in d.sampled),
        "sampled_json_hash_ms_last": 1000 * d.sampled[-1][1],
        "sampled_json_persist_ms_mean": 1000 * statistics.mean(d.json_persist_s),
        "sampled_json_persist_ms_last": 1000 * d.json_persist_s[-1],
        "state_to_json_ms": 1000 * (t1 - t0),
        "state_from_json_ms": 1000 * (t2 - t1),
        "state_json_bytes": len(text),
    }


def main(quick: bool = False) -> None:
    sizes = (100, 10, 3) if quick else (1000, 100, 20)
    load_start = os.getloadavg()[0]  # wall times on a shared machine follow its load: say what it was
    with tempfile.TemporaryDirectory() as tmp:
        result = simulate(*sizes, folder=Path(tmp))
    result["load_average_1m_start"], result["load_average_1m_end"] = load_start, os.getloadavg()[0]
    result["cpu_count"] = os.cpu_count() or 0
    print(f"{'metric':34s} value")
    for k, v in result.items():
        print(f"{k:34s} {v:,.2f}" if isinstance(v, float) else f"{k:34s} {v:,}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"quick": quick, **result}, indent=2) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    main(quick=ap.parse_args().quick)
