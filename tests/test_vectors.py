"""Recompute every committed vector in `specs/vectors/` from its JSON inputs, as another
implementation would, and check the generator still writes the committed files."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from google.protobuf import any_pb2

from protocol import chunks, codecs, merkle, prf
from protocol.envclass import class_fields, class_pair, replay_decision
from protocol.messages import EnvFingerprint, MsgCreateRun, MsgSend
from protocol.outer import eager_scale, eager_start, global_model_hash, outer_update
from protocol.tensors import StateKind, canonical_bytes, tensor_hash
from protocol.wire import from_any, to_any
from specs.make_vectors import (
    BUILDERS,
    VECTORS,
    render,
    replay_blocks,
    scenario_summary,
    set_from_json,
    set_to_json,
    vector_genesis,
)


def load(name: str) -> Any:
    return json.loads((VECTORS / f"{name}.json").read_text())


def test_tensor_vectors() -> None:
    for v in load("tensors"):
        ts = set_from_json(v["input"])
        assert canonical_bytes(ts).hex() == v["output"]["canonical_bytes"]
        for kind in StateKind:
            assert tensor_hash(ts, kind) == v["output"]["hash"][kind.value]


def test_chunk_vectors() -> None:
    for v in load("chunks"):
        i = v["input"]
        data, dom, c = bytes.fromhex(i["bytes"]), bytes.fromhex(i["domain"]), i["chunk_bytes"]
        h, digests = chunks.hash_stream(dom, [data], c)
        assert h == v["output"]["content_hash"]
        assert [d.hex() for d in digests] == v["output"]["digests"]
        assert chunks.mth(digests).hex() == v["output"]["tree_hash"]
        for k, proof in enumerate(v["output"]["chunk_proofs"]):
            a, b = chunks.chunk_span(k, len(data), c)
            pb = [bytes.fromhex(p) for p in proof]
            assert chunks.verify_chunk(h, dom, c, len(data), k, data[a:b], pb)


def test_merkle_vectors() -> None:
    for v in load("merkle"):
        leaves = [bytes.fromhex(x) for x in v["input"]["leaves"]]
        root = bytes.fromhex(v["output"]["root"])
        n = len(leaves)
        assert merkle.merkle_root(leaves) == root
        for i, proof in enumerate(v["output"]["inclusion_proofs"]):
            assert merkle.verify_inclusion(leaves[i], i, n, [bytes.fromhex(p) for p in proof], root)
        for i, proof in enumerate(v["output"]["pair_proofs"]):
            pb = [bytes.fromhex(p) for p in proof]
            assert merkle.verify_pair(leaves[i], leaves[i + 1], i, n, pb, root)


def test_codec_vectors() -> None:
    for v in load("codecs"):
        ts = set_from_json(v["input"]["tensors"])
        if "e" in v["input"]:  # §4.1 error feedback: C(β·e + Δ) and the carried e − C(…)
            from protocol.errorfeedback import EFConfig, ef_hash, ef_step

            i = v["input"]
            ef = EFConfig(i["block_size"], i["topk"], i["ef_decay"])
            payload, e_next = ef_step(set_from_json(i["e"]), ts, ef)
            assert set_to_json(e_next) == v["output"]["e_next"]
            assert ef_hash(e_next) == v["output"]["ef_hash"]
        else:
            payload = codecs.encode(ts, v["input"]["codec"], v["input"]["block_size"], v["input"].get("topk"))
        assert payload.hex() == v["output"]["payload"]
        assert codecs.delta_hash(payload) == v["output"]["delta_hash"]
        layout = {n: tuple(t.shape) for n, t in ts.items()}
        assert set_to_json(codecs.decode(payload, layout)) == v["output"]["decoded"]


def test_prf_vectors() -> None:
    v = load("prf")
    for case in v["prf_bytes"]:
        assert prf.prf_bytes(*case["input"]).hex() == case["output"]
    for case in v["prf_int"]:
        i = case["input"]
        assert prf.prf_int(i["seed"], *i["parts"], bound=i["bound"]) == case["output"]
    for case in v["coin"]:
        assert prf.coin(*case["input"]) == case["output"]
    for case in v["shard_index"]:
        assert prf.shard_index(**case["input"]) == case["output"]
    for case in v["batch_offsets"]:
        assert prf.batch_offsets(**case["input"]) == case["output"]
    for case in v["draw_windows"]:
        i = case["input"]
        got = prf.draw_windows(i["block_hash"], i["host"], i["n_segments"], i["w"], i["slots"])
        assert got == case["output"]["windows"]
        assert prf.windows_opened(got, i["n_segments"], i["w"]) == case["output"]["opened"]
    for case in v["sample_segments"]:
        i = case["input"]
        assert prf.sample_segments(i["block_hash"], i["host"], i["n_segments"], i["s"]) == case["output"]
    for case in v["prf_int_wide"]:
        i = case["input"]
        assert prf.prf_int(i["seed"], *i["parts"], bound=i["bound"]) == case["output"]
    for case in v["assign_verifiers"]:
        i = case["input"]
        got = prf.assign_verifiers(i["block_hash"], i["host"], i["stakes"], i["v"], i["round"], i["exclude"])
        assert got == case["output"]
    for case in v["seed_from_blocks"]:
        assert prf.seed_from_blocks(case["input"]) == case["output"]
    for case in v["audited"]:
        i = case["input"]
        assert prf.audited(i["seed"], i["host"], i["audit_bps"]) is case["output"]


def test_outer_vectors() -> None:
    for v in load("outer"):
        i = v["input"]
        params, momentum = set_from_json(i["params"]), set_from_json(i["momentum"])
        if "payloads" in i:  # §7 over sparse payloads (§4.1)
            from protocol.config import OuterRule, SparseMean
            from protocol.outer import sparse_outer_update

            ps = [(p["host"], p["tokens"], bytes.fromhex(p["payload"])) for p in i["payloads"]]
            new_p, new_m = sparse_outer_update(params, momentum, ps, i["lr"], i["mu"], chunk=i["chunk"],
                                               topk=i["topk"], rule=OuterRule(i["rule"]),
                                               mean=SparseMean(i.get("mean", "hosts")))  # fmt: skip
            assert set_to_json(new_p) == v["output"]["params"]
            assert set_to_json(new_m) == v["output"]["momentum"]
            assert global_model_hash(new_p, new_m) == v["output"]["global_model_hash"]
            continue
        deltas = [(d["host"], d["tokens"], set_from_json(d["delta"])) for d in i["deltas"]]
        new_p, new_m = outer_update(params, momentum, deltas, i["lr"], i["mu"])
        assert set_to_json(new_p) == v["output"]["params"]
        assert set_to_json(new_m) == v["output"]["momentum"]
        assert global_model_hash(new_p, new_m) == v["output"]["global_model_hash"]
        assert global_model_hash(params, momentum) == v["output"]["input_global_model_hash"]
        assert float(eager_scale(i["lr"], i["mu"])) == v["output"]["eager_alpha"]
        if deltas:  # §2.2.1: the first host's eager start from its own Δ
            start = eager_start(params, momentum, deltas[0][2], i["lr"], i["mu"])
            assert set_to_json(start) == v["output"]["eager_start"]


def test_wire_vectors() -> None:
    models = {cls.type_url(): cls for cls in (MsgSend, MsgCreateRun)}
    for v in load("wire"):
        packed = any_pb2.Any(type_url=v["input"]["type_url"], value=bytes.fromhex(v["output"]))
        msg = from_any(packed)
        assert msg.model_dump(mode="json") == v["input"]["json"]
        assert to_any(msg).value.hex() == v["output"]
        if v["input"]["type_url"] in models:
            assert isinstance(msg, models[v["input"]["type_url"]])


def test_envclass_vectors() -> None:
    """The class is recomputable from the JSON alone: sha256(domain || canonical JSON of its fields)."""
    import hashlib

    v = load("envclass")
    for name, env in v["envs"].items():
        want = v["classes"][name]
        assert class_fields(env) == want["class_fields"]
        body = json.dumps(want["class_fields"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert hashlib.sha256(v["domain"].encode() + body.encode()).hexdigest() == want["replay_class"]
        assert EnvFingerprint(**env).replay_class == want["replay_class"]
    classes = {n: SimpleNamespace(replay_class=c["replay_class"]) for n, c in v["classes"].items()}
    h100 = classes["h100"].replay_class
    for d in v["decisions"]:
        host, mine = classes[d["host"]], classes[d["verifier"]]
        assert replay_decision(d["mode"], host, mine).value == d["decision"]
        only = [class_pair(host.replay_class, h100)]
        want = d["decision_if_only_host_h100_calibrated"]
        assert replay_decision(d["mode"], host, mine, only).value == want


def test_chain_vectors() -> None:
    """Replay each scenario's blocks through the state machine: outcomes, stakes and app hash."""
    for v in load("chain"):
        assert v["genesis"] == vector_genesis().model_dump(mode="json")
        assert scenario_summary(replay_blocks(v["blocks"])) == v["output"], v["label"]


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_generator_reproduces_committed_files(name: str) -> None:
    assert render(BUILDERS[name]()) == (VECTORS / f"{name}.json").read_text(), f"run `make vectors` ({name})"


