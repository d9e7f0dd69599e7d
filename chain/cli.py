"""`gonka-diloco chain start`: run a chain node in the foreground; `chain localnet`: lay out a network.

Two engines run the same state machine: `--engine embedded` (default) is the single-process devnet
node that makes its own blocks; `--engine cometbft` is one validator of a CometBFT network (the
app plus a CometBFT child process, `chain.abci.validator`), its home made by `chain localnet`
(or, for a one-validator network, on first start). The first stdout line is
`{"event": "listening", "url": ...}` (with the real port when `--port 0`), so a parent process
can start the node and read where it listens; every later line is a JSON log record (one per
block, one per rejected tx).
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import typer
import uvicorn
from pydantic import ValidationError

from chain.genesis import Genesis
from chain.node import DEV_BALANCE, Node, create_app, dev_genesis, log_json
from chain.params import BLOCK_SECONDS
from chain.store import StoreError
from protocol.keys import Keyring, KeyringError
from protocol.messages import parse_amount

app = typer.Typer(help="The devnet chain: the embedded node, or CometBFT validators.", no_args_is_help=True)
MAX_GENESIS_BYTES = 16 * 1024 * 1024


def load_genesis(path: Path) -> Genesis:
    """A genesis JSON file, size-bounded and validated; exits with a clear message when bad."""
    try:
        if path.stat().st_size > MAX_GENESIS_BYTES:
            raise ValueError(f"larger than {MAX_GENESIS_BYTES} bytes")
        return Genesis.model_validate_json(path.read_bytes())
    except (OSError, ValueError, ValidationError) as exc:
        typer.echo(f"error: cannot load genesis {path}: {exc}", err=True)
        raise typer.Exit(2) from None


class Engine(enum.StrEnum):
    EMBEDDED = "embedded"
    COMETBFT = "cometbft"


def _listen(host: str, port: int) -> socket.socket:
    """The node's listening socket, or one line naming --host/--port when it cannot be had."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        typer.echo(
            f"error: cannot listen on {host}:{port} (--host/--port): {exc.strerror}; "
            "give another --port (0 picks a free one)",
            err=True,
        )
        raise typer.Exit(2) from None
    return sock


LOCK_FILE = "node.lock"
_held: list[object] = []
"""Open lock files, kept for the life of the process (closing one releases its lock)."""


