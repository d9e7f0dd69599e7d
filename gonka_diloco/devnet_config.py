"""`DevnetConfig`: everything one `gonka-diloco devnet` needs, from flags or a TOML file.

The defaults are sized to finish in about three minutes on a 2-core machine: a tiny GPT, short
outer steps, half-second blocks. Phase lengths are given in seconds and turned into blocks with
the block interval, so changing the block interval does not silently shrink the time a host has
to train. Bad input raises `DevnetConfigError` with one readable line per problem.
"""

from __future__ import annotations

import functools
import math
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from protocol.chunks import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES, MIN_CHUNK_BYTES
from protocol.config import (
    EF_DECAY,
    Codec,
    Moments,
    OuterRule,
    Overlap,
    ReplayMode,
    Sampling,
    SparseMean,
)

ParamValue = int | float | str | bool

MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 64},
    "small": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64},
    "base": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128},
}
"""Model presets for `small_gpt`; the default GPT of the trainer is `base`."""

MAX_NODES = 31
"""The devnet genesis funds test wallets 0..31; wallet 0 is the authority, the rest are nodes."""

ModelSize = Literal["tiny", "small", "base"]

HF_MODELS: dict[str, tuple[str, str]] = {
    f"{arch}-{preset}": (arch, preset) for arch in ("llama", "qwen2") for preset in ("tiny", "small")
}
"""`--model` names for Hugging Face architectures (`replay.hf`), e.g. llama-tiny; 'gpt' = small_gpt."""
ModelName = Literal["gpt", "llama-tiny", "llama-small", "qwen2-tiny", "qwen2-small"]


class DevnetConfigError(ValueError):
    """The devnet configuration (flags or TOML) is invalid; the message says which field and why."""


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AdversarySpec(Strict):
    """`count` nodes that run the library behaviour `behaviour` with `params`."""

    behaviour: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_-]*$")
    count: int = Field(1, ge=1, le=64)
    params: dict[str, ParamValue] = Field(default_factory=dict)


class PhaseSeconds(Strict):
    """Phase lengths in seconds of wall time (rounded up to whole blocks)."""

    join: float = Field(
        2.0, gt=0, description="at least this from run creation to outer step 0 (which waits for every node)"
    )
    train: float = Field(8.0, gt=0)
    reveal: float = Field(4.0, gt=0)
    verify: float = Field(6.0, gt=0)
    escalation: float = Field(4.0, gt=0)
    result: float = Field(6.0, gt=0)
    audit: float = Field(5.0, gt=0, description="verdict window of the audit round")
    confirm: float = Field(5.0, gt=0, description="verdict window of a dispute's confirmation")


DEVNET_WINDOW_SEGMENTS = 5
"""The devnet's w (RunConfig's is `DEFAULT_WINDOW_SEGMENTS`, 3): with H/k = 10 and two verifiers the
run has two checks per contribution, and w = 5 makes them two blocks, each checked every outer step.
Under w = 3 (four blocks) a fake of one block (the default noise host's Δ is a fake of the last,
specs §6) meets a check in half the outer steps, and the devnet fails on any adversary accepted."""


