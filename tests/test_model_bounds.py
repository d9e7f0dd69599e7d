"""Model size is bounded before anything is allocated (specs §2.4 MsgCreateRun, `replay.spec.check_fits`).

The chain counts a run's model from its spec alone (`protocol.modelsize`, exact for the allow-listed
factories: checked here against the numel of real builds) and refuses it above `max_model_params`
or `max_model_tensors` (ErrModelTooLarge), or when it cannot count it (ErrBadModelSpec); a node
refuses, in one line naming the numbers, a model its own memory cannot hold, before building it;
`run create --dry-run` refuses what the chain would. Each absurd config fails next to an honest one
that succeeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from chain import errors
from chain.module import check_model_size
from chain.params import MAX_MODEL_PARAMS, MAX_MODEL_TENSORS, ModuleParams
from nodekit.node import NodeError
from protocol.config import ModelSpec, RunConfig, tolerance_moments
from protocol.modelsize import PARAM_COUNT_KEY, ModelSizeError, model_size
from replay import hf
from replay.model import small_gpt
from replay.spec import (
    BYTES_PER_PARAM,
    CUMULATIVE_BYTES_PER_PARAM,
    Holder,
    ModelTooLarge,
    activation_floor,
    available_memory,
    build_model,
    check_fits,
    meta_param_count,
    sums_residuals,
)
from tests.support.chain import AUTH, Sim, make_config, make_state

H = "0" * 64
GPT = "trainer.model:small_gpt"


def spec(factory: str, **config: object) -> ModelSpec:
    return ModelSpec(factory=factory, config=config)  # type: ignore[arg-type]


def hf_spec(arch: str, preset: str = "tiny", **kw: object) -> ModelSpec:
    return spec(f"trainer.hf:{arch}", **hf.spec_config(arch, preset, **kw))


def numel(module: torch.nn.Module) -> tuple[int, int]:
    named = list(module.named_parameters())
    return sum(p.numel() for _, p in named), len(named)


GPT_CONFIGS = [
    {},
    {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 100},
    {"n_layer": 3, "n_head": 3, "n_embd": 48, "block_size": 40, "vocab_size": 300, "bias": True},
    {"n_layer": 2, "n_embd": 64, "dropout": 0.1, "seed": 9},
]
HF_CONFIGS = [
    ("llama", "tiny", {}),
    ("qwen2", "tiny", {}),
    ("llama", "tiny", {"num_key_value_heads": 4, "vocab_size": 1000, "intermediate_size": 100}),
    ("qwen2", "small", {"num_key_value_heads": 1}),
    ("llama", "small", {"tie_word_embeddings": True}),  # built untied: see protocol.modelsize.hf_size
    ("qwen2", "tiny", {"tie_word_embeddings": True, "num_hidden_layers": 3}),
]


@pytest.mark.parametrize("config", GPT_CONFIGS)
def test_small_gpt_count_is_the_built_models_numel(config: dict[str, object]) -> None:
    size = model_size(spec(GPT, **config))
    assert (size.params, size.tensors) == numel(small_gpt(**config))  # type: ignore[arg-type]


@pytest.mark.parametrize(("arch", "preset", "kw"), HF_CONFIGS)
def test_llama_and_qwen2_counts_are_the_built_models_numel(arch: str, preset: str, kw: dict) -> None:
    s = hf_spec(arch, preset, **kw)
    size = model_size(s)
    assert (size.params, size.tensors) == numel(build_model(s))
    assert meta_param_count(s) == size.params


@pytest.mark.parametrize(("arch", "preset"), [("llama", "125m"), ("qwen2", "1b"), ("llama", "1b")])
def test_the_large_presets_count_exactly_on_the_meta_device(arch: str, preset: str) -> None:
    s = hf_spec(arch, preset)
    with torch.device("meta"):
        built = build_model(s)
    assert numel(built) == (model_size(s).params, model_size(s).tensors)
    assert 1.0e9 < model_size(hf_spec("llama", "1b")).params < 1.2e9  # the preset's "≈1.1B"


ABSURD = {
    "n_embd 65536": spec(GPT, n_embd=65536),
    "vocab 2^31": spec(GPT, vocab_size=2**31),
    "block 2^31": spec(GPT, block_size=2**31),
    "llama hidden 2^17": hf_spec("llama", "tiny", hidden_size=2**17, intermediate_size=2**17),
    "llama vocab 2^31": hf_spec("llama", "tiny", vocab_size=2**31),
    "qwen2 intermediate 2^40": hf_spec("qwen2", "tiny", intermediate_size=2**40),
    "a billion one-wide layers": spec(GPT, n_layer=10**9, n_embd=1, n_head=1),
    "declared 10^12": spec("mine:model", **{PARAM_COUNT_KEY: 10**12}),
}
HONEST = {
    "small gpt": spec(GPT, n_layer=2, n_embd=64),
    "llama tiny": hf_spec("llama"),
    "declared custom": spec("mine:model", **{PARAM_COUNT_KEY: 12_345}),
}


def _create(model: ModelSpec, params: ModuleParams | None = None) -> object:
    sim = Sim(make_state(params))
    (result,) = sim.block(_msg(model))
    return result


def _msg(model: ModelSpec) -> object:
    from protocol.messages import MsgCreateRun

    return MsgCreateRun(creator=AUTH, config=make_config(model=model))


@pytest.mark.parametrize("name", sorted(ABSURD))
def test_the_chain_refuses_an_absurd_model_and_accepts_an_honest_one(name: str) -> None:
    refused = _create(ABSURD[name])
    assert isinstance(refused, errors.ErrModelTooLarge), refused
    for honest in HONEST.values():
        assert not isinstance(_create(honest), errors.ChainError)


def test_a_model_the_chain_cannot_count_is_refused() -> None:
    cases = {
        "unknown factory, nothing declared": spec("mine:model", width=3),
        "declared count not the real one": spec(GPT, **{PARAM_COUNT_KEY: 5}),
        "a float dimension": spec(GPT, n_embd=64.0),
        "a boolean dimension": spec(GPT, n_layer=True),
        "heads that do not divide": spec(GPT, n_embd=10, n_head=3),
        "an unknown key": spec(GPT, n_embed=64),
        "zero layers": spec(GPT, n_layer=0),
        "an unexpanded preset": spec("trainer.hf:llama", preset="tiny"),
        "kv heads that do not divide": hf_spec("llama", num_key_value_heads=3),
        "a non-positive declaration": spec("mine:model", **{PARAM_COUNT_KEY: 0}),
    }
    for name, s in cases.items():
        assert isinstance(_create(s), errors.ErrBadModelSpec), name
    long_seq = make_config(model=spec(GPT, block_size=16), seq_len=32)
    with pytest.raises(errors.ErrBadModelSpec, match="seq_len 32 exceeds"):
        check_model_size(long_seq, MAX_MODEL_PARAMS, MAX_MODEL_TENSORS)


def test_the_bounds_are_genesis_params_that_keep_the_default_app_hash() -> None:
    model = spec(GPT, n_layer=2, n_embd=64)
    n = model_size(model).params
    assert isinstance(_create(model, ModuleParams(max_model_params=n - 1)), errors.ErrModelTooLarge)
    assert not isinstance(_create(model, ModuleParams(max_model_params=n)), errors.ChainError)
    assert isinstance(_create(model, ModuleParams(max_model_tensors=3)), errors.ErrModelTooLarge)
    assert ModuleParams().model_dump() == {"max_participants_per_run": 10_000, "max_active_runs": 16}


def test_model_size_errors_name_the_field() -> None:
    with pytest.raises(ModelSizeError, match="n_embd 10 must be a multiple of n_head 3"):
        model_size(spec(GPT, n_embd=10, n_head=3))
    with pytest.raises(ModelSizeError, match=r"declare config\.param_count"):
        model_size(spec("mine:model"))


# ---- node side: refused before anything is allocated ---------------------------------------------


def _run(model: ModelSpec, **kw: object) -> RunConfig:
    fields = tolerance_moments({"model": model, "dataset_manifest_hash": H, "initial_model_hash": H, **kw})
    return RunConfig(**fields)  # tolerance runs: fp32 moments, which tolerance mode needs


def test_a_node_refuses_in_one_line_what_its_memory_cannot_hold() -> None:
    honest = _run(spec(GPT, n_layer=2, n_embd=64))
    size = check_fits(honest, "cpu", Holder.HOST)  # the real probe: a small model fits
    assert size.params == model_size(honest.model).params
    room = BYTES_PER_PARAM[Holder.HOST] * size.params  # exactly the state, no room for activations
    with pytest.raises(ModelTooLarge) as refused:
        check_fits(honest, "cpu", Holder.HOST, available=room)
    line = str(refused.value)
    assert "\n" not in line and f"{size.params:,} parameters" in line and "GiB available" in line
    assert isinstance(refused.value, NodeError)
    one = room + activation_floor(honest, size)  # what one training model needs, exactly
    check_fits(honest, "cpu", Holder.HOST, available=one)
    with pytest.raises(ModelTooLarge, match="a verifier needs"):  # two replay models at once
        check_fits(honest, "cpu", Holder.VERIFIER, workers=2, available=2 * one - 1)
    check_fits(honest, "cpu", Holder.VERIFIER, workers=2, available=2 * one)


def test_a_verifier_that_sums_residuals_counts_their_accumulators() -> None:
    """Issue 36 (3): a tolerance-mode verification with a summed-residual threshold keeps two
    float32 vectors of the parameters' size per worker (specs §6.4); the sizing counts them, and
    only for such runs."""
    thresholds = dict.fromkeys(("tolerance", "tolerance_exp_avg", "tolerance_exp_avg_sq"), 0.1)
    tol = {"replay_mode": "tolerance", **thresholds}
    per_segment = _run(spec(GPT, n_layer=2, n_embd=64), **tol)
    summed = _run(spec(GPT, n_layer=2, n_embd=64), **tol, tolerance_cumulative=0.01)
    assert sums_residuals(summed) and not sums_residuals(per_segment)
    size = model_size(summed.model)
    one = BYTES_PER_PARAM[Holder.VERIFIER] * size.params + activation_floor(summed, size)
    check_fits(per_segment, "cpu", Holder.VERIFIER, workers=2, available=2 * one)
    need = 2 * (one + CUMULATIVE_BYTES_PER_PARAM * size.params)
    with pytest.raises(ModelTooLarge, match=r"2 x \(16 B/param \+ 8 B/param summed residuals"):
        check_fits(summed, "cpu", Holder.VERIFIER, workers=2, available=need - 1)
    check_fits(summed, "cpu", Holder.VERIFIER, workers=2, available=need)
    check_fits(summed, "cpu", Holder.HOST, available=one)  # a host keeps no sums


def test_a_model_the_chain_accepts_but_this_machine_cannot_hold_is_refused_without_allocating() -> None:
    """50B parameters (under the chain's 100B): 800 GB of training state, refused by the real probe
    in a fraction of a second: had it allocated, the process would have died instead."""
    big = _run(spec(GPT, n_layer=16, n_embd=16384, n_head=16))
    assert 4e10 < model_size(big.model).params < MAX_MODEL_PARAMS
    room = available_memory("cpu")
    assert room is not None and room < 16 * model_size(big.model).params
    with pytest.raises(ModelTooLarge, match=r"51,550,633,984 parameters: a host needs 768\.7 GiB on cpu"):
        check_fits(big, "cpu", Holder.HOST)


def test_a_declared_count_is_checked_on_the_meta_device_before_building() -> None:
    def toy(width: int = 3) -> torch.nn.Module:
        return torch.nn.Linear(width, width)

    allow = {"mine:toy": toy}
    good = _run(spec("mine:toy", width=4, **{PARAM_COUNT_KEY: 20}))
    assert check_fits(good, "cpu", Holder.HOST, allow_list=allow).params == 20
    lying = _run(spec("mine:toy", width=4, **{PARAM_COUNT_KEY: 19}))
    with pytest.raises(NodeError, match="declares 19 parameters but builds 20"):
        check_fits(lying, "cpu", Holder.HOST, allow_list=allow)
    with pytest.raises(NodeError, match=r"declare config\.param_count"):
        check_fits(_run(spec("mine:toy", width=4)), "cpu", Holder.HOST, allow_list=allow)
    with pytest.raises(NodeError, match="not on this node's allow-list"):
        check_fits(good, "cpu", Holder.HOST)
    assert build_model(good.model, allow).weight.shape == (4, 4)  # the reserved key never reaches it


def test_run_create_dry_run_refuses_an_absurd_model_in_one_line(tmp_path: Path) -> None:
    from gonka_diloco.cli import app

    toml = '[model]\nfactory = "trainer.model:small_gpt"\nconfig = {{ n_layer = 2, n_embd = {} }}\n'
    absurd, honest = tmp_path / "absurd.toml", tmp_path / "honest.toml"
    absurd.write_text(toml.format(65536))
    honest.write_text(toml.format(64))
    runner = CliRunner()
    refused = runner.invoke(app, ["run", "create", str(absurd), "--dry-run"])
    assert refused.exit_code == 2, refused.output
    lines = [line for line in refused.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "ErrModelTooLarge" in lines[0] and "103,1" not in lines[0], refused.output
    ok = runner.invoke(app, ["run", "create", str(honest), "--dry-run"])
    assert ok.exit_code == 0 and '"config_hash"' in ok.output, ok.output


def test_host_and_verifier_nodes_refuse_a_model_they_cannot_hold_before_building_it(tmp_path: Path) -> None:
    """A 50B-parameter run the chain accepts: a host and a verifier on this machine stop in one line
    naming the numbers, before the model (or the dataset) is touched, and never join; on the same
    chain an honest run's nodes set up and build their model."""
    from chain.inprocess import InProcessChain
    from tests.support.nodes import create_run, host_config, run_config, tiny_corpus, verifier_node
    from trainer.node import HostNode

    corpus = tiny_corpus()
    chain = InProcessChain()
    honest = create_run(chain, run_config(corpus))
    big = create_run(chain, run_config(corpus, model=spec(GPT, n_layer=16, n_embd=16384, n_head=16)))
    assert big != honest  # the chain accepted it: 51.6B < max_model_params
    host = HostNode(host_config(tmp_path, 1, big), chain, corpus=corpus, log=lambda e: None)
    with pytest.raises(ModelTooLarge, match=r"51,550,633,984 parameters: a host needs"):
        host.run()
    verifier = verifier_node(tmp_path, 2, big, corpus)
    with pytest.raises(ModelTooLarge, match=r"51,550,633,984 parameters: a verifier needs"):
        verifier.run()
    assert chain.query("participants", run_id=big)["participants"] == []  # nobody joined
    ok = HostNode(host_config(tmp_path, 3, honest), chain, corpus=corpus, log=lambda e: None)
    ok._setup()
    assert sum(p.numel() for p in ok.model.parameters()) == model_size(ok.cfg.model).params
