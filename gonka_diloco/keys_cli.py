"""`gonka-diloco keys`: an on-disk keyring for operators, and sending tokens between accounts.

Host and verifier configs point at a keyring directory and a key name, so an operator creates or
imports a key once here and never pastes a mnemonic into a config file. Keys are plaintext (the
Cosmos SDK "test" backend) unless created with `--encrypt` (or a passphrase given by
`--passphrase-file` / GONKA_KEYRING_PASSPHRASE): then the mnemonic is sealed under the passphrase
(scrypt + AES-256-GCM, the SDK "file" backend's idea). `keys send` is the chain's bank send, the
way to fund a new key on a running chain.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

DEFAULT_KEYRING = Path("~/.gonka-diloco/keyring")
PASSPHRASE_ENV = "GONKA_KEYRING_PASSPHRASE"  # protocol.keys.PASSPHRASE_ENV (not imported: --help stays fast)

app = typer.Typer(
    help="Create, import, list and fund account keys (secp256k1, gonka1… addresses).", no_args_is_help=True
)

KeyringDir = Annotated[
    Path,
    typer.Option(
        "--keyring-dir", envvar="GONKA_KEYRING_DIR", help="Keyring directory (created 0700 if missing)."
    ),
]
PassphraseFile = Annotated[
    Path | None,
    typer.Option(
        "--passphrase-file",
        envvar="GONKA_KEYRING_PASSPHRASE_FILE",
        help=f"File whose first line is the keyring passphrase (0600); else ${PASSPHRASE_ENV}, else a "
        "prompt.",
    ),
]
ChainUrl = Annotated[str, typer.Option("--chain-url", envvar="GONKA_CHAIN_URL", help="Chain node URL.")]


def _fail(message: str, code: int = 1) -> None:
    Console(stderr=True, soft_wrap=True).print(Text.assemble(("error: ", "red"), message))
    raise typer.Exit(code)


def passphrase_source(passphrase_file: Path | None, *, confirm: bool = False) -> Any:
    """The keyring passphrase: a file, else the environment, else (on a terminal) a prompt asked
    only when an encrypted key is used; None when there is no way to get one."""
    from protocol.keys import KeyringError, read_passphrase_file

    if passphrase_file is not None:
        try:
            return read_passphrase_file(passphrase_file.expanduser())
        except KeyringError as e:
            _fail(str(e))
    if os.environ.get(PASSPHRASE_ENV):
        return os.environ[PASSPHRASE_ENV]
    if sys.stdin.isatty():
        return lambda: typer.prompt("keyring passphrase", hide_input=True, confirmation_prompt=confirm)
    return None


def open_keyring(directory: Path, passphrase_file: Path | None = None, *, confirm: bool = False) -> Any:
    """`protocol.keys.Keyring` over `directory` with the passphrase sources above; exits with one
    line if the directory cannot be used."""
    from protocol.keys import Keyring, KeyringError

    try:
        return Keyring(directory.expanduser(), passphrase_source(passphrase_file, confirm=confirm))
    except (OSError, KeyringError) as e:
        _fail(f"cannot open keyring {directory}: {e}")


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
    encrypt: Annotated[
        bool,
        typer.Option(
            "--encrypt",
            help="Seal the mnemonic under a passphrase (asked twice; implied by --passphrase-file or "
            f"${PASSPHRASE_ENV}).",
        ),
    ] = False,
    passphrase_file: PassphraseFile = None,
) -> None:
    """Create a new key (prints its mnemonic once) or import one with --recover / --mnemonic-file."""
    from protocol.keys import KeyringError

    mnemonic: str | None = None
    if mnemonic_file is not None:
        try:
            mnemonic = mnemonic_file.read_text()[:4096]
        except (OSError, UnicodeDecodeError) as e:
            _fail(f"cannot read {mnemonic_file}: {getattr(e, 'strerror', None) or e}")
    elif recover:
        mnemonic = (
            sys.stdin.readline() if not sys.stdin.isatty() else typer.prompt("mnemonic", hide_input=True)
        )
    encrypt = encrypt or passphrase_file is not None or bool(os.environ.get(PASSPHRASE_ENV))
    ring = open_keyring(keyring_dir, passphrase_file, confirm=True)
    try:
        info, phrase = ring.add(name, mnemonic, encrypt=encrypt)
    except KeyringError as e:
        _fail(str(e))
        return
    typer.echo(f"name: {info.name}\naddress: {info.address}\npubkey: {info.public_key}")
    if info.encrypted:
        typer.echo("encrypted: yes (its passphrase is needed to sign)")
    if mnemonic is None:
        typer.echo("\n**Write this mnemonic down; it is the only way to recover the key:**\n" + phrase)


@app.command("list")
def list_keys(keyring_dir: KeyringDir = DEFAULT_KEYRING) -> None:
    """List every key in the keyring with its address (no passphrase needed)."""
    from protocol.keys import KeyringError

    try:
        infos = open_keyring(keyring_dir).list()
    except KeyringError as e:
        _fail(str(e))
        return
    table = Table("name", "address", "hd path", "encrypted")
    for info in infos:
        table.add_row(info.name, info.address, info.hd_path, "yes" if info.encrypted else "no")
    Console(width=None if sys.stdout.isatty() else 200).print(table)


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="Key name.")],
    keyring_dir: KeyringDir = DEFAULT_KEYRING,
    address_only: Annotated[bool, typer.Option("--address", "-a", help="Print only the address.")] = False,
) -> None:
    """Show one key's address and public key (never its mnemonic; no passphrase needed)."""
    from protocol.keys import KeyringError

    try:
        info = open_keyring(keyring_dir).show(name)
    except KeyringError as e:
        _fail(str(e))
        return
    if address_only:
        typer.echo(info.address)
    else:
        typer.echo(
            f"name: {info.name}\naddress: {info.address}\npubkey: {info.public_key}\nhd_path: {info.hd_path}"
            f"\nencrypted: {'yes' if info.encrypted else 'no'}"
        )


