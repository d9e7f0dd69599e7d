"""`gonka-diloco chain start`: run the devnet node in the foreground.

The first stdout line is `{"event": "listening", "url": ...}` (with the real port when `--port 0`),
so a parent process can start the node and read where it listens; every later line is a JSON log
record (one per block, one per rejected tx).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import typer
import uvicorn
from pydantic import ValidationError

from chain.genesis import Genesis
from chain.node import Node, create_app, dev_genesis, log_json
from chain.store import StoreError

app = typer.Typer(help="The single-validator devnet chain.", no_args_is_help=True)
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


@app.command()
def start(
    home: Path = typer.Option(Path(".devnet/chain"), help="Data directory (SQLite database)."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(26657, min=0, max=65535, help="HTTP port; 0 picks a free one."),
    block_interval: float = typer.Option(1.0, min=0.01, help="Seconds between blocks."),
    genesis: Path | None = typer.Option(None, help="Genesis JSON; default: dev wallets 0..31 funded."),
    min_gas_price: float = typer.Option(1.0, min=0, help="Minimum fee in ngonka per unit of gas."),
) -> None:
    """Start the node: produce blocks and serve the Cosmos REST routes and the module's API."""
    gen = load_genesis(genesis) if genesis else None
    try:
        node = Node(home, gen, block_interval=block_interval, min_gas_price=min_gas_price)
    except StoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    url = f"http://{host}:{sock.getsockname()[1]}"
    sys.stdout.write(
        json.dumps({"event": "listening", "url": url, "height": node.height, "chain_id": node.app.chain_id})
        + "\n"
    )
    sys.stdout.flush()
    log_json(event="genesis", authority=node.genesis.authority, accounts=len(node.genesis.accounts))
    config = uvicorn.Config(create_app(node), log_level="warning", access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


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
        port: int = 0,
        log_path: Path | None = None,
        startup_timeout: float = 60.0,
    ):
        cmd = [
            sys.executable,
            "-m",
            "chain.cli",
            "start",
            "--home",
            str(home),
            "--port",
            str(port),
            "--block-interval",
            str(block_interval),
        ]
        if genesis is not None:
            cmd += ["--genesis", str(genesis)]
        self.log_path = log_path or Path(home).with_suffix(".log")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent
        )
        first: list[str] = []
        ready = threading.Event()
        threading.Thread(target=self._drain, args=(first, ready), daemon=True).start()
        if not ready.wait(startup_timeout) or not first or not first[0].startswith("{"):
            self.kill()
            raise RuntimeError(f"node did not start: {first[:1]} (see {self.log_path})")
        self.url: str = json.loads(first[0])["url"]

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
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL: the crash a durable chain must survive."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


if __name__ == "__main__":
    app()
