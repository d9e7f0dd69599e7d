"""`gonka-diloco verifier …`: run a verifier node, or calibrate the tolerance-mode thresholds."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="The verifier node: replay and judge contributions.", no_args_is_help=True)
DEFAULT_CHAIN_WAIT = 60.0
"""`nodekit.reach.DEFAULT_CHAIN_WAIT` (see gonka_diloco/host_cli.py)."""


def _listing() -> str:
    from gonka_diloco.adversaries import listing

    return listing()


@app.command(epilog="Behaviours: `gonka-diloco verifier behaviours` lists them with their parameters.")
def run(
    config: Annotated[Path, typer.Option("--config", "-c", help="verifier.toml")],
    linger: Annotated[
        bool, typer.Option(help="After the run ends, keep serving what it holds until stopped.")
    ] = False,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait", help="If the run does not exist yet, wait for it (a line says so) instead of failing."
        ),
    ] = False,
    chain_wait: Annotated[
        float,
        typer.Option("--chain-wait", min=0, help="Seconds to wait for an unreachable chain at start-up."),
    ] = DEFAULT_CHAIN_WAIT,
) -> None:
    """Join the run in verifier.toml and judge every contribution assigned to this key."""
    from verifier.node_config import ConfigError, load_verifier_config

    try:  # before torch and the node: a bad file is an error at once
        cfg = load_verifier_config(config)
    except ConfigError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    from chain.client import ChainClientError, HttpChainClient
    from gonka_diloco.adversaries import resolve_verifier  # the process entry point composes
    from nodekit.reach import Reach, chain_error, listen_error
    from verifier.node import NodeError, VerifierNode

    try:
        behaviour = resolve_verifier(cfg.behaviour, cfg.behaviour_params)
        chain = HttpChainClient(cfg.chain_url)
        node = VerifierNode(cfg, chain, behaviour=behaviour)
        node.reach = Reach(chain_wait=chain_wait, wait_for_run=wait)
    except (ConfigError, ValueError, OSError) as e:
        line = listen_error(e, cfg.listen, config) if isinstance(e, OSError) else None
        typer.echo(f"error: {line or e}", err=True)
        raise typer.Exit(2) from None
    signal.signal(signal.SIGTERM, lambda *_: node.stop())
    signal.signal(signal.SIGINT, lambda *_: node.stop())
    try:
        node.run(linger=linger)
    except Exception as e:
        line = chain_error(e, cfg.chain_url, config)
        if line is None and not isinstance(e, NodeError | ChainClientError):
            raise
        node.log("fatal", error=f"{type(e).__name__}: {e}")
        typer.echo(f"error: {line or e}", err=True)
        raise typer.Exit(1) from None
    finally:
        chain.close()


@app.command()
def behaviours() -> None:
    """List the host and verifier behaviours (honest and adversarial) with their parameters."""
    typer.echo(_listing())


@app.command()
def calibrate(
    size: Annotated[str, typer.Option(help="Model: 'tiny' or 'small' (the default small GPT).")] = "small",
    ks: Annotated[str, typer.Option(help="Segment lengths k, comma-separated.")] = "1,2,5,10,20,50",
    threads: Annotated[str, typer.Option(help="Verifier,host thread counts.")] = "1,2",
    device_a: Annotated[str, typer.Option(help="The verifier's device: cpu, cuda, cuda:N.")] = "cpu",
    device_b: Annotated[str, typer.Option(help="The host's device: cpu, cuda, cuda:N.")] = "cpu",
    precision: Annotated[str, typer.Option(help="The run's precision: fp32 or bf16 (autocast).")] = "fp32",
    trials: Annotated[int, typer.Option(min=1, help="Start states per k (max noise, min signal).")] = 8,
    factor: Annotated[float, typer.Option(min=1.0, help="Threshold = factor × honest noise.")] = 8.0,
    window_segments: Annotated[
        int | None,
        typer.Option(min=1, help="The run's w (default: the chain's): for the sums its windows make."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Where to write the JSON result.")] = Path("calibration.json"),
) -> None:
    """Measure honest replay noise between two environments (thread counts, or devices: CPU vs GPU,
    GPU vs GPU; separate processes) against the signal of one skipped step and one swapped batch,
    for the parameters and both AdamW moments; propose a threshold per group (the run config's
    tolerance, tolerance_exp_avg, tolerance_exp_avg_sq), for the moments in update space
    (tolerance_update, tolerance_denominator) and for the replayed segments' summed residuals
    (tolerance_cumulative, tolerance_cumulative_update: the largest over every set of as many
    segments as windows of w sum, or more, of whole trajectories of k·⌊max k / k⌋ steps; the
    JSON records that count and `run create` takes them only for a run that sums as many)
    and the largest safe k."""
    from gonka_diloco.adversaries.lab import TINY_GPT
    from protocol.config import InnerOptim, ModelSpec, Moments, Numerics, Precision, RunConfig
    from verifier.calibrate import CalibrationError, table, to_json
    from verifier.calibrate import calibrate as measure

    try:
        k_list = [int(x) for x in ks.split(",")]
        a, b = (int(x) for x in threads.split(","))
        spec = {"tiny": TINY_GPT, "small": ModelSpec(factory="trainer.model:small_gpt")}[size]
        numerics = Numerics(precision=Precision(precision))
    except (ValueError, KeyError):
        typer.echo("error: --ks and --threads take comma-separated integers, --size tiny|small, "
                   "--precision fp32|bf16", err=True)  # fmt: skip
        raise typer.Exit(2) from None
    kmax = max(k_list)
    # float32 moments: what tolerance mode runs with (specs §6.2.1; the default is int8)
    cfg = RunConfig(model=spec, dataset_manifest_hash="0" * 64, initial_model_hash="0" * 64,
                    inner_steps=kmax, segment_len=kmax, sampled_segments=1, numerics=numerics,
                    inner=InnerOptim(moments=Moments.FP32),
                    **({} if window_segments is None else {"window_segments": window_segments}),
                    **({"seq_len": int(spec.config["block_size"])} if size == "tiny" else {}))  # fmt: skip
    devices = (device_a, device_b)
    try:
        proposal = measure(cfg, "shakespeare", k_list, (a, b), trials, factor=factor, devices=devices)
    except (CalibrationError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    same = device_a == device_b == "cpu"
    typer.echo(table(proposal, (a, b) if same else (f"{device_a} x{a}", f"{device_b} x{b}")))
    result = {"model": size, "threads": [a, b], "devices": list(devices), "precision": precision,
              "trials": trials, **to_json(proposal)}  # fmt: skip
    out.write_text(json.dumps(result, indent=2))
    typer.echo(f"wrote {out}")
