"""The `gonka-diloco` command line: one typer app, sub-apps per node kind.

Sub-apps are imported only when they run: the node sub-apps pull in torch, FastAPI and cosmpy,
which would make `gonka-diloco --help` take seconds. A sub-app whose package is not installed (or
not built yet) still shows in the help and fails with a clear message when called.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

# typer vendors click (typer/_click, no `click` dependency): its groups take and return these
# classes, and its main loop reports only its own UsageError as a usage error (a click.UsageError
# would end in a traceback)
from typer import _click as click
from typer._click.exceptions import UsageError
from typer.core import TyperCommand, TyperGroup

from gonka_diloco.devnet_config import DevnetConfig
from gonka_diloco.options import (
    Tolerance,
    ToleranceCumulative,
    ToleranceCumulativeUpdate,
    ToleranceDenominator,
    ToleranceExpAvg,
    ToleranceExpAvgSq,
    ToleranceUpdate,
)

LAZY: dict[str, tuple[str, str]] = {
    "chain": ("chain.cli", "The devnet chain node (`chain start`)."),
    "host": (
        "gonka_diloco.host_cli",
        "The host node: train, commit, reveal (`host run --config host.toml`).",
    ),
    "verifier": (
        "gonka_diloco.verifier_cli",
        "The verifier node: replay and judge (`verifier run --config verifier.toml`).",
    ),
    "keys": ("gonka_diloco.keys_cli", "Create, import, list and fund account keys (`keys send`)."),
    "init": ("gonka_diloco.init_cli", "Write a run.toml, host.toml and verifier.toml that fit together."),
    "run": ("gonka_diloco.run_cli", "Create training runs from a TOML run config."),
    "data": ("gonka_diloco.data_cli", "Prepare token-shard datasets from text or JSONL (`data prepare`)."),
    "status": ("gonka_diloco.status_cli", "Show runs, outer steps, phases, contributions and verdicts."),
    "plan": ("gonka_diloco.plan_cli", "What a run costs and how safe it is, per outer step (and --sweep)."),
    "model": (
        "gonka_diloco.model_cli",
        "Export a finished run's trained model (`model export`), and write text with it (`model sample`).",
    ),
}
"""name -> (module with a typer `app`, the one-line help shown without importing it)."""


class LazyGroup(TyperGroup):
    """A typer group whose sub-commands are imported on first use, not to print the help."""

    _listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *LAZY})

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in LAZY:
            return self.commands.get(cmd_name)
        module_name, help_text = LAZY[cmd_name]
        if self._listing:
            return TyperCommand(cmd_name, help=help_text, short_help=help_text)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            return _unavailable(cmd_name, help_text, f"{module_name} is not installed ({e.name} missing)")
        command = typer.main.get_command(module.app)
        command.name = cmd_name
        self.commands[cmd_name] = command
        return command


def _unavailable(name: str, help_text: str, why: str) -> click.Command:
    def callback() -> None:
        raise UsageError(f"`{name}` is unavailable: {why}")

    return TyperCommand(name, help=f"{help_text} (unavailable: {why})", callback=callback)


D = DevnetConfig()
"""The devnet defaults, shown in `devnet --help` (flags left unset fall back to the TOML, then these)."""

DEVNET_EPILOG = """\b
A TOML file (--config) takes the same fields as the flags, plus [phases] in seconds:
  hosts = 5
  verifiers = 3
  verifiers_per_contribution = 3
  [[adversaries]]
  behaviour = "lazy"
  params = { fraction = 0.5 }
  [[verifier_adversaries]]
  behaviour = "malicious"
  [phases]
  join = 25.0
  train = 8.0
Flags on the command line win over the file.
Exit status: 0 = the run passed every check, 1 = it failed one (see report.md), 2 = bad configuration.
"""

app = typer.Typer(cls=LazyGroup, help="Verifiable DiLoCo training on a Cosmos chain.", no_args_is_help=True)


def version_line() -> str:
    """`gonka-diloco --version`: this package's version and the torch it would run (read from the
    installed metadata, without importing torch)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"gonka-diloco {of('gonka-diloco')} (torch {of('torch')}, transformers {of('transformers')})"


