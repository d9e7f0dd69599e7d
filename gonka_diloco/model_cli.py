"""`gonka-diloco model`: get a finished run's trained model out (`export`), and see what it writes
(`sample`).

`model export` reads the final global model by the hash the chain adopted — from a devnet run
folder's node disks, from one node's data_dir, or from the run's nodes over HTTP — with every chunk
verified, and writes a folder that `transformers` (the Llama/Qwen2 presets) or
`replay.spec.load_exported` (the built-in GPT) loads. Errors are one line each.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.text import Text

app = typer.Typer(
    help="Export a finished run's trained model, and sample text from it.", no_args_is_help=True
)


@app.callback()
def _group() -> None:
    """Export a finished run's trained model, and sample text from it."""


def _fail(message: str, code: int = 1) -> None:
    Console(stderr=True, soft_wrap=True).print(Text.assemble(("error: ", "red"), message))
    raise typer.Exit(code)


EXPORT_EPILOG = """\b
Sources:
  model export runs/<time> --out DIR                 a devnet run folder: its nodes' disks
  model export DATA_DIR --chain URL --run N --out DIR one node's data_dir, by the chain's hash
  model export --chain URL --run N --out DIR         fetched from the run's nodes (params only)
The folder: model.safetensors (parameters only, no outer momentum), config.json, tokenizer.json
when the run's tokenizer is known, and MODEL.md (run, chain, final hash, outer steps, tokens,
validation loss). Exit status: 0 = written, 1 = the run or its model cannot be exported (not
finished, unknown, nobody holds it intact), 2 = a bad argument.
"""


@app.command(epilog=escape(EXPORT_EPILOG))
def export(
    source: Annotated[
        Path | None,
        typer.Argument(help="A devnet run folder (with snapshot.json), or a node's data_dir (with --chain)."),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="The new model folder.")] = None,
    chain: Annotated[
        str | None, typer.Option("--chain", "--chain-url", help="Chain node URL: the run's state and hash.")
    ] = None,
    run: Annotated[int | None, typer.Option("--run", "--run-id", help="With --chain: which run.")] = None,
    dataset: Annotated[
        str | None,
        typer.Option(help="The run's dataset (folder, manifest or URL), for its tokenizer files."),
    ] = None,
    dtype: Annotated[str, typer.Option(help="float32 (as trained), bfloat16 or float16.")] = "float32",
) -> None:
    """Write a finished run's final model as a model folder (Hugging Face layout for HF presets)."""
    from gonka_diloco.export import DTYPES, ExportError, final_from_folder
    from gonka_diloco.export import export as write

    if out is None:
        _fail("give --out DIR: the new model folder", 2)
    assert out is not None
    if dtype not in DTYPES:
        _fail(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}", 2)
    if chain is not None and not chain.startswith(("http://", "https://")):
        _fail(f"--chain {chain!r} is not an http:// or https:// URL", 2)
    if (chain is None) != (run is None):
        _fail("--chain URL and --run N go together", 2)
    scratch: Path | None = None
    try:
        if source is None:
            if chain is None or run is None:
                _fail("give a run folder, or --chain URL --run N", 2)
            assert chain is not None and run is not None
            final, endpoints = _from_chain(chain, run, None)
            from gonka_diloco.export import fetch_params

            out.resolve().parent.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(dir=out.resolve().parent, prefix=f".{out.name}.fetch-"))
            final.holders = [fetch_params(final, endpoints, scratch)]
        elif not source.is_dir():
            _fail(f"{source}: no such folder", 2)
        elif (source / "snapshot.json").exists():
            if chain is not None:
                _fail(
                    f"{source} is a run folder, which names its own run and chain: leave out --chain/--run", 2
                )
            final = final_from_folder(source)
        elif (source / "store").is_dir():
            if chain is None or run is None:
                _fail(
                    f"{source} is a node's data_dir: give --chain URL --run N (which run's model to read)", 2
                )
            assert chain is not None and run is not None
            final, _ = _from_chain(chain, run, source)
        else:
            _fail(
                f"{source} is neither a devnet run folder (snapshot.json) nor a node's data_dir (store/)", 2
            )
        if dataset is not None:
            final.dataset = dataset
        path, who = write(final, out, dtype=dtype)
    except ExportError as e:
        _fail(str(e))
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    p = final.prov
    loss = f", validation loss {p.val_loss:.4f}" if p.val_loss is not None else ""
    typer.echo(
        f"run {p.run_id}'s final model {p.model_hash[:12]} ({p.outer_steps} outer steps, "
        f"{p.tokens_seen:,} tokens{loss}) -> {path}"
    )
    typer.echo(f"read from: {who}")
    typer.echo(f"files: {', '.join(sorted(f.name for f in path.iterdir()))}")


def _from_chain(url: str, run_id: int, data_dir: Path | None) -> Any:
    from chain.client import HttpChainClient
    from gonka_diloco.export import ExportError, final_from_chain

    client = HttpChainClient(url, timeout=10.0)
    try:
        try:
            client.height()
        except Exception as e:  # transport: one clear line
            raise ExportError(f"cannot reach the chain at {url}: {' '.join(str(e).split())[:200]}") from None
        return final_from_chain(client, run_id, url, data_dir)
    finally:
        client.close()


@app.command()
def sample(
    folder: Annotated[Path, typer.Argument(help="A folder `model export` wrote.")],
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="The text to continue.")],
    tokens: Annotated[int, typer.Option(min=1, max=100_000, help="Tokens to write.")] = 200,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="0 = greedy; above 0, sampled (seeded by --seed).")
    ] = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0, help="Sample among the k likeliest (0 = all).")] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the sampled tokens.")] = 0,
    verify: Annotated[
        bool,
        typer.Option("--verify/--no-verify", help="Check model.safetensors against its recorded sha256."),
    ] = True,
) -> None:
    """Continue --prompt with an exported model (its own training forward; reproducible)."""
    from gonka_diloco.export import verify_export
    from gonka_diloco.sample import Settings, context_of, continue_text, folder_tokenizer
    from replay.spec import ExportedModelError, exported_section, load_exported

    try:
        exported_section(folder)  # a folder an export wrote, before anything else is read
        codec = folder_tokenizer(folder)
        if verify:
            verify_export(folder)
        model = load_exported(folder)
        text = continue_text(
            model, codec, prompt, context_of(folder), Settings(tokens, temperature, top_k, seed)
        )
    except ExportedModelError as e:
        _fail(str(e))
    except ValueError as e:  # an empty prompt
        _fail(f"--prompt: {e}", 2)
    typer.echo(prompt + text)
