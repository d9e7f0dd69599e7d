"""`gonka-diloco host run --config host.toml`: the host node in the foreground.

The first stdout line is `{"event": "listening", "url": ...}`; every later line is one JSON log
record. On a terminal a rich progress line shows the outer step and phase above the log.
SIGTERM/SIGINT stop the node at its next wait; all its state is on disk, so it resumes later.

Under `torchrun --nproc_per_node N` rank 0 is the node and ranks >= 1 only follow its training
calls (`trainer.ddp.follow`): they never bind a port, touch the chain or write the data dir.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from trainer.node_config import ConfigError, load_host_config

if TYPE_CHECKING:
    pass

DEFAULT_CHAIN_WAIT = 60.0
"""`nodekit.reach.DEFAULT_CHAIN_WAIT`, repeated here so that `--help` imports neither the chain
client nor torch (tests/test_cli.py checks the two agree)."""

app = typer.Typer(help="The host node: train, commit, reveal, aggregate.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """The host node: train, commit, reveal, aggregate."""


def _follower_corpus(config: Path) -> Any:
    """A DDP follower's dataset: the one host.toml names (`follow` checks it against the run).
    Remote shards go to the user's cache, not `data_dir`, which only rank 0 writes."""
    from replay.data import cache_root, open_dataset

    source = load_host_config(config).dataset_source
    return lambda: open_dataset(source, cache_root() / "datasets")


class _Progress:
    """A one-line rich status (outer step, phase, losses) when stdout is a terminal."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console()
        self.live = Live(console=self.console, transient=True, refresh_per_second=4)
        self.state: dict[str, Any] = {}

    def __call__(self, event: dict[str, Any]) -> None:
        self.console.print(json.dumps(event, default=str), markup=False, soft_wrap=True)
        for key in ("outer_step", "loss", "val_loss"):
            if key in event:
                self.state[key] = event[key]
        self.state["event"] = event.get("event")
        line = "  ".join(f"{k}={v}" for k, v in self.state.items())
        self.live.update(f"[bold]host[/bold] {line}")


@app.command()
def run(
    config: Path = typer.Option(..., "--config", "-c", help="host.toml"),
    max_outer_steps: int = typer.Option(
        0, min=0, help="Stop after this many outer steps (0: run to the end)."
    ),
    linger: bool = typer.Option(False, help="After the run ends, keep serving blobs until stopped."),
    wait: bool = typer.Option(
        False,
        "--wait",
        help="If the run does not exist yet, wait for it (a line says so) instead of failing.",
    ),
    chain_wait: float = typer.Option(
        DEFAULT_CHAIN_WAIT,
        "--chain-wait",
        min=0,
        help="Seconds to wait for an unreachable chain at start-up.",
    ),
) -> None:
    """Join the run, then train, commit, reveal and aggregate every outer step."""
    rank0 = os.environ.get("RANK", "0") == "0"
    try:  # before torch and the node: a bad file is an error at once
        cfg = load_host_config(config)
    except ConfigError as e:
        if rank0:  # under torchrun every rank reads it; one says what is wrong
            typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    from chain.client import ChainClientError, HttpChainClient
    from gonka_diloco.adversaries import resolve_host  # the process entry point composes
    from nodekit.node import json_line
    from nodekit.reach import Reach, chain_error, listen_error
    from trainer import behaviour, ddp
    from trainer.node import HostNode, NodeError

    try:
        exchange = ddp.launch(cfg.device)  # None unless torchrun started several ranks
    except ValueError as e:  # a device this machine does not have
        typer.echo(f"error: {config}: device = {cfg.device!r}: {e}", err=True)
        raise typer.Exit(2) from None
    if exchange is not None and exchange.rank != 0:
        try:
            ddp.follow(exchange, corpus=_follower_corpus(config))
        finally:
            ddp.shutdown()
        return
    team = ddp.Team(exchange) if exchange is not None else None
    try:
        if team is not None:
            team.shard_state = cfg.shard_state
        node_behaviour = resolve_host(cfg.behaviour, cfg.behaviour_params)
        chain = HttpChainClient(cfg.chain_url)
        progress = _Progress() if sys.stdout.isatty() else None
        log = progress if progress is not None else json_line  # json_line: HostNode's default
        node = HostNode(cfg, chain, behaviour=node_behaviour, team=team, log=log)
        node.reach = Reach(chain_wait=chain_wait, wait_for_run=wait)
    except (ConfigError, behaviour.BehaviourError, NodeError, OSError, ValueError) as e:
        line = listen_error(e, cfg.listen, config) if isinstance(e, OSError) else None
        typer.echo(f"error: {line or e}", err=True)
        if team is not None:
            team.close()
            ddp.shutdown()
        raise typer.Exit(2) from None

    def stop(signum: int, _frame: Any) -> None:
        node.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        if progress is not None:
            with progress.live:
                node.run(max_outer_steps or None, linger=linger)
        else:
            node.run(max_outer_steps or None, linger=linger)
    except Exception as e:
        line = chain_error(e, cfg.chain_url, config)
        if line is None and not isinstance(e, NodeError | ChainClientError | ddp.TeamError):
            raise
        node.log("fatal", error=f"{type(e).__name__}: {e}")
        typer.echo(f"error: {line or e}", err=True)
        raise typer.Exit(1) from None
    finally:
        chain.close()
        if team is not None:
            team.close()
            ddp.shutdown()
