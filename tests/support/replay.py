"""The small replay fixtures the step, commit, DDP and verify tests share: a tiny GPT run config,
a Shakespeare corpus, a fresh model and optimizer."""

from __future__ import annotations

from pathlib import Path

import torch

from protocol.config import ModelSpec, RunConfig, tolerance_moments
from replay.data import Corpus
from replay.spec import build_model
from replay.step import (
    make_optimizer,
)

HOST = "gonka1" + "q" * 38
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32)
SPEC = ModelSpec(factory="trainer.model:small_gpt", config=TINY)
ROOT = Path(__file__).resolve().parents[2]


def tiny_cfg(**kw: object) -> RunConfig:
    base: dict[str, object] = dict(
        model=SPEC, dataset_manifest_hash="0" * 64, initial_model_hash="0" * 64,
        batch_size=4, seq_len=32, inner_steps=10, segment_len=5, sampled_segments=2, data_shards=2,
    )  # fmt: skip
    # tolerance mode: fp32 moments unless the test names them (the default, int8, is refused there)
    return RunConfig(**tolerance_moments({**base, **kw}))  # type: ignore[arg-type]


def tiny_corpus() -> Corpus:
    g = torch.Generator().manual_seed(0)
    text = torch.randint(97, 123, (20_000,), generator=g).to(torch.uint8)
    return Corpus(text, text[:2000].clone(), "test")


def fresh(cfg: RunConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model(cfg.model)
    return model, make_optimizer(model, cfg.inner)
