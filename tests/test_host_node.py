"""The host node against the in-process chain: host.toml, G_n on disk, and one full honest outer step.

Also the shared harness of the host tests: `LockstepChain` produces a block only when every
node thread is blocked on the chain, so phases advance exactly as fast as the nodes work (no
wall-clock block timer, no sleeps); verifiers are the real `verifier.node.VerifierNode`.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from chain.client import ChainTimeout
from chain.inprocess import InProcessChain
from nodekit.blobs import BlobClient, BlobUnavailable
from nodekit.globalmodel import GlobalModel, GlobalModelError, GlobalStore
from nodekit.store import ContentStore, StoreError
from protocol.chunks import DEFAULT_CHUNK_BYTES
from protocol.codecs import delta_hash
from protocol.config import Codec, ModelSpec, Phases, RunConfig, Stake
from protocol.keys import test_wallet
from protocol.messages import MsgCreateRun
from replay.data import Corpus, shakespeare_files
from replay.spec import build_model
from trainer.node import HostNode
from trainer.node_config import ConfigError, HostConfig, KeySource, load_host_config
from verifier.behaviour import VerifierBehaviour
from verifier.node import VerifierNode
from verifier.node_config import VerifierConfig

TINY = {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32}
SPEC = ModelSpec(factory="trainer.model:small_gpt", config=TINY)


# ---------------------------------------------------------------- harness


class LockstepChain(InProcessChain):
    """Produces the next block only when every registered actor waits on the chain for
    something that is not there yet: the run advances as fast as its slowest node works."""

    def __init__(self, max_height: int = 3000) -> None:
        super().__init__(auto=False)
        self._actors = 0
        self._blocked: dict[object, Callable[[], Any]] = {}
        self.max_height = max_height
        self._pause_at: int | None = None

    def hold(self) -> None:
        """Count one more actor that never waits: no block is produced until `release`."""
        with self._cond:
            self._actors += 1

    def release(self) -> None:
        with self._cond:
            self._actors -= 1
            self._maybe_produce()

    def run_until(self, height: int, timeout: float = 60.0) -> None:
        """Give up one held slot until the others, in lockstep, reach `height`; then hold again."""
        with self._cond:
            self._pause_at = height
            self._actors -= 1
            try:
                self._maybe_produce()
                while self.app.height < height:
                    if not self._cond.wait(timeout):
                        raise ChainTimeout(f"height {height} not reached within {timeout}s")
            finally:
                self._actors += 1
                self._pause_at = None

    def _maybe_produce(self) -> None:
        while (
            self._blocked
            and len(self._blocked) >= self._actors
            and all(r() is None for r in self._blocked.values())
            and self.app.height < self.max_height
            and (self._pause_at is None or self.app.height < self._pause_at)
        ):
            self.produce_block()

    def _wait(self, ready: Any, timeout: float, what: str) -> Any:
        key = object()
        deadline = time.monotonic() + timeout
        with self._cond:
            try:
                while (value := ready()) is None:
                    self._blocked[key] = ready
                    self._maybe_produce()
                    if ready() is not None:
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or not self._cond.wait(remaining):
                        raise ChainTimeout(f"{what} within {timeout}s")
                return value
            finally:
                self._blocked.pop(key, None)


def tiny_corpus() -> Corpus:
    """60 kB of one play: structured enough that a tiny GPT's loss visibly falls in a few steps."""
    _, files = shakespeare_files()
    data = files[0].read_bytes()[:60_000]
    cut = 54_000
    as_t = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)  # noqa: E731
    return Corpus(as_t(data[:cut]), as_t(data[cut:]), hashlib.sha256(data).hexdigest())


def run_config(corpus: Corpus, **kw: Any) -> RunConfig:
    g0 = GlobalModel.from_module(build_model(SPEC), kw.get("state_chunk_bytes", DEFAULT_CHUNK_BYTES))
    base: dict[str, Any] = dict(
        model=SPEC,
        dataset_manifest_hash=corpus.manifest_hash,
        initial_model_hash=g0.hash,
        batch_size=4,
        seq_len=32,
        inner_steps=10,
        segment_len=5,
        sampled_segments=1,
        verifiers_per_contribution=1,  # one replay per contribution; the security tests raise both
        audit_bps=0,
        data_shards=3,
        codec=Codec.INT8,
        inner={"lr": 1e-3},
        threads=1,
        phases=Phases(
            join_blocks=3,
            train_blocks=3,
            reveal_blocks=3,
            verify_blocks=3,
            escalation_blocks=2,
            result_blocks=3,
            epoch_length=1000,
            poc_window=0,
        ),
        stake=Stake(min_host_stake=10, min_verifier_stake=10),
    )
    return RunConfig(**{**base, **kw})


