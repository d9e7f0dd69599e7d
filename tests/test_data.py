"""The corpus: manifest verification, deterministic splits, shards and rebuildable PRF batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from protocol.config import ModelSpec, RunConfig
from trainer.data import (
    Corpus,
    DataError,
    batch,
    eval_loss,
    host_shard,
    load_corpus,
    make_manifest,
    shakespeare_manifest,
)
from trainer.model import small_gpt

HOST_A = "gonka1" + "q" * 38
HOST_B = "gonka1" + "p" * 38


def _cfg(**kw: object) -> RunConfig:
    spec = ModelSpec(factory="trainer.model:small_gpt", config={})
    base = dict(
        model=spec, dataset_manifest_hash="0" * 64, initial_model_hash="0" * 64, batch_size=4, seq_len=16
    )
    return RunConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_shakespeare_is_38_plays_with_a_stable_manifest() -> None:
    root, man = shakespeare_manifest()
    assert len(man.files) == 38
    assert [f.name for f in man.files] == sorted(f.name for f in man.files)
    assert all(f.name.endswith(".md") for f in man.files)
    _, again = shakespeare_manifest()
    assert again.manifest_hash() == man.manifest_hash()
    corpus = load_corpus(root, man)
    total = sum(f.size for f in man.files)
    assert corpus.train.numel() + corpus.val.numel() == total
    assert 0.04 < corpus.val.numel() / total < 0.06


def _user_files(tmp_path: Path) -> list[Path]:
    a, b = tmp_path / "a.txt", tmp_path / "tokens.bin"
    a.write_text("to be or not to be, that is the question. " * 20)
    b.write_bytes(bytes(range(256)) * 2)
    return [a, b]


def test_user_files_load_and_tampering_is_detected(tmp_path: Path) -> None:
    files = _user_files(tmp_path)
    man = make_manifest(tmp_path, files, val_fraction=0.1)
    corpus = load_corpus(tmp_path, man)
    assert corpus.manifest_hash == man.manifest_hash()
    assert bytes(corpus.val[-51:].tolist()) == (bytes(range(256)) * 2)[-51:]
    files[0].write_text("to be or not to be, that is the question. " * 19 + "x" * 42)  # same size
    with pytest.raises(DataError, match="sha256"):
        load_corpus(tmp_path, man)
    files[0].write_text("short")
    with pytest.raises(DataError, match="size"):
        load_corpus(tmp_path, man)
    files[0].write_text("to be or not to be, that is the question. " * 20)
    assert torch.equal(load_corpus(tmp_path, man).train, corpus.train)
    files[1].unlink()
    with pytest.raises(DataError, match="cannot read"):
        load_corpus(tmp_path, man)


def test_manifest_cannot_escape_root(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    outside = tmp_path / "secret.txt"
    outside.write_text("x" * 100)
    man = make_manifest(tmp_path, [outside])
    bad = man.model_copy(update={"files": [man.files[0].model_copy(update={"name": "../secret.txt"})]})
    with pytest.raises(DataError, match="escapes"):
        load_corpus(tmp_path / "d", bad)


def test_batches_are_rebuildable_and_differ_per_step_and_host() -> None:
    corpus = Corpus(
        torch.arange(10_000, dtype=torch.int64).to(torch.uint8), torch.zeros(100, dtype=torch.uint8), "h"
    )
    cfg = _cfg(data_shards=4)
    x, y = batch(cfg, corpus, HOST_A, 3, 7)
    x2, y2 = batch(cfg, corpus, HOST_A, 3, 7)
    assert x.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert not torch.equal(x, batch(cfg, corpus, HOST_A, 3, 8)[0])
    assert not torch.equal(x, batch(cfg, corpus, HOST_A, 4, 7)[0])
    shard = host_shard(cfg, corpus, HOST_A)
    assert shard.numel() == 2500
    # every window comes from the host's own shard
    hay = bytes(shard.tolist())
    assert all(bytes(row.tolist()) in hay for row in x.to(torch.uint8))
    assert corpus.shards(4)[0].numel() + corpus.shards(4)[3].numel() == 5000
    _ = batch(cfg, corpus, HOST_B, 3, 7)


def test_short_shard_is_a_named_error() -> None:
    corpus = Corpus(torch.zeros(40, dtype=torch.uint8), torch.zeros(40, dtype=torch.uint8), "h")
    with pytest.raises(DataError, match="too short"):
        batch(_cfg(data_shards=8), corpus, HOST_A, 0, 0)


def test_eval_loss_is_deterministic_and_restores_mode() -> None:
    val = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    m = small_gpt(n_layer=1, n_head=2, n_embd=16, block_size=16)
    a = eval_loss(m, val, 2, seed=5, batch_size=2, seq_len=16)
    assert m.training
    assert a == eval_loss(m, val, 2, seed=5, batch_size=2, seq_len=16)
    assert a != eval_loss(m, val, 2, seed=6, batch_size=2, seq_len=16)
