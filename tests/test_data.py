"""Token-shard datasets: `data prepare` round trips, manifests, verified shards (local, file://,
HTTP), host shards over many files, PRF batches, and the Shakespeare default."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gonka_diloco.adversaries.mirror import DatasetMirror, Tamper
from protocol.config import ModelSpec, RunConfig
from replay.data import (
    Corpus,
    DataError,
    TokenStream,
    batch,
    eval_loss,
    host_shard,
    load_corpus,
    open_dataset,
    parse_manifest,
    shakespeare_corpus,
    shakespeare_files,
    shakespeare_manifest,
)
from replay.model import small_gpt
from replay.prepare import PrepareOptions, load_tokenizer, prepare

HOST_A = "gonka1" + "q" * 38
HOST_B = "gonka1" + "p" * 38
TEXT = "To be, or not to be, that is the question: Whether 'tis nobler — ünïcödé ✓\n" * 40


def _cfg(**kw: object) -> RunConfig:
    spec = ModelSpec(factory="trainer.model:small_gpt", config={})
    base = dict(
        model=spec, dataset_manifest_hash="0" * 64, initial_model_hash="0" * 64, batch_size=4, seq_len=16
    )
    return RunConfig(**{**base, **kw})  # type: ignore[arg-type]


def _all_tokens(tokens: TokenStream) -> list[int]:
    return tokens.read(0, tokens.numel()).tolist()


# ---------------------------------------------------------------- the Shakespeare default


def test_shakespeare_is_a_prepared_byte_manifest_of_38_plays() -> None:
    folder, man = shakespeare_manifest()
    assert man.tokenizer.kind == "bytes" and man.dtype == "uint16" and (folder / "manifest.json").is_file()
    _, files = shakespeare_files()
    assert len(files) == 38
    total = sum(len(p.read_bytes()) for p in files)
    assert man.total_tokens == total  # one token per byte, no separators
    assert 0.04 < man.val_tokens / total < 0.06
    corpus = shakespeare_corpus()
    assert corpus.manifest_hash == man.manifest_hash() == shakespeare_manifest()[1].manifest_hash()
    first = files[0].read_bytes()
    cut = len(first) - int(len(first) * 0.05)  # the last 5% of every play is held out
    assert bytes(corpus.train.read(0, 200).tolist()) == first[:200]
    assert bytes(corpus.val.read(0, 100).tolist()) == first[cut : cut + 100]


# ---------------------------------------------------------------- data prepare


def _decode_split(folder: Path, split: str) -> str:
    corpus = open_dataset(str(folder))
    assert corpus.manifest is not None
    tok = load_tokenizer(folder, corpus.manifest)
    tokens = corpus.train if split == "train" else corpus.val
    assert isinstance(tokens, TokenStream)
    ids = [i for i in _all_tokens(tokens) if i != corpus.manifest.tokenizer.eot_token]
    return tok.decode(ids)


def _bpe_tokenizer_json(tmp: Path) -> Path:
    """A small tokenizer.json made with `tokenizers` (as one from a model folder would be)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["a different corpus entirely, to be sure"] * 10, trainer=trainer)
    path = tmp / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.mark.parametrize("tokenizer", ["bytes", "tokenizer.json", "train-bpe"])
def test_prepare_round_trips_text(tmp_path: Path, tokenizer: str) -> None:
    src = tmp_path / "corpus.txt"
    src.write_text(TEXT)
    opts = {"bytes": PrepareOptions(shard_tokens=500, val_fraction=0.1),
            "tokenizer.json": PrepareOptions(tokenizer=str(_bpe_tokenizer_json(tmp_path)), shard_tokens=300),
            "train-bpe": PrepareOptions(train_bpe=320, shard_tokens=300)}[tokenizer]  # fmt: skip
    out = tmp_path / "ds"
    man = prepare([str(src)], out, opts)
    assert len(man.train) > 1  # several shards: windows and host shards cross files
    assert _decode_split(out, "train") + _decode_split(out, "val") == TEXT
    assert man.tokenizer.kind == ("bytes" if tokenizer == "bytes" else "tokenizers")
    if tokenizer != "bytes":
        assert man.tokenizer.eot_token is not None  # </s> / <|endoftext|> ends the document
        assert (out / "tokenizer.json").is_file() and man.tokenizer.vocab_size <= 320
    # deterministic: the same inputs and options give the same manifest
    assert prepare([str(src)], tmp_path / "again", opts).manifest_hash() == man.manifest_hash()