class DevnetConfig(Strict):
    """The devnet's shape; field names follow the run config (H, k, s, v in comments)."""

    hosts: int = Field(4, ge=1, le=32)
    verifiers: int = Field(2, ge=1, le=32)
    adversaries: list[AdversarySpec] = Field(
        default_factory=lambda: [AdversarySpec(behaviour="noise")],
        description="adversarial hosts, taken from the end of the host list",
    )
    verifier_adversaries: list[AdversarySpec] = Field(default_factory=list)
    outer_steps: int = Field(6, ge=1, le=1000)
    inner_steps: int = Field(50, ge=1, description="H")
    segment_len: int = Field(5, ge=1, description="k")
    sampled_segments: int = Field(2, ge=1, description="s (sampling = segments)")
    sampling: Sampling = Field(Sampling.WINDOWS, description="windows: each checker its own window (§2.3)")
    window_segments: int = Field(
        DEVNET_WINDOW_SEGMENTS, ge=1,
        description="w (sampling = windows); the devnet's 5 splits H/k = 10 into two blocks, which its "
        "two checks (v = 1 and one auditor) cover every outer step, so every fake meets one",
    )  # fmt: skip
    state_chunk_bytes: int = Field(
        DEFAULT_CHUNK_BYTES, ge=MIN_CHUNK_BYTES, le=MAX_CHUNK_BYTES,
        description="c: chunk size of every content hash (a devnet's states are small: smaller chunks "
        "let a dispute panel fetch θ_H's parameters alone)",
    )  # fmt: skip
    verifiers_per_contribution: int = Field(1, ge=1, description="v")
    batch_size: int = Field(8, ge=1, le=1024)
    seq_len: int = Field(64, ge=2, le=4096)
    codec: Codec = Codec.INT8
    sparse_chunk: int = Field(
        4096, ge=8, le=65536, description="codec sparse: chunk C of its top-k (specs §4.1 recommends 4096)"
    )
    sparse_topk: int = Field(
        64, ge=1, le=65535, description="codec sparse: entries k kept per chunk (64 of 4096: 1.56%)"
    )
    # codec sparse: its mean and β as RunConfig's defaults (issue 37); its outer step DiLoCo's, which from
    # scratch learns fastest per outer step here (bench/RESULTS.md §11f; from a warm start SparseLoCo's
    # average at lr 1 does, §1i–§1u)
    sparse_mean: SparseMean = Field(
        SparseMean.CONTRIBUTORS, description="codec sparse: a coordinate's mean over the hosts that kept it "
        "(contributors, SparseLoCo's) or over all hosts (specs §4.1)"
    )
    sparse_ef_decay: float = Field(EF_DECAY, gt=0, le=1, description="codec sparse: β of error feedback")
    sparse_outer_rule: OuterRule = Field(OuterRule.NESTEROV, description="codec sparse: the outer rule (§7)")
    sparse_outer_lr: float = Field(0.7, gt=0, description="codec sparse: the outer lr")
    model_size: ModelSize = "small"
    model: ModelName = Field("gpt", description="gpt (sized by model_size) or a transformers preset")
    dataset: str = Field("", max_length=4096, description="prepared dataset folder or URL; '' = Shakespeare")
    block_interval: float = Field(0.5, gt=0, le=10)
    replay_mode: ReplayMode = ReplayMode.BITWISE
    moments: Moments | None = Field(
        None, description="AdamW moments, int8 or fp32 (specs §6.2.1); unset: the run config's default "
        "(int8), fp32 in tolerance mode (its thresholds are calibrated on float32 moments)",
    )  # fmt: skip
    tolerance: float = Field(0.0, ge=0, description="tolerance mode: threshold on the parameters")
    tolerance_exp_avg: float = Field(0.0, ge=0, description="tolerance mode: threshold on exp_avg")
    tolerance_exp_avg_sq: float = Field(0.0, ge=0, description="tolerance mode: threshold on exp_avg_sq")
    tolerance_update: float = Field(
        0.0, ge=0, description="tolerance mode: exp_avg in update space (0 = tolerance_exp_avg)"
    )
    tolerance_denominator: float = Field(
        0.0, ge=0, description="tolerance mode: AdamW's denominator (0 = tolerance_exp_avg_sq)"
    )
    tolerance_cumulative: float = Field(
        0.0, ge=0, description="tolerance mode: opened segments' summed param residuals (0 = off)"
    )
    tolerance_cumulative_update: float = Field(
        0.0, ge=0, description="tolerance mode: their summed update-space residuals (0 = off)"
    )
    seed: int = Field(0, ge=0, lt=2**63)
    threads: int = Field(1, ge=1, le=64)
    phases: PhaseSeconds = PhaseSeconds()
    outer_lr: float = Field(0.7, gt=0, description="outer SGD learning rate (DiLoCo's 0.7)")
    outer_momentum: float = Field(
        0.9, ge=0, lt=1, description="outer Nesterov momentum (DiLoCo's 0.9; bench.overlap: 0 with overlap)"
    )
    checkpoint_every: int | None = Field(
        None, ge=1, le=1_000_000,
        description="hosts persist every m-th boundary (host.toml checkpoint_every); default: w "
        "(window_segments), so every window start is on disk and the reveal recomputes nothing",
    )  # fmt: skip

    overlap: Overlap = Field(
        Overlap.NONE,
        description="none, or eager: train step n+1 while step n is verified, each host starting "
        "from G_{n-1} moved by its own step n-1 Δ (specs §2.2.1)",
    )
    early_close: bool = Field(
        True, description="a phase window closes once every message it waits for is in (specs §2.3.1)"
    )
    step_seconds: float | None = Field(
        None, gt=0, description="seconds per inner step: size phases.train when it is not set (else measured)"
    )
    engine: Literal["embedded", "cometbft"] = Field(
        "embedded", description="embedded: one chain process; cometbft: a network of CometBFT validators"
    )
    validators: int = Field(1, ge=1, le=16, description="CometBFT validators (the embedded engine has one)")
    timeout: float = Field(900.0, gt=0, description="seconds before the run counts as stalled")
    out_dir: Path = Path("runs")
    live: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> DevnetConfig:
        if self.inner_steps % self.segment_len:
            raise ValueError("inner_steps (H) must be a multiple of segment_len (k)")
        if self.sampled_segments > self.inner_steps // self.segment_len:
            raise ValueError("sampled_segments (s) cannot exceed H/k")
        if self.sparse_topk > self.sparse_chunk:
            raise ValueError("sparse_topk (k) cannot exceed sparse_chunk (C)")
        if self.verifiers_per_contribution > self.verifiers:
            raise ValueError("verifiers_per_contribution (v) cannot exceed the number of verifiers")
        if self.hosts + self.verifiers > MAX_NODES:
            raise ValueError(
                f"hosts + verifiers must be at most {MAX_NODES} (the devnet's funded test wallets)"
            )
        if self.n_adversarial_hosts >= self.hosts:
            raise ValueError("at least one host must be honest (adversaries take up every host)")
        if sum(a.count for a in self.verifier_adversaries) > self.verifiers:
            raise ValueError("more adversarial verifiers than verifiers")
        if self.engine == "embedded" and self.validators != 1:
            raise ValueError("several validators need --engine cometbft (the embedded node is one process)")
        tolerances = (self.tolerance, self.tolerance_exp_avg, self.tolerance_exp_avg_sq)
        if self.replay_mode is ReplayMode.TOLERANCE and min(tolerances) <= 0:
            raise ValueError(
                "replay_mode 'tolerance' needs positive tolerance, tolerance_exp_avg and "
                "tolerance_exp_avg_sq (`gonka-diloco verifier calibrate` proposes all three)"
            )
        if self.replay_mode is ReplayMode.TOLERANCE and self.moments is Moments.INT8:
            raise ValueError("replay_mode 'tolerance' needs moments 'fp32' (or unset): its thresholds are "
                             "calibrated on float32 moments")  # fmt: skip
        if self.model == "gpt" and self.seq_len > MODEL_SIZES[self.model_size]["block_size"]:
            raise ValueError(f"seq_len exceeds the {self.model_size} model's context")
        if self.model != "gpt":
            from replay.hf import PRESETS

            if self.seq_len > PRESETS[HF_MODELS[self.model][1]]["max_position_embeddings"]:
                raise ValueError(f"seq_len exceeds the {self.model} model's context")
        return self

    @property
    def run_moments(self) -> Moments:
        """The run config's `inner.moments`: as set, else fp32 in tolerance mode, else the default."""
        from protocol.config import DEFAULT_MOMENTS

        if self.moments is not None:
            return self.moments
        return Moments.FP32 if self.replay_mode is ReplayMode.TOLERANCE else DEFAULT_MOMENTS

    @property
    def n_adversarial_hosts(self) -> int:
        return sum(a.count for a in self.adversaries)

    def blocks(self, seconds: float) -> int:
        """Whole blocks covering `seconds` (at least one)."""
        return max(1, math.ceil(seconds / self.block_interval))

    def host_behaviours(self) -> list[tuple[str, dict[str, ParamValue]]]:
        """Behaviour per host index: honest first, adversaries last (so host-0 is always honest)."""
        out: list[tuple[str, dict[str, ParamValue]]] = [("honest", {})] * (
            self.hosts - self.n_adversarial_hosts
        )
        for adv in self.adversaries:
            out += [(adv.behaviour, dict(adv.params))] * adv.count
        return out

    def verifier_behaviours(self) -> list[tuple[str, dict[str, ParamValue]]]:
        bad = sum(a.count for a in self.verifier_adversaries)
        out: list[tuple[str, dict[str, ParamValue]]] = [("honest", {})] * (self.verifiers - bad)
        for adv in self.verifier_adversaries:
            out += [(adv.behaviour, dict(adv.params))] * adv.count
        return out


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        lines.append(f"{where}: {e['msg']}")
    return "; ".join(lines)


