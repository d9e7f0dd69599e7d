"""A data-parallel host in a real run: `torchrun --nproc_per_node 2 … host run` (gloo) against the
devnet chain node and a real verifier, all separate processes.

Rank 0 is the node; rank 1 trains a slice of every batch with it. The host shards its training
state (`shard_state`: each rank 1/2 of the moments, its part of every hash and every saved state).
The commitment records `micro_batches = 2`, the verifier replays it in one process with 2 slices
and accepts it, and the host reports the G_1 the chain records. Every process group is gone at the
end. The unsharded team and the sharded one are also checked against one process, call by call.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gonka_diloco.devnet import node_toml
from gonka_diloco.procs import NodeProcess, Supervisor, python_cli
from nodekit.globalmodel import GlobalModel
from protocol.config import Codec, ModelSpec, Phases, RunConfig, Stake
from protocol.keys import test_wallet
from protocol.messages import MsgCreateRun
from replay.data import Corpus, shakespeare_manifest
from replay.spec import build_model
from replay.step import configure_determinism, make_optimizer
from tests.support.nodes import TINY
from tests.support.procs import gone
from tests.support.replay import HOST as ADDRESS
from tests.support.replay import ROOT, fresh, tiny_cfg, tiny_corpus
from trainer.commit import CommitJob, param_tensors, run_committed

HOST, VERIFIER = 1, 2
STAKE = 1000
BLOCK = 0.2  # seconds
START_TIMEOUT = 60.0


def run_config() -> RunConfig:
    """Tiny GPT, H = 4, k = 2, s = 1, v = 1 on the Shakespeare corpus the CLI nodes load. Training
    is open for ~25 s from the run's creation: enough for torchrun's ranks to start on a busy CPU."""
    spec = ModelSpec(factory="trainer.model:small_gpt", config=TINY)
    _, manifest = shakespeare_manifest()
    return RunConfig(
        name="ddp",
        model=spec,
        dataset_manifest_hash=manifest.manifest_hash(),
        initial_model_hash=GlobalModel.from_module(build_model(spec)).hash,
        inner_steps=4,
        segment_len=2,
        sampled_segments=1,
        window_segments=1,  # two windows: the verifier fetches a start or θ_H's parameters
        verifiers_per_contribution=1,
        batch_size=4,
        seq_len=32,
        codec=Codec.INT8,
        inner={"lr": 1e-3},
        threads=1,
        phases=Phases(
            join_blocks=2,
            min_hosts=1,  # step 0 trains only once the host and the verifier have bonded
            min_verifiers=1,
            train_blocks=int(25 / BLOCK),
            reveal_blocks=int(4 / BLOCK),
            verify_blocks=int(4 / BLOCK),
            escalation_blocks=5,
            result_blocks=int(4 / BLOCK),
            epoch_length=1_000_000,
            poc_window=0,
        ),
        stake=Stake(min_host_stake=10, min_verifier_stake=10),
        max_outer_steps=1,
    )


class Events:
    """Every JSON line the nodes print, and a bounded wait for one (no sleeps)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self._cond = threading.Condition()

    def __call__(self, node: str, event: dict[str, Any]) -> None:
        with self._cond:
            self.seen.append((node, event))
            self._cond.notify_all()

    def wait(self, node: str, match: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        with self._cond:
            found = self._cond.wait_for(
                lambda: next((e for n, e in self.seen if n == node and match(e)), None), timeout
            )
        assert found, f"{node}: no matching event in {timeout}s; saw {[e.get('event') for _, e in self.seen]}"
        return found


def processes_under(root: int) -> list[int]:
    """`root` and all its descendants (torchrun starts each rank in its own session, so a process
    group would not find them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def test_two_rank_host_commits_two_slices_and_is_accepted(tmp_path: Path) -> None:
    from chain.client import HttpChainClient

    events = Events()
    sup = Supervisor(grace=5)
    client: HttpChainClient | None = None
    roots: list[int] = []
    members: set[int] = set()
    t0 = time.monotonic()
    try:
        home = str(tmp_path / "chain")
        argv = python_cli("chain", "start", "--home", home, "--port", "0", "--block-interval", str(BLOCK))
        chain = sup.add(NodeProcess("chain", argv, tmp_path / "chain.log"))
        chain.start()
        url = chain.wait_listening(START_TIMEOUT)
        client = HttpChainClient(url)
        authority = test_wallet(0)
        cfg = run_config()
        client.broadcast(authority, [MsgCreateRun(creator=str(authority.address()), config=cfg)])
        run_id = int(client.query("runs")["runs"][-1]["run_id"])

        def toml(role: str, index: int) -> Path:
            fields = {"chain_url": url, "run_id": run_id, "data_dir": str(tmp_path / role),
                      "listen": "127.0.0.1:0", "stake": STAKE, "threads": 1}  # fmt: skip
            if role == "host":
                fields["shard_state"] = True  # each rank 1/2 of the moments, hashes and saves its part
            path = tmp_path / f"{role}.toml"
            path.write_text(node_toml(fields, {"test_index": index}))
            return path

        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        host = sup.add(
            NodeProcess(
                "host",
                [*torchrun, "-m", "gonka_diloco.cli", "host", "run", "--config", str(toml("host", HOST))],
                tmp_path / "host.log",
                env={"OMP_NUM_THREADS": "1"},
                on_event=events,
            )
        )
        verifier = sup.add(
            NodeProcess(
                "verifier",
                python_cli("verifier", "run", "--config", str(toml("verifier", VERIFIER))),
                tmp_path / "verifier.log",
                on_event=events,
            )
        )
        host.start()
        verifier.start()
        host.wait_listening(START_TIMEOUT)
        verifier.wait_listening(START_TIMEOUT)
        assert host.pid is not None
        roots = [p.pid for p in (chain, host, verifier) if p.pid is not None]
        members = {pid for r in roots for pid in processes_under(r)}
        assert len(processes_under(host.pid)) >= 3  # torchrun and its two ranks

        committed = events.wait("host", lambda e: e.get("event") == "committed", 60)
        events.wait("host", lambda e: e.get("event") == "outcome", 60)
        applied = events.wait("host", lambda e: e.get("event") == "outer_step_applied", 60)
        members |= {pid for r in roots for pid in processes_under(r)}
        assert host.proc is not None and host.proc.wait(60) == 0  # run over: every rank exited cleanly
        assert verifier.proc is not None and verifier.proc.wait(60) == 0

        address = str(test_wallet(HOST).address())
        c = client.query("commitment", run_id=run_id, host=address, step=0)
        assert c["trajectory_root"] == committed["root"]
        assert c["env"]["micro_batches"] == 2  # the world size, so a verifier replays 2 slices
        verdicts = client.query("verdicts", run_id=run_id, step=0)["verdicts"]
        assert [(v["host"], v["verifier"], v["reason"]) for v in verdicts] == [
            (address, str(test_wallet(VERIFIER).address()), 0)  # ACCEPT, after a bitwise replay
        ]
        step = client.query("outer_step", run_id=run_id, step=0)
        assert step["outcomes"] == {address: "accepted"} and step["phase"] == "DONE"
        assert step["result_hash"] == applied["model_hash"] != cfg.initial_model_hash
        assert address in step["result_votes"]  # G_1 as rank 0 computed and reported it
        assert client.run(run_id)["global_model_hash"] == applied["model_hash"]
        log = (tmp_path / "host.log").read_text()
        assert log.count('"event": "listening"') == 1  # only rank 0 serves and logs
        # sharded: each rank saved its part (the carried optimizer state is still on disk), and the
        # verifier fetched what its window needs as the host served it: the window's start (boundary
        # 1, from shard files), or, when its window is segment 0 (short of θ_H), the committed Δ
        kept = sorted(p.name.split(".", 1)[1] for p in (tmp_path / "host" / "store" / "optimizer").iterdir())
        assert kept == ["optimizer.chunks", "optimizer.r0", "optimizer.r1", "optimizer.shards"]
        fetched = [e for n, e in events.seen if n == "verifier" and e.get("event") == "fetched"]
        ch = client.query("challenges", run_id=run_id, step=0)["challenges"][0]
        start = ch["windows"][ch["slots"][str(test_wallet(VERIFIER).address())]]
        assert [e["kind"] for e in fetched] == (["delta"] if start == 0 else ["state"]), (start, fetched)
        assert not [e for n, e in events.seen if e.get("event") in ("sitting_out", "fatal")]
    finally:
        sup.close()
        if client is not None:
            client.close()
    assert all(gone(pid) for pid in members - {os.getpid()}), "a process outlived the test"
    print(f"2-rank DDP host, 1 outer step accepted in {time.monotonic() - t0:.1f}s")


RANK = """
import json, sys
sys.path.insert(0, {root!r})
from tests.test_host_ddp import corpus
from dataclasses import replace
from tests.support.replay import HOST, fresh, tiny_cfg
from trainer import ddp
from trainer.commit import CommitJob, param_tensors
from replay.step import configure_determinism, make_optimizer
configure_determinism(1)
ex = ddp.launch()
cfg = tiny_cfg(dataset_manifest_hash="0" * 64)
if ex.rank:
    print(json.dumps({{"jobs": ddp.follow(ex, corpus=corpus)}}))
else:
    team = ddp.Team(ex)
    model, opt = fresh(cfg)
    g0 = param_tensors(model)
    job = CommitJob(cfg, corpus(), HOST, 0, start_params=g0, base_model_hash="a" * 64)
    roots = [team.train(job, model, opt).trajectory_root]
    # carried moments, and a G_1 only rank 0 computed
    g1 = {{n: p * 0.5 for n, p in param_tensors(model).items()}}
    job1 = replace(job, outer_step=1, start_params=g1, base_model_hash="b" * 64)
    roots.append(team.train(job1, model, opt).trajectory_root)
    # its state thrown away (a fresh optimizer after a rejection), back to G_0
    opt = make_optimizer(model, cfg.inner)
    roots.append(team.train(replace(job, outer_step=2), model, opt).trajectory_root)
    team.close()
    print(json.dumps({{"roots": roots}}))
ddp.shutdown()
"""


def corpus() -> Corpus:
    """`tiny_corpus` under a hash the run config can name (followers check it)."""
    c = tiny_corpus()
    return Corpus(c.train, c.val, "0" * 64)


def two_ranks(code: str, timeout: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run `code` as ranks 0 and 1 of a gloo group (1 thread each); their last JSON lines."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), [o[1][-3000:] for o in outs]
    lead, follower = (json.loads(o[0].strip().splitlines()[-1]) for o in outs)
    return lead, follower


def test_followers_train_from_rank_0s_state_whatever_it_decided(tmp_path: Path) -> None:
    """Two gloo ranks, three training calls: from G_0, then with carried moments from a G_1 only
    rank 0 computed, then with a fresh optimizer (as after a rejection) from G_0 again. The follower
    must start each from what rank 0 holds: every trajectory equals one process training with 2
    slices from the same states."""
    lead, follower = two_ranks(RANK.format(root=str(ROOT)), timeout=60)
    got = lead["roots"]
    assert follower == {"jobs": 3}  # and then it stopped

    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    configure_determinism(1)
    try:
        cfg, data = tiny_cfg(dataset_manifest_hash="0" * 64), corpus()
        model, opt = fresh(cfg)
        g0 = param_tensors(model)

        def root(n: int, g: dict[str, torch.Tensor]) -> str:
            job = CommitJob(cfg, data, ADDRESS, n, micro_batches=2, start_params=g, base_model_hash="0" * 64)
            return run_committed(job, model, opt).trajectory_root

        want = [root(0, g0)]
        want.append(root(1, {n: p * 0.5 for n, p in param_tensors(model).items()}))
        opt = make_optimizer(model, cfg.inner)
        want.append(root(2, g0))
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
    assert got == want


TOLERANCE: dict[str, object] = {
    "replay_mode": "tolerance", "tolerance": 1e-3, "tolerance_exp_avg": 1e-3, "tolerance_exp_avg_sq": 1e-3
}
"""Tolerance mode: hosts keep both ends of each opened segment (bitwise mode: the starts but
segment 0's), so boundaries 0, 1 and 3 are recomputed below."""

SHARDED = """
import json, sys
sys.path.insert(0, {root!r})
from tests.test_host_ddp import corpus
from tests.support.replay import HOST, fresh, tiny_cfg
from tests.test_host_ddp import TOLERANCE
from nodekit.objects import Kind
from trainer import ddp
from trainer.commit import CommitJob, param_tensors
from replay.step import configure_determinism
from nodekit.statestore import StateStore
configure_determinism(1)
ex = ddp.launch()
cfg = tiny_cfg(dataset_manifest_hash="0" * 64, inner_steps=30, state_chunk_bytes=1024, **TOLERANCE)
if ex.rank:
    print(json.dumps({{"jobs": ddp.follow(ex, corpus=corpus)}}))
else:
    team = ddp.Team(ex, shard_state=True)
    store = StateStore({store!r}, chunk_bytes=1024, checkpoint_every=2)
    model = fresh(cfg)[0]
    g0 = param_tensors(model)
    out = []
    carried = None
    for n in range(2):
        g = {{k: p * 0.5**n for k, p in g0.items()}}  # G_1 = G_0 / 2: what rank 0 alone decides
        team.carry(carried, "optimizer")
        opt = team.shard_optimizer(model, cfg, store.content)
        job = CommitJob(cfg, corpus(), HOST, n, start_params=g, base_model_hash="a" * 64, store=store)
        c = team.train(job, model, opt)
        done = team.materialize(job, model, c.leaves, [0, 2])
        opened = all(store.has(c.leaves[j], n) for j in (0, 1, 2, 3))
        out.append([c.leaves, c.final_optimizer_hash, done, opened, store.hashes(n)])
        carried = c.final_optimizer_hash
    team.close()
    print(json.dumps({{"steps": out}}))
ddp.shutdown()
"""


def test_a_sharded_team_trains_hashes_saves_and_recomputes_the_unsharded_trajectory(tmp_path: Path) -> None:
    """Two gloo ranks with sharded optimizer state, 1 KiB chunks (chunks straddle the ranks'
    ranges), m = 2: two outer steps (fresh, then carried moments from the shard files of the
    first step's final optimizer state). Leaves and final optimizer hashes equal one process
    training 2 slices unsharded; in tolerance mode boundaries 0, 1 (from G_n) and 3 (from
    persisted boundary 2) are recomputed by both ranks, and only the opened ones stay on disk."""
    lead, follower = two_ranks(SHARDED.format(root=str(ROOT), store=str(tmp_path / "store")), timeout=120)
    got = lead["steps"]
    assert follower == {"jobs": 4}  # 2 trains, 2 recomputes

    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    configure_determinism(1)
    try:
        cfg = tiny_cfg(dataset_manifest_hash="0" * 64, inner_steps=30, state_chunk_bytes=1024, **TOLERANCE)
        data = corpus()
        model, opt = fresh(cfg)
        g0 = param_tensors(model)
        for n in range(2):
            g = {k: p * 0.5**n for k, p in g0.items()}
            job = CommitJob(cfg, data, ADDRESS, n, micro_batches=2, start_params=g, base_model_hash="a" * 64)
            c = run_committed(job, model, opt)
            leaves, opt_hash, done, opened, kept = got[n]
            assert (leaves, opt_hash) == (c.leaves, c.final_optimizer_hash)
            assert done == [0, 1, 3] and opened
            assert sorted(kept) == sorted(set(c.leaves[:4]))  # boundary 2 (a source) stays: opened
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