def test_prepare_jsonl_splits_by_record_and_separates_documents(tmp_path: Path) -> None:
    src = tmp_path / "docs.jsonl"
    docs = [f"document number {i}: the quick brown fox" for i in range(100)]
    src.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    man = prepare([str(src)], tmp_path / "ds", PrepareOptions(train_bpe=300, val_fraction=0.1))
    eot = man.tokenizer.eot_token
    corpus = open_dataset(str(tmp_path / "ds"))
    tok = load_tokenizer(tmp_path / "ds", man)
    ids = _all_tokens(corpus.train) + _all_tokens(corpus.val)  # type: ignore[arg-type]
    pieces, cur = [], []
    for i in ids:
        if i == eot:
            pieces.append(tok.decode(cur))
            cur = []
        else:
            cur.append(i)
    assert pieces == docs and not cur
    assert 5 <= sum(1 for i in _all_tokens(corpus.val) if i == eot) <= 15  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("files", "opts", "message"),
    [
        ({"bad.txt": b"fine\n\xff\xfe broken"}, {}, "not UTF-8 text at byte 5"),
        ({"empty.txt": b""}, {}, "is empty"),
        ({"a.jsonl": b'{"text": "ok"}\n{oops\n'}, {}, r"a.jsonl:2: not JSON"),
        ({"a.jsonl": b'{"body": "x"}\n'}, {}, "no 'text' field"),
        ({"a.jsonl": b'{"text": 3}\n'}, {}, "is not a string"),
        ({"a.txt": b"x" * 100}, {"train_bpe": 70_000, "dtype": "uint16"}, "overflows uint16"),
        ({"a.txt": b"x" * 100}, {"val_fraction": 0.0}, "validation split is empty"),
    ],
)
def test_prepare_refuses_bad_input_with_a_clear_error(
    tmp_path: Path, files: dict[str, bytes], opts: dict, message: str
) -> None:
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError, match=message):
        prepare([str(tmp_path / n) for n in files], tmp_path / "out", PrepareOptions(**opts))


def test_a_vocabulary_past_uint16_needs_uint32(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(70_000)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "big.json"))
    (tmp_path / "a.txt").write_text("w1 w69999 w5\n" * 50)
    with pytest.raises(DataError, match="70000 tokens overflows uint16"):
        opts = PrepareOptions(tokenizer=str(tmp_path / "big.json"), dtype="uint16")
        prepare([str(tmp_path / "a.txt")], tmp_path / "o1", opts)
    man = prepare(
        [str(tmp_path / "a.txt")], tmp_path / "o2", PrepareOptions(tokenizer=str(tmp_path / "big.json"))
    )
    assert man.dtype == "uint32" and 69_999 in _all_tokens(open_dataset(str(tmp_path / "o2")).train)  # type: ignore[arg-type]


