"""`gonka-diloco run create`: create a run on chain from a TOML run config.

The two hashes a run is bound to may be left out of the TOML: the initial model hash is then
computed from the model spec (seeded init, zero momentum) and the dataset manifest hash from the
Shakespeare corpus — exactly what every host will recompute and check.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

app = typer.Typer(help="Create training runs.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Create training runs (a group, so that `run create` keeps its name as more commands come)."""


class RunConfigFileError(ValueError):
    """The run config TOML is missing, malformed or invalid; the message says where."""


def load_run_config(path: Path) -> Any:  # -> protocol.config.RunConfig
    """Read and validate a run config TOML, filling in the two derivable hashes when absent."""
    from protocol.config import ModelSpec, RunConfig

    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise RunConfigFileError(f"run config not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RunConfigFileError(f"cannot read {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise RunConfigFileError(f"{path} is not valid TOML: {e}") from None
    if "model" not in data:
        raise RunConfigFileError(f"{path}: [model] is required (factory and config)")
    if "initial_model_hash" not in data:
        try:
            spec = ModelSpec.model_validate(data["model"])
        except ValidationError as e:
            raise RunConfigFileError(f"{path}: model: {_errors(e)}") from None
        data["initial_model_hash"] = initial_model_hash(spec)
    if "dataset_manifest_hash" not in data:
        from trainer.data import shakespeare_manifest

        data["dataset_manifest_hash"] = shakespeare_manifest()[1].manifest_hash()
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise RunConfigFileError(f"{path}: {_errors(e)}") from None


def initial_model_hash(spec: Any) -> str:
    """G_0's hash: the seeded model's parameters with zero outer momentum."""
    from trainer.globalmodel import GlobalModel
    from trainer.spec import BadModelSpec, ModelNotAllowed, build_model

    try:
        return GlobalModel.from_module(build_model(spec)).hash
    except (BadModelSpec, ModelNotAllowed) as e:
        raise RunConfigFileError(f"model: {e}") from None


def _errors(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in e.errors()
    )


def _fail(message: str, code: int = 2) -> None:
    Console(stderr=True, soft_wrap=True).print(Text.assemble(("error: ", "red"), message))
    raise typer.Exit(code)


def _wallet(key: str | None, keyring_dir: Path, test_index: int | None) -> Any:
    from protocol.keys import Keyring, KeyringError, test_wallet

    try:
        if test_index is not None:
            return test_wallet(test_index)
        if key is None:
            _fail("give --key NAME (from `gonka-diloco keys add`) or --test-index I (devnet)")
        return Keyring(keyring_dir.expanduser()).wallet(key)
    except KeyringError as e:
        _fail(str(e))


@app.command()
def create(
    config: Annotated[Path, typer.Argument(help="Run config TOML (protocol.config.RunConfig fields).")],
    chain_url: Annotated[
        str, typer.Option("--chain-url", envvar="GONKA_CHAIN_URL", help="Chain node URL.")
    ] = ("http://127.0.0.1:26657"),
    key: Annotated[
        str | None, typer.Option("--key", help="Keyring key that signs (the chain's authority).")
    ] = None,
    keyring_dir: Annotated[
        Path, typer.Option("--keyring-dir", envvar="GONKA_KEYRING_DIR", help="Keyring directory.")
    ] = Path("~/.gonka-diloco/keyring"),
    test_index: Annotated[
        int | None,
        typer.Option("--test-index", help="Sign with devnet test wallet I instead (0 = authority)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and print the config; send nothing.")
    ] = False,
) -> None:
    """Create a run from a TOML run config with MsgCreateRun, and print its run id."""
    try:
        cfg = load_run_config(config)
    except RunConfigFileError as e:
        _fail(str(e))
        return
    if dry_run:
        typer.echo(
            json.dumps({"config_hash": cfg.config_hash(), "config": cfg.model_dump(mode="json")}, indent=2)
        )
        return
    from chain.client import HttpChainClient
    from protocol.messages import MsgCreateRun

    wallet = _wallet(key, keyring_dir, test_index)
    client = HttpChainClient(chain_url)
    try:
        result = client.broadcast(wallet, [MsgCreateRun(creator=str(wallet.address()), config=cfg)])
    except Exception as e:  # transport, tx or ante failure: one clear line, no traceback
        _fail(f"MsgCreateRun failed: {e}", 1)
        return
    finally:
        client.close()
    run_id = next((e.attributes["run_id"] for e in result.events if e.type == "create_run"), "?")
    typer.echo(
        json.dumps(
            {
                "run_id": int(run_id) if run_id != "?" else None,
                "tx": result.hash,
                "height": result.height,
                "config_hash": cfg.config_hash(),
            }
        )
    )
