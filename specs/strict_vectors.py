"""Vectors of the strict-input rules (issue 23), for `make vectors`: `modelsize.json` (§2.4.1: the
chain's exact parameter and tensor counts, and its MsgCreateRun decision at the default module
params) and `strict.json` (§1: amount strings as `sdk.Int`, non-finite doubles on the wire).
Inputs are spelled out; `tests/test_vectors.py` recomputes every output from the JSON."""

from __future__ import annotations

import math
from typing import Any

from chain.errors import ChainError
from chain.module import check_model_size
from chain.params import ModuleParams
from protocol.amounts import MAX_AMOUNT
from protocol.config import ModelSpec, RunConfig
from protocol.modelsize import ModelSizeError, model_size
from protocol.wire import to_proto

H = "0" * 64
LLAMA_TINY: dict[str, Any] = {
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "initializer_range": 0.02, "tie_word_embeddings": False,
    "attn_implementation": "sdpa", "seed": 0, "transformers_version": "5.24.0",
}  # fmt: skip
SPECS: list[tuple[str, dict[str, Any], int]] = [  # (factory, config, seq_len)
    ("trainer.model:small_gpt", {}, 64),
    ("trainer.model:small_gpt", {"n_layer": 3, "n_head": 3, "n_embd": 48, "block_size": 40, "bias": True},
     32),
    ("trainer.model:small_gpt", {"n_embd": 65536}, 64),  # issue 23: 206 billion parameters
    ("trainer.model:small_gpt", {"vocab_size": 2**31}, 64),
    ("trainer.model:small_gpt", {"n_layer": 100_000, "n_embd": 8, "n_head": 1}, 64),  # 600,004 tensors
    ("trainer.model:small_gpt", {"block_size": 16}, 64),  # seq_len beyond the context
    ("trainer.model:small_gpt", {"n_embd": 10, "n_head": 3}, 64),
    ("trainer.model:small_gpt", {"n_layer": 2.0}, 64),
    ("trainer.hf:llama", LLAMA_TINY, 64),
    ("trainer.hf:qwen2", LLAMA_TINY, 64),
    ("trainer.hf:llama", {**LLAMA_TINY, "hidden_size": 2**17, "intermediate_size": 2**17}, 64),
    ("trainer.hf:llama", {"preset": "tiny"}, 64),
    ("mine:model", {"param_count": 123_456}, 64),
    ("mine:model", {"width": 3}, 64),
    ("trainer.model:small_gpt", {"param_count": 869_504}, 64),
    ("trainer.model:small_gpt", {"param_count": 869_505}, 64),
]


def modelsize_vectors() -> list[dict[str, Any]]:
    params = ModuleParams()
    out = []
    for factory, config, seq_len in SPECS:
        spec = ModelSpec(factory=factory, config=config)
        output: dict[str, Any] = {}
        try:
            size = model_size(spec)
            output.update(params=size.params, tensors=size.tensors, context=size.context)
        except ModelSizeError:
            output["params"] = None
        run = RunConfig(model=spec, dataset_manifest_hash=H, initial_model_hash=H, seq_len=seq_len)
        try:
            check_model_size(run, params.max_model_params, params.max_model_tensors)
            output["create_run"] = "accepted"
        except ChainError as e:
            output["create_run"] = e.name
        out.append({"input": {"model": spec.model_dump(mode="json"), "seq_len": seq_len}, "output": output})
    return out


AMOUNTS = ["0", "7", "007", "400000", str(MAX_AMOUNT), "9" * 78, "", " 1", "1 ", "+1", "-1", "1_000",
           "0x10", "1e3", "1.0", "\u00b2\u2070\u2070", "\u0661\u0662\u0663", "\uff11\uff12", "9" * 79,
           str(MAX_AMOUNT + 1)]  # fmt: skip


def _parse(text: str) -> int | None:
    ok = 0 < len(text) <= 78 and all("0" <= c <= "9" for c in text) and int(text) <= MAX_AMOUNT
    return int(text) if ok else None


def strict_vectors() -> dict[str, Any]:
    """`amounts`: each text and its value, or null where it is refused. `non_finite`: wire bytes of
    a MsgCreateRun whose one double is NaN or ±inf, which a decoder must refuse (naming `field`)."""
    from protocol.messages import MsgCreateRun

    cfg = RunConfig(model=ModelSpec(factory="trainer.model:small_gpt", config={"dropout": 0.1}),
                    dataset_manifest_hash=H, initial_model_hash=H)  # fmt: skip
    creator = "gonka1k4swv40ur28fvu54p8mskjj4lxkgsj07u9f8ny"
    msg = MsgCreateRun(creator=creator, config=cfg)
    bad = []
    for field, value in (("inner.lr", math.nan), ("outer.momentum", math.inf), ("tolerance", -math.inf),
                         ("model.config.dropout", math.nan)):  # fmt: skip
        pb = to_proto(msg)
        if field == "model.config.dropout":
            pb.config.model.config["dropout"].float_value = value  # type: ignore[attr-defined]
        else:
            node = pb.config  # type: ignore[attr-defined]
            *path, last = field.split(".")
            for part in path:
                node = getattr(node, part)
            setattr(node, last, value)
        bad.append({"type_url": msg.type_url(), "field": field, "value": repr(value),
                    "bytes": pb.SerializeToString(deterministic=True).hex()})  # fmt: skip
    return {"amounts": [{"text": t, "value": _parse(t)} for t in AMOUNTS], "non_finite": bad}