chain_of: dict[int, InProcessChain] = {}
"""run id -> the chain of the test that created it (tests create one run per chain)."""


def create_run(chain: InProcessChain, cfg: RunConfig) -> int:
    authority = test_wallet(0)
    chain.broadcast(authority, [MsgCreateRun(creator=str(authority.address()), config=cfg)])
    run_id = max(chain.state.runs)
    chain_of[run_id] = chain
    return run_id


def host_config(tmp: Path, index: int, run_id: int, **kw: Any) -> HostConfig:
    return HostConfig(
        chain_url="http://in-process",
        run_id=run_id,
        data_dir=str(tmp / f"host-{index}"),
        stake=1000,
        key=KeySource(test_index=index),
        **kw,
    )


def verifier_node(tmp: Path, index: int, run_id: int, corpus: Corpus) -> VerifierNode:
    """The real verifier node (fetch, proofs, start state, bitwise replay, Δ), honest."""
    cfg = VerifierConfig(
        chain_url="http://in-process",
        run_id=run_id,
        data_dir=str(tmp / f"verifier-{index}"),
        stake=1000,
        key={"test_index": index},
        max_concurrent=1,
    )
    return VerifierNode(
        cfg,
        chain_of[run_id],
        behaviour=VerifierBehaviour(),
        corpus=corpus,
        log=lambda e: None,
        poll_timeout=0.5,
    )


def verdicts(chain: InProcessChain, run_id: int, steps: int) -> list[tuple[int, str, int]]:
    """(outer step, host, reason) of every verdict on chain."""
    out = []
    for n in range(steps):
        for v in chain.query("verdicts", run_id=run_id, step=n)["verdicts"]:
            out.append((n, v["host"], v["reason"]))
    return sorted(out)


def then_stop(fn: Callable[[], None], nodes: list[Any]) -> Callable[[], None]:
    """Run `fn` (a verifier), then stop `nodes` (hosts lingering so it can still fetch from them)."""

    def go() -> None:
        try:
            fn()
        finally:
            for node in nodes:
                node.stop()

    return go


@contextmanager
def running(targets: list[Callable[[], None]], chain: LockstepChain) -> Iterator[list[threading.Thread]]:
    """Run each target in a thread that counts as a chain actor from before it starts (so no
    block slips past it) until it ends; always joined, and its exception re-raised here."""
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def go() -> None:
            try:
                fn()
            except BaseException as e:  # surfaced in the test thread below
                errors.append(e)
            finally:
                chain.release()

        return go

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for t in threads:
        chain.hold()
        t.start()
    try:
        yield threads
    finally:
        for t in threads:
            t.join(120)
    assert not [t for t in threads if t.is_alive()], "a node thread did not stop"
    if errors:
        raise errors[0]


# ---------------------------------------------------------------- host.toml


