"""The run config: every number a run is bound to, hashed on chain at `MsgCreateRun`.

Hosts and verifiers read their whole behaviour from this one object, so two nodes that agree on
its hash agree on what honest training and honest verification mean.
"""

from __future__ import annotations

import hashlib
import json
import math
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from protocol.chunks import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES, MIN_CHUNK_BYTES
from protocol.inner import Moments as Moments  # re-exported: the run's vocabulary
from protocol.prf import lone_last_block

DEFAULT_WINDOW_SEGMENTS = 3
"""w: segments per checker window (`RunConfig.window_segments`)."""
CUMULATIVE_RULE = "root-sum-square"
"""What `tolerance_cumulative*` are thresholds of (specs §6.4): summed residuals over √(Σ wᵢ²), the
same for any number of segments summed (issue 36). `verifier calibrate` writes it into its JSON;
`run create` refuses summed-residual thresholds calibrated for the earlier rule (over Σ wᵢ, for a
fixed number of opened segments)."""

Hex32 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
"""A SHA-256 digest as 64 lower-case hex characters: the only hash form on the wire."""


class Codec(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    INT8 = "int8"
    INT4 = "int4"
    SPARSE = "sparse"
    """Chunk-wise top-k of `codec_topk` entries per chunk of `codec_block_size`, 2-bit values, sent
    through the host's error-feedback accumulator (`protocol.errorfeedback`, specs §4.1)."""


class ReplayMode(StrEnum):
    BITWISE = "bitwise"
    TOLERANCE = "tolerance"


class Sampling(StrEnum):
    """Which segments a contribution's checkers replay (specs §2.3, §6).

    WINDOWS: each checker slot gets its own window of `window_segments` consecutive segments (an
    aligned block, distinct blocks per slot, drawn from the challenge seed), so c checkers cover c
    blocks for about one downloaded state each, and every checker also checks Δ against θ_H.
    SEGMENTS: every checker opens the same `sampled_segments` segments (the last always), as runs did
    before windows; kept so both can be measured on the same run (`bench.verification`)."""

    WINDOWS = "windows"
    SEGMENTS = "segments"


class Precision(StrEnum):
    """How the forward and backward run. Master weights, gradients and AdamW moments are float32
    either way, and so is everything hashed and stored."""

    FP32 = "fp32"
    BF16 = "bf16"  # torch.autocast(bfloat16) around forward and loss


class Attention(StrEnum):
    """The scaled-dot-product-attention kernel every node uses (`torch.nn.attention.SDPBackend`).

    Fixed by the run because backends differ in their bits, and some have non-deterministic
    backward passes on CUDA; `math` is deterministic everywhere (and slowest on GPUs)."""

    MATH = "math"
    FLASH = "flash"
    EFFICIENT = "efficient"
    CUDNN = "cudnn"


class Overlap(StrEnum):
    """The outer-loop schedule of a run (specs/protocol.md §2.2.1).

    NONE: step n+1 opens once step n is done, from its result. EAGER: step n+1 trains while step
    n is verified and aggregated (Streaming DiLoCo's overlapped communication with τ = 1): its base
    is the latest adopted model when it opens, its accepted Δs are applied to the latest one, and
    a host whose step n contribution may still enter starts step n+1 from that base moved by the
    outer step with its own committed Δ standing in for the aggregate (Kale et al. 2025); a child
    whose parent does not enter the model is dropped (specs §2.2.1). A one-step-delayed schedule
    without the stand-in ("delayed") was measured and removed (issue 22, bench/RESULTS.md §1d)."""

    NONE = "none"
    EAGER = "eager"


class OuterRule(StrEnum):
    """How G_{n+1} is made from the mean of the accepted Δs (specs §7).

    NESTEROV: DiLoCo's SGD with Nesterov momentum over the mean (b' = μ·b + g; θ' = θ − lr·(g + μ·b')).
    AVERAGE: SparseLoCo's rule, θ' = θ − lr·g with the momentum left as it is (zero from G_0): the
    hosts' error-feedback accumulators take momentum's place (Sarfi et al. 2025)."""

    NESTEROV = "nesterov"
    AVERAGE = "average"


EF_DECAY = 0.9
"""The sparse codec's default β (`RunConfig.codec_ef_decay`): measured best at H = 25 and H = 100
(bench/RESULTS.md §1j, §1k, §1n; 1 before issue 37). Omitted from the dump at it."""


class SparseMean(StrEnum):
    """Whose values a coordinate of the sparse codec's mean g averages (specs §4.1, §7).

    CONTRIBUTORS (the default): the token-weighted mean over the hosts that kept it (SparseLoCo's
    reference aggregation, a scatter mean that leaves out the others' zeros); +0 where nobody kept
    it. HOSTS: the token-weighted mean over every accepted host, a host that did not keep the
    coordinate counting as 0, so a value only some hosts kept is shrunk by their share while each
    of them drops all of it from its error feedback (the rule before issue 37; measured worse,
    bench/RESULTS.md §1i). Dense codecs send every coordinate from every host: there the two are
    the same mean."""

    HOSTS = "hosts"
    CONTRIBUTORS = "contributors"


class Frozen(BaseModel):
    """Every config and message model. Floats must be finite (`allow_inf_nan=False`): NaN and ±inf
    have no canonical JSON (Python writes `NaN`, `Infinity`, which JSON does not define), so a config
    holding one would hash differently in a second implementation, and they are never a valid
    learning rate, tolerance or model hyper-parameter (specs §1)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: the byte form whose SHA-256 names a config."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class ModelSpec(Frozen):
    """Which model to build. `factory` is resolved only against the node's own allow-list.

    `config` is the factory's keyword config, except the reserved key `param_count`: the model's
    declared parameter count (`protocol.modelsize`), required for a factory the chain cannot count
    itself and never passed to the factory."""

    factory: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    config: dict[str, int | float | str | bool] = Field(default_factory=dict)

    def spec_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.model_dump(mode="json"))).hexdigest()


DEFAULT_MOMENTS = Moments.INT8
"""`InnerOptim.moments` when unset (specs §6.2.1)."""


class InnerOptim(Frozen):
    """AdamW with DiLoCo's defaults; the lr warms up linearly, then (if `decay_steps`) follows a
    cosine down to `min_lr_fraction`·lr at step `decay_steps` of the host's step counter, as the
    DiLoCo paper's inner schedule does."""

    lr: float = Field(4e-4, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int = Field(0, ge=0)
    decay_steps: int = Field(0, ge=0, description="0 = constant after warm-up")
    min_lr_fraction: float = Field(0.0, ge=0, le=1)
    moments: Moments = Field(DEFAULT_MOMENTS, description="how the moments are stored (specs §6.2.1)")
    """Default `int8`: a training state is half the bytes (6.03 B/param against 12), which is what
    lets the planner's 30B goals hold at defaults (`gonka-diloco plan --params 30e9 --hosts 64`),
    and its final loss was measured within 0.1% of float32's (RESULTS §1h). Tolerance replay mode
    needs `fp32` (its thresholds are calibrated on float32 moments)."""

    @field_validator("moments", mode="before")
    @classmethod
    def _moments_unset(cls, value: Any) -> Any:
        """An unset proto3 string reads as "": the default, int8 moments."""
        return DEFAULT_MOMENTS if value == "" else value

    @model_serializer(mode="wrap")
    def _omit_default_moments(self, handler: Any) -> dict[str, Any]:
        """`moments` is in the dump (config hash, wire bytes, chain state) only when it is not the
        default (int8): a float32 run states `moments = fp32`, so an unset field never reads as it."""
        data = handler(self)
        if self.moments is DEFAULT_MOMENTS:
            data.pop("moments", None)
        return data


class OuterOptim(Frozen):
    """SGD with Nesterov momentum with DiLoCo's defaults; `rule` AVERAGE drops the momentum."""

    lr: float = Field(0.7, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    rule: OuterRule = Field(OuterRule.NESTEROV, description="outer update rule (specs §7)")
    sparse_mean: SparseMean = Field(SparseMean.CONTRIBUTORS, description="sparse codec: whose values a "
                                    "coordinate's mean averages (specs §4.1)")  # fmt: skip

    @field_validator("rule", mode="before")
    @classmethod
    def _rule_unset(cls, value: Any) -> Any:
        """An unset proto3 string reads as "": DiLoCo's Nesterov."""
        return OuterRule.NESTEROV if value == "" else value

    @field_validator("sparse_mean", mode="before")
    @classmethod
    def _sparse_mean_unset(cls, value: Any) -> Any:
        """An unset proto3 string reads as "": the contributors' mean (measured best, issue 37)."""
        return SparseMean.CONTRIBUTORS if value == "" else value

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: Any) -> dict[str, Any]:
        """`rule` and `sparse_mean` are in the dump (config hash, wire bytes, chain state) only when
        not at their defaults (NESTEROV, CONTRIBUTORS): existing runs keep their hashes bit for bit."""
        data = handler(self)
        if self.rule is OuterRule.NESTEROV:
            data.pop("rule", None)
        if self.sparse_mean is SparseMean.CONTRIBUTORS:
            data.pop("sparse_mean", None)
        return data


class Phases(Frozen):
    """Phase lengths in blocks. An outer step: train/commit → challenge → reveal → verify → finalize."""

    join_blocks: int = Field(5, ge=0, description="blocks after MsgCreateRun before outer step 0 opens")
    min_hosts: int = Field(0, ge=0, description="outer step 0 trains once this many hosts are bonded")
    min_verifiers: int = Field(0, ge=0, description="... and this many verifiers")
    train_blocks: int = Field(20, ge=1)
    reveal_blocks: int = Field(10, ge=1)
    verify_blocks: int = Field(20, ge=1)
    escalation_blocks: int = Field(10, ge=1)
    max_escalations: int = Field(1, ge=0)
    result_blocks: int = Field(30, ge=1)
    audit_blocks: int = Field(10, ge=1, description="verdict window of the audit round")
    confirm_blocks: int = Field(10, ge=1, description="verdict window of a dispute's confirmation")
    result_rounds: int = Field(3, ge=1, description="result rounds before the step closes with G_n")
    epoch_length: int = Field(200, ge=1)
    poc_window: int = Field(0, ge=0)
    early_close: bool = Field(
        False, description="a window closes once every message it waits for is in (specs §2.3.1)"
    )

    @model_serializer(mode="wrap")
    def _omit_default_early_close(self, handler: Any) -> dict[str, Any]:
        """`early_close` is in the dump (config hash, wire bytes, chain state) only when set: runs
        with fixed windows keep their hashes bit for bit."""
        data = handler(self)
        if not self.early_close:
            data.pop("early_close", None)
        return data

    @model_validator(mode="after")
    def _poc_fits(self) -> Phases:
        if self.poc_window >= self.epoch_length:
            raise ValueError("poc_window must be shorter than epoch_length")
        return self


class Stake(Frozen):
    """Bonds and slashing in ngonka (1 GNK = 1e9 ngonka); fractions in basis points.

    Defaults from `protocol.collusion` / bench.collusion: with min_host_stake ≥ reward_per_outer_step
    a fake Δ has negative expected value for every accomplice stake share below 1/2.
    """

    min_host_stake: int = Field(10_000_000_000, ge=0)
    min_verifier_stake: int = Field(1_000_000_000, ge=0)
    host_slash_bps: int = Field(1000, ge=0, le=10_000)
    verifier_slash_bps: int = Field(500, ge=0, le=10_000)
    reward_per_outer_step: int = Field(10_000_000_000, ge=0)
    fraud_host_slash_bps: int = Field(
        5000, ge=0, le=10_000, description="host whose rejected Δ a verifier had accepted (collusion)"
    )
    fraud_verifier_slash_bps: int = Field(
        5000, ge=0, le=10_000, description="verifier whose ACCEPT a confirmed dispute contradicts"
    )


class Numerics(Frozen):
    """The arithmetic a replay must repeat: precision, TF32 matmuls, the attention kernel."""

    precision: Precision = Precision.FP32
    tf32: bool = Field(False, description="allow TF32 in CUDA matmuls and convolutions")
    attention: Attention = Attention.MATH


class RunConfig(Frozen):
    """Everything a run is bound to. Its hash is recorded on chain with the run."""

    name: str = Field("run", min_length=1, max_length=64)
    model: ModelSpec
    dataset_manifest_hash: Hex32
    initial_model_hash: Hex32
    seed: int = Field(0, ge=0, lt=2**63)
    # Defaults from bench.detection: H = 500 (DiLoCo's), k = 5, s = 8 catches a host faking half its
    # segments in ≥ 99% of outer steps at ≈ 8% of the host's compute per verifier.
    inner_steps: int = Field(500, ge=1, description="H")
    segment_len: int = Field(5, ge=1, description="k")
    sampled_segments: int = Field(8, ge=1, description="s (sampling = segments)")
    # Windows (issue 34): each of the c = v + a checker slots replays its own block of w segments
    # from one downloaded state; the default w is the planner's choice at the mission's size
    # (`gonka-diloco plan`: the least wall time with replay ≤ 25% of the hosts' compute).
    sampling: Sampling = Field(Sampling.WINDOWS, description="which segments the checkers replay")
    window_segments: int = Field(DEFAULT_WINDOW_SEGMENTS, ge=1, description="w (sampling = windows)")
    # Defaults from protocol.collusion / bench.collusion: v = 4 and an audit of every accepted
    # contribution by a = 3 more verifiers, drawn after the verdicts, keep a fake out of the model in
    # ≥ 99% of outer steps (≤ 0.5^7 = 0.78%) and make faking lose money for accomplices holding any
    # minority of the verifier stake: 7 replays per contribution. The cheapest setting meeting both
    # (v = 6, p = 0.72, a = 1: 6.72) sits on the 1% edge and risks an accept to an audit only 36% of
    # the time; here 87.5% (README, security model).
    verifiers_per_contribution: int = Field(4, ge=1, description="v")
    audit_bps: int = Field(10_000, ge=0, le=10_000, description="p: share of accepted contributions audited")
    audit_verifiers: int = Field(3, ge=1, le=64, description="a: auditors per audited contribution")
    batch_size: int = Field(8, ge=1)
    seq_len: int = Field(64, ge=2)
    data_shards: int = Field(8, ge=1, le=4096)
    codec: Codec = Codec.INT8
    codec_block_size: int = Field(256, ge=8, le=1 << 20)
    codec_topk: int = Field(
        0, ge=0, le=65535, description="sparse: entries kept per chunk of codec_block_size (0 = ⌊C/64⌋)"
    )
    codec_ef_decay: float = Field(
        EF_DECAY, gt=0, le=1, description="sparse: β of the error-feedback accumulator, a = β·e + Δ (§4.1)"
    )
    inner: InnerOptim = InnerOptim()
    outer: OuterOptim = OuterOptim()
    phases: Phases = Phases()
    stake: Stake = Stake()
    replay_mode: ReplayMode = ReplayMode.BITWISE
    tolerance: float = Field(0.0, ge=0, description="tolerance mode: threshold on the parameters")
    tolerance_exp_avg: float = Field(0.0, ge=0, description="tolerance mode: threshold on AdamW exp_avg")
    tolerance_exp_avg_sq: float = Field(0.0, ge=0, description="tolerance mode: threshold on exp_avg_sq")
    tolerance_update: float = Field(
        0.0, ge=0, description="tolerance mode: exp_avg in update space (specs §6; 0 = tolerance_exp_avg)"
    )
    tolerance_denominator: float = Field(
        0.0, ge=0, description="tolerance mode: AdamW's denominator (specs §6; 0 = tolerance_exp_avg_sq)"
    )
    tolerance_cumulative: float = Field(
        0.0, ge=0, description="tolerance mode: replayed segments' summed param residuals (§6.4; 0 = off)"
    )
    tolerance_cumulative_update: float = Field(
        0.0, ge=0, description="tolerance mode: their summed update-space residuals (§6.4; 0 = off)"
    )
    threads: int = Field(1, ge=1, le=256)
    max_outer_steps: int = Field(0, ge=0, description="0 = unbounded")
    numerics: Numerics = Numerics()
    state_chunk_bytes: int = Field(
        DEFAULT_CHUNK_BYTES,
        ge=MIN_CHUNK_BYTES,
        le=MAX_CHUNK_BYTES,
        description="c: chunk size of every content hash (states, models, Δs); see protocol.chunks",
    )
    overlap: Overlap = Field(Overlap.NONE, description="outer-loop schedule (specs §2.2.1)")

    @field_validator("overlap", mode="before")
    @classmethod
    def _overlap_unset(cls, value: Any) -> Any:
        """An unset proto3 string reads as "": the default schedule."""
        return Overlap.NONE if value == "" else value

    @field_validator("sampling", mode="before")
    @classmethod
    def _sampling_unset(cls, value: Any) -> Any:
        """An unset proto3 string reads as "": the default, windows."""
        return Sampling.WINDOWS if value == "" else value

    @field_validator("window_segments", mode="before")
    @classmethod
    def _window_unset(cls, value: Any) -> Any:
        """An unset proto3 integer reads as 0 (never a valid w): the default."""
        return DEFAULT_WINDOW_SEGMENTS if value == 0 else value

    @model_serializer(mode="wrap")
    def _omit_default_overlap(self, handler: Any) -> dict[str, Any]:
        """`overlap` appears in the dump (and so in the config hash, the wire bytes and the chain
        state) only when it is not NONE: runs with today's schedule keep their hashes bit for bit."""
        data = handler(self)
        if self.overlap is Overlap.NONE:
            data.pop("overlap", None)
        if self.sampling is Sampling.WINDOWS:  # likewise the sampling fields at their defaults
            data.pop("sampling", None)
        if self.window_segments == DEFAULT_WINDOW_SEGMENTS:
            data.pop("window_segments", None)
        for name in ("tolerance_update", "tolerance_denominator", "tolerance_cumulative",
                     "tolerance_cumulative_update"):  # likewise, when unset (0)
            if not getattr(self, name):
                data.pop(name, None)
        if not self.codec_topk:  # the sparse codec's parameters, likewise, at their defaults
            data.pop("codec_topk", None)
        if self.codec_ef_decay == EF_DECAY:
            data.pop("codec_ef_decay", None)
        return data

    @field_validator("codec_ef_decay", mode="before")
    @classmethod
    def _decay_unset(cls, value: Any) -> Any:
        """An unset proto3 double reads as 0.0 (never a valid β): the default."""
        return EF_DECAY if value == 0 else value

    @model_validator(mode="after")
    def _sparse_consistent(self) -> RunConfig:
        if self.codec is Codec.SPARSE:
            if self.codec_block_size > 1 << 16:
                raise ValueError(f"codec 'sparse' needs codec_block_size ≤ 65536 ({self.codec_block_size})")
            if self.codec_topk > self.codec_block_size:
                raise ValueError(f"codec_topk = {self.codec_topk} exceeds codec_block_size = "
                                 f"{self.codec_block_size}")  # fmt: skip
        elif self.codec_topk or self.codec_ef_decay != EF_DECAY:
            raise ValueError(f"codec_topk and codec_ef_decay apply to codec 'sparse' only, not "
                             f"{self.codec.value!r}")  # fmt: skip
        return self

    @property
    def sparse_topk(self) -> int:
        """The sparse codec's k per chunk (`codec_topk`, or ⌊C/64⌋ when 0)."""
        return self.codec_topk or max(1, self.codec_block_size // 64)

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.inner_steps % self.segment_len:
            raise ValueError(
                f"inner_steps (H) = {self.inner_steps} must be a multiple of segment_len (k) = "
                f"{self.segment_len}"
            )
        if self.sampled_segments > self.n_segments:
            raise ValueError(
                f"sampled_segments (s) = {self.sampled_segments} cannot exceed H/k = "
                f"{self.inner_steps}/{self.segment_len} = {self.n_segments} segments"
            )
        if self.replay_mode is ReplayMode.TOLERANCE and min(self.tolerances.values()) <= 0:
            raise ValueError(
                "tolerance mode needs positive tolerance, tolerance_exp_avg and tolerance_exp_avg_sq"
            )
        if self.replay_mode is ReplayMode.TOLERANCE and not self.windowed:
            raise ValueError(
                "replay_mode 'tolerance' needs sampling 'windows': under 'segments' the summed residuals "
                "still leave a host 13× (s = 3) to 20× (s = 2) the honest noise of steering (specs §6.4)"
            )
        if self.replay_mode is ReplayMode.TOLERANCE and self.inner.moments is not Moments.FP32:
            raise ValueError(
                f"replay_mode 'tolerance' needs inner.moments = 'fp32' (set it; the default is "
                f"{DEFAULT_MOMENTS.value!r}, and this config has {self.inner.moments.value!r}): tolerance "
                "mode's thresholds are calibrated on float32 moments (specs §6.2.1)"
            )
        return self

    @property
    def tolerances(self) -> dict[str, float]:
        """Tolerance mode's thresholds (the step counter: exact): per tensor group of a training state,
        then the moments in update space (`verifier.update_space`; unset, they take the moments')."""
        return {
            "param": self.tolerance,
            "exp_avg": self.tolerance_exp_avg,
            "exp_avg_sq": self.tolerance_exp_avg_sq,
            "update": self.tolerance_update or self.tolerance_exp_avg,
            "denominator": self.tolerance_denominator or self.tolerance_exp_avg_sq,
        }

    @property
    def cumulative_tolerances(self) -> dict[str, float]:
        """Tolerance mode's thresholds over all opened segments of a contribution together
        (`verifier.tolerance.Cumulative`, specs §6.4); unset (0), a check is not applied (∞)."""
        return {
            "cumulative": self.tolerance_cumulative or math.inf,
            "cumulative_update": self.tolerance_cumulative_update or math.inf,
        }

    @property
    def n_segments(self) -> int:
        return self.inner_steps // self.segment_len

    @property
    def windowed(self) -> bool:
        return self.sampling is Sampling.WINDOWS

    @property
    def window_len(self) -> int:
        """w as drawn: `window_segments`, at most H/k (one window then covers the trajectory)."""
        return min(self.window_segments, self.n_segments)

    @property
    def summed_least(self) -> int:
        """The fewest segments any summed-residual check of this run sums (specs §6.4), at least 2
        (a set of one is its segment's own check): windows, the shortest block of two or more
        (a panel sums whole disputed windows, never fewer); segments, the drawn s − 1 when that is
        two or more, else the challenge's s. Honest summed noise per √(Σ wᵢ²) falls as the count
        grows, so thresholds calibrated over sets of this many segments or more hold for every
        set the run sums, and are tighter than ones calibrated from two (`verifier.calibrate`)."""
        n = self.n_segments
        if self.windowed:
            w = self.window_len
            lengths = {min(w, n - a) for a in range(0, n, w)}  # a lone last segment taken on: w + 1
        else:
            lengths = {self.sampled_segments - 1, self.sampled_segments}
        return min((m for m in lengths if m >= 2), default=2)

    @property
    def lone_last(self) -> bool:
        """Sampling windows with a last block of one segment (n mod w = 1, n > w): no window sums
        segment n − 1 with another, so in tolerance mode the window ending where it begins takes it
        on (specs §6.4, `verifier.job.Job.replays`)."""
        return self.windowed and lone_last_block(self.n_segments, self.window_len)

    def window_reaches_end(self, start: int) -> bool:
        """Sampling windows: whether the check of the window that starts at segment `start` replays
        segment n − 1 (the last block; in tolerance mode also the window a lone last block is merged
        into, `lone_last`) and so ends at θ_H: that check alone checks Δ against θ_H (specs §6). A
        check ending short of θ_H could compare Δ with θ_H only by fetching θ_H, and a host that fakes
        Δ can as well commit a θ_H that matches it, which only a replay of segment n − 1 catches."""
        n, w = self.n_segments, self.window_len
        end = min(n, start + w)
        return end == n or (self.replay_mode is ReplayMode.TOLERANCE and self.lone_last and end == n - 1)

    @property
    def checker_slots(self) -> int:
        """Window slots drawn per contribution at the challenge: v initial (escalations reuse
        them), then a for the audit (its verifiers are drawn later, from the audit seed)."""
        return self.verifiers_per_contribution + self.audit_verifiers

    @property
    def tokens_per_outer_step(self) -> int:
        return self.inner_steps * self.batch_size * self.seq_len

    def config_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.model_dump(mode="json"))).hexdigest()


def tolerance_moments(data: dict[str, Any]) -> dict[str, Any]:
    """A run config's raw fields (a TOML's, a JSON's, keyword arguments) with `inner.moments =
    fp32` filled in where `replay_mode` is tolerance and `inner` names no moments: tolerance mode's
    thresholds are calibrated on float32 moments, and the default is int8 (specs §6.2.1). Moments the
    fields name stay as they are, so an explicit int8 with tolerance is still refused, in one line.
    `inner` may be a mapping or an `InnerOptim` (whose moments count as named if they were set)."""
    if str(data.get("replay_mode", "")) != ReplayMode.TOLERANCE.value:
        return data
    inner = data.get("inner")
    if isinstance(inner, InnerOptim):
        if "moments" in inner.model_fields_set:
            return data
        return {**data, "inner": inner.model_copy(update={"moments": Moments.FP32})}
    if inner is None:
        inner = {}
    if isinstance(inner, dict) and inner.get("moments", "") == "":
        return {**data, "inner": {**inner, "moments": Moments.FP32.value}}
    return data