def _version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Verifiable DiLoCo training on a Cosmos chain."""


@app.command(epilog=escape(DEVNET_EPILOG))
def devnet(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="Devnet TOML (DevnetConfig fields).")
    ] = None,
    hosts: Annotated[int | None, typer.Option(help=f"Number of hosts (default {D.hosts}).")] = None,
    verifiers: Annotated[
        int | None, typer.Option(help=f"Number of verifiers (default {D.verifiers}).")
    ] = None,
    adversary: Annotated[
        list[str] | None,
        typer.Option(
            "--adversary",
            "-a",
            help="Adversarial hosts, NAME[:COUNT[:k=v,…]], repeatable (default noise:1; 'none').",
        ),
    ] = None,
    verifier_adversary: Annotated[
        list[str] | None, typer.Option("--verifier-adversary", help="Adversarial verifiers, same form.")
    ] = None,
    outer_steps: Annotated[
        int | None, typer.Option("--outer-steps", help=f"Outer steps to run (default {D.outer_steps}).")
    ] = None,
    inner_steps: Annotated[
        int | None,
        typer.Option("--inner-steps", "-H", help=f"H: inner steps per outer step (default {D.inner_steps})."),
    ] = None,
    segment_len: Annotated[
        int | None,
        typer.Option("--segment-len", "-k", help=f"k: inner steps per segment (default {D.segment_len})."),
    ] = None,
    sampled_segments: Annotated[
        int | None,
        typer.Option(
            "--sampled", "-s", help=f"s: segments opened per contribution (default {D.sampled_segments})."
        ),
    ] = None,
    sampling: Annotated[
        str | None,
        typer.Option(
            "--sampling",
            help=f"windows: each checker replays its own window of w segments; segments: every checker "
            f"opens the same s (default {D.sampling.value}, specs §2.3).",
        ),
    ] = None,
    window_segments: Annotated[
        int | None,
        typer.Option("--window", "-w", help=f"w: segments per checker window (default {D.window_segments})."),
    ] = None,
    verifiers_per_contribution: Annotated[
        int | None,
        typer.Option(
            "--verifiers-per",
            "-v",
            help=f"v: verifiers per contribution (default {D.verifiers_per_contribution}).",
        ),
    ] = None,
    codec: Annotated[
        str | None,
        typer.Option(
            help="Δ codec: fp32, bf16, int8, int4, or sparse (top-k with error feedback) "
            f"(default {D.codec.value})."
        ),
    ] = None,
    sparse_chunk: Annotated[
        int | None,
        typer.Option("--sparse-chunk", help=f"codec sparse: chunk C (default {D.sparse_chunk})."),
    ] = None,
    sparse_topk: Annotated[
        int | None,
        typer.Option("--sparse-topk", help=f"codec sparse: entries k per chunk (default {D.sparse_topk})."),
    ] = None,
    sparse_mean: Annotated[
        str | None,
        typer.Option(
            "--sparse-mean",
            help="codec sparse: each coordinate's mean over the hosts that kept it (contributors) or over "
            f"all hosts (hosts) (default {D.sparse_mean.value}).",
        ),
    ] = None,
    model_size: Annotated[
        str | None,
        typer.Option("--model-size", help=f"Model preset: tiny, small or base (default {D.model_size})."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", help="gpt (sized by --model-size), llama-tiny, llama-small, qwen2-tiny or qwen2-small."
        ),
    ] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="Prepared dataset folder or URL (default: Shakespeare).")
    ] = None,
    block_interval: Annotated[
        float | None,
        typer.Option("--block-interval", help=f"Seconds per block (default {D.block_interval})."),
    ] = None,
    replay_mode: Annotated[
        str | None,
        typer.Option("--replay-mode", help=f"bitwise or tolerance (default {D.replay_mode.value})."),
    ] = None,
    moments: Annotated[
        str | None,
        typer.Option(
            "--moments",
            help="AdamW moments: int8 or fp32 (default int8; fp32 in tolerance mode, which needs it).",
        ),
    ] = None,
    overlap: Annotated[
        str | None,
        typer.Option(
            help="none, or eager: train step n+1 while step n is verified, starting from G_(n-1) "
            f"moved by the host's own step n-1 Δ (default {D.overlap.value})."
        ),
    ] = None,
    early_close: Annotated[
        bool | None,
        typer.Option(
            "--early-close/--fixed-windows",
            help="Close a phase window as soon as every message it waits for is in (specs §2.3.1; "
            f"default {'--early-close' if D.early_close else '--fixed-windows'}).",
        ),
    ] = None,
    tolerance: Tolerance = None,
    tolerance_exp_avg: ToleranceExpAvg = None,
    tolerance_exp_avg_sq: ToleranceExpAvgSq = None,
    tolerance_update: ToleranceUpdate = None,
    tolerance_denominator: ToleranceDenominator = None,
    tolerance_cumulative: ToleranceCumulative = None,
    tolerance_cumulative_update: ToleranceCumulativeUpdate = None,
    seed: Annotated[
        int | None, typer.Option(help=f"Run seed: model init, data, batches (default {D.seed}).")
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(help=f"Seconds before the run counts as stalled (default {D.timeout:.0f})."),
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out-dir", help=f"Where <timestamp>/ goes (default {D.out_dir}).")
    ] = None,
    live: Annotated[
        bool | None, typer.Option("--live/--no-live", help="Show the live terminal view.")
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(help=f"Chain engine: embedded (one process) or cometbft (default {D.engine})."),
    ] = None,
    validators: Annotated[
        int | None, typer.Option(help="CometBFT validators (with --engine cometbft; default 4 there).")
    ] = None,
    list_adversaries: Annotated[
        bool, typer.Option("--list-adversaries", help="List the adversary library's behaviours and exit.")
    ] = False,
) -> None:
    """Run a local devnet (chain, hosts, verifiers as separate processes); writes runs/<time>/report.md."""
    from gonka_diloco.devnet_config import DevnetConfigError, load_config, parse_adversary
    from gonka_diloco.report import summary_rows

    if list_adversaries:
        from gonka_diloco.adversaries import listing

        typer.echo(listing())
        return
    overrides: dict[str, Any] = {
        "hosts": hosts,
        "verifiers": verifiers,
        "outer_steps": outer_steps,
        "inner_steps": inner_steps,
        "segment_len": segment_len,
        "sampled_segments": sampled_segments,
        "sampling": sampling,
        "window_segments": window_segments,
        "verifiers_per_contribution": verifiers_per_contribution,
        "codec": codec,
        "sparse_chunk": sparse_chunk,
        "sparse_topk": sparse_topk,
        "sparse_mean": sparse_mean,
        "model_size": model_size,
        "model": model,
        "dataset": dataset,
        "block_interval": block_interval,
        "replay_mode": replay_mode,
        "moments": moments,
        "overlap": overlap,
        "early_close": early_close,
        "tolerance": tolerance,
        "tolerance_exp_avg": tolerance_exp_avg,
        "tolerance_exp_avg_sq": tolerance_exp_avg_sq,
        "tolerance_update": tolerance_update,
        "tolerance_denominator": tolerance_denominator,
        "tolerance_cumulative": tolerance_cumulative,
        "tolerance_cumulative_update": tolerance_cumulative_update,
        "seed": seed,
        "timeout": timeout,
        "out_dir": out_dir,
        "live": live,
        "engine": engine,
        "validators": validators if validators is not None else (4 if engine == "cometbft" else None),
    }
    try:
        if adversary:
            specs = [] if adversary == ["none"] else [parse_adversary(a) for a in adversary]
            overrides["adversaries"] = [s.model_dump() for s in specs]
        if verifier_adversary:
            overrides["verifier_adversaries"] = [parse_adversary(a).model_dump() for a in verifier_adversary]
        cfg = load_config(config, overrides)
        from gonka_diloco.devnet import run_devnet

        snap = run_devnet(cfg, echo=typer.echo)
    except DevnetConfigError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from None
    _print_summary(snap.run_id, summary_rows(snap), snap.failures)
    if snap.failures:
        raise typer.Exit(1)


def _print_summary(run_id: int, rows: list[tuple[str, str]], failures: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("", "", title=f"run {run_id} summary", show_header=False)
    for k, v in rows:
        table.add_row(k, v)
    console = Console()
    console.print(table)
    for f in failures:
        console.print(f"[red]FAIL[/red] {f}", highlight=False)


REPORT_EPILOG = """\b
With a chain URL the report describes any run, also after its nodes have exited: the validation
loss is the median of what the hosts' result votes carried for the adopted model (on chain),
sit-outs and counts come from the chain, and each thing that could not be read (a node that
exited, a Δ no longer served) is one line. Exit status: 0 = written, 1 = the chain could not be
read (unreachable, no such run), 2 = a bad run folder. A devnet folder keeps its PASS/FAIL.
"""


@app.command(epilog=escape(REPORT_EPILOG))
def report(
    target: Annotated[str, typer.Argument(help="A devnet run folder (with snapshot.json) or a chain URL.")],
    run_id: Annotated[int, typer.Option("--run-id", help="With a chain URL: which run.")] = 1,
    out: Annotated[
        Path | None, typer.Option("--out", help="Folder to write into (default: the run folder).")
    ] = None,
    keyring_dir: Annotated[
        Path,
        typer.Option(
            "--keyring-dir",
            envvar="GONKA_KEYRING_DIR",
            help="With a chain URL: participants whose address is a key here are shown by its name.",
        ),
    ] = Path("~/.gonka-diloco/keyring"),
) -> None:
    """Write report.md and loss.png for a run folder or a run on a chain, and print the summary."""
    from gonka_diloco.report import ChainReadError, ReportError, load_snapshot, summary_rows, write_report

    try:
        if target.startswith(("http://", "https://")):
            snap = _snapshot_from_chain(target, run_id, _key_names(keyring_dir))
            folder = out or Path("runs") / f"report-run{run_id}"
        else:
            path = Path(target)
            snap = load_snapshot(path)
            folder = out or (path if path.is_dir() else path.parent)
    except ReportError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(1 if isinstance(e, ChainReadError) else 2) from None
    path = write_report(snap, folder)
    _print_summary(snap.run_id, summary_rows(snap), snap.failures if snap.judged else [])
    for note in snap.notes:
        typer.echo(f"note: {note}")
    typer.echo(f"report: {path}")


def _key_names(directory: Path) -> dict[str, str]:
    """address -> key name of the local keyring (addresses only: no passphrase); {} without one."""
    from protocol.keys import Keyring, KeyringError

    path = directory.expanduser()
    if not path.is_dir():
        return {}
    try:
        return {info.address: info.name for info in Keyring(path).list()}
    except (OSError, KeyringError):  # a courtesy: a report never fails on the keyring
        return {}


def _snapshot_from_chain(url: str, run_id: int, names: dict[str, str] | None = None) -> Any:
    """Everything the chain says about run `run_id` over its own span, plus what its nodes' /status
    still say; `ChainReadError` (one line) when the chain cannot be read or has no such run."""
    from chain.client import HttpChainClient
    from gonka_diloco.collect import BlockTally, collect, fetch_status, scan_blocks, update_from_status
    from gonka_diloco.report import UNKNOWN, ChainReadError, NodeRow

    client = HttpChainClient(url, timeout=10.0)
    try:
        try:
            height = client.height()
        except Exception as e:  # transport: one clear line
            raise ChainReadError(f"cannot reach the chain at {url}: {e}") from None
        try:
            run = client.run(run_id)
        except Exception as e:
            if "404" in str(e) or "ErrUnknownRun" in str(e) or "unknown run" in str(e).lower():
                raise ChainReadError(f"no run {run_id} on {url}") from None
            raise ChainReadError(f"cannot read run {run_id} from {url}: {e}") from None
        try:
            last = height
            if run["status"] == "finished":
                done = client.outer_step(run_id, int(run["current_step"])).get("done_height")
                last = min(height, int(done)) if done is not None else height
            tally = scan_blocks(client, run_id, BlockTally(), last, from_height=run.get("created_height"))
            parts = client.query("participants", run_id=run_id)["participants"]
            names = names or {}
            known = [
                NodeRow(
                    name=names[p["address"]], role=p["role"], address=p["address"],
                    url=p.get("endpoint", ""), behaviour=UNKNOWN,
                )
                for p in parts
                if p["address"] in names
            ]
            snap = collect(client, run_id, known, tally=tally, measure_deltas=True)
        except Exception as e:  # transport trouble midway: one clear line
            raise ChainReadError(f"cannot read run {run_id} from {url}: {e}") from None
    finally:
        client.close()
    snap.source = "chain"
    answered = 0
    for i, node in enumerate(snap.nodes):
        status = fetch_status(node.url) if node.url else None
        if status is not None:
            answered += 1
            snap.nodes[i] = update_from_status(node, status)
    snap.notes += _unread(snap, answered)
    return snap


def _unread(snap: Any, answered: int) -> list[str]:
    """One line for each thing a chain report could not read."""
    notes = []
    if snap.nodes and answered < len(snap.nodes):
        notes.append(
            f"node status: {len(snap.nodes) - answered} of {len(snap.nodes)} nodes did not answer /status "
            "(exited or unreachable): their states and local losses are not shown"
        )
    unsized = [c for c in snap.contributions if c.delta_bytes is None]
    if unsized:
        notes.append(
            f"Δ sizes: {len(unsized)} of {len(snap.contributions)} Δs are no longer served by their "
            "hosts (exited, or pruned after the step): 'Δ bytes' shows n/a"
        )
    val = snap.val_loss()
    missing = [s.index for s in snap.steps if s.phase == "DONE" and s.index not in val]
    if missing:
        notes.append(
            f"validation loss: none recorded for outer step(s) {', '.join(map(str, missing))} (no vote for "
            "the adopted model carried one — it closed unchanged, or its hosts predate val_loss_ppm — and "
            "no node's /status had it)"
        )
    return notes


if __name__ == "__main__":
    app()