def test_host_toml_loads_and_rejects_bad_configs(tmp_path: Path) -> None:
    good = tmp_path / "host.toml"
    good.write_text(
        'chain_url = "http://127.0.0.1:26657"\nrun_id = 1\ndata_dir = "h0"\n'
        "behaviour_params = {fraction = 0.5}\n[key]\ntest_index = 3\n"
    )
    cfg = load_host_config(good)
    assert cfg.data_path == tmp_path / "h0" and cfg.threads == 1 and cfg.listen == "127.0.0.1:0"
    assert str(cfg.wallet().address()) == str(test_wallet(3).address())
    head = 'chain_url = "http://x"\ndata_dir = "d"\n'
    key = "[key]\ntest_index = 1\n"
    cases = {
        head + "run_id = 1\ntypo = 1\n" + key: "typo",
        head + "run_id = 0\n" + key: "run_id",
        head + "run_id = 'x'\n" + key: "run_id",
        head + "run_id = 1\nlisten = 'nope'\n" + key: "listen",
        head + "run_id = 1\n[key]\nmnemonic_file = 'm'\ntest_index = 1\n": "exactly one",
        head + "run_id = 1\n": "key",
        "[[[": "not valid TOML",
    }
    bad = tmp_path / "bad.toml"
    for body, needle in cases.items():
        bad.write_text(body)
        with pytest.raises(ConfigError, match=needle):
            load_host_config(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_host_config(tmp_path / "missing.toml")
    loose = tmp_path / "m.txt"
    loose.write_text("abandon " * 11 + "about")
    loose.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        HostConfig(
            chain_url="http://x", run_id=1, data_dir="d", key=KeySource(mnemonic_file=str(loose))
        ).wallet()


# ---------------------------------------------------------------- the global model on disk


def node_globals(node_dir: Path) -> GlobalStore:
    """A node's global models, as `HostNode`/`VerifierNode` keep them (default chunk size)."""
    return GlobalStore(ContentStore(node_dir / "store"))


def test_global_store_verifies_on_read_and_fetches_from_peers(tmp_path: Path) -> None:
    from nodekit.blobs import BlobCatalog, ServerThread, StoredObject, build_app

    model = build_model(SPEC)
    layout = {n: tuple(p.shape) for n, p in model.named_parameters()}
    g0 = GlobalModel.from_module(model, 1024)  # many chunks
    assert all(torch.equal(m, torch.zeros_like(m)) for m in g0.momentum.values())
    store = GlobalStore(ContentStore(tmp_path / "a", 1024), layout)
    store.save(g0)
    assert store.load(g0.hash).hash == g0.hash
    catalog = BlobCatalog(1024)
    catalog.publish("model", g0.hash, StoredObject(store.store, "model", g0.hash))
    other = GlobalStore(ContentStore(tmp_path / "b", 1024), layout)
    with (
        ServerThread(build_app(catalog, dict)) as server,
        BlobClient([server.url], timeout=5, retries=0) as c,
    ):
        got = other.fetch(g0.hash, c)
        assert got.hash == g0.hash and other.has(g0.hash)
        with pytest.raises(BlobUnavailable):
            other.fetch("ab" * 32, c)
    # a flipped byte on disk is caught on the next read
    path = tmp_path / "a" / "global" / f"{g0.hash}.model"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    lazy = store.load(g0.hash)  # tensors are read (and each chunk checked) when used
    with pytest.raises(StoreError, match="corrupted"):
        [lazy.params[n] for n in sorted(lazy.params)]
    with pytest.raises(StoreError, match="corrupted"):
        store.store.verify("model", g0.hash, "global")
    with pytest.raises(ValueError, match="64 lower-case hex"):
        store.has("../etc")


def test_outer_step_only_moves_with_accepted_deltas(tmp_path: Path) -> None:
    from protocol.config import OuterOptim

    g0 = GlobalModel.from_module(build_model(SPEC))
    assert g0.apply([], OuterOptim()) is g0
    delta = {n: torch.full_like(p, 0.01) for n, p in g0.params.items()}
    g1 = g0.apply([("gonka1b", 10, delta), ("gonka1a", 30, delta)], OuterOptim())
    assert g1.hash != g0.hash
    name = next(iter(g0.params))
    # Nesterov from zero momentum: p - lr * (g + mu * g) with g the (equal) mean Δ
    want = g0.params[name] - 0.7 * (0.01 + 0.9 * 0.01)
    assert torch.allclose(g1.params[name], want, atol=1e-6)
    with pytest.raises(GlobalModelError, match="layout"):
        g0.apply([("gonka1a", 1, {name: delta[name]})], OuterOptim())
    with pytest.raises(GlobalModelError, match="tokens"):
        g0.apply([("gonka1a", 0, delta)], OuterOptim())


# ---------------------------------------------------------------- one honest outer step


def test_honest_host_joins_commits_reveals_and_applies_its_accepted_delta(tmp_path: Path) -> None:
    corpus = tiny_corpus()
    chain = LockstepChain()
    cfg = run_config(corpus, max_outer_steps=1)
    run_id = create_run(chain, cfg)
    verifier = verifier_node(tmp_path, 9, run_id, corpus)
    logs: list[dict[str, Any]] = []
    node = HostNode(host_config(tmp_path, 1, run_id), chain, corpus=corpus, log=logs.append, poll_timeout=0.5)
    with running([lambda: node.run(linger=True), then_stop(verifier.run, [node])], chain):
        pass
    events = [e["event"] for e in logs]
    for expected in (
        "listening",
        "joined",
        "trained",
        "committed",
        "revealed",
        "outcome",
        "outer_step_applied",
    ):
        assert expected in events, (expected, events)
    assert verdicts(chain, run_id, 1) == [(0, node.address, 0)]
    step = chain.query("outer_step", run_id=run_id, step=0)
    assert step["accepted"] == [node.address] and step["phase"] == "DONE"
    c = chain.query("commitment", run_id=run_id, host=node.address, step=0)
    assert c["equivocation_tx"] is None
    # the chain adopted the node's G_1, which is on its disk and differs from G_0
    g1 = chain.run(run_id)["global_model_hash"]
    assert g1 != cfg.initial_model_hash and g1 == step["result_hash"]
    assert node_globals(tmp_path / "host-1").load(g1).hash == g1
    assert node.snapshot()["accepted"] == 1 and node.snapshot()["commits"] == 1
    assert "0" in node.snapshot()["val_loss"]
    # the vote carried the host's validation loss of G_1, the one it adopted (specs §2.7)
    assert step["result_losses"] == {node.address: round(node.snapshot()["val_loss"]["0"] * 1e6)}
    # finalized states were pruned and the Δ payload on disk is the committed one
    assert not list((tmp_path / "host-1" / "store").glob("*/*.state"))
    payload = ContentStore(tmp_path / "host-1" / "store").read_bytes("delta", c["delta_hash"])
    assert delta_hash(payload) == c["delta_hash"]
    text = "".join(f"{e}\n" for e in events)
    assert "sitting_out" not in text


def test_cli_refuses_bad_config_and_unknown_behaviour_clearly(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trainer.cli import app

    runner = CliRunner()
    missing = runner.invoke(app, ["run", "--config", str(tmp_path / "nope.toml")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
    toml = tmp_path / "host.toml"
    toml.write_text(
        'chain_url = "http://127.0.0.1:1"\nrun_id = 1\ndata_dir = "d"\nbehaviour = "sneaky"\n'
        "[key]\ntest_index = 1\n"
    )
    unknown = runner.invoke(app, ["run", "--config", str(toml)])
    assert unknown.exit_code == 2 and "unknown behaviour 'sneaky'" in unknown.output


def test_node_refuses_what_would_break_replay_or_mix_identities(tmp_path: Path) -> None:
    from trainer.node import NodeError

    corpus = tiny_corpus()
    chain = InProcessChain()
    run_id = create_run(chain, run_config(corpus))
    wrong_threads = HostNode(
        host_config(tmp_path, 1, run_id, threads=2), chain, corpus=corpus, log=lambda e: None
    )
    with pytest.raises(NodeError, match="threads=2"):
        wrong_threads.run()
    other_data = Corpus(corpus.train[:-1].clone(), corpus.val, "ab" * 32)
    wrong_data = HostNode(host_config(tmp_path, 2, run_id), chain, corpus=other_data, log=lambda e: None)
    with pytest.raises(NodeError, match="dataset"):
        wrong_data.run()
    # host-1's data_dir now belongs to wallet 1: wallet 3 must not pick up its records
    cfg = host_config(tmp_path, 3, run_id).model_copy(update={"data_dir": str(tmp_path / "host-1")})
    with pytest.raises(NodeError, match="belongs to"):
        HostNode(cfg, chain, corpus=corpus, log=lambda e: None)
    assert chain.query("participants", run_id=run_id)["participants"] == []  # nobody joined


def test_behaviour_registry_refuses_unknown_names_and_params() -> None:
    from trainer import behaviour

    assert isinstance(behaviour.resolve("honest"), behaviour.HostBehaviour)
    with pytest.raises(behaviour.BehaviourError, match="does not take"):
        behaviour.resolve("honest", {"fraction": 0.5})
    with pytest.raises(behaviour.BehaviourError, match="unknown behaviour 'nope'"):
        behaviour.resolve("nope")
    behaviour.register("test-not-a-behaviour", lambda: object())
    try:
        with pytest.raises(behaviour.BehaviourError, match="not a HostBehaviour"):
            behaviour.resolve("test-not-a-behaviour")
    finally:
        behaviour._REGISTRY.pop("test-not-a-behaviour")
