"""The `gonka-diloco` command line: one typer app, sub-apps per node kind."""

from __future__ import annotations

import typer

app = typer.Typer(help="Verifiable DiLoCo training on a Cosmos chain.", no_args_is_help=True)


@app.command()
def devnet() -> None:
    """Run a local devnet (chain, hosts, verifiers as separate processes)."""
    typer.echo("make devnet is not built yet (issue 6).", err=True)
    raise typer.Exit(2)
