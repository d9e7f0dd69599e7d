"""`gonka-diloco run create`: create a run on chain from a TOML run config.

The two hashes a run is bound to may be left out of the TOML: the initial model hash is then
computed from the model spec (seeded init, or `--init-checkpoint`; zero momentum) and the dataset
manifest hash from `--dataset` (default: the Shakespeare corpus) — exactly what every host will
recompute and check. A `trainer.hf:*` model's `preset` is expanded into its complete config,
pinned to the installed `transformers` version, so the spec hash covers every number of it.
`--init-from-run N` starts from run N's final global model, fetched from N's nodes by its
on-chain hash.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from chain.params import BLOCK_SECONDS
from gonka_diloco.options import (
    Tolerance,
    ToleranceCumulative,
    ToleranceCumulativeUpdate,
    ToleranceDenominator,
    ToleranceExpAvg,
    ToleranceExpAvgSq,
    ToleranceUpdate,
)

app = typer.Typer(help="Create training runs.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Create training runs (a group, so that `run create` keeps its name as more commands come)."""


class RunConfigFileError(ValueError):
    """The run config TOML is missing, malformed or invalid; the message says where."""


def with_overlap(cfg: Any, overlap: str) -> Any:  # RunConfig -> RunConfig
    """The config with another schedule, validated like the TOML's own `overlap`."""
    from pydantic import ValidationError

    from protocol.config import Overlap, RunConfig

    try:
        return RunConfig.model_validate({**cfg.model_dump(), "overlap": Overlap(overlap)})
    except (ValueError, ValidationError):
        choices = ", ".join(o.value for o in Overlap)
        raise RunConfigFileError(f"--overlap {overlap!r}: expected one of {choices}") from None


TOLERANCE_FIELDS = (
    "tolerance",
    "tolerance_exp_avg",
    "tolerance_exp_avg_sq",
    "tolerance_update",
    "tolerance_denominator",
    "tolerance_cumulative",
    "tolerance_cumulative_update",
)
"""The run config's tolerance-mode thresholds, each a `run create` flag of its name."""
CUMULATIVE_FIELDS = ("tolerance_cumulative", "tolerance_cumulative_update")
MAX_CALIBRATION_BYTES = 1 << 20
"""`verifier calibrate` writes a few kB; anything larger is not one of its files."""


def with_fields(cfg: Any, fields: dict[str, Any], what: str) -> Any:  # RunConfig -> RunConfig
    """The config with `fields` replaced, validated like the TOML's own (`what` names the source).
    Fields that make it a tolerance run give it float32 moments unless the config named its moments
    (`protocol.config.tolerance_moments`: tolerance mode needs them, the default is int8)."""
    from protocol.config import RunConfig, tolerance_moments

    data = cfg.model_dump()
    if "moments" in cfg.inner.model_fields_set:  # named: kept (the dump omits the default)
        data["inner"] = {**data["inner"], "moments": cfg.inner.moments}
    try:
        return RunConfig.model_validate(tolerance_moments({**data, **fields}))
    except ValidationError as e:
        raise RunConfigFileError(f"{what}: {_errors(e)}") from None


@dataclass(frozen=True)
class Calibration:
    """What a `verifier calibrate` JSON proposes: the run config's tolerance fields (with
    `replay_mode = "tolerance"`), the summed-residual rule its thresholds are for (`cumulative_rule`;
    None: a calibration from before issue 36), and the fewest segments they hold for
    (`cumulative_least_segments`; 2 if the file does not say: calibrated over every set of two)."""

    fields: dict[str, Any]
    rule: str | None
    least: int


