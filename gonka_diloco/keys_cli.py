"""`gonka-diloco keys`: an on-disk keyring for operators (the Cosmos SDK "test" backend's shape).

Host and verifier configs point at a keyring directory and a key name, so an operator creates or
imports a key once here and never pastes a mnemonic into a config file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

DEFAULT_KEYRING = Path("~/.gonka-diloco/keyring")

app = typer.Typer(
    help="Create, import and list account keys (secp256k1, gonka1… addresses).", no_args_is_help=True
)

KeyringDir = Annotated[
    Path,
    typer.Option(
        "--keyring-dir", envvar="GONKA_KEYRING_DIR", help="Keyring directory (created 0700 if missing)."
    ),
]


def _keyring(directory: Path):  # -> protocol.keys.Keyring, imported late to keep --help fast
    from protocol.keys import Keyring, KeyringError

    try:
        return Keyring(directory.expanduser())
    except (OSError, KeyringError) as e:
        _fail(f"cannot open keyring {directory}: {e}")


def _fail(message: str) -> None:
    Console(stderr=True, soft_wrap=True).print(Text.assemble(("error: ", "red"), message))
    raise typer.Exit(1)


@app.command()
def add(
    name: Annotated[str, typer.Argument(help="Key name (letters, digits, . _ -).")],
    keyring_dir: KeyringDir = DEFAULT_KEYRING,
    recover: Annotated[
        bool,
        typer.Option("--recover", help="Import an existing BIP-39 mnemonic (read from stdin or a prompt)."),
    ] = False,
    mnemonic_file: Annotated[
        Path | None, typer.Option("--mnemonic-file", help="Import the mnemonic held in this file.")
    ] = None,
) -> None:
    """Create a new key (prints its mnemonic once) or import one with --recover / --mnemonic-file."""
    from protocol.keys import KeyringError

    mnemonic: str | None = None
    if mnemonic_file is not None:
        try:
            mnemonic = mnemonic_file.read_text()[:4096]
        except OSError as e:
            _fail(f"cannot read {mnemonic_file}: {e.strerror}")
    elif recover:
        mnemonic = (
            sys.stdin.readline() if not sys.stdin.isatty() else typer.prompt("mnemonic", hide_input=True)
        )
    try:
        info, phrase = _keyring(keyring_dir).add(name, mnemonic)
    except KeyringError as e:
        _fail(str(e))
        return
    typer.echo(f"name: {info.name}\naddress: {info.address}\npubkey: {info.public_key}")
    if mnemonic is None:
        typer.echo("\n**Write this mnemonic down; it is the only way to recover the key:**\n" + phrase)


@app.command("list")
def list_keys(keyring_dir: KeyringDir = DEFAULT_KEYRING) -> None:
    """List every key in the keyring with its address."""
    from protocol.keys import KeyringError

    try:
        infos = _keyring(keyring_dir).list()
    except KeyringError as e:
        _fail(str(e))
        return
    table = Table("name", "address", "hd path")
    for info in infos:
        table.add_row(info.name, info.address, info.hd_path)
    Console(width=None if sys.stdout.isatty() else 200).print(table)


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="Key name.")],
    keyring_dir: KeyringDir = DEFAULT_KEYRING,
    address_only: Annotated[bool, typer.Option("--address", "-a", help="Print only the address.")] = False,
) -> None:
    """Show one key's address and public key (never its mnemonic)."""
    from protocol.keys import KeyringError

    try:
        info = _keyring(keyring_dir).show(name)
    except KeyringError as e:
        _fail(str(e))
        return
    if address_only:
        typer.echo(info.address)
    else:
        typer.echo(
            f"name: {info.name}\naddress: {info.address}\npubkey: {info.public_key}\nhd_path: {info.hd_path}"
        )
