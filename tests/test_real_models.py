"""A Hugging Face Llama on a prepared token-shard dataset, from an init checkpoint, through the real
nodes on the in-process chain: replayed bitwise and accepted, every node on the same G_0 and G_1,
and the finished run's final model as the next run's start."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from nodekit.globalmodel import GlobalModel, GlobalStore
from nodekit.node import NodeError
from nodekit.store import ContentStore
from protocol.config import ModelSpec
from protocol.messages import Reason
from replay.checkpoint import CheckpointError, initial_global, load_params
from replay.data import open_dataset, shakespeare_files
from replay.hf import hf_names, spec_config
from replay.prepare import PrepareOptions, prepare
from replay.spec import build_model
from tests.support.nodes import (
    QUICK_HOST,
    QUICK_VERIFIER,
    LockstepChain,
    create_run,
    host_config,
    run_config,
    running,
    then_stop,
    verdicts,
)
from trainer.node import HostNode
from verifier.behaviour import VerifierBehaviour
from verifier.node import VerifierNode
from verifier.node_config import VerifierConfig

BPE_VOCAB = 300
LLAMA = ModelSpec(factory="trainer.hf:llama", config=spec_config("llama", "tiny", vocab_size=BPE_VOCAB))


def _dataset(tmp: Path) -> Path:
    """60 kB of a play, tokenized with a BPE trained on it, in several shards."""
    _, files = shakespeare_files()
    (tmp / "play.txt").write_bytes(files[0].read_bytes()[:60_000])
    prepare([str(tmp / "play.txt")], tmp / "ds", PrepareOptions(train_bpe=BPE_VOCAB, shard_tokens=8000))
    return tmp / "ds"


def _pretrained(tmp: Path) -> Path:
    """A "pretrained" Hugging Face model folder: other weights than the seeded init, HF tensor names."""
    other = build_model(LLAMA.model_copy(update={"config": {**LLAMA.config, "seed": 7}}))
    names = hf_names(other)
    folder = tmp / "pretrained"
    folder.mkdir()
    save_file({names[n]: p.detach().contiguous() for n, p in other.named_parameters()},
              str(folder / "model.safetensors"))  # fmt: skip
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return folder


def test_llama_from_a_checkpoint_on_token_shards_is_replayed_and_accepted(tmp_path: Path) -> None:
    from gonka_diloco.run_cli import save_final_model

    ds, ckpt = _dataset(tmp_path), _pretrained(tmp_path)
    corpus = open_dataset(str(ds))
    g0 = initial_global(build_model(LLAMA), ckpt)
    assert g0.hash != GlobalModel.from_module(build_model(LLAMA)).hash  # the checkpoint, not the seed
    chain = LockstepChain()
    cfg = run_config(
        corpus, model=LLAMA, initial_model_hash=g0.hash, inner_steps=10, segment_len=5, sampled_segments=2,
        data_shards=2, max_outer_steps=1,
    )  # fmt: skip
    run_id = create_run(chain, cfg)
    logs: list[dict[str, Any]] = []
    hosts = [  # only host-1 holds the checkpoint; host-2 and the verifier fetch G_0 by its hash
        HostNode(host_config(tmp_path, 1, run_id, dataset=str(ds), init_checkpoint=str(ckpt)), chain,
                 log=logs.append, patience=QUICK_HOST),
        HostNode(host_config(tmp_path, 2, run_id, dataset=str(ds)), chain, log=logs.append,
            patience=QUICK_HOST),
    ]  # fmt: skip
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    verifier = VerifierNode(  # the verifier reads the shards over HTTP
        VerifierConfig(chain_url="http://in-process", run_id=run_id, data_dir=str(tmp_path / "verifier"),
                       stake=1000, key={"test_index": 9}, max_concurrent=1,
                       dataset=f"http://127.0.0.1:{server.server_address[1]}/ds"),
        chain, behaviour=VerifierBehaviour(), log=logs.append, patience=QUICK_VERIFIER,
    )  # fmt: skip
    final: list[Path] = []

    def verify_then_take_the_final_model() -> None:
        verifier.run()
        final.append(save_final_model(chain, run_id, tmp_path / "final.safetensors"))  # hosts still linger

    try:
        with running([lambda h=h: h.run(linger=True) for h in hosts]
                     + [then_stop(verify_then_take_the_final_model, hosts)], chain):  # fmt: skip
            pass
    finally:
        server.shutdown()
        server.server_close()
    accept = Reason.ACCEPT.value
    assert verdicts(chain, run_id, 1) == sorted((0, h.address, accept) for h in hosts)
    step = chain.query("outer_step", run_id=run_id, step=0)
    assert step["accepted"] == sorted(h.address for h in hosts) and step["base_model_hash"] == g0.hash
    g1 = chain.run(run_id)["global_model_hash"]
    layout = {n: tuple(p.shape) for n, p in build_model(LLAMA).named_parameters()}

    def node_globals(d: Path) -> GlobalStore:
        return GlobalStore(ContentStore(d / "store", cfg.state_chunk_bytes), layout)

    for d in (hosts[0].dir, hosts[1].dir, tmp_path / "verifier"):
        assert node_globals(d).load(g1).hash == g1
    fetching = [e for e in logs if e["event"] == "fetching_global" and e["model_hash"] == g0.hash]
    fetchers = sorted(e["node"] for e in fetching)
    assert fetchers == ["host-2", "verifier"]  # the host with the checkpoint builds G_0 from it
    assert all(e["event"] != "sitting_out" for e in logs)
    # the finished run's final model starts the next run: its parameters, zero momentum
    nxt = initial_global(build_model(LLAMA), final[0])
    assert nxt.hash == GlobalModel.create(node_globals(hosts[0].dir).load(g1).params).hash


def test_a_node_refuses_a_checkpoint_that_is_not_the_runs_start(tmp_path: Path) -> None:
    ckpt = _pretrained(tmp_path)
    model = build_model(LLAMA)
    corpus = open_dataset(str(_dataset(tmp_path)))
    chain = LockstepChain()
    run_id = create_run(
        chain, run_config(corpus, model=LLAMA, initial_model_hash=GlobalModel.from_module(model).hash)
    )
    node = HostNode(host_config(tmp_path, 1, run_id, dataset=str(tmp_path / "ds"), init_checkpoint=str(ckpt)),
                    chain, log=lambda e: None)  # fmt: skip
    try:
        with pytest.raises(NodeError, match=r"init_checkpoint .* gives G_0"):
            node._setup()
    finally:
        node.rt.close()


def test_checkpoint_forms_and_their_errors(tmp_path: Path) -> None:
    model = build_model(LLAMA)
    folder = _pretrained(tmp_path)
    from_folder = load_params(model, folder)
    ours = {n: t.clone() for n, t in from_folder.items()}
    save_file(ours, str(tmp_path / "ours.safetensors"))  # our own names load the same
    assert all(
        torch.equal(load_params(model, tmp_path / "ours.safetensors")[n], t) for n, t in from_folder.items()
    )
    half = {n: t.to(torch.bfloat16) for n, t in ours.items()}  # bf16 checkpoints become float32 G_0
    save_file(half, str(tmp_path / "half.safetensors"))
    assert (
        initial_global(model, tmp_path / "half.safetensors").params[next(iter(ours))].dtype == torch.float32
    )
    broken = dict(ours)
    broken.pop(next(iter(broken)))
    save_file(broken, str(tmp_path / "missing.safetensors"))
    with pytest.raises(CheckpointError, match="lacks 1"):
        load_params(model, tmp_path / "missing.safetensors")
    wrong = {n: torch.zeros(3) for n in ours}
    save_file(wrong, str(tmp_path / "wrong.safetensors"))
    with pytest.raises(CheckpointError, match="needs"):
        load_params(model, tmp_path / "wrong.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
    with pytest.raises(CheckpointError, match="not a readable"):
        load_params(model, tmp_path / "junk.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        load_params(model, tmp_path / "empty")


def test_run_create_binds_dataset_and_checkpoint(tmp_path: Path) -> None:
    from gonka_diloco.run_cli import RunConfigFileError, load_run_config

    ds, ckpt = _dataset(tmp_path), _pretrained(tmp_path)
    toml = tmp_path / "run.toml"
    toml.write_text('name = "mine"\n[model]\nfactory = "trainer.hf:llama"\n'
                    f'config = {{preset = "tiny", vocab_size = {BPE_VOCAB}}}\n')  # fmt: skip
    cfg = load_run_config(toml, dataset=str(ds), init_checkpoint=ckpt)
    assert cfg.dataset_manifest_hash == open_dataset(str(ds)).manifest_hash
    assert cfg.initial_model_hash == initial_global(build_model(LLAMA), ckpt).hash
    assert cfg.model == LLAMA  # the preset is expanded and pinned to the transformers version
    toml.write_text('[model]\nfactory = "trainer.hf:llama"\nconfig = {preset = "tiny"}\n')
    with pytest.raises(RunConfigFileError, match="vocabulary"):  # 300 BPE tokens, 256 embeddings
        load_run_config(toml, dataset=str(ds))
    old = {**LLAMA.config, "transformers_version": "0.0.1"}
    with pytest.raises(ValueError, match=r"defined by transformers 0\.0\.1"):  # a node refuses other maths
        build_model(LLAMA.model_copy(update={"config": old}))


def test_devnet_model_option_puts_a_complete_llama_spec_on_chain() -> None:
    from gonka_diloco.devnet import run_config as devnet_run_config
    from gonka_diloco.devnet_config import DevnetConfigError, make_config

    cfg = devnet_run_config(make_config({"model": "llama-tiny", "seed": 3}))
    assert cfg.model == ModelSpec(factory="trainer.hf:llama", config=spec_config("llama", "tiny", seed=3))
    assert cfg.initial_model_hash == GlobalModel.from_module(build_model(cfg.model)).hash
    with pytest.raises(DevnetConfigError, match="context"):
        make_config({"model": "llama-tiny", "seq_len": 256})
    with pytest.raises(DevnetConfigError, match="model"):
        make_config({"model": "llama-huge"})


def test_devnet_dataset_reaches_every_node_toml(tmp_path: Path) -> None:
    from gonka_diloco.devnet import Devnet
    from gonka_diloco.devnet_config import make_config
    from trainer.node_config import load_host_config
    from verifier.node_config import load_verifier_config

    ds = tmp_path / "ds"
    with Devnet(make_config({"dataset": str(ds), "model": "llama-tiny"}), tmp_path / "run") as dn:
        dn.run_id = 1  # as after `create_run`
        dn._add_node("host-0", "host", 1, "honest", {}, "http://127.0.0.1:1")
        dn._add_node("verifier-0", "verifier", 2, "honest", {}, "http://127.0.0.1:1")
    assert load_host_config(tmp_path / "run" / "host-0" / "host.toml").dataset_source == str(ds)
    assert load_verifier_config(tmp_path / "run" / "verifier-0" / "verifier.toml").dataset_source == str(ds)