def read_calibration(path: Path) -> Calibration:
    """The calibration at `path`, with one clear error for a missing, unreadable or malformed file."""
    try:
        if path.stat().st_size > MAX_CALIBRATION_BYTES:
            raise RunConfigFileError(f"{path}: over {MAX_CALIBRATION_BYTES} bytes, not a calibration")
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunConfigFileError(f"calibration not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunConfigFileError(f"cannot read calibration {path}: {e}") from None
    fields = data.get("run_config") if isinstance(data, dict) else None
    if not isinstance(fields, dict) or not fields or set(fields) - set(TOLERANCE_FIELDS):
        raise RunConfigFileError(
            f"{path}: no `run_config` of tolerance thresholds (`gonka-diloco verifier calibrate` writes one)"
        )
    rule = data.get("cumulative_rule")
    if rule is not None and not isinstance(rule, str):
        raise RunConfigFileError(f"{path}: cumulative_rule: expected a string, got {rule!r}")
    least = data.get("cumulative_least_segments", 2)
    if isinstance(least, bool) or not isinstance(least, int) or least < 2:
        raise RunConfigFileError(f"{path}: cumulative_least_segments: expected an integer ≥ 2, got {least!r}")
    return Calibration({**fields, "replay_mode": "tolerance"}, rule, least)


def check_calibrated_for(path: Path, cal: Calibration, cfg: Any = None) -> None:  # cfg: RunConfig
    """Summed-residual thresholds mean what the rule they were calibrated for divides by (specs
    §6.4): the earlier rule's (Σ wᵢ, for a fixed number of opened segments) are smaller than the
    count-independent rule needs, and would reject honest hosts. And they hold for sets of
    `cal.least` segments or more: honest summed noise is larger over fewer, so a run whose rule sums
    fewer (`RunConfig.summed_least`: a shorter window, a smaller s) would reject honest hosts too."""
    from protocol.config import CUMULATIVE_RULE

    if not any(cal.fields.get(f) for f in CUMULATIVE_FIELDS):
        return
    if cal.rule != CUMULATIVE_RULE:
        what = "the rule before issue 36 (no `cumulative_rule`)" if cal.rule is None else f"rule {cal.rule!r}"
        raise RunConfigFileError(
            f"{path}: its summed-residual thresholds are for {what}, this version checks "
            f"{CUMULATIVE_RULE!r}; calibrate again with `gonka-diloco verifier calibrate`"
        )
    if cfg is not None and cfg.summed_least < cal.least:
        how = (f"windows of w = {cfg.window_len}" if cfg.windowed
               else f"s = {cfg.sampled_segments} opened segments")  # fmt: skip
        raise RunConfigFileError(
            f"{path}: its summed-residual thresholds hold for sets of {cal.least} segments or more, and this "
            f"run ({how} of H/k = {cfg.n_segments}) sums {cfg.summed_least}; calibrate again with "
            f"`gonka-diloco verifier calibrate --window-segments {cfg.window_len}`"
        )


PLACEHOLDER_HASH = "0" * 64


def read_run_toml(path: Path) -> dict[str, Any]:
    """The TOML as a dict, with one clear error for a missing, unreadable or malformed file."""
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
    return data


def _validate(path: Path, data: dict[str, Any]) -> Any:  # -> RunConfig
    from protocol.config import RunConfig

    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise RunConfigFileError(f"{path}: {_errors(e)}") from None


def _expand_model(path: Path, data: dict[str, Any]) -> None:
    """A `trainer.hf:*` preset expanded in place into the complete config (imports torch)."""
    model = data["model"]
    if isinstance(model, dict) and isinstance(model.get("config", {}), dict):
        from replay.hf import expand

        try:
            model["config"] = expand(str(model.get("factory", "")), model.get("config", {}))
        except ValueError as e:
            raise RunConfigFileError(f"{path}: model: {e}") from None


def parse_run_config(path: Path) -> Any:  # -> protocol.config.RunConfig
    """A run config TOML validated exactly as `run create` validates it, the model's preset
    expanded, the two hashes placeholders where the file leaves them out: what `plan` reads (it
    needs neither hash, and must accept every file `run create` accepts)."""
    data = read_run_toml(path)
    hashes = {k: data.get(k, PLACEHOLDER_HASH) for k in ("initial_model_hash", "dataset_manifest_hash")}
    _validate(path, {**data, **hashes})
    _expand_model(path, data)
    return _validate(path, {**data, **hashes})


def load_run_config(
    path: Path, *, dataset: str | None = None, init_checkpoint: Path | None = None
) -> Any:  # -> protocol.config.RunConfig
    """Read and validate a run config TOML, filling in the two derivable hashes when absent.

    `dataset` (a folder, manifest or URL) and `init_checkpoint` set those hashes from what they
    name; a TOML that states a different hash is an error, not silently overridden. Everything
    the file alone decides is checked first, before torch is imported and G_0 is built: a typo
    is an error in a second, not after the model's initialisation.
    """
    from protocol.config import ModelSpec, tolerance_moments

    data = tolerance_moments(read_run_toml(path))  # tolerance mode: fp32 moments unless it names them
    hashes = {k: data.get(k, PLACEHOLDER_HASH) for k in ("initial_model_hash", "dataset_manifest_hash")}
    _validate(path, {**data, **hashes})
    _expand_model(path, data)
    check_model_bounds(path, _validate(path, {**data, **hashes}))  # before G_0 is built
    derived = {}
    if "initial_model_hash" not in data or init_checkpoint is not None:
        try:
            spec = ModelSpec.model_validate(data["model"])
        except ValidationError as e:
            raise RunConfigFileError(f"{path}: model: {_errors(e)}") from None
        chunk = data.get("state_chunk_bytes")  # validated with the rest below; G_0's hash needs it now
        derived["initial_model_hash"] = initial_model_hash(
            spec, init_checkpoint, chunk if isinstance(chunk, int) and chunk > 0 else None
        )
    if "dataset_manifest_hash" not in data or dataset is not None:
        derived["dataset_manifest_hash"] = dataset_manifest_hash(dataset or "")
    for key, value in derived.items():
        if key in data and data[key] != value:
            raise RunConfigFileError(
                f"{path}: {key} {data[key][:12]} is not the {value[:12]} of what you named"
            )
        data[key] = value
    cfg = _validate(path, data)
    if dataset is not None:
        from replay.data import DataError, check_vocab, open_dataset

        try:
            check_vocab(cfg, open_dataset(dataset))
        except DataError as e:
            raise RunConfigFileError(str(e)) from None
    return cfg


def check_model_bounds(path: Path, cfg: Any) -> None:
    """The chain's MsgCreateRun bounds on the model (specs §2.4), at the default module params: a
    run the chain would refuse (ErrModelTooLarge, ErrBadModelSpec) is refused here in one line,
    before `run create` builds G_0 or `--dry-run` prints it."""
    from chain.errors import ChainError
    from chain.module import check_model_size
    from chain.params import ModuleParams

    params = ModuleParams()
    try:
        check_model_size(cfg, params.max_model_params, params.max_model_tensors)
    except ChainError as e:
        raise RunConfigFileError(f"{path}: model: {e.log} [{e.codespace}:{e.code}]") from None


def size_train_phase(
    cfg: Any, step_seconds: float, block_seconds: float, margin: float
) -> tuple[Any, dict[str, float | int]]:
    """`cfg` with `phases.train_blocks` derived from the seconds one inner step takes
    (`gonka_diloco.phase_sizing`), and the figures that sized it. A TOML that sets
    `train_blocks` itself is an error: one of the two would be silently ignored."""
    from gonka_diloco.phase_sizing import PhaseSizingError, train_phase_blocks
    from protocol.config import RunConfig

    if "train_blocks" in cfg.phases.model_fields_set:
        raise RunConfigFileError(
            "the config sets phases.train_blocks and a flag asks to size it: give one of the two"
        )
    try:
        blocks = train_phase_blocks(cfg.inner_steps, step_seconds, block_seconds, margin=margin)
    except PhaseSizingError as e:
        raise RunConfigFileError(f"phase sizing: {e}") from None
    data = cfg.model_dump()
    data["phases"] = {**data["phases"], "train_blocks": blocks}
    info = {"step_seconds": step_seconds, "inner_steps": cfg.inner_steps, "margin": margin,
            "block_seconds": block_seconds, "train_blocks": blocks}  # fmt: skip
    return RunConfig.model_validate(data), info


def dataset_manifest_hash(source: str) -> str:
    """The manifest hash of a prepared dataset (folder, manifest.json or URL; '' = Shakespeare)."""
    from replay.data import DataError, open_dataset, shakespeare_manifest

    if not source:
        return shakespeare_manifest()[1].manifest_hash()
    try:
        return open_dataset(source).manifest_hash
    except DataError as e:
        raise RunConfigFileError(f"dataset: {e}") from None


def initial_model_hash(spec: Any, checkpoint: Path | None = None, chunk_bytes: int | None = None) -> str:
    """G_0's hash: the checkpoint's (or else the seeded model's) parameters with zero outer momentum,
    a chunked content hash at the run's chunk size."""
    from nodekit.node import NodeError
    from protocol.config import RunConfig
    from replay.checkpoint import CheckpointError, initial_global
    from replay.spec import BadModelSpec, Holder, ModelNotAllowed, build_model, check_fits

    try:
        check_fits(spec, "cpu", Holder.BUILD)  # refused in one line before anything is allocated
    except NodeError as e:
        raise RunConfigFileError(f"model: {e}") from None
    try:
        chunk = chunk_bytes or RunConfig.model_fields["state_chunk_bytes"].default
        return initial_global(build_model(spec), checkpoint or "", chunk).hash
    except (BadModelSpec, ModelNotAllowed) as e:
        raise RunConfigFileError(f"model: {e}") from None
    except CheckpointError as e:
        raise RunConfigFileError(f"init checkpoint: {e}") from None


def fetch_final_model(chain_url: str, run_id: int, out: Path) -> Path:
    """Run `run_id`'s final global model, fetched from its nodes by the on-chain hash (verified)."""
    from chain.client import HttpChainClient

    client = HttpChainClient(chain_url)
    try:
        return save_final_model(client, run_id, out)
    finally:
        client.close()


def save_final_model(chain: Any, run_id: int, out: Path) -> Path:
    """`fetch_final_model` over any chain client: the finished run's G by hash from its nodes,
    streamed chunk by chunk (each verified) into a scratch content store beside `out`, then written
    as a safetensors global-model file (`param/<n>`, `momentum/<n>`), a checkpoint form
    `replay.checkpoint` reads."""
    import tempfile

    from safetensors.torch import save_file

    from nodekit.blobs import BlobClient, BlobError
    from nodekit.globalmodel import GlobalModelError, GlobalStore
    from nodekit.store import ContentStore
    from protocol.config import RunConfig
    from replay.spec import BadModelSpec, ModelNotAllowed, build_model

    try:
        run = chain.run(run_id)
        parts = chain.query("participants", run_id=run_id)["participants"]
    except Exception as e:  # transport or unknown run: one clear line
        raise RunConfigFileError(f"cannot read run {run_id} from the chain: {e}") from None
    if run["status"] != "finished":
        raise RunConfigFileError(
            f"run {run_id} is {run['status']}, not finished: its final model may still change"
        )
    cfg = RunConfig.model_validate(run["config"])
    try:
        model = build_model(cfg.model)  # the layout that bounds every byte we accept
    except (BadModelSpec, ModelNotAllowed) as e:
        raise RunConfigFileError(f"run {run_id}'s model: {e}") from None
    layout = {n: tuple(p.shape) for n, p in model.named_parameters()}
    target = run["global_model_hash"]
    endpoints = [p["endpoint"] for p in parts if p.get("endpoint")]
    if out.is_dir():
        out = out / f"run{run_id}-final-{target[:12]}.safetensors"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".fetch-") as scratch:
        store = GlobalStore(ContentStore(scratch, cfg.state_chunk_bytes), layout)
        with BlobClient(endpoints, 60.0, 2) as blobs:
            try:
                gm = store.fetch(target, blobs, endpoints)
            except (BlobError, GlobalModelError) as e:
                why = f"no node of run {run_id} served its final model {target[:12]}: {e}"
                raise RunConfigFileError(why) from None
        save_file(gm.to_tensors(), str(out))
    return out