def test_data_prepare_cli(tmp_path: Path) -> None:
    from gonka_diloco.cli import app

    (tmp_path / "a.txt").write_text(TEXT)
    runner = CliRunner()
    out = runner.invoke(app, ["data", "prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "ds")])
    assert out.exit_code == 0, out.output
    printed = json.loads(out.stdout.strip().splitlines()[-1])
    assert printed["manifest_hash"] == open_dataset(str(tmp_path / "ds")).manifest_hash
    bad = runner.invoke(app, ["data", "prepare", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "no such file" in bad.output and not (tmp_path / "x").exists()


# ---------------------------------------------------------------- verified shards, local and remote


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    (tmp_path / "a.txt").write_text(TEXT * 3)
    prepare([str(tmp_path / "a.txt")], tmp_path / "ds", PrepareOptions(shard_tokens=1000))
    return tmp_path / "ds"


def test_a_tampered_shard_is_refused(dataset: Path) -> None:
    corpus = open_dataset(str(dataset))
    cfg = _cfg(dataset_manifest_hash=corpus.manifest_hash, data_shards=2)
    assert load_corpus(cfg, str(dataset), host=HOST_A).manifest_hash == corpus.manifest_hash
    shard = dataset / "train-00001.bin"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 1  # same size, one bit
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="sha256 does not match"):
        for host in (HOST_A, HOST_B, "gonka1other"):  # whichever host's range covers the shard
            load_corpus(cfg, str(dataset), host=host)
    lazy = open_dataset(str(dataset))  # no host: shards are checked on first use, still refused
    with pytest.raises(DataError, match="sha256"):
        lazy.train.read(0, lazy.train.numel())  # type: ignore[union-attr]
    shard.write_bytes(bytes(raw[:-2]))
    with pytest.raises(DataError, match="bytes, the manifest says"):
        open_dataset(str(dataset)).train.read(0, 3000)  # type: ignore[union-attr]


def test_the_run_names_the_manifest_and_the_vocabulary_must_fit(dataset: Path) -> None:
    with pytest.raises(DataError, match="the run's is 000000000000"):
        load_corpus(_cfg(), str(dataset))
    h = open_dataset(str(dataset)).manifest_hash
    small = ModelSpec(factory="trainer.model:small_gpt", config={"vocab_size": 100})
    with pytest.raises(DataError, match="vocabulary"):
        load_corpus(_cfg(dataset_manifest_hash=h, model=small), str(dataset))
    manifest = (dataset / "manifest.json").read_bytes()
    (dataset / "manifest.json").write_bytes(manifest.replace(b'"name": "dataset"', b'"name": "datasez"'))
    with pytest.raises(DataError, match="the run's is"):  # any edit changes the hash the run names
        load_corpus(_cfg(dataset_manifest_hash=h), str(dataset))


def test_fsspec_sources_local_file_url_and_http_give_the_same_tokens(dataset: Path, tmp_path: Path) -> None:
    local = open_dataset(str(dataset))
    cfg = _cfg(dataset_manifest_hash=local.manifest_hash, data_shards=3)
    want = (_all_tokens(local.train), _all_tokens(local.val))  # type: ignore[arg-type]
    with DatasetMirror(dataset.parent) as url:
        http = f"{url}/ds"
        for source in (f"file://{dataset}", str(dataset / "manifest.json"), f"{http}/manifest.json", http):
            corpus = load_corpus(cfg, source, tmp_path / "cache", host=HOST_A)
            assert (_all_tokens(corpus.train), _all_tokens(corpus.val)) == want, source  # type: ignore[arg-type]
        with pytest.raises(DataError, match="cannot"):
            open_dataset(f"{http}/missing/manifest.json")
        cached = tmp_path / "cache" / local.manifest_hash
        assert sorted(p.name for p in cached.iterdir()) == sorted(p.name for p in dataset.glob("*.bin"))
        bad = cached / "train-00000.bin"  # our cached copy rots on disk: checked again, fetched again
        bad.write_bytes(b"\x00" * bad.stat().st_size)
        again = open_dataset(http, tmp_path / "cache")
        assert _all_tokens(again.train) == want[0]  # type: ignore[arg-type]
        assert bad.read_bytes() == (dataset / "train-00000.bin").read_bytes()


@pytest.mark.parametrize("tamper", [Tamper.FLIP, Tamper.TRUNCATE, Tamper.PAD, Tamper.SWAP])
def test_a_tampering_mirror_is_refused_next_to_an_honest_one(
    dataset: Path, tmp_path: Path, tamper: Tamper
) -> None:
    """The adversary (`gonka_diloco.adversaries.mirror`) serves the same manifest with altered shards."""
    cfg = _cfg(dataset_manifest_hash=open_dataset(str(dataset)).manifest_hash, data_shards=1)
    with DatasetMirror(dataset.parent) as honest, DatasetMirror(dataset.parent, tamper) as bad:
        assert load_corpus(cfg, f"{honest}/ds", tmp_path / "ok", host=HOST_A).train.numel() > 0
        with pytest.raises(DataError, match=r"sha256|bytes"):
            load_corpus(cfg, f"{bad}/ds", tmp_path / "bad", host=HOST_A)
    assert not list((tmp_path / "bad").rglob("*.bin"))  # nothing unverified is kept


def test_node_toml_points_at_the_dataset(tmp_path: Path) -> None:
    from trainer.node_config import load_host_config

    (tmp_path / "host.toml").write_text(
        'chain_url = "http://x"\nrun_id = 1\ndata_dir = "d"\ndataset = "data/ds"\n[key]\ntest_index = 1\n'
    )
    cfg = load_host_config(tmp_path / "host.toml")
    assert cfg.dataset_source == str(tmp_path / "data" / "ds")
    assert cfg.model_copy(update={"dataset": "https://h/ds"}).dataset_source == "https://h/ds"


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=400) | st.from_regex(r'\{"format": ?"[a-z/0-9-]*", ?"name": ?".{0,5}"\}'))
def test_manifest_parser_refuses_garbage_with_data_error(raw: bytes | str) -> None:
    data = raw.encode() if isinstance(raw, str) else raw
    with pytest.raises(DataError):
        parse_manifest(data)


# ---------------------------------------------------------------- batches


def test_shard_streams_batch_exactly_like_one_tensor(dataset: Path) -> None:
    """Windows crossing shard files, host shards split across files: the same batches as the
    same tokens held in one tensor (the representation never changes what is trained)."""
    streamed = open_dataset(str(dataset))
    assert isinstance(streamed.train, TokenStream) and len(streamed.train.parts) > 2
    flat = torch.tensor(_all_tokens(streamed.train))
    in_memory = Corpus(flat, torch.tensor(_all_tokens(streamed.val)), streamed.manifest_hash)  # type: ignore[arg-type]
    cfg = _cfg(data_shards=3, seq_len=32)
    for host in (HOST_A, HOST_B):
        for n, i in ((0, 0), (3, 7), (9, 1)):
            a, b = batch(cfg, streamed, host, n, i), batch(cfg, in_memory, host, n, i)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert host_shard(cfg, streamed, host).numel() == host_shard(cfg, in_memory, host).numel()
    m = small_gpt(n_layer=1, n_head=2, n_embd=16, block_size=32)
    assert eval_loss(m, streamed.val, 2, 5, batch_size=2, seq_len=32) == eval_loss(
        m, in_memory.val, 2, 5, batch_size=2, seq_len=32
    )


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
    hay = bytes(shard.tolist())  # type: ignore[union-attr]
    assert all(bytes(row.tolist()) in hay for row in x.to(torch.uint8))
    assert corpus.shards(4)[0].numel() + corpus.shards(4)[3].numel() == 5000
    _ = batch(cfg, corpus, HOST_B, 3, 7)


def test_batch_offsets_reach_every_part_of_a_large_dataset(tmp_path: Path) -> None:
    """A shard range of 10^11 tokens (memory-mapped, never read whole): offsets land all over it."""
    from replay.data import Shard, ShardFile

    n = 10**11
    fake = [ShardFile(Shard(name=f"s{i}", tokens=n // 4, bytes=n // 2, sha256="0" * 64), "uint16", "", None)
            for i in range(4)]  # fmt: skip
    corpus = Corpus(TokenStream(fake), TokenStream(fake[:1]), "h")
    from protocol.prf import batch_offsets

    shard = host_shard(_cfg(data_shards=1), corpus, HOST_A)
    offs = [o for i in range(50) for o in batch_offsets(0, HOST_A, 0, i, 8, shard.numel() - 16)]
    quarters = {o * 4 // shard.numel() for o in offs}
    assert quarters == {0, 1, 2, 3} and max(offs) > 0.9 * n


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
    assert np.isfinite(a)