def test_vectors_cover_every_builder() -> None:
    assert sorted(p.stem for p in Path(VECTORS).glob("*.json")) == sorted(BUILDERS)
    assert torch.get_default_dtype() == torch.float32


def test_modelsize_vectors() -> None:
    """§2.4.1: the chain's exact count of a model from its spec, and MsgCreateRun's decision on it."""
    from chain.errors import ChainError
    from chain.module import check_model_size
    from chain.params import ModuleParams
    from protocol.config import ModelSpec, RunConfig
    from protocol.modelsize import ModelSizeError, model_size

    params = ModuleParams()
    for v in load("modelsize"):
        spec = ModelSpec.model_validate(v["input"]["model"])
        out = v["output"]
        try:
            size = model_size(spec)
            got = {"params": size.params, "tensors": size.tensors, "context": size.context}
            assert got == {k: out[k] for k in got}
        except ModelSizeError:
            assert out["params"] is None
        h = "0" * 64
        seq_len = v["input"]["seq_len"]
        run = RunConfig(model=spec, dataset_manifest_hash=h, initial_model_hash=h, seq_len=seq_len)
        try:
            check_model_size(run, params.max_model_params, params.max_model_tensors)
            assert out["create_run"] == "accepted"
        except ChainError as e:
            assert out["create_run"] == e.name


def test_strict_vectors() -> None:
    """§1: amount strings as sdk.Int; a decoder refuses a non-finite double, naming its field."""
    from protocol.amounts import parse_sdk_int
    from protocol.wire import WireError

    v = load("strict")
    for a in v["amounts"]:
        if a["value"] is None:
            with pytest.raises(ValueError):
                parse_sdk_int(a["text"])
        else:
            assert parse_sdk_int(a["text"]) == a["value"]
    for bad in v["non_finite"]:
        packed = any_pb2.Any(type_url=bad["type_url"], value=bytes.fromhex(bad["bytes"]))
        with pytest.raises(WireError, match="finite"):
            from_any(packed)
