"""`gonka-diloco data`: prepare a corpus as token shards, and inspect or verify a prepared one.

`data prepare` prints the manifest hash a run config's `dataset_manifest_hash` takes (or pass the
folder to `run create --dataset`), then hosts and verifiers point `dataset` in their TOML at the
folder or at a URL where it is served.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

app = typer.Typer(help="Prepare and inspect token-shard datasets.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Prepare and inspect token-shard datasets."""


def _fail(message: str, code: int = 2) -> None:
    Console(stderr=True, soft_wrap=True).print(Text.assemble(("error: ", "red"), message))
    raise typer.Exit(code)


@app.command()
def prepare(
    inputs: Annotated[list[str], typer.Argument(help="Text files, JSONL files (a `text` field) or folders.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="New (or empty) dataset folder.")],
    tokenizer: Annotated[
        str, typer.Option(help="'bytes' (built-in, vocabulary 256) or a Hugging Face tokenizer.json.")
    ] = "bytes",
    train_bpe: Annotated[
        int | None,
        typer.Option("--train-bpe", metavar="VOCAB", help="Train a byte-level BPE of VOCAB tokens."),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="auto, uint16 or uint32 (auto: the smallest that fits).")
    ] = "auto",
    val_fraction: Annotated[
        float, typer.Option("--val-fraction", help="Held-out tail of every input file.")
    ] = 0.05,
    shard_tokens: Annotated[int, typer.Option("--shard-tokens", help="Tokens per shard file.")] = 100_000_000,
    text_field: Annotated[str, typer.Option("--text-field", help="JSONL field holding the text.")] = "text",
    eot: Annotated[str, typer.Option(help="End-of-document token (default: the tokenizer's own).")] = "",
    name: Annotated[str | None, typer.Option(help="Dataset name (default: the folder's).")] = None,
    errors: Annotated[
        str,
        typer.Option(
            help="An input that is not UTF-8: strict (stop, naming the file and byte), replace (bad "
            "bytes become U+FFFD) or skip (leave that file out, and say so).",
        ),
    ] = "strict",
) -> None:
    """Tokenize INPUTS into shards + manifest.json in --out; prints the manifest hash."""
    from pydantic import ValidationError
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from replay.data import DataError
    from replay.prepare import PrepareOptions, remove_partial
    from replay.prepare import prepare as run_prepare

    try:
        opts = PrepareOptions(
            name=name or out.resolve().name, tokenizer=tokenizer, train_bpe=train_bpe, dtype=dtype,
            val_fraction=val_fraction, shard_tokens=shard_tokens, text_field=text_field, eot=eot,
            errors=errors,
        )  # fmt: skip
    except ValidationError as e:
        _fail("; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()))
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    skipped: list[str] = []
    err = Console(stderr=True, soft_wrap=True)

    def skip(path: Path, why: str) -> None:
        skipped.append(str(path))
        err.print(Text.assemble(("skipped ", "yellow"), f"{path}: {why}"))

    failed: DataError | None = None
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("reading", total=None)

        def phase(label: str, total: int) -> None:
            bar.reset(task, description=label, total=total)

        try:
            manifest = run_prepare(
                inputs, out, opts, progress=lambda n: bar.advance(task, n), on_phase=phase, on_skip=skip
            )
        except DataError as e:
            remove_partial(out)
            failed = e  # said once the progress bar is gone, on a line of its own
        except KeyboardInterrupt:
            remove_partial(out)
            raise
    if failed is not None:
        _fail(str(failed))
        return
    typer.echo(json.dumps({
        "manifest_hash": manifest.manifest_hash(), "folder": str(out), "dtype": manifest.dtype,
        "tokenizer": manifest.tokenizer.kind, "vocab_size": manifest.tokenizer.vocab_size,
        "train_tokens": manifest.train_tokens, "val_tokens": manifest.val_tokens,
        "shards": len(manifest.train) + len(manifest.val), **({"skipped": skipped} if skipped else {}),
    }))  # fmt: skip


@app.command()
def info(
    source: Annotated[str, typer.Argument(help="Dataset folder, manifest.json or URL ('' = Shakespeare).")],
    verify: Annotated[bool, typer.Option(help="Fetch and hash-check every shard too.")] = False,
) -> None:
    """Print a dataset's manifest hash and sizes; with --verify, check every shard's SHA-256."""
    from replay.data import DataError, TokenStream, cache_root, open_dataset

    try:
        corpus = open_dataset(source, cache_root() / "datasets")
        if verify:
            for tokens in (corpus.train, corpus.val):
                if isinstance(tokens, TokenStream):
                    tokens.touch()
    except DataError as e:
        _fail(str(e), 1)
        return
    m = corpus.manifest
    assert m is not None
    typer.echo(json.dumps({
        "manifest_hash": corpus.manifest_hash, "name": m.name, "dtype": m.dtype,
        "tokenizer": m.tokenizer.model_dump(), "train_tokens": m.train_tokens, "val_tokens": m.val_tokens,
        "shards": len(m.train) + len(m.val), "verified": verify,
    }, indent=2))  # fmt: skip