def lock_home(home: Path) -> None:
    """An exclusive lock on `home` for this process's life (fcntl.flock, released by the kernel when
    the process exits, however it dies): two nodes on one home would write the same SQLite state
    or CometBFT data. A second one stops with one line naming --home and the holder's pid."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        f = (home / LOCK_FILE).open("a+")
    except OSError as exc:
        typer.echo(f"error: cannot use --home {home}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        typer.echo(
            f"error: --home {home} is in use by another chain node (pid {holder}): stop it, or give "
            "another --home",
            err=True,
        )
        raise typer.Exit(2) from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _held.append(f)


def _announce(sock: socket.socket, host: str, **fields: object) -> None:
    url = f"http://{host}:{sock.getsockname()[1]}"
    sys.stdout.write(json.dumps({"event": "listening", "url": url, **fields}) + "\n")
    sys.stdout.flush()


def _parse_fund(item: str) -> tuple[str, int]:
    """NAME:AMOUNT (NAME a keyring key or a gonka1… address) → (name, ngonka)."""
    name, sep, amount = item.rpartition(":")
    if not sep or not name:
        raise ValueError(f"--fund {item!r}: expected NAME:AMOUNT, e.g. host-0:20GNK")
    try:
        ngonka = parse_amount(amount)
    except ValueError as exc:
        raise ValueError(f"--fund {item!r}: {exc}") from None
    if ngonka <= 0:
        raise ValueError(f"--fund {item!r}: the amount must be positive")
    return name, ngonka


def shaped_genesis(
    base: Genesis | None, keyring_dir: Path, authority: str | None, fund: list[str]
) -> tuple[Genesis | None, list[dict[str, object]]]:
    """The genesis a new chain starts from: `base` (default: the dev genesis) with `authority` — a
    keyring key, created when missing, funded with DEV_BALANCE unless --fund names it — as the only
    account allowed to create runs, and every --fund added to its account. Returns it (None when
    nothing was asked: the node's own default) and the lines to log once it listens."""
    if authority is None and not fund and base is None:
        return None, []
    gen = base or dev_genesis()
    if authority is None and not fund:
        return gen, []
    ring = Keyring(keyring_dir.expanduser())
    notes: list[dict[str, object]] = []
    accounts = dict(gen.accounts)
    funded = [(ring.resolve(name), amount, name) for name, amount in map(_parse_fund, fund)]
    update: dict[str, object] = {}
    if authority is not None:
        if authority.startswith("gonka1"):
            address = ring.resolve(authority)
        elif authority in ring.names():
            address = ring.show(authority).address
        else:
            info, _ = ring.add(authority)
            address = info.address
            note = "created in the keyring (its mnemonic is in the key file)"
            notes.append({"event": "key_created", "name": authority, "address": address, "note": note})
        update["authority"] = address
        if address not in {a for a, _, _ in funded}:
            accounts[address] = accounts.get(address, 0) + DEV_BALANCE
    for address, amount, _ in funded:
        accounts[address] = accounts.get(address, 0) + amount
    update["accounts"] = accounts
    shaped = Genesis.model_validate({**gen.model_dump(), **update})
    if funded:
        notes.append({"event": "funded", "accounts": {name: amount for _, amount, name in funded}})
    return shaped, notes


@app.command()
def start(
    home: Path = typer.Option(Path(".devnet/chain"), help="Data directory (SQLite; CometBFT home)."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int | None = typer.Option(
        None, min=0, max=65535, help="HTTP port; 0 picks a free one (default 26657, or the localnet's)."
    ),
    block_interval: float = typer.Option(BLOCK_SECONDS, min=0.01, help="Seconds between blocks."),
    genesis: Path | None = typer.Option(None, help="Genesis JSON; default: dev wallets 0..31 funded."),
    min_gas_price: float = typer.Option(1.0, min=0, help="Minimum fee in ngonka per unit of gas."),
    engine: Engine = typer.Option(Engine.EMBEDDED, help="embedded (one process) or cometbft (a validator)."),
    authority: str | None = typer.Option(
        None,
        help="A new chain's authority (the only account that creates runs): a keyring key, created "
        "if missing, or a gonka1… address; funded with 1e9 GNK. Default: the dev genesis's, the "
        "public test mnemonic's first account (`run create --test-index 0`).",
    ),
    fund: list[str] = typer.Option(
        [],
        "--fund",
        help="NAME:AMOUNT, repeatable: give a keyring key (or gonka1… address) AMOUNT (e.g. 20GNK) in "
        "a new chain's genesis. On a running chain use `gonka-diloco keys send`.",
    ),
    keyring_dir: Path = typer.Option(
        Path("~/.gonka-diloco/keyring"),
        envvar="GONKA_KEYRING_DIR",
        help="The keyring --authority and --fund names are looked up in.",
    ),
) -> None:
    """Start a node: make (or validate) blocks; serve the Cosmos REST routes and the module's API."""
    lock_home(home)
    try:
        gen, notes = shaped_genesis(load_genesis(genesis) if genesis else None, keyring_dir, authority, fund)
    except (KeyringError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if engine is Engine.COMETBFT:
        _start_validator(home, host, port, block_interval, gen, min_gas_price)
        return
    try:
        node = Node(home, gen, block_interval=block_interval, min_gas_price=min_gas_price)
    except StoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    sock = _listen(host, 26657 if port is None else port)
    _announce(sock, host, height=node.height, chain_id=node.app.chain_id, engine="embedded")
    for note in notes:
        log_json(**note)
    log_json(event="genesis", authority=node.genesis.authority, accounts=len(node.genesis.accounts))
    config = uvicorn.Config(create_app(node), log_level="warning", access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


def validator_home(home: Path, genesis: Genesis | None, block_interval: float) -> Path:
    """The CometBFT home to run: `home` itself, the only node of a localnet in `home`, or a new
    one-validator network made there on first start."""
    from chain.abci.cometbft import LOCALNET_FILE, Localnet, write_localnet

    if (home / "config" / "genesis.json").exists():
        return home
    if not (home / LOCALNET_FILE).exists():
        write_localnet(home, 1, genesis=genesis or dev_genesis(), block_interval=block_interval)
    net = Localnet.load(home)
    if len(net.validators) != 1:
        names = ", ".join(f"{home / v.home}" for v in net.validators)
        raise StoreError(f"{home} holds {len(net.validators)} validators: start each with --home ({names})")
    return home / net.validators[0].home


def _start_validator(
    home: Path,
    host: str,
    port: int | None,
    block_interval: float,
    genesis: Genesis | None,
    min_gas_price: float,
) -> None:
    from chain.abci.cometbft import CometBFTError
    from chain.abci.faults import FAULT_ENV
    from chain.abci.validator import Validator

    try:
        vhome = validator_home(home, genesis, block_interval)
        if vhome.resolve() != home.resolve():  # a localnet folder naming its one validator
            lock_home(vhome)
        node = Validator(vhome, min_gas_price=min_gas_price, fault=os.environ.get(FAULT_ENV) or None)
        if genesis is not None and genesis.chain_id != node.genesis.chain_id:
            raise StoreError(f"{vhome} runs chain {node.genesis.chain_id}, not {genesis.chain_id}")
    except (StoreError, CometBFTError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    sock = _listen(host, node.info.rest_port if port is None else port)
    _announce(
        sock,
        host,
        height=node.height,
        chain_id=node.app.chain_id,
        engine="cometbft",
        name=node.info.name,
        rpc=node.info.rpc_url,
    )
    node.start_engine()  # before the server's threads exist: the child is forked from one thread
    try:
        config = uvicorn.Config(create_app(node), log_level="warning", access_log=False, lifespan="on")
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        node.stop_engine()


@app.command()
def localnet(
    validators: int = typer.Option(4, min=1, max=64, help="Number of validators."),
    home: Path = typer.Option(Path(".devnet/localnet"), help="Folder for the validators' homes (empty)."),
    block_interval: float = typer.Option(0.5, min=0.05, help="Seconds between blocks (timeout_commit)."),
    base_port: int = typer.Option(
        26600,
        min=0,
        max=65000,
        help="Validator i listens on base+10i (P2P), +1 (RPC), +2 (REST); 0: free ports.",
    ),
    genesis: Path | None = typer.Option(None, help="App genesis JSON; default: dev wallets 0..31 funded."),
) -> None:
    """Write keys, one genesis and a config per validator for a local CometBFT network."""
    from chain.abci.cometbft import CometBFTError, write_localnet

    gen = load_genesis(genesis) if genesis else dev_genesis()
    try:
        net = write_localnet(
            home, validators, genesis=gen, block_interval=block_interval, base_port=base_port
        )
    except CometBFTError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"localnet {net.chain_id}: {len(net.validators)} validators in {home}")
    for v in net.validators:
        typer.echo(f"  {v.name}: REST {v.rest_url}  RPC {v.rpc_url}  P2P 127.0.0.1:{v.p2p_port}  {v.address}")
    typer.echo("start each with: gonka-diloco chain start --engine cometbft --home " + str(home / "node<i>"))


@app.command()
def genesis_template(out: Path = typer.Argument(..., help="Where to write the dev genesis JSON.")) -> None:
    """Write the default dev genesis, as a starting point for a custom one."""
    out.write_text(dev_genesis().model_dump_json(indent=2))


class NodeProcess:
    """A devnet node in a child process: started, its URL read from its first line, its log
    drained to a file by a thread (so a full pipe never stalls it), stopped or killed on demand."""

    def __init__(
        self,
        home: Path,
        *,
        block_interval: float = 1.0,
        genesis: Path | None = None,
        port: int | None = 0,
        log_path: Path | None = None,
        startup_timeout: float = 60.0,
        engine: Engine = Engine.EMBEDDED,
        env: dict[str, str] | None = None,
    ):
        cmd = [sys.executable, "-m", "chain.cli", "start", "--home", str(home)]
        cmd += ["--block-interval", str(block_interval), "--engine", engine.value]
        if port is not None:
            cmd += ["--port", str(port)]
        if genesis is not None:
            cmd += ["--genesis", str(genesis)]
        self.log_path = log_path or Path(home).with_suffix(".log")
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # its own group: stopping it stops its CometBFT child too
        )
        first: list[str] = []
        ready = threading.Event()
        threading.Thread(target=self._drain, args=(first, ready), daemon=True).start()
        try:
            if not ready.wait(startup_timeout) or not first:
                raise ValueError("no output")
            self.url: str = json.loads(first[0])["url"]
        except (ValueError, KeyError, TypeError):
            self.kill()
            raise RuntimeError(f"node did not start: {first[:1]} (see {self.log_path})") from None

    def _drain(self, first: list[str], ready: threading.Event) -> None:
        assert self.proc.stdout is not None
        with open(self.log_path, "ab") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                if not ready.is_set():
                    first.append(line.decode(errors="replace"))
                    ready.set()
        ready.set()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._signal(signal.SIGKILL)  # anything of its group left behind

    def kill(self) -> None:
        """SIGKILL to the node's whole process group: the crash a durable chain must survive."""
        self._signal(signal.SIGKILL)
        self.proc.wait()

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


if __name__ == "__main__":
    app()