@app.command()
def encrypt(
    name: Annotated[str, typer.Argument(help="Key name.")],
    keyring_dir: KeyringDir = DEFAULT_KEYRING,
    passphrase_file: PassphraseFile = None,
) -> None:
    """Seal an existing plaintext key under a passphrase (the file is rewritten atomically)."""
    from protocol.keys import KeyringError

    try:
        info = open_keyring(keyring_dir, passphrase_file, confirm=True).encrypt(name)
    except KeyringError as e:
        _fail(str(e))
        return
    typer.echo(f"encrypted key {info.name} ({info.address})")


def _amount(text: str) -> int:
    from protocol.messages import parse_amount

    try:
        amount = parse_amount(text)
    except ValueError as e:
        _fail(str(e), 2)
    if amount <= 0:
        _fail(f"amount {text!r} must be positive", 2)
    return amount


@app.command()
def send(
    sender: Annotated[str, typer.Argument(metavar="FROM", help="Key name that signs and pays.")],
    recipient: Annotated[str, typer.Argument(metavar="TO", help="Key name or gonka1… address.")],
    amount: Annotated[
        str, typer.Argument(help="e.g. 20GNK, 1.5GNK or 5000000000ngonka (a bare number is ngonka).")
    ],
    chain_url: ChainUrl = "http://127.0.0.1:26657",
    keyring_dir: KeyringDir = DEFAULT_KEYRING,
    passphrase_file: PassphraseFile = None,
    memo: Annotated[str, typer.Option(help="Tx memo.")] = "",
) -> None:
    """Send tokens (the chain's bank MsgSend): how a new key is funded on a running chain."""
    from chain.client import HttpChainClient
    from protocol.keys import KeyringError
    from protocol.messages import Coin, MsgSend, format_amount

    ngonka = _amount(amount)
    ring = open_keyring(keyring_dir, passphrase_file)
    try:
        to = ring.resolve(recipient)
        wallet = ring.wallet(sender)
    except KeyringError as e:
        _fail(str(e))
        return
    msg = MsgSend(from_address=str(wallet.address()), to_address=to, amount=[Coin(amount=ngonka)])
    client = HttpChainClient(chain_url)
    try:
        result = client.broadcast(wallet, [msg], memo=memo[:256])
        after = client.balance(to)
    except Exception as e:  # transport, unfunded sender, insufficient funds: one clear line
        _fail(f"send failed: {getattr(e, 'log', None) or e}")
        return
    finally:
        client.close()
    out = {"tx": result.hash, "height": result.height, "from": msg.from_address, "to": to, "amount": ngonka}
    typer.echo(json.dumps({**out, "amount_gnk": format_amount(ngonka), "to_balance": after}))


@app.command()
def balance(
    account: Annotated[str, typer.Argument(metavar="NAME|ADDRESS", help="Key name or gonka1… address.")],
    chain_url: ChainUrl = "http://127.0.0.1:26657",
    keyring_dir: KeyringDir = DEFAULT_KEYRING,
) -> None:
    """An account's balance on the chain, in ngonka and GNK."""
    from chain.client import HttpChainClient
    from protocol.keys import KeyringError
    from protocol.messages import format_amount

    try:
        address = open_keyring(keyring_dir).resolve(account)
    except KeyringError as e:
        _fail(str(e))
        return
    client = HttpChainClient(chain_url, timeout=5.0)
    try:
        amount = client.balance(address)
    except Exception as e:  # unreachable chain: one line
        _fail(f"cannot read {chain_url}: {e}")
        return
    finally:
        client.close()
    typer.echo(json.dumps({"address": address, "ngonka": amount, "gnk": format_amount(amount)}))
