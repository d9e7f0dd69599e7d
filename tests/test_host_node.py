"""The host node against the in-process chain: host.toml, G_n on disk, and one full honest outer step.

Also the shared harness of the host tests: `LockstepChain` produces a block only when every
node thread is blocked on the chain, so phases advance exactly as fast as the nodes work (no
wall-clock block timer, no sleeps); verifiers are the real `verifier.node.VerifierNode`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from chain.inprocess import InProcessChain
from nodekit.blobs import BlobClient, BlobUnavailable
from nodekit.globalmodel import GlobalModel, GlobalModelError, GlobalStore
from nodekit.store import ContentStore, StoreError
from protocol.codecs import delta_hash
from protocol.keys import test_wallet
from replay.data import Corpus
from replay.spec import build_model
from tests.support.nodes import (
    QUICK_HOST,
    SPEC,
    LockstepChain,
    create_run,
    host_config,
    node_globals,
    run_config,
    running,
    then_stop,
    tiny_corpus,
    verdicts,
    verifier_node,
)
from trainer.node import HostNode
from trainer.node_config import ConfigError, HostConfig, KeySource, load_host_config

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
    node = HostNode(host_config(tmp_path, 1, run_id), chain, corpus=corpus, log=logs.append,
        patience=QUICK_HOST)
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

    from gonka_diloco.host_cli import app

    runner = CliRunner()
    missing = runner.invoke(app, ["run", "--config", str(tmp_path / "nope.toml")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
    toml = tmp_path / "host.toml"
    toml.write_text(
        'chain_url = "http://127.0.0.1:1"\nrun_id = 1\ndata_dir = "d"\nbehaviour = "sneaky"\n'
        "[key]\ntest_index = 1\n"
    )
    unknown = runner.invoke(app, ["run", "--config", str(toml)])
    assert unknown.exit_code == 2 and "unknown host behaviour 'sneaky'" in unknown.output


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


def test_behaviours_are_composed_by_the_caller_never_looked_up_by_the_node(tmp_path: Path) -> None:
    """The composition root (the CLI, `gonka_diloco.adversaries.resolve_host`) builds a behaviour and
    passes it in; the node has no registry: a host.toml naming another behaviour without one is an
    error, and the library refuses unknown names and parameters."""
    from gonka_diloco.adversaries import UnknownBehaviour, resolve_host
    from trainer.behaviour import HostBehaviour
    from trainer.node import NodeError

    assert type(resolve_host("honest")) is HostBehaviour
    with pytest.raises(UnknownBehaviour, match="does not take"):
        resolve_host("honest", {"fraction": 0.5})
    with pytest.raises(UnknownBehaviour, match="unknown host behaviour 'nope'"):
        resolve_host("nope")
    chain = LockstepChain()
    run_id = create_run(chain, run_config(tiny_corpus()))
    with pytest.raises(NodeError, match="'lazy' must be resolved by the caller"):
        HostNode(host_config(tmp_path, 1, run_id, behaviour="lazy"), chain, log=lambda e: None)
    node = HostNode(host_config(tmp_path, 2, run_id, behaviour="lazy"), chain,
                    behaviour=resolve_host("lazy"), log=lambda e: None)  # fmt: skip
    try:
        assert node.behaviour.name == "lazy"
    finally:
        node.rt.close()