def make_config(data: dict[str, Any]) -> DevnetConfig:
    """Validate a plain dict (from TOML and/or flags) into a `DevnetConfig`."""
    try:
        return DevnetConfig.model_validate(data)
    except ValidationError as e:
        raise DevnetConfigError(f"invalid devnet config: {_format_errors(e)}") from None


def load_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file into a dict, with a clear error for a missing or malformed file."""
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise DevnetConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise DevnetConfigError(f"{path} is not valid TOML: {e}") from None
    except OSError as e:
        raise DevnetConfigError(f"cannot read {path}: {e.strerror}") from None


def parse_adversary(text: str) -> AdversarySpec:
    """`name`, `name:count` or `name:count:key=value,key=value` — the command-line form."""
    name, _, rest = text.partition(":")
    count_text, _, params_text = rest.partition(":")
    try:
        count = int(count_text) if count_text else 1
    except ValueError:
        raise DevnetConfigError(f"adversary {text!r}: count {count_text!r} is not an integer") from None
    params: dict[str, ParamValue] = {}
    for item in filter(None, params_text.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise DevnetConfigError(f"adversary {text!r}: parameter {item!r} is not key=value")
        params[key] = _scalar(value)
    try:
        return AdversarySpec(behaviour=name, count=count, params=params)
    except ValidationError as e:
        raise DevnetConfigError(f"adversary {text!r}: {_format_errors(e)}") from None


def _scalar(text: str) -> ParamValue:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@functools.lru_cache(maxsize=8)
def dataset_vocab(source: str) -> int | None:
    """The vocabulary of a prepared dataset (its manifest's tokenizer), which the devnet sizes its
    model's embedding to; None for the built-in Shakespeare bytes, which every preset already fits.
    Only the manifest is read."""
    if not source:
        return None
    from replay.data import DataError, open_dataset

    try:
        corpus = open_dataset(source)
    except DataError as e:
        raise DevnetConfigError(f"dataset {source}: {e}") from None
    return corpus.manifest.tokenizer.vocab_size if corpus.manifest is not None else None


TINY_DEVNET: dict[str, Any] = {
    "inner_steps": 10,
    "segment_len": 5,
    "sampled_segments": 1,
    "verifiers_per_contribution": 1,
    "batch_size": 4,
    "seq_len": 32,
    "model_size": "tiny",
    "block_interval": 0.2,
    "phases": {"join": 2.0, "train": 4.0, "reveal": 2.0, "verify": 3.0, "escalation": 2.0, "result": 3.0},
    "live": False,
}
"""The shape of a devnet small enough for 2 cores in seconds (a 1-layer GPT, H = 10, 0.2 s blocks):
the tests' and the chaos runs' devnets add their hosts, verifiers, steps and timeout to it."""

DEVNET_MARGIN = 2.0
"""Step time × 2 in a devnet (`phase_sizing.DEFAULT_MARGIN` is 1.5): a `make devnet` at 1.5 missed
its commit deadlines on a 2-core machine shared with other work (trained 4–7.8 s in a 5.1 s phase)."""


def size_train_phase(
    cfg: DevnetConfig, measure: Callable[[DevnetConfig], list[float]] | None = None
) -> DevnetConfig:
    """`cfg` with `phases.train` derived from compute when neither the TOML nor a flag set it:
    H × (seconds per inner step) × margin + the commit's slack blocks
    (`gonka_diloco.phase_sizing`). The step time is `step_seconds` if declared, else measured
    (`measure`, default: a few inner steps of the devnet's model here), times the node processes
    that share this machine's cores ((hosts + verifiers) × threads ÷ cores, at least 1: verifiers
    replay while hosts train), with `DEVNET_MARGIN` or the measured samples' noise where that is
    larger (`sizing_margin`): one machine runs every node and the chain.
    Never shorter than the default phase: a step timed alone here ran 5× faster than the same step
    in four hosts next to the verifiers and the chain on 2 cores, so only longer work lengthens it."""
    import statistics

    from gonka_diloco.phase_sizing import COMMIT_SLACK_BLOCKS, sizing_margin, train_phase_seconds

    if "train" in cfg.phases.model_fields_set:
        return cfg
    samples = [cfg.step_seconds] if cfg.step_seconds is not None else (measure or measure_devnet_step)(cfg)
    contention = max(1.0, (cfg.hosts + cfg.verifiers) * cfg.threads / (os.cpu_count() or 1))
    margin = sizing_margin(DEVNET_MARGIN, samples)  # the measured jitter, where it beats the margin
    train = train_phase_seconds(cfg.inner_steps, statistics.median(samples) * contention, margin=margin)
    train = max(train + COMMIT_SLACK_BLOCKS * cfg.block_interval, PhaseSeconds().train)
    return cfg.model_copy(update={"phases": cfg.phases.model_copy(update={"train": train})})


def measure_devnet_step(cfg: DevnetConfig) -> list[float]:
    """A few inner steps of the devnet's own model, batch shape and thread count, timed here."""
    from gonka_diloco.devnet import model_spec
    from gonka_diloco.phase_sizing import measure_step_samples
    from protocol.config import RunConfig

    run = RunConfig(
        model=model_spec(cfg), dataset_manifest_hash="0" * 64, initial_model_hash="0" * 64,
        inner_steps=cfg.inner_steps, segment_len=cfg.segment_len, sampled_segments=cfg.sampled_segments,
        batch_size=cfg.batch_size, seq_len=cfg.seq_len, threads=cfg.threads,
    )  # fmt: skip
    return measure_step_samples(run)


def load_config(
    path: Path | None, overrides: dict[str, Any], measure: Callable[[DevnetConfig], list[float]] | None = None
) -> DevnetConfig:
    """TOML file (if any) first, then every flag the user actually set on top of it; then the train
    phase sized from compute if neither set it (`size_train_phase`)."""
    data: dict[str, Any] = load_toml(path) if path is not None else {}
    for key, value in overrides.items():
        if value is None:
            continue
        if key == "phases":
            data["phases"] = {**data.get("phases", {}), **value}
        else:
            data[key] = value
    return size_train_phase(make_config(data), measure)
