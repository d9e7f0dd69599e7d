"""`gonka-diloco status`: what a chain says about its runs, as rich tables.

Read-only and chain-only (the module's JSON queries), so an operator can point it at any node
without keys: every run, its current outer step and phase, and each commitment's verdicts.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gonka_diloco.collect import reason_name, short
from gonka_diloco.live import PHASE_STYLE

app = typer.Typer(help="Show the runs on a chain.")


def _error(message: str) -> None:
    Console(stderr=True, soft_wrap=True).print(Text.assemble(("error: ", "red"), message))


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 160)


def runs_table(runs: list[dict[str, Any]]) -> Table:
    table = Table(
        "run", "name", "status", "outer step", "phase", "hosts", "verifiers", "global model", title="runs"
    )
    for r in runs:
        phase = str(r["phase"])
        table.add_row(
            str(r["run_id"]),
            r["name"],
            r["status"],
            str(r["current_step"]),
            f"[{PHASE_STYLE.get(phase, '')}]{phase}[/]" if PHASE_STYLE.get(phase) else phase,
            str(r["hosts"]),
            str(r["verifiers"]),
            r["global_model_hash"][:16],
        )
    return table


def contributions_table(client: Any, run_id: int, step: int) -> Table:
    """One outer step: every commitment, its outcome and each verifier's verdict."""
    s = client.query("outer_step", run_id=run_id, step=step)
    commits = client.query("commitments", run_id=run_id, step=step)["commitments"]
    verdicts: dict[str, list[str]] = {}
    for v in client.query("verdicts", run_id=run_id, step=step)["verdicts"]:
        verdicts.setdefault(v["host"], []).append(
            f"{short(v['verifier'])}:{reason_name(v['reason'])}"
        )
    title = f"run {run_id} · outer step {step} · {s['phase']} · block {s['height']}"
    table = Table("host", "outcome", "tokens", "Δ hash", "verdicts", title=title)
    for c in commits:
        outcome = (s.get("outcomes") or {}).get(c["host"]) or "pending"
        style = {"accepted": "green", "pending": "dim"}.get(outcome, "red")
        table.add_row(
            short(c["host"]),
            f"[{style}]{outcome}[/]",
            str(c["tokens"]),
            c["delta_hash"][:12],
            ", ".join(verdicts.get(c["host"], [])) or "-",
        )
    return table


@app.command()
def status(
    chain_url: Annotated[
        str, typer.Option("--chain-url", envvar="GONKA_CHAIN_URL", help="Chain node URL.")
    ] = ("http://127.0.0.1:26657"),
    run_id: Annotated[
        int | None, typer.Option("--run-id", help="Only this run (default: every run).")
    ] = None,
    steps: Annotated[
        int, typer.Option("--steps", min=0, help="How many recent outer steps to detail per run.")
    ] = 2,
) -> None:
    """Show runs, outer steps, phases, contributions and verdicts from a chain node."""
    from chain.client import HttpChainClient

    console = _console()
    client = HttpChainClient(chain_url, timeout=5.0)
    try:
        runs = client.query("runs")["runs"]
        if run_id is not None:
            runs = [r for r in runs if r["run_id"] == run_id]
            if not runs:
                _error(f"no run {run_id} on {chain_url}")
                raise typer.Exit(1)
        console.print(f"chain {chain_url} · height {client.height()}")
        console.print(runs_table(runs))
        for r in runs:
            current = int(r["current_step"])
            for step in range(max(0, current - steps + 1), current + 1) if steps else ():
                console.print(contributions_table(client, int(r["run_id"]), step))
    except typer.Exit:
        raise
    except Exception as e:  # any transport or protocol failure: one clear line, no traceback
        _error(f"cannot read {chain_url}: {e}")
        raise typer.Exit(1) from None
    finally:
        client.close()