def _errors(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in e.errors()
    )


def _fail(message: str, code: int = 2) -> None:
    Console(stderr=True, soft_wrap=True).print(Text.assemble(("error: ", "red"), message))
    raise typer.Exit(code)


def _wallet(key: str | None, keyring_dir: Path, test_index: int | None, passphrase_file: Path | None) -> Any:
    from gonka_diloco.keys_cli import open_keyring
    from protocol.keys import KeyringError, test_wallet

    try:
        if test_index is not None:
            return test_wallet(test_index)
        if key is None:
            _fail("give --key NAME (from `gonka-diloco keys add`) or --test-index I (devnet)")
        return open_keyring(keyring_dir, passphrase_file).wallet(key)
    except KeyringError as e:
        _fail(str(e))


def _authority_hint(client: Any, signer: str) -> str:
    """Who may create runs on this chain, and how a local chain gets an authority key."""
    try:
        authority = client.params()["authority"]
    except Exception:  # the hint is a courtesy: the error itself is already clear
        return ""
    return (
        f" (this chain's authority is {authority}, not {signer}: sign with its key, `--test-index 0` on "
        "the default dev genesis, or start a new local chain with "
        "`gonka-diloco chain start --authority NAME`)"
    )


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
    passphrase_file: Annotated[
        Path | None,
        typer.Option(
            "--passphrase-file",
            envvar="GONKA_KEYRING_PASSPHRASE_FILE",
            help="Unlocks an encrypted --key (else $GONKA_KEYRING_PASSPHRASE, else a prompt).",
        ),
    ] = None,
    test_index: Annotated[
        int | None,
        typer.Option("--test-index", help="Sign with devnet test wallet I instead (0 = authority)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and print the config; send nothing.")
    ] = False,
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", help="Prepared dataset (folder, manifest.json or URL): its manifest hash."),
    ] = None,
    init_checkpoint: Annotated[
        Path | None,
        typer.Option(
            "--init-checkpoint",
            help="Start from this safetensors file or local HF model folder (hosts set init_checkpoint too).",
        ),
    ] = None,
    init_from_run: Annotated[
        int | None,
        typer.Option("--init-from-run", help="Start from finished run N's final model (fetched by hash)."),
    ] = None,
    checkpoint_out: Annotated[
        Path, typer.Option("--checkpoint-out", help="Where --init-from-run saves that model.")
    ] = Path("."),
    step_seconds: Annotated[
        float | None,
        typer.Option(
            "--step-seconds", help="Seconds one inner step takes on a host: sizes phases.train_blocks."
        ),
    ] = None,
    measure: Annotated[
        bool,
        typer.Option(
            "--measure", help="Time a few inner steps of the run's model here to size phases.train_blocks."
        ),
    ] = False,
    block_seconds: Annotated[
        float,
        typer.Option(
            "--block-seconds",
            help=f"The chain's block interval, for phase sizing (default {BLOCK_SECONDS:g}, the chain's).",
        ),
    ] = BLOCK_SECONDS,
    margin: Annotated[
        float, typer.Option("--margin", help="Phase sizing: training time × this (≥ 1).")
    ] = 1.5,
    overlap: Annotated[
        str | None,
        typer.Option(
            "--overlap",
            help="Outer-loop schedule, overriding the TOML's: none or eager (specs §2.2.1).",
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            "--calibration",
            help="Tolerance mode with the thresholds a `verifier calibrate` JSON proposes (its "
            "summed-residual ones only if calibrated for sums no longer than the run's windows).",
        ),
    ] = None,
    tolerance: Tolerance = None,
    tolerance_exp_avg: ToleranceExpAvg = None,
    tolerance_exp_avg_sq: ToleranceExpAvgSq = None,
    tolerance_update: ToleranceUpdate = None,
    tolerance_denominator: ToleranceDenominator = None,
    tolerance_cumulative: ToleranceCumulative = None,
    tolerance_cumulative_update: ToleranceCumulativeUpdate = None,
) -> None:
    """Create a run from a TOML run config with MsgCreateRun, and print its run id. The flags override
    the TOML; each tolerance flag wins over `--calibration`."""
    flags = {
        "tolerance": tolerance,
        "tolerance_exp_avg": tolerance_exp_avg,
        "tolerance_exp_avg_sq": tolerance_exp_avg_sq,
        "tolerance_update": tolerance_update,
        "tolerance_denominator": tolerance_denominator,
        "tolerance_cumulative": tolerance_cumulative,
        "tolerance_cumulative_update": tolerance_cumulative_update,
    }
    try:
        cal = read_calibration(calibration) if calibration is not None else None
        if init_from_run is not None:
            if init_checkpoint is not None:
                _fail("give --init-checkpoint or --init-from-run, not both")
            init_checkpoint = fetch_final_model(chain_url, init_from_run, checkpoint_out)
        cfg = load_run_config(config, dataset=dataset, init_checkpoint=init_checkpoint)
        if overlap is not None:
            cfg = with_overlap(cfg, overlap)
        if calibration is not None and cal is not None:
            check_calibrated_for(calibration, cal)
        given = {k: v for k, v in flags.items() if v is not None}
        tolerances = {**(cal.fields if cal else {}), **given}
        if tolerances:
            source = "the tolerance flags" if calibration is None else str(calibration)
            cfg = with_fields(cfg, tolerances, source)
        if calibration is not None and cal is not None and not set(CUMULATIVE_FIELDS) <= set(given):
            check_calibrated_for(calibration, cal, cfg)  # the summed thresholds it gave hold for cfg's sums
        sizing: dict[str, Any] = {}
        if step_seconds is not None and measure:
            _fail("give --step-seconds or --measure, not both")
        samples: list[float] = []
        if measure:
            import statistics

            from gonka_diloco.phase_sizing import measure_step_samples, sizing_margin

            try:
                samples = measure_step_samples(cfg)
            except (ValueError, RuntimeError) as e:  # the model cannot run this config's batches
                raise RunConfigFileError(f"cannot time the run's inner step: {e}") from None
            step_seconds = statistics.median(samples)
            margin = sizing_margin(margin, samples)  # the measured jitter, where it beats --margin
        if step_seconds is not None:
            cfg, figures = size_train_phase(cfg, step_seconds, block_seconds, margin)
            sizing = {**figures, "measured": measure}
            if samples:
                sizing["samples"] = list(samples)  # as measured: they reproduce the margin exactly
    except RunConfigFileError as e:
        _fail(str(e))
        return
    extra: dict[str, Any] = {"init_checkpoint": str(init_checkpoint)} if init_checkpoint is not None else {}
    if sizing:
        extra["phase_sizing"] = sizing
    if dry_run:
        typer.echo(
            json.dumps(
                {"config_hash": cfg.config_hash(), "config": cfg.model_dump(mode="json"), **extra}, indent=2
            )
        )
        return
    from chain.client import HttpChainClient
    from protocol.messages import MsgCreateRun

    wallet = _wallet(key, keyring_dir, test_index, passphrase_file)
    client = HttpChainClient(chain_url)
    try:
        result = client.broadcast(wallet, [MsgCreateRun(creator=str(wallet.address()), config=cfg)])
    except Exception as e:  # transport, tx or ante failure: one clear line, no traceback
        why = getattr(e, "log", None) or str(e)
        if "is not the authority" in why:
            why += _authority_hint(client, str(wallet.address()))
        _fail(f"MsgCreateRun failed: {why}", 1)
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
                "initial_model_hash": cfg.initial_model_hash,
                **extra,
            }
        )
    )
