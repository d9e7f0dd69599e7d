"""The cost model of a run: time, bytes, disk, memory, detection and deterrence per outer step.

Every formula is one small pure function here, named in `specs/protocol.md` §9 ("Cost model"),
so `gonka-diloco plan`, its `--sweep` and the validation benchmark (`bench.plan`) all compute
the same thing. No I/O and no torch: machine constants come in as a `Constants` value
(`gonka_diloco.plan_constants` reads them from `bench/results/*.json`).

Units: bytes, seconds, FLOP/s, bytes per second; stakes and rewards in GNK.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from itertools import product
from typing import Any

from chain.params import BLOCK_SECONDS, BPS_DENOMINATOR
from protocol import inner as sizes
from protocol.config import DEFAULT_WINDOW_SEGMENTS, Codec, ReplayMode, RunConfig, Sampling, Stake
from protocol.inner import GRAD_BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM, STATE_BYTES_PER_PARAM
from protocol.prf import lone_last_block, window_blocks

# ---------------------------------------------------------------- fixed facts

NGONKA_PER_GNK = 1e9


def run_default(name: str) -> Any:
    """A `RunConfig` field's default: the planner's run and security defaults are the chain's own
    (one source), so `plan` with no flags describes the run `run create` makes of a bare config."""
    return RunConfig.model_fields[name].default


STAKE = Stake()
RUN_CODEC: Codec = run_default("codec")
RUN_REPLAY: ReplayMode = run_default("replay_mode")
RUN_SAMPLING: Sampling = run_default("sampling")

FLOPS_PER_PARAM_TOKEN = 6
"""Forward + backward of a dense transformer: ≈ 6 FLOP per parameter per token (Kaplan et al. 2020)."""
GLOBAL_BYTES_PER_PARAM = 8
"""G_n: fp32 parameters + fp32 outer Nesterov momentum (the inner state's sizes: `protocol.inner`)."""
FP32_DELTA_BYTES_PER_PARAM = 4
PARAM_BYTES_PER_PARAM = STATE_BYTES_PER_PARAM - OPTIMIZER_BYTES_PER_PARAM
"""θ alone (fp32): what a dispute panel member fetches of θ_H for its Δ check (disputes are rare:
not in the steady state's figures; no windowed check fetches it, specs §6)."""
EF_BYTES_PER_PARAM = 4
"""Codec sparse: the host's carried error-feedback accumulator, fp32 (specs §4.1)."""
RUNTIME_BYTES_PER_GPU = 3e9
"""CUDA context, cuBLAS workspace, NCCL buffers, allocator slack: a flat allowance per GPU."""
BLOCK_AFTER_COMMIT = 3
"""Blocks from the end of training to the challenge: commit inclusion + CHALLENGE_DELAY (2)."""


class Sharding(StrEnum):
    """How a host's ranks hold the training state (ZeRO stages; fsdp = ZeRO-3 / FSDP2)."""

    NONE = "none"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    FSDP = "fsdp"
    FSDP_OFFLOAD = "fsdp-offload"
    """FSDP with the AdamW moments in host RAM and the optimizer step on the CPU (ZeRO-Offload)."""


class Pipeline(StrEnum):
    """Which state pipeline the hosts and verifiers run.

    `today`: every boundary persisted until the step is DONE; a verifier downloads all s opened
    start states (segment 0's too) and the Δ; each Δ is served by its author alone.
    `sparse` (the scale pipeline): every m-th boundary persisted, opened starts recomputed after
    the challenge; a verifier rebuilds segment 0's start from G_n and downloads s − 1 states plus
    the host's previous optimizer state, and in bitwise mode derives Δ from its own replay;
    Δs are fetched from every holder, so upload ≈ download per node.
    """

    TODAY = "today"
    SPARSE = "sparse"


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: float
    """Dense bf16 tensor-core FLOP/s (no sparsity)."""
    memory: float
    """Bytes of device memory."""


GPUS: dict[str, Gpu] = {
    "h100": Gpu("NVIDIA H100 SXM", 989e12, 80e9),
    "h200": Gpu("NVIDIA H200 SXM", 989e12, 141e9),
    "a100": Gpu("NVIDIA A100 SXM 80GB", 312e12, 80e9),
    "b200": Gpu("NVIDIA B200", 2250e12, 180e9),
    "l40s": Gpu("NVIDIA L40S", 362e12, 48e9),
    "mi300x": Gpu("AMD MI300X", 1307e12, 192e9),
}
"""Vendor datasheet figures; `--peak-tflops` / `--gpu-memory` override them."""


@dataclass(frozen=True)
class Constants:
    """Machine constants: measured by `bench/` where a result exists, else the stated default."""

    sha256_bytes_per_s: float = 2.0e9
    """One core's SHA-256 throughput."""
    hash_efficiency: float = 0.8
    """Parallel leaf hashing GB/s ÷ (threads × one core's SHA-256)."""
    codec_ratio: dict[str, float] = field(
        default_factory=lambda: {"fp32": 1.0, "bf16": 2.0, "int8": 4.0, "int4": 8.0, "sparse": 141.0}
    )
    """fp32 Δ bytes ÷ transport blob bytes, per codec (sparse: `sparse_bytes_per_param` is used)."""
    codec_encode: dict[str, float] = field(default_factory=lambda: dict.fromkeys(Codec, 5e8))
    codec_decode: dict[str, float] = field(default_factory=lambda: dict.fromkeys(Codec, 5e8))
    """fp32 bytes per second per thread."""
    codec_error: dict[str, float] = field(
        default_factory=lambda: {"fp32": 0.0, "bf16": 2e-3, "int8": 5e-3, "int4": 9e-2, "sparse": 1.0}
    )
    """Relative L2 error of a decoded Δ: the sweep's quality floor (convergence is not modelled)."""
    """The sparse codec sends 1.6% of an accumulator per step and carries the rest (error
    feedback): its per-step error says nothing of convergence, so the sweep never picks it;
    `--codec sparse` plans it and `bench.convergence --only sparse` measures it."""
    chain_ms_per_msg: float = 0.1
    state_code_ratio: dict[str, float] = field(default_factory=lambda: dict.fromkeys(sizes.Moments, 1.0))
    """Canonical ÷ coded bytes of an opened training state (`protocol.statecode`, DIFF against
    G_n), per `InnerOptim.moments`: the lowest measured by `bench.statecode`; 1.0 = sent uncoded."""
    state_code_speed: dict[str, float] = field(default_factory=lambda: {"encode": 4e8, "decode": 4e8})
    """Canonical bytes per second per core of that coding (the slower side bounds a transfer's CPU)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each constant came from (a results file or 'default')."""


@dataclass(frozen=True)
class PhaseBlocks:
    """Configured phase lengths in blocks (`RunConfig.phases`); None in Inputs = size them."""

    train: int
    reveal: int
    verify: int


@dataclass(frozen=True)
class Inputs:
    """Everything a plan depends on. Defaults: a 30B model on 16 hosts of 8×H100 at 1 Gbit/s (the
    mission's fleet), with the chain's own run, audit, stake and block defaults."""

    # model
    params: float = 30e9
    d_model: int | None = None
    layers: int | None = None
    # fleet
    hosts: int = 16
    verifier_nodes: int | None = None
    """Bonded verifiers (machines like a host); default: as many as hosts."""
    gpu: Gpu = GPUS["h100"]
    gpus_per_host: int = 8
    mfu: float = 0.4
    cpu_cores: int = 96
    pcie: float = 25e9
    up: float = 125e6
    down: float = 125e6
    disk_write: float = 2e9
    disk_budget: float = 30e12
    host_ram: float = 2e12
    host_mem_bw: float = 200e9
    """Host RAM bandwidth: what a CPU optimizer step (offload) streams through."""
    step_seconds: float | None = None
    """Measured seconds per inner step; overrides the FLOP model (used to validate on CPUs)."""
    # run: RunConfig's defaults (run_default); m, host.toml's checkpoint_every, as the scale design
    H: int = run_default("inner_steps")
    k: int = run_default("segment_len")
    s: int = run_default("sampled_segments")
    sampling: Sampling = RUN_SAMPLING
    w: int = run_default("window_segments")
    """Segments per checker window (sampling windows); s is used only by sampling segments."""
    v: int = run_default("verifiers_per_contribution")
    moments: sizes.Moments = run_default("inner").moments
    """How AdamW's moments are stored (`InnerOptim.moments`): int8 halves every training state."""
    m: int = DEFAULT_WINDOW_SEGMENTS
    """Persist every m-th boundary (host.toml `checkpoint_every`): a multiple of w keeps every
    window start on disk, so nothing is recomputed after the challenge (at 30B: 34 of the 101
    boundaries, 12 TB, within the disk budget)."""
    codec: Codec = RUN_CODEC
    codec_chunk: int = 4096
    """Codec sparse: the chunk C (`codec_block_size`)."""
    codec_topk: int = 64
    """Codec sparse: entries kept per chunk (`codec_topk`): 64 of 4096 = 1.5625%."""
    tokens_per_step: int = 1 << 20
    micro_tokens: int = 8192
    sharding: Sharding = Sharding.FSDP
    replay: ReplayMode = RUN_REPLAY
    chunk_bytes: float = 64 * 2**20
    pipeline: Pipeline = Pipeline.SPARSE
    # chain
    block_seconds: float = BLOCK_SECONDS
    epoch_blocks: int = 0
    poc_blocks: int = 0
    phases: PhaseBlocks | None = None
    # security and economics: RunConfig's audits and stake (a bond at the run's minimum)
    fake_fraction: float = 0.5
    dishonest_stake: float = 0.1
    audit_p: float = run_default("audit_bps") / BPS_DENOMINATOR
    auditors: int = run_default("audit_verifiers")
    host_stake: float = STAKE.min_host_stake / NGONKA_PER_GNK
    host_slash_bps: int = STAKE.host_slash_bps
    audit_slash_bps: int = STAKE.fraud_host_slash_bps
    reward: float = STAKE.reward_per_outer_step / NGONKA_PER_GNK
    gpu_hour_value: float = 1.0
    attack_value: float = 0.0

    def __post_init__(self) -> None:  # values read back from JSON or TOML arrive as strings
        for name, kind in (("codec", Codec), ("sharding", Sharding), ("pipeline", Pipeline),
                           ("replay", ReplayMode), ("sampling", Sampling),
                           ("moments", sizes.Moments)):  # fmt: skip
            object.__setattr__(self, name, kind(getattr(self, name)))

    @property
    def n(self) -> int:
        """Segments per outer step, H/k."""
        return self.H // self.k

    @property
    def verifiers(self) -> int:
        return self.verifier_nodes if self.verifier_nodes is not None else self.hosts

    @property
    def windowed(self) -> bool:
        return self.sampling is Sampling.WINDOWS

    @property
    def window_len(self) -> int:
        """w as the chain draws it (`RunConfig.window_len`): at most n."""
        return max(1, min(self.w, self.n))

    @property
    def blocks(self) -> int:
        """B = ⌈n/w⌉ aligned blocks."""
        return window_blocks(self.n, self.window_len)

    @property
    def slots(self) -> int:
        """Window slots drawn at the challenge: v initial + a audit (`RunConfig.checker_slots`)."""
        return self.v + self.auditors


# ---------------------------------------------------------------- model shape and compute


def model_shape(params: float, d_model: int | None = None, layers: int | None = None) -> tuple[int, int]:
    """(d_model, layers) of a GPT with ≈ `params` parameters, P ≈ 12·L·d², aspect d/L ≈ 128
    (Llama-7B 4096/32, Llama-30B 6656/60): either given dimension fixes the other."""
    if d_model and layers:
        return d_model, layers
    if layers:
        return max(64, round(math.sqrt(params / (12 * layers)) / 64) * 64), layers
    if d_model:
        return d_model, max(1, round(params / (12 * d_model**2)))
    d = (params * 128 / 12) ** (1 / 3)
    d = max(64, round(d / 128) * 128)
    return d, max(1, round(params / (12 * d * d)))


def inner_step_seconds(params: float, tokens: int, gpus: int, peak_flops: float, mfu: float) -> float:
    """6·P·tokens ÷ (gpus · peak · MFU): one inner step of the host's data-parallel ranks."""
    return FLOPS_PER_PARAM_TOKEN * params * tokens / (gpus * peak_flops * mfu)


def state_bytes(params: float, moments: sizes.Moments = sizes.Moments.FP32) -> float:
    """A training state: fp32 params + the moments (12 B/param; 6.03 with int8 moments)."""
    return sizes.state_bytes_per_param(moments) * params


def optimizer_bytes(params: float, moments: sizes.Moments = sizes.Moments.FP32) -> float:
    """An optimizer state, both moments (8 B/param; 2.03 with int8 moments)."""
    return sizes.optimizer_bytes_per_param(moments) * params


RUN_MOMENTS: sizes.Moments = run_default("inner").moments


def state_wire_bytes(i: Inputs, c: Constants, moments: sizes.Moments = RUN_MOMENTS) -> float:
    """An opened training state on the wire (issue 35): its canonical size for the run's moment
    format (`InnerOptim.moments`, default RunConfig's: 12 B/param fp32, 6.03 int8) ÷ the measured
    lossless ratio of coding its chunks against G_n (`Constants.state_code_ratio`,
    `bench.statecode`). Disk, hashing and the device → host copy keep the canonical size
    (`state_canonical_bytes`)."""
    moments = sizes.Moments(moments)
    return state_canonical_bytes(i.params, moments) / c.state_code_ratio.get(moments.value, 1.0)


def state_canonical_bytes(params: float, moments: sizes.Moments = RUN_MOMENTS) -> float:
    """A training state's canonical (hashed, stored) size: `protocol.inner.state_bytes_per_param`."""
    return sizes.state_bytes_per_param(moments) * params


def optimizer_wire_bytes(i: Inputs, moments: sizes.Moments = RUN_MOMENTS) -> float:
    """The carried optimizer state a checker fetches (moments + step): not coded (no parameters
    to difference against G_n), so its canonical size for the run's moment format."""
    return sizes.optimizer_bytes_per_param(sizes.Moments(moments)) * i.params


def sparse_bytes_per_param(chunk: int, topk: int) -> float:
    """The sparse payload per parameter (specs §4.1): per chunk of C, one fp32 scale, k indices of
    bitlen(C − 1) bits and k 2-bit codes; exact for whole chunks (headers and short last chunks
    are ≪ 1% at ≥ 1B)."""
    bits = max(1, (chunk - 1).bit_length())
    return (32 + topk * (bits + 2)) / (8 * chunk)


def delta_bytes(params: float, codec: Codec, c: Constants, chunk: int = 4096, topk: int = 64) -> float:
    """The Δ transport blob: fp32 bytes ÷ the codec's measured ratio (quantization + zstd); the
    sparse payload from its layout (`sparse_bytes_per_param`)."""
    if Codec(codec) is Codec.SPARSE:
        return params * sparse_bytes_per_param(chunk, topk)
    return FP32_DELTA_BYTES_PER_PARAM * params / c.codec_ratio[codec]


def run_delta_bytes(i: Inputs, c: Constants) -> float:
    """`delta_bytes` of a plan's inputs."""
    return delta_bytes(i.params, i.codec, c, i.codec_chunk, i.codec_topk)


# ---------------------------------------------------------------- hashing and checkpoints


def leaf_hash_seconds(
    params: float, cores: int, chunk_bytes: float, c: Constants, moments: sizes.Moments = sizes.Moments.FP32
) -> float:
    """One boundary leaf: 12·P bytes (int8 moments: 6.03·P) in chunks over min(cores, chunks)
    threads (per rank, each rank its own shard, so a host's cores work together)."""
    size = state_bytes(params, moments)
    threads = max(1, min(cores, math.ceil(size / chunk_bytes)))
    return size / (threads * c.sha256_bytes_per_s * c.hash_efficiency)


def snapshot_seconds(
    params: float, gpus: int, pcie: float, moments: sizes.Moments = sizes.Moments.FP32
) -> float:
    """Device → host copy of one boundary state, all ranks in parallel (each its 12·P/G shard)."""
    return state_bytes(params, moments) / (gpus * pcie)


def boundary_stall(work_seconds: float, budget_seconds: float) -> float:
    """Training waits when a boundary's background work outlasts what it may overlap with
    (one snapshot in flight, so the queue applies backpressure instead of growing)."""
    return max(0.0, work_seconds - budget_seconds)


@lru_cache(maxsize=4096)
def recompute_segments(n: int, s: int, m: int) -> float:
    """Expected segments a host replays after the challenge to rebuild its opened start states
    from the boundaries it persisted (0, m, 2m, …): per checkpoint interval, one pass up to the
    largest opened offset in it. Openings: s − 1 of segments 0..n−2 at random, plus n − 1."""
    if m <= 1 or n <= 1:
        return 0.0
    cand, r = n - 1, min(s - 1, n - 1)
    last_off = (n - 1) % m
    last_base = n - 1 - last_off

    def p_none(u: int) -> float:  # P(none of u given candidates among the r random openings)
        p = 1.0
        for i in range(r):
            p *= max(0, cand - u - i) / (cand - i)
        return p

    total = 0.0
    for base in range(0, n, m):
        positions = max(0, min(base + m, cand) - base)
        floor = last_off if base == last_base else 0
        total += floor
        for x in range(floor + 1, m):
            u = max(0, positions - x)
            if u:
                total += 1.0 - p_none(u)
    return total


def window_persisted(n: int, m: int, tolerance: bool) -> list[int]:
    """The boundaries a host has on disk after a windowed step's training
    (`trainer.boundaries.Boundaries.persisted`): every m-th (boundary 0 is G_n + the carried
    optimizer state, rebuilt) and θ_H (boundary n): the end the last block's check reaches (in
    tolerance mode its claimed end, fetched), and what a dispute panel fetches for its Δ check."""
    return sorted({*range(0, n, m), n})


def window_needs(n: int, w: int, b: int, tolerance: bool) -> range:
    """The boundaries a drawn block b makes the host serve (`trainer.recompute.needed_boundaries`):
    bitwise its start (none for block 0, rebuilt from G_n); tolerance every boundary of it."""
    if tolerance:
        return range(b * w, min(n, (b + 1) * w) + 1)
    return range(b * w, b * w + 1) if b > 0 else range(0)


def blocks_needing(w: int, blocks: int, lo: int, top: int, tolerance: bool) -> int:
    """How many blocks need a boundary in lo … top (`window_needs`): bitwise the blocks b ≥ 1 with
    lo ≤ b·w ≤ top; tolerance those whose boundaries b·w … (b+1)·w meet the range."""
    if tolerance:
        first, last = max(0, -(-lo // w) - 1), min(blocks - 1, top // w)
    else:
        first, last = max(1, -(-lo // w)), min(blocks - 1, top // w)
    return max(0, last - first + 1)


@lru_cache(maxsize=4096)
def recompute_windows(n: int, w: int, x: int, m: int, tolerance: bool = False) -> float:
    """Expected segments a host replays after a windowed challenge to rebuild what its x drawn
    blocks (distinct, uniformly drawn of B) and θ_H need, from the boundaries it persisted
    (`window_persisted`): from each persisted boundary, one pass up to the largest needed boundary
    before the next. Exactly over the draw: E[pass] = Σ_d P(a needed boundary at offset ≥ d), and a
    needed boundary lies in a range with probability 1 if it is always needed (θ_H; tolerance: and
    the last segment's start), else 1 − C(B − u, x) ÷ C(B, x), u = the blocks needing one there."""
    if m <= 1:
        return 0.0
    B = window_blocks(n, w)
    x = min(x, B)
    always = {n - 1, n} if tolerance else {n}
    persisted = window_persisted(n, m, tolerance)
    total = 0.0
    for q, nxt in zip(persisted, [*persisted[1:], n + 1], strict=True):
        top = nxt - 1
        for lo in range(q + 1, top + 1):
            if any(lo <= j <= top for j in always):
                total += 1.0
                continue
            u = blocks_needing(w, B, lo, top, tolerance)
            total += 1.0 - math.comb(B - u, x) / math.comb(B, x)
    return total


def opening_recompute(i: Inputs) -> float:
    """Segments the host replays after the challenge (0 with every boundary persisted)."""
    if i.pipeline is Pipeline.TODAY:
        return 0.0
    if i.windowed:
        return recompute_windows(i.n, i.window_len, i.slots, i.m, i.replay is ReplayMode.TOLERANCE)
    return recompute_segments(i.n, i.s, i.m)


def window_held_states(n: int, w: int, x: int, tolerance: bool) -> int:
    """States a host keeps for a windowed challenge: bitwise each drawn block's start and θ_H;
    tolerance every boundary of each drawn block and the last segment's two ends (at most n + 1)."""
    x = min(x, window_blocks(n, w))
    return min(n + 1, x * (w + 1) + 2) if tolerance else x + 1


def disk_states(i: Inputs) -> float:
    """States a host holds at its peak in one outer step.

    today: all n + 1 boundaries, kept until the step is DONE, plus G_n and G_{n+1} and two
    optimizer states (8·P each, counted as 2/3 state) and the Δ.
    sparse: ⌈n/m⌉ persisted + the openings it serves + 3 (live snapshot, G_n, optimizer) — the
    scale pipeline's bound H/(k·m) + s + 3; windows: ⌈n/m⌉ + (v + a) + 1 + 3 (`window_held_states`).
    """
    if i.pipeline is Pipeline.TODAY:
        return i.n + 1 + 4 * GLOBAL_BYTES_PER_PARAM / STATE_BYTES_PER_PARAM
    if i.windowed:
        held = window_held_states(i.n, i.window_len, i.slots, i.replay is ReplayMode.TOLERANCE)
        return math.ceil(i.n / i.m) + held + 3
    return math.ceil(i.n / i.m) + i.s + 3


def disk_bytes(i: Inputs, c: Constants) -> float:
    extra = run_delta_bytes(i, c) if i.pipeline is Pipeline.TODAY else 0.0
    return disk_states(i) * state_bytes(i.params, i.moments) + extra


# ---------------------------------------------------------------- memory


def gpu_memory(i: Inputs) -> dict[str, float]:
    """Peak bytes per GPU: sharded state and gradients + the replicated bits + activations.

    ZeRO-1 shards the moments, ZeRO-2 also the gradients, FSDP also the fp32 master weights
    (each rank gathers two layers in bf16 and reduce-scatters one layer's fp32 gradients).
    Activations with per-layer checkpointing: micro_tokens · d · (2·L + 34) bytes (Korthikanti
    et al. 2022: 2 bytes per layer input kept, ≈ 34·s·b·h for the layer being recomputed).
    """
    P, w = i.params, i.gpus_per_host
    d, L = model_shape(P, i.d_model, i.layers)
    weights, moments, grads = 4 * P, OPTIMIZER_BYTES_PER_PARAM * P, GRAD_BYTES_PER_PARAM * P
    layer = 12 * d * d
    if i.sharding is Sharding.NONE:
        sharded, replicated = 0.0, weights + moments + grads
    elif i.sharding is Sharding.ZERO1:
        sharded, replicated = moments / w, weights + grads
    elif i.sharding is Sharding.ZERO2:
        sharded, replicated = (moments + grads) / w, weights
    elif i.sharding is Sharding.FSDP:
        sharded, replicated = (weights + moments + grads) / w, layer * (2 * 2 + 4)
    else:
        sharded, replicated = (weights + grads) / w, layer * (2 * 2 + 4)
    activations = i.micro_tokens * d * (2 * L + 34)
    total = sharded + replicated + activations + RUNTIME_BYTES_PER_GPU
    return {"sharded": sharded, "replicated": replicated, "activations": activations,
            "runtime": RUNTIME_BYTES_PER_GPU, "total": total, "d_model": d, "layers": L}  # fmt: skip


# ---------------------------------------------------------------- bytes on the wire


def block_lengths(n: int, w: int) -> list[int]:
    """Segments of each aligned block: w each, the last one short when w does not divide n."""
    return [min(w, n - b * w) for b in range(window_blocks(n, w))]


def window_check_bytes(params: float, lengths: list[int], b: int, **kw: Any) -> float:
    """What the checker of block b downloads. Its start: 12·P, or for block 0 the carried optimizer
    state (8·P, G_n is held). Tolerance adds every later claimed boundary of the block (its
    segments' starts and its end, L_b states) and the Δ; where the last block is one segment alone
    (n mod w = 1), the block before it replays on into it (specs §6.4) and fetches its claimed end
    θ_H, a state. No other check fetches θ_H: only the check that ends at θ_H checks Δ against it
    (`RunConfig.window_reaches_end`), and a window short of θ_H fetches the committed Δ to keep and
    serve, the download its verifier makes anyway to aggregate G_{n+1} (not verification traffic).
    `ef`: codec sparse's carried accumulator, fetched by every check. Training states travel coded
    against G_n (specs §8.2, ÷ `ratio`, r); the optimizer state, e and Δ as they are. Keywords:
    those of `window_check_parts`, whose parts these are."""
    return sum(window_check_parts(params, lengths, b, **kw).values())


CHECK_PARTS = ("start", "optimizer", "theta_h", "claims", "ef")
"""What one check downloads, by kind (`window_check_parts`): the downloaded start state, the carried
optimizer state (block 0), θ_H (a whole state, only where a tolerance window takes on the lone last
segment), tolerance mode's claimed boundaries and Δ, codec sparse's accumulator e."""


def window_check_parts(
    params: float,
    lengths: list[int],
    b: int,
    *,
    bitwise: bool,
    ef: float = 0.0,
    delta: float = 0.0,
    moments: sizes.Moments = sizes.Moments.FP32,
    ratio: float = 1.0,
) -> dict[str, float]:
    """`window_check_bytes` by kind (`CHECK_PARTS`)."""
    S = state_bytes(params, moments) / ratio
    last = len(lengths) - 1
    takes_last = not bitwise and last >= 1 and lengths[last] == 1 and b == last - 1
    return {
        "start": 0.0 if b == 0 else S,
        "optimizer": optimizer_bytes(params, moments) if b == 0 else 0.0,
        "theta_h": S if takes_last else 0.0,
        "claims": 0.0 if bitwise else lengths[b] * S + delta,
        "ef": ef,
    }


def code_ratio(i: Inputs, c: Constants) -> float:
    """The measured lossless ratio the nodes' transfers of training states get (specs §8.2: every
    holder that holds G_n codes, every checker holds it), for the run's moment format; 1.0 where
    none was measured. Pipeline `today` (the design before issue 34) sends states uncoded."""
    if i.pipeline is Pipeline.TODAY:
        return 1.0
    return c.state_code_ratio.get(sizes.Moments(i.moments).value, 1.0)


def carried_ef_bytes(i: Inputs) -> float:
    """Codec sparse: the host's error-feedback accumulator a check fetches (0 for other codecs)."""
    return EF_BYTES_PER_PARAM * i.params if i.codec is Codec.SPARSE else 0.0


def window_bytes_per_check(i: Inputs, c: Constants) -> float:
    """One check's download, expected over its block (every block equally likely to be drawn):
    bitwise (1/B)·8·P + ((B−1)/B)·12·P/r (+ 4·P codec sparse), r the coding ratio of training
    states (`code_ratio`); no θ_H (`window_check_parts`)."""
    return sum(mean_check_parts(i, c).values())


def mean_check_parts(i: Inputs, c: Constants) -> dict[str, float]:
    """`window_check_parts` of the run's blocks, averaged over the drawn block (sampling windows)."""
    lengths = block_lengths(i.n, i.window_len)
    bitwise = i.replay is ReplayMode.BITWISE
    ef, d, r = carried_ef_bytes(i), run_delta_bytes(i, c), code_ratio(i, c)
    per = [window_check_parts(i.params, lengths, b, bitwise=bitwise, ef=ef, delta=d, moments=i.moments,
                              ratio=r)
           for b in range(len(lengths))]  # fmt: skip
    return {k: sum(p[k] for p in per) / len(per) for k in CHECK_PARTS}


def states_by_kind(i: Inputs, c: Constants) -> dict[str, float]:
    """A contribution's verification traffic (all c checks, sampling windows), by kind
    (`CHECK_PARTS`), in training states of 12·P: where `states_per_contribution` goes (θ_H only in
    tolerance mode with a lone last segment). Empty under sampling segments."""
    if not i.windowed:
        return {}
    scale = checks_per_contribution(i) / state_bytes(i.params)
    return {k: v * scale for k, v in mean_check_parts(i, c).items()}


def window_replay_segments(n: int, w: int, tolerance: bool = False) -> float:
    """Segments one check replays, expected over its block: n/B; in tolerance mode with a lone
    last segment (n mod w = 1, n > w) the block before it replays it too: + 1/B (specs §6.4)."""
    B = window_blocks(n, w)
    return n / B + (1 / B if tolerance and lone_last_block(n, w) else 0.0)


def from_zero_segments(n: int, w: int) -> float:
    """Segments a check replays if it starts from G_n (segment 0) instead of downloading its
    block's start: up to its block's end, mean over the block: Σ_b min(n, (b+1)·w) ÷ B =
    w·(B − 1)/2 + n/B."""
    B = window_blocks(n, w)
    return w * (B - 1) / 2 + n / B


def from_zero_check_bytes(
    params: float, ef: float = 0.0, moments: sizes.Moments = sizes.Moments.FP32
) -> float:
    """A from-segment-0 check (bitwise) downloads no state: the carried optimizer, 8·P (+ e); a
    window short of θ_H fetches no θ_H either (`window_check_parts`)."""
    return optimizer_bytes(params, moments) + ef


def replay_segments_per_check(i: Inputs) -> float:
    """Segments one check replays: s (every opened segment) or its window's n/B."""
    tolerance = i.replay is ReplayMode.TOLERANCE
    return window_replay_segments(i.n, i.window_len, tolerance) if i.windowed else float(i.s)


def verifier_bytes_per_contribution(i: Inputs, c: Constants) -> float:
    """What one verifier downloads to judge one contribution (one check).

    today: s start states + Δ. sparse: s − 1 start states (segment 0's is rebuilt from G_n) +
    the previous optimizer state + Δ only in tolerance mode (bitwise derives Δ from the replay).
    Codec sparse adds the host's carried error-feedback accumulator (4·P: the verifier rebuilds
    C(β·e + Δ) from it). Sampling windows: `window_bytes_per_check`.
    """
    if i.windowed:  # what today's verifier does whatever the host persists
        return window_bytes_per_check(i, c)
    S = state_bytes(i.params, i.moments) / code_ratio(i, c)
    d = run_delta_bytes(i, c)
    if i.pipeline is Pipeline.TODAY:
        return i.s * S + d
    f = segment_fetches(i.n, i.s)
    ef = EF_BYTES_PER_PARAM * i.params if i.codec is Codec.SPARSE else 0.0
    opt = f.segment_zero * optimizer_bytes(i.params, i.moments)
    if i.replay is ReplayMode.TOLERANCE:
        return f.boundaries * S + opt + ef + d
    return f.starts * S + opt + ef


@dataclass(frozen=True)
class SegmentFetches:
    """Expected downloads of one check under segment sampling (s − 1 random openings of the n − 1
    first segments, and the last one), exactly over the draw."""

    starts: float
    """Bitwise: opened starts neither segment 0's (rebuilt from G_n) nor the end of an opened
    segment just replayed."""
    boundaries: float
    """Tolerance: every boundary of an opened segment but boundary 0 (claimed starts and ends)."""
    segment_zero: float
    """P(segment 0 opened): the carried optimizer state is then fetched."""


def segment_fetches(n: int, s: int) -> SegmentFetches:
    """P(j opened) = r/(n−1) for j ≤ n−2 (r = s − 1 random openings), 1 for j = n − 1; two given
    segments of 0 … n−2 are both opened with probability r(r−1)/((n−1)(n−2))."""
    if n <= 1:
        return SegmentFetches(0.0, float(n), 1.0)
    r = min(s - 1, n - 1)
    one = r / (n - 1)
    two = r * (r - 1) / ((n - 1) * (n - 2)) if n > 2 else 0.0

    def opened(j: int) -> float:
        return 1.0 if j == n - 1 else one

    def both(j: int) -> float:  # segments j − 1 and j opened
        return one if j == n - 1 else two

    starts = sum(opened(j) - both(j) for j in range(1, n))
    boundaries = sum(opened(b) + opened(b - 1) - both(b) for b in range(1, n)) + 1.0  # + boundary n
    return SegmentFetches(starts, boundaries, opened(0))


def checks_per_contribution(i: Inputs) -> float:
    """Verifier downloads and replays per contribution: v drawn + p·auditors on average."""
    return i.v + i.audit_p * i.auditors


def states_per_contribution(i: Inputs, c: Constants) -> float:
    """Everything a contribution's checks download together, in training states (12·P)."""
    return checks_per_contribution(i) * verifier_bytes_per_contribution(i, c) / state_bytes(i.params)


def replay_share(i: Inputs) -> float:
    """Verifiers' replay GPU time ÷ the host's training compute: checks × segments per check × k/H
    (× the offload overhead, which a replay pays too)."""
    t = step_seconds(i)
    overhead = (t + step_overhead_seconds(i)) / t
    return checks_per_contribution(i) * replay_segments_per_check(i) * i.k / i.H * overhead


def contributions_per_verifier(i: Inputs) -> float:
    """Mean load of one verifier per outer step (draws are stake-weighted: equal stakes here)."""
    return i.hosts * checks_per_contribution(i) / i.verifiers


def host_openings_bytes(i: Inputs, c: Constants) -> float:
    """What the author uploads of one contribution's openings: c × one check's bytes.

    Segments: every check fetches the same opened states, at about the same time, from the author.
    Windows: each check fetches its own block's start (distinct from the others'), the carried
    optimizer, e and its tolerance claims; nothing two checks share leaves the author twice to
    be saved by swarming (specs §8.1), since no check fetches θ_H's parameters any more (only the
    check that ends at θ_H checks Δ, `window_check_parts`)."""
    return checks_per_contribution(i) * verifier_bytes_per_contribution(i, c)


def host_upload_bytes(i: Inputs, c: Constants) -> dict[str, float]:
    """Per host per outer step: its openings (`host_openings_bytes`), and its Δ to whoever aggregates.

    today the author serves its Δ to the other A − 1 hosts and to every verifier (each computes
    G_{n+1} itself). sparse: multi-source fetching spreads serving, so a host uploads about what
    it downloads, (A − 1)·Δ.
    """
    d = run_delta_bytes(i, c)
    openings = host_openings_bytes(i, c)
    peers = (i.hosts - 1 + i.verifiers) if i.pipeline is Pipeline.TODAY else (i.hosts - 1)
    return {"openings": openings, "delta": peers * d, "total": openings + peers * d}


def host_download_bytes(i: Inputs, c: Constants) -> float:
    """The other A − 1 accepted Δs, streamed one at a time into the fixed-order sum."""
    return (i.hosts - 1) * run_delta_bytes(i, c)


def verifier_download_bytes(i: Inputs, c: Constants) -> float:
    """Per verifier per outer step: its contributions' openings + the A Δs to compute G_{n+1}."""
    checks = contributions_per_verifier(i) * verifier_bytes_per_contribution(i, c)
    return checks + i.hosts * run_delta_bytes(i, c)


# ---------------------------------------------------------------- detection and deterrence


def faked_segments(n: int, f: float) -> int:
    """A lazy host fakes round(f·n) segments, never the always-opened last one."""
    return min(n - 1, round(f * n))


def detection_probability(n: int, faked: int, s: int) -> float:
    """P(at least one faked segment opened): s − 1 openings drawn without replacement from the
    n − 1 non-final segments, of which `faked` are fake: 1 − C(n−1−faked, s−1) / C(n−1, s−1)."""
    if s <= 1 or faked <= 0:
        return 0.0
    return 1.0 - math.comb(n - 1 - faked, s - 1) / math.comb(n - 1, s - 1)


def naive_detection(f: float, s: int) -> float:
    """The with-replacement approximation 1 − (1 − f)^s."""
    return 1.0 - (1.0 - f) ** s


def naive_window_detection(i: Inputs) -> float:
    """Windows' with-replacement approximation 1 − (1 − F/B)^(v + p·a)."""
    share = window_fake_blocks(i.n, i.window_len, i.fake_fraction) / i.blocks
    return 1.0 - (1.0 - share) ** checks_per_contribution(i)


@dataclass(frozen=True)
class Cheat:
    success: float
    """P(the fake reaches the model)."""
    caught_first: float
    """P(an honest drawn verifier rejects it)."""
    caught_audit: float
    """P(it passes the first verdicts and an audit overturns the accept)."""


def cheat_outcome(sigma: float, v: int, p: float, auditors: int, detection: float) -> Cheat:
    """A cheater whose accomplices hold a share σ of the bonded verifier stake.

    Each stake-weighted draw is an accomplice with probability σ. An honest verifier catches the
    fake with probability `detection` (1 for a fake Δ; the opened-segment chance for a lazy
    host), and one honest reject escalates to a stake-weighted confirmation. Accepted work is
    audited with probability p by `auditors` verifiers drawn after the first verdicts, catching
    it unless all are accomplices (or the fresh openings miss it):

        pass(x)  = σ^x + (1 − σ^x)·(1 − detection)
        success  = pass(v) · (1 − p + p·pass(auditors))

    With detection = 1 this is σ^v · (1 − p + p·σ^auditors).
    """

    def passes(x: int) -> float:
        allies = sigma**x
        return allies + (1 - allies) * (1 - detection)

    first = passes(v)
    audited = first * p * (1 - passes(auditors))
    return Cheat(success=first * (1 - p + p * passes(auditors)), caught_first=1 - first, caught_audit=audited)


def expected_profit(cheat: Cheat, gain: float, slash: float, audit_slash: float) -> float:
    """success · gain − caught · slash (an overturned accept costs the larger audit slash)."""
    return cheat.success * gain - cheat.caught_first * slash - cheat.caught_audit * audit_slash


def min_deterrent_slash(cheat: Cheat, gain: float) -> float:
    """The smallest slash S (same for both kinds of catch) with expected profit ≤ 0."""
    caught = cheat.caught_first + cheat.caught_audit
    return math.inf if caught <= 0 else cheat.success * gain / caught


def window_fake_blocks(n: int, w: int, f: float) -> int:
    """A lazy host fakes round(f·n) segments packed into the fewest blocks, ⌈round(f·n)/w⌉ (≤ B):
    every block is equally likely to be drawn, so no block is safer, and the last segment is
    replayed only by the last block's checker, so it may be faked too."""
    return min(window_blocks(n, w), math.ceil(round(f * n) / w))


def window_detection(blocks: int, fake: int, drawn: int) -> float:
    """P(at least one of `drawn` distinct blocks of B is one of the F fake ones):
    1 − C(B − F, x) ÷ C(B, x)."""
    x = min(drawn, blocks)
    return 1.0 - math.comb(blocks - fake, x) / math.comb(blocks, x)


def slot_counts(blocks: int, first: int, count: int) -> list[int]:
    """Slots first … first + count − 1 on each position of the keyed block order (slot j takes
    position j mod B, `protocol.prf.draw_windows`)."""
    per = [0] * blocks
    for j in range(first, first + count):
        per[j % blocks] += 1
    return per


@lru_cache(maxsize=4096)
def window_cheat(blocks: int, fake: int, v: int, auditors: int, p: float, sigma: float) -> Cheat:
    """A host with F fake blocks of B, whose accomplices hold a share σ of the verifier stake (each
    slot holder one independently): it passes the first verdicts iff every initial slot on a fake
    block is an accomplice, and an audit iff every audit slot on one is too.

        K1, K2 = initial and audit slots whose block is fake (the fake blocks sit at a uniformly
                 random F-subset of the keyed order's positions; with v + a ≤ B jointly
                 hypergeometric over v + a distinct blocks)
        success = E[σ^K1 · (1 − p + p·σ^K2)]; caught first = 1 − E[σ^K1];
        caught by audit = p·(E[σ^K1] − E[σ^(K1+K2)])

    σ = 0 gives the detection of a lazy host. A fake Δ is a fake of the blocks whose check ends
    at θ_H (`fake_delta_cheat`); every block fake is a wholly faked trajectory, `cheat_outcome` with
    detection 1.
    """
    groups = Counter(zip(slot_counts(blocks, 0, v), slot_counts(blocks, v, auditors), strict=True))
    keys = sorted(groups, key=lambda k: groups[k])
    rest, free = keys[-1], keys[:-1]  # the largest group takes what the others leave
    total = math.comb(blocks, fake)
    first = both = 0.0
    for take in product(*(range(min(groups[k], fake) + 1) for k in free)):
        left = fake - sum(take)
        if not 0 <= left <= groups[rest]:
            continue
        counts = [*zip(free, take, strict=True), (rest, left)]
        weight = math.prod(math.comb(groups[k], t) for k, t in counts) / total
        k1 = sum(k[0] * t for k, t in counts)
        k2 = sum(k[1] * t for k, t in counts)
        first += weight * sigma**k1
        both += weight * sigma ** (k1 + k2)
    return Cheat(success=(1 - p) * first + p * both, caught_first=1 - first, caught_audit=p * (first - both))


def lazy_cheat(i: Inputs, f: float) -> Cheat:
    """A lazy host faking a fraction f of its segments, no accomplices."""
    if i.windowed:
        fake = window_fake_blocks(i.n, i.window_len, f)
        return window_cheat(i.blocks, fake, i.v, i.auditors, i.audit_p, 0.0)
    det = detection_probability(i.n, faked_segments(i.n, f), i.s)
    return cheat_outcome(0.0, i.v, i.audit_p, i.auditors, det)


def lazy_detection(i: Inputs, f: float) -> float:
    """P(a host faking a fraction f is caught in an outer step). segments: every checker opens the
    same s segments, so one check's chance (`detection_probability`); windows: 1 − the lazy host's
    success over the initial and (with probability p) the audit windows."""
    if i.windowed:
        return 1.0 - lazy_cheat(i, f).success
    return detection_probability(i.n, faked_segments(i.n, f), i.s)


def one_segment_detection(i: Inputs) -> float:
    """P(a host faking one segment is caught in an outer step): segments (s − 1)/(n − 1) whatever
    v and a; windows 1 − the success of one fake block, (v + p·a)/B while v + a ≤ B."""
    if i.windowed:
        return 1.0 - window_cheat(i.blocks, 1, i.v, i.auditors, i.audit_p, 0.0).success
    return detection_probability(i.n, 1, i.s)


def fake_delta_success(sigma: float, v: int, p: float, auditors: int) -> float:
    """Sampling segments: a fake Δ (or a wholly faked trajectory), seen by every check, since every
    check replays segment n − 1 and checks Δ against θ_H: σ^v·(1 − p + p·σ^a)."""
    return cheat_outcome(sigma, v, p, auditors, 1.0).success


def largest_share(holds: Callable[[float], bool], cap: float = 0.5) -> float:
    """The largest accomplice share σ ≤ `cap` at which `holds` (true at 0, false from some σ on:
    a fake's odds only grow with σ) is still true, by bisection; `cap` itself when it holds there."""
    if holds(cap):
        return cap
    lo, hi = 0.0, cap
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo


def collusion_share_bound(v: int, p: float, auditors: int, ceiling: float = 0.01, cap: float = 0.5) -> float:
    """Sampling segments: the largest accomplice share σ ≤ `cap` whose fake Δ reaches the model in
    at most `ceiling` of outer steps (`fake_delta_success`); `cap` itself when even it does."""
    return largest_share(lambda sigma: fake_delta_success(sigma, v, p, auditors) <= ceiling, cap)


def fake_delta_blocks(i: Inputs) -> int:
    """Sampling windows: the blocks whose check ends at θ_H (`RunConfig.window_reaches_end`): the
    last one, and in tolerance mode with a lone last segment the block before it too (it replays on
    into segment n − 1, specs §6.4)."""
    lone = lone_last_block(i.n, i.window_len)
    return 2 if i.replay is ReplayMode.TOLERANCE and lone else 1


def fake_delta_cheat(i: Inputs, sigma: float) -> Cheat:
    """A fake Δ whose host's accomplices hold a share σ of the verifier stake.

    Segments: every check replays segment n − 1 and checks Δ against θ_H, so it meets them all:
    `cheat_outcome` with detection 1, σ^v·(1 − p + p·σ^a). Windows: only a check that ends at θ_H
    checks Δ, and the host commits a θ_H that matches its fake Δ (which only the replay of segment
    n − 1 catches), so a fake Δ is a fake of the blocks that end at θ_H (`fake_delta_blocks`: the
    last): `window_cheat`, exact since every block is equally likely for every slot."""
    if i.windowed:
        return window_cheat(i.blocks, fake_delta_blocks(i), i.v, i.auditors, i.audit_p, sigma)
    return cheat_outcome(sigma, i.v, i.audit_p, i.auditors, 1.0)


def fake_delta_fraction(i: Inputs) -> float:
    """The share of the training a host that fakes Δ need not do: segments 1 (every check sees a
    fake Δ, so a wholly faked trajectory fares the same); windows the last block's segments, the
    only ones a check ending at θ_H replays alone."""
    return block_lengths(i.n, i.window_len)[-1] / i.n if i.windowed else 1.0


def coalition_caught_floor(sigma: float) -> float:
    """Sampling windows: the least share of outer steps a fake Δ must be caught in against
    accomplices holding σ of the verifier stake, ONE_SEGMENT_CAUGHT·(1 − σ)
    (`WINDOW_FAKE_DELTA_CAUGHT` at σ = COALITION)."""
    return ONE_SEGMENT_CAUGHT * (1 - sigma)


def collusion_floor_holds(windowed: bool, success: float, sigma: float, ceiling: float = 0.01) -> bool:
    """A coalition holding σ of the verifier stake whose fake Δ reaches the model with probability
    `success`: segments, at most `ceiling`; windows (where no window setting in a replay budget gets
    a fake Δ near that), it is caught in at least `coalition_caught_floor(σ)` of outer steps."""
    if windowed:
        return 1 - success >= coalition_caught_floor(sigma) - 1e-12
    return success <= ceiling


def collusion_floor_met(i: Inputs, sigma: float, ceiling: float = 0.01) -> bool:
    """`collusion_floor_holds` for this setting's fake Δ (`fake_delta_cheat`)."""
    return collusion_floor_holds(i.windowed, fake_delta_cheat(i, sigma).success, sigma, ceiling)


def cheat_gain(i: Inputs, fraction: float, train_seconds: float) -> float:
    """What a fake that passes is worth: the host's reward share, the compute it did not spend
    (fraction × its GPU-hours × their value), and whatever the attacker values the poison at."""
    gpu_hours = i.gpus_per_host * train_seconds / 3600
    return i.reward / i.hosts + fraction * gpu_hours * i.gpu_hour_value + i.attack_value


# ---------------------------------------------------------------- the outer step in time


@dataclass(frozen=True)
class Timeline:
    """Seconds of one outer step, in order. GPU work: train (+ stalls) and recompute."""

    train: float
    stall: float
    commit: float
    recompute: float
    reveal: float
    verify: float
    finalize: float
    aggregate: float
    result: float
    poc_wait: float

    @property
    def gpu(self) -> float:
        return self.train + self.stall + self.recompute

    @property
    def after_training(self) -> float:
        return (self.commit + self.recompute + self.reveal + self.verify + self.finalize + self.aggregate
                + self.result)  # fmt: skip

    @property
    def sequential(self) -> float:
        """Wall time of a step when nothing overlaps (today's schedule)."""
        return self.train + self.stall + self.after_training + self.poc_wait

    @property
    def overlapped(self) -> float:
        """Period of the overlapped schedule (`overlap = "eager"`, specs §2.2.1): two steps in
        flight, step n+1 training (with step n's opening recompute on the same GPUs) while step n
        is committed, challenged, revealed, verified, finalized and aggregated. Step n+2 opens
        once step n+1's training is over and step n's result is adopted (it trains from it), so
        the period is the GPU work or the post-training path, whichever is longer: training never
        waits exactly when the verification fits inside one train phase (`overlap_fits`)."""
        return max(self.gpu, self.after_training) + self.poc_wait

    @property
    def overlap_fits(self) -> bool:
        """Step n's post-training path fits inside step n+1's GPU work: hosts never wait."""
        return self.after_training <= self.gpu


def verify_seconds(i: Inputs, c: Constants, t_step: float) -> dict[str, float]:
    """The verification window: every verifier downloads and replays its contributions.

    Downloads are bounded by the host's upload (its openings, `host_openings_bytes`) and by the
    verifier's download (it fetches all its
    contributions); replay is (segments per check)·k inner steps each (s, or a window's n/B) on the
    verifier's own GPUs; fetch and replay pipeline across contributions.
    """
    per = verifier_bytes_per_contribution(i, c)
    load = max(1.0, contributions_per_verifier(i))
    data = max(host_openings_bytes(i, c) / i.up, load * per / i.down)
    replay = replay_segments_per_check(i) * i.k * t_step
    first = min(per / i.down, replay)
    return {"data": data, "replay": load * replay, "total": max(data, load * replay) + first}


def aggregate_seconds(i: Inputs, c: Constants) -> float:
    """Fetch the A − 1 other Δs (link-bound; decoding streams alongside) and serve one's own.
    Decoding is measured per fp32 byte of Δ (sparse: decoded into the running sum, never dense)."""
    up = host_upload_bytes(i, c)["delta"] / i.up
    down = host_download_bytes(i, c) / i.down
    decode = (
        (i.hosts - 1) * FP32_DELTA_BYTES_PER_PARAM * i.params / (c.codec_decode[i.codec] * i.gpus_per_host)
    )
    return max(up, down, decode)


def poc_wait_seconds(i: Inputs) -> float:
    """A step opening uniformly in an epoch of E blocks lands in the PoC window W with
    probability W/E and then waits W/2 on average: W²/(2E) blocks."""
    if not i.epoch_blocks or not i.poc_blocks:
        return 0.0
    return i.poc_blocks**2 / (2 * i.epoch_blocks) * i.block_seconds


def offload_seconds(params: float, gpus: int, pcie: float, host_mem_bw: float) -> float:
    """Per inner step with the moments offloaded: fp32 gradients down and weights up over PCIe
    (4·P each, all ranks in parallel), and a CPU AdamW step streaming ≈ 28 bytes per parameter
    (read weight, gradient, two moments; write weight and two moments) through host RAM."""
    return 2 * 4 * params / (gpus * pcie) + 28 * params / host_mem_bw


def step_seconds(i: Inputs) -> float:
    """The inner step's compute: the FLOP model, or a measured figure where one is given."""
    if i.step_seconds is not None:
        return i.step_seconds
    return inner_step_seconds(i.params, i.tokens_per_step, i.gpus_per_host, i.gpu.peak_flops, i.mfu)


def step_overhead_seconds(i: Inputs) -> float:
    """Per inner step on top of the compute: the CPU optimizer step when moments are offloaded."""
    if i.sharding is Sharding.FSDP_OFFLOAD:
        return offload_seconds(i.params, i.gpus_per_host, i.pcie, i.host_mem_bw)
    return 0.0


def timeline(i: Inputs, c: Constants) -> Timeline:
    t = step_seconds(i) + step_overhead_seconds(i)
    n, seg = i.n, i.k * t
    hash_s = leaf_hash_seconds(i.params, i.cpu_cores, i.chunk_bytes, c, i.moments)
    persist_every = 1 if i.pipeline is Pipeline.TODAY else i.m
    persisted = math.ceil(n / persist_every)
    write_s = state_bytes(i.params, i.moments) / i.disk_write
    stall = (
        i.H * step_overhead_seconds(i)
        + n * boundary_stall(snapshot_seconds(i.params, i.gpus_per_host, i.pcie, i.moments), t)
        + (n - persisted) * boundary_stall(hash_s, seg)
        + persisted * boundary_stall(max(hash_s, write_s), seg)
    )
    recompute = opening_recompute(i) * seg
    b = i.block_seconds
    return Timeline(
        train=i.H * step_seconds(i), stall=stall, commit=BLOCK_AFTER_COMMIT * b, recompute=recompute,
        reveal=b, verify=verify_seconds(i, c, t)["total"], finalize=b, aggregate=aggregate_seconds(i, c),
        result=b, poc_wait=poc_wait_seconds(i),
    )  # fmt: skip


AGGREGATION_SHARE_LIMIT = 0.5
"""Where a codec's aggregation stops fitting beside training: half of it (RESULTS §9b: at 30B int8
reaches it at 64 hosts, sparse at 869)."""


def aggregation_share(i: Inputs, c: Constants, codec: Codec) -> float:
    """Aggregation (fetch and sum the other Δs, `aggregate_seconds`) ÷ training, had the run `codec`."""
    return aggregate_seconds(replace(i, codec=codec), c) / max(i.H * step_seconds(i), 1e-12)


def host_limit(i: Inputs, c: Constants, codec: Codec, *, most: int = 1 << 20) -> int | None:
    """The fewest hosts at which `codec`'s aggregation reaches `AGGREGATION_SHARE_LIMIT` of training
    (None: not up to `most`). The share only grows with hosts, so bisection finds it."""
    if aggregation_share(replace(i, hosts=most), c, codec) < AGGREGATION_SHARE_LIMIT:
        return None
    lo, hi = 1, most  # share(lo) < limit ≤ share(hi), once lo is checked
    if aggregation_share(replace(i, hosts=lo), c, codec) >= AGGREGATION_SHARE_LIMIT:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if aggregation_share(replace(i, hosts=mid), c, codec) >= AGGREGATION_SHARE_LIMIT:
            hi = mid
        else:
            lo = mid
    return hi


def codec_advice(i: Inputs, c: Constants) -> dict[str, Any]:
    """Which Δ codec this fleet should run: int8 while its aggregation fits beside training (it
    learns better per outer step: RESULTS §1u), the sparse codec past that host count (its Δ is
    ~36× smaller at 30B, so aggregation stays flat far longer)."""
    shares = {codec.value: aggregation_share(i, c, codec) for codec in (Codec.INT8, Codec.SPARSE)}
    limits = {codec.value: host_limit(i, c, codec) for codec in (Codec.INT8, Codec.SPARSE)}
    fits = shares[Codec.INT8.value] < AGGREGATION_SHARE_LIMIT
    recommended = Codec.INT8 if fits else Codec.SPARSE
    return {"recommended": recommended.value, "share": shares, "host_limit": limits}


def configured_period(phases: PhaseBlocks, block_seconds: float, aggregate: float) -> float:
    """A step with fixed phases (§2.2): train + 1 + reveal + verify blocks to finalization, the
    result as soon as a majority voted (≥ 1 block after aggregating), then 1 block to open."""
    result = max(1, math.ceil(aggregate / block_seconds))
    return (phases.train + 1 + phases.reveal + phases.verify + result + 1) * block_seconds


def configured_overlapped_period(phases: PhaseBlocks, block_seconds: float, aggregate: float) -> float:
    """The overlapped (eager) schedule with fixed phases (specs §2.2.1): step n opens at
    max(commit_deadline(n−1) + 1, done(n−2) + 1), i.e. P ≥ train + 1 blocks after step n − 1 and
    2P ≥ one whole sequential step after step n − 2: the mean period is the larger of the two."""
    sequential = configured_period(phases, block_seconds, aggregate)
    return max((phases.train + 1) * block_seconds, sequential / 2)


def recommended_phases(tl: Timeline, block_seconds: float, margin: float = 0.2) -> PhaseBlocks:
    """Phase lengths (blocks) that fit the work with a margin: train covers training, reveal the
    recompute of the openings, verify the verification window."""

    def blocks(seconds: float) -> int:
        return max(1, math.ceil(seconds * (1 + margin) / block_seconds))

    return PhaseBlocks(train=blocks(tl.train + tl.stall), reveal=blocks(tl.recompute + tl.reveal),
                       verify=blocks(tl.verify))  # fmt: skip


def utilization(useful: float, period: float, poc_share: float = 0.0) -> float:
    """Training compute seconds ÷ wall seconds (a PoC window's share of the epoch is not training)."""
    return 0.0 if period <= 0 else useful / period * (1 - poc_share)


def run_cost(util: float, replay_share: float) -> float:
    """GPU-seconds spent per second of useful training compute: the hosts' wall time (1/util) plus
    the verifiers' replays (`replay_share`: checks × segments per check × k/H of a host's compute)."""
    return 1 / max(util, 1e-12) + replay_share


# ---------------------------------------------------------------- the whole plan


@dataclass(frozen=True)
class Plan:
    inputs: dict[str, Any]
    compute: dict[str, float]
    network: dict[str, float]
    verification: dict[str, float]
    hashing: dict[str, float]
    disk: dict[str, float]
    memory: dict[str, float]
    timeline: dict[str, float]
    utilization: dict[str, float]
    security: dict[str, float]
    chain: dict[str, float]
    phases: dict[str, int]
    cost: float
    """GPU-seconds the run spends (hosts' wall + verifiers' replays) per useful training second."""
    warnings: list[str]
    economics: dict[str, Any] = field(default_factory=dict)
    """Issue 34's cheating floors at these settings (`economics`)."""
    codec: dict[str, Any] = field(default_factory=dict)
    """`codec_advice`: the codec this host count should run, and where each stops fitting."""
    states_by_kind: dict[str, float] = field(default_factory=dict)
    """`states_by_kind`: where the verification's states per contribution go (sampling windows)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


HALF_FAKE_CAUGHT = 0.9
"""A host faking half its segments is caught in at least this share of outer steps (issue 34)."""
ONE_SEGMENT_CAUGHT = 0.2
"""A host faking one segment is caught in at least this share of outer steps (issue 34)."""
FAKE_DELTA_CEILING = 0.01
"""A fake Δ reaches the model in at most this share of outer steps (DESIGN §7) …"""
COALITION = 0.5
"""… for every coalition holding less than this share of the verifier stake (sampling segments;
windows: `WINDOW_FAKE_DELTA_CAUGHT`)."""
WINDOW_FAKE_DELTA_CAUGHT = ONE_SEGMENT_CAUGHT * (1 - COALITION)
"""Sampling windows: a fake Δ is caught in at least this share of outer steps (10%) against a
coalition holding COALITION of the verifier stake, in place of the ≤ FAKE_DELTA_CEILING floor.

Why: only the check that ends at θ_H checks Δ against it, and a host that fakes Δ commits a θ_H
that matches it, which only the replay of segment n − 1 catches. So a fake Δ is a one-block fake
of the last block (`fake_delta_cheat`), caught alone in the one-segment share (v + p·a)/B: no
window within the replay budget gets it near 99%, so a ≤ 1% ceiling could never be met (nor was it
before, against a θ_H faked to match). What a coalition can do is replace honest checkers by
accomplices at rate σ, thinning the catch to (1 − σ) of it; the floor asks that below COALITION it
thin no further: the one-segment floor (ONE_SEGMENT_CAUGHT) for the checkers' honest share,
ONE_SEGMENT_CAUGHT·(1 − COALITION). While v + a ≤ B the catch is exactly (v + p·a)/B·(1 − σ), so
the floor then holds exactly when the one-segment floor does (at every σ or at none); it adds to
it where slots share blocks. That a fake Δ passing most steps does not pay is left to the slashes
(the economics' best fake), not to the draw."""

RUN_FIELDS = ("H", "k", "s", "sampling", "w", "v", "audit_p", "auditors", "host_stake", "host_slash_bps",
              "audit_slash_bps", "reward")  # fmt: skip
"""The inputs that come from RunConfig: equal to `Inputs()`'s, a plan is at the run's defaults."""


def at_run_defaults(i: Inputs) -> bool:
    d = Inputs()
    return all(getattr(i, f) == getattr(d, f) for f in RUN_FIELDS)


def host_slash(i: Inputs) -> float:
    return i.host_stake * i.host_slash_bps / 10_000


def audit_slash(i: Inputs) -> float:
    return i.host_stake * i.audit_slash_bps / 10_000


def most_profitable_fake(i: Inputs, train_seconds: float) -> tuple[int, float, float]:
    """(segments, expected profit, deterring slash) of the lazy fake that pays best, over 1 … n
    faked segments: the floors below bound two points of that curve, not its maximum."""
    best = (0, -math.inf, 0.0)
    for faked in range(1, i.n + 1):
        f = faked / i.n
        cheat, gain = lazy_cheat(i, f), cheat_gain(i, f, train_seconds)
        profit = expected_profit(cheat, gain, host_slash(i), audit_slash(i))
        if profit > best[1]:
            best = (faked, profit, min_deterrent_slash(cheat, gain))
    return best


def economics(i: Inputs, train_seconds: float) -> dict[str, Any]:
    """Issue 34's floors: a host faking half its segments is caught in ≥ 90% of outer steps and
    expects a loss; one faking one segment is caught in ≥ 20%; and the coalition floor at σ =
    COALITION (`collusion_floor_met`): sampling segments, a fake Δ reaches the model in ≤ 1% of
    outer steps for every coalition below ½ of the verifier stake; sampling windows, where a fake
    Δ is a one-block fake of the last block (`fake_delta_cheat`), it is caught in ≥
    `WINDOW_FAKE_DELTA_CAUGHT` at ½. `fake_delta_sigma_bound`: the largest σ ≤ ½ the floor holds at
    (None: not even without accomplices)."""
    half = lazy_cheat(i, 0.5)
    caught = lazy_detection(i, 0.5)
    profit = expected_profit(half, cheat_gain(i, 0.5, train_seconds), host_slash(i), audit_slash(i))
    one = one_segment_detection(i)
    def holds(sigma: float) -> bool:
        return collusion_floor_met(i, sigma, FAKE_DELTA_CEILING)

    bound = largest_share(holds, COALITION) if holds(0.0) else None
    alone, at_coalition = fake_delta_cheat(i, 0.0).success, fake_delta_cheat(i, COALITION).success
    worst, worst_profit, worst_slash = most_profitable_fake(i, train_seconds)
    ok = {
        "half_fake": caught >= HALF_FAKE_CAUGHT and profit < 0,
        "one_segment": one >= ONE_SEGMENT_CAUGHT,
        "coalition": collusion_floor_met(i, COALITION, FAKE_DELTA_CEILING),
    }
    return {
        "half_fake_caught": caught, "half_fake_profit": profit, "one_segment_caught": one,
        "windowed": i.windowed, "fake_delta_blocks": fake_delta_blocks(i) if i.windowed else 0,
        "fake_delta_sigma_bound": bound, "fake_delta_success_alone": alone,
        "fake_delta_success_at_coalition": at_coalition,
        "fake_delta_caught_floor": coalition_caught_floor(COALITION) if i.windowed else None,
        "best_fake_segments": worst, "best_fake_profit": worst_profit, "best_fake_min_slash": worst_slash,
        "meets": ok, "meets_all": all(ok.values()), "at_run_defaults": at_run_defaults(i),
    }  # fmt: skip


def plan(i: Inputs, c: Constants, *, overlap: bool = True) -> Plan:
    """Every figure of one setting. `overlap` picks which schedule `cost` is judged on."""
    t = step_seconds(i)
    t_gpu = t + step_overhead_seconds(i)
    tl = timeline(i, c)
    S, d = state_bytes(i.params, i.moments), run_delta_bytes(i, c)
    up = host_upload_bytes(i, c)
    ver = verify_seconds(i, c, t_gpu)
    poc_share = i.poc_blocks / i.epoch_blocks if i.epoch_blocks else 0.0
    configured = configured_period(i.phases, i.block_seconds, tl.aggregate) if i.phases is not None else None
    util = {
        "sequential": utilization(tl.train, tl.sequential, poc_share),
        "overlapped": utilization(tl.train, tl.overlapped, poc_share),
    }
    if configured is not None and i.phases is not None:
        util["configured"] = utilization(tl.train, configured, poc_share)
        overlapped = configured_overlapped_period(i.phases, i.block_seconds, tl.aggregate)
        util["configured_overlapped"] = utilization(tl.train, overlapped, poc_share)
    share = replay_share(i)
    cost = run_cost(util["overlapped" if overlap else "sequential"], share)

    det = lazy_detection(i, i.fake_fraction)
    naive = naive_window_detection(i) if i.windowed else naive_detection(i.fake_fraction, i.s)
    slash, a_slash = host_slash(i), audit_slash(i)
    lazy = lazy_cheat(i, i.fake_fraction)
    coll = fake_delta_cheat(i, i.dishonest_stake)
    lazy_gain = cheat_gain(i, i.fake_fraction, tl.train)
    coll_gain = cheat_gain(i, fake_delta_fraction(i), tl.train)
    mem = gpu_memory(i)
    hash_s = leaf_hash_seconds(i.params, i.cpu_cores, i.chunk_bytes, c, i.moments)
    msgs = i.hosts * (3 + checks_per_contribution(i))  # commit, reveal, result + verdicts

    warnings = []
    if mem["total"] > i.gpu.memory:
        warnings.append(f"does not fit: {mem['total'] / 1e9:.0f} GB per GPU > {i.gpu.memory / 1e9:.0f} GB")
    if disk_bytes(i, c) > i.disk_budget:
        warnings.append(
            f"disk {disk_bytes(i, c) / 1e12:.1f} TB per host > budget {i.disk_budget / 1e12:.1f} TB"
        )
    ram = S + (OPTIMIZER_BYTES_PER_PARAM * i.params if i.sharding is Sharding.FSDP_OFFLOAD else 0.0)
    if ram > i.host_ram:
        warnings.append(f"host RAM: {ram / 1e12:.2f} TB (a boundary snapshot + offloaded moments) > "
                        f"{i.host_ram / 1e12:.2f} TB")  # fmt: skip
    if i.replay is ReplayMode.TOLERANCE and i.k > 10:
        warnings.append("tolerance mode needs short segments (k ≤ 10) to see one skipped step")
    advice = codec_advice(i, c)
    if advice["recommended"] != i.codec.value and i.codec in (Codec.INT8, Codec.SPARSE):
        limit = advice["host_limit"][Codec.INT8.value]
        int8_share = advice["share"][Codec.INT8.value]
        why = (f"int8's aggregation is {int8_share:.0%} of training (half of it from {limit} hosts)"
               if advice["recommended"] == Codec.SPARSE.value else
               "int8's aggregation fits and it learns better per outer step (RESULTS §1u)")  # fmt: skip
        warnings.append(f"codec {advice['recommended']} recommended at {i.hosts} hosts: {why}")
    if i.phases is not None:
        need = recommended_phases(tl, i.block_seconds, margin=0.0)
        for name in ("train", "reveal", "verify"):
            if getattr(need, name) > getattr(i.phases, name):
                warnings.append(f"{name} phase too short: needs {getattr(need, name)} blocks, has "
                                f"{getattr(i.phases, name)}")  # fmt: skip
    return Plan(
        inputs={**_plain(i), "n_segments": i.n, "verifiers": i.verifiers},
        compute={
            "inner_step_s": t,
            "overhead_per_step_s": t_gpu - t,
            "train_s": tl.train,
            "flops_per_inner_step": FLOPS_PER_PARAM_TOKEN * i.params * i.tokens_per_step,
            "tokens_per_outer_step": i.H * i.tokens_per_step,
        },
        network={
            "state_bytes": S,
            "delta_bytes": d,
            "delta_upload_s": d / i.up,
            "host_upload_bytes": up["total"],
            "host_upload_openings_bytes": up["openings"],
            "host_upload_delta_bytes": up["delta"],
            "host_download_bytes": host_download_bytes(i, c),
            "aggregate_s": tl.aggregate,
            "verifier_download_bytes": verifier_download_bytes(i, c),
        },
        verification={
            "bytes_per_contribution": verifier_bytes_per_contribution(i, c),
            "checks_per_contribution": checks_per_contribution(i),
            "states_per_contribution": states_per_contribution(i, c),
            "replay_segments_per_check": replay_segments_per_check(i),
            "window_segments": float(i.window_len if i.windowed else 0),
            "blocks": float(i.blocks if i.windowed else 0),
            "one_segment_detection": one_segment_detection(i),
            "contributions_per_verifier": contributions_per_verifier(i),
            "fetch_s": ver["data"],
            "replay_s": ver["replay"],
            "window_s": ver["total"],
            "replay_share": share,
        },
        hashing={
            "leaf_s": hash_s,
            "segment_compute_s": i.k * t_gpu,
            "snapshot_s": snapshot_seconds(i.params, i.gpus_per_host, i.pcie, i.moments),
            "stall_s": tl.stall,
            "host_ram_bytes": S,
        },
        disk={
            "states": disk_states(i),
            "bytes": disk_bytes(i, c),
            "recompute_segments": opening_recompute(i),
        },
        memory={**mem, "capacity": i.gpu.memory},
        timeline={
            **asdict(tl),
            "sequential": tl.sequential,
            "overlapped": tl.overlapped,
            "gpu": tl.gpu,
            "after_training": tl.after_training,
            **({"configured": configured} if configured is not None else {}),
        },
        utilization=util,
        security={
            "detection": det,
            "detection_naive": naive,
            "lazy_success": lazy.success,
            "lazy_gain": lazy_gain,
            "lazy_profit": expected_profit(lazy, lazy_gain, slash, a_slash),
            "lazy_min_slash": min_deterrent_slash(lazy, lazy_gain),
            "collusion_success": coll.success,
            "collusion_gain": coll_gain,
            "collusion_profit": expected_profit(coll, coll_gain, slash, a_slash),
            "collusion_min_slash": min_deterrent_slash(coll, coll_gain),
            "slash": slash,
            "audit_slash": a_slash,
        },
        chain={"messages": msgs, "chain_s": msgs * c.chain_ms_per_msg / 1000},
        phases=asdict(recommended_phases(tl, i.block_seconds)),
        cost=cost,
        warnings=warnings,
        economics=economics(i, tl.train),
        codec=advice,
        states_by_kind=states_by_kind(i, c),
    )


def token_budget(p: Plan, tokens: float, *, overlap: bool = True) -> dict[str, float]:
    """Training on `tokens` tokens at this setting: every host trains H inner steps of T tokens
    per outer step (all accepted), steps follow each other at the schedule's period, and the
    GPU-hours are the hosts' whole wall time on every GPU plus the verifiers' replays on machines
    like a host's (replay share × the hosts' compute) — `cost` × useful GPU-hours."""
    i = p.inputs
    per_outer = i["hosts"] * i["H"] * i["tokens_per_step"]
    steps = math.ceil(tokens / per_outer)
    wall = steps * p.timeline["overlapped" if overlap else "sequential"]
    gpus = i["hosts"] * i["gpus_per_host"]
    hosts_h = wall * gpus / 3600
    verifiers_h = steps * p.verification["replay_share"] * p.compute["train_s"] * gpus / 3600
    return {
        "tokens": float(tokens), "tokens_per_inner_step": float(i["tokens_per_step"]),
        "tokens_per_outer_step": float(per_outer), "outer_steps": float(steps), "wall_s": wall,
        "host_gpu_hours": hosts_h, "verifier_gpu_hours": verifiers_h, "gpu_hours": hosts_h + verifiers_h,
        "useful_gpu_hours": steps * p.compute["train_s"] * gpus / 3600,
    }  # fmt: skip


def _plain(i: Inputs) -> dict[str, Any]:
    out = asdict(i)
    out["gpu"] = i.gpu.name
    return out


# ---------------------------------------------------------------- sweep


@dataclass(frozen=True)
class Floors:
    """What a setting must meet to be recommended."""

    utilization: float = 0.9
    detection: float = 0.9
    collusion_success: float = 0.01
    """Sampling segments: a coalition of `Inputs.dishonest_stake`'s fake Δ reaches the model in at
    most this share of outer steps; windows: it is caught in ≥ `coalition_caught_floor(σ)` instead
    (`collusion_floor_met`)."""
    deterrence: bool = True
    """Both the lazy host's and the colluder's expected profit must be negative."""
    max_H: int = 500
    """The longest outer step the sweep considers (DiLoCo's H = 500; convergence is not modelled)."""
    codec_error: float = 0.01
    """Largest relative Δ error of a codec the sweep may pick (int4's 9% is excluded by default)."""


SWEEP_H = (100, 200, 250, 500, 1000)
SWEEP_K = (1, 2, 5, 10, 20, 25, 50)
SWEEP_S = tuple(range(1, 17))
SWEEP_W = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 25)
SWEEP_V = (1, 2, 3, 4, 5)
SWEEP_M = (1, 2, 5, 10, 20, 50)


def meets(p: Plan, floors: Floors, overlap: bool) -> bool:
    sec = p.security
    util = p.utilization["overlapped" if overlap else "sequential"]
    return (
        not p.warnings
        and util >= floors.utilization
        and sec["detection"] >= floors.detection
        and collusion_floor_holds(
            p.inputs["sampling"] == Sampling.WINDOWS,
            sec["collusion_success"],
            p.inputs["dishonest_stake"],
            floors.collusion_success,
        )
        and (not floors.deterrence or (sec["lazy_profit"] < 0 and sec["collusion_profit"] < 0))
    )


def opened_state_bytes(i: Inputs, ratio: float = 1.0) -> float:
    """One check's states alone, whatever the codec (no Δ, no error feedback), training states
    coded at `ratio`: a lower bound on what the host serves per check."""
    S, P = state_bytes(i.params, i.moments) / ratio, i.params
    if i.windowed:
        lengths = block_lengths(i.n, i.window_len)
        bitwise = i.replay is ReplayMode.BITWISE
        per = [window_check_bytes(P, lengths, b, bitwise=bitwise, moments=i.moments, ratio=ratio)
               for b in range(len(lengths))]  # fmt: skip
        return sum(per) / len(per)
    return i.s * S if i.pipeline is Pipeline.TODAY else (i.s - 1) * S + optimizer_bytes(P, i.moments)


def utilization_bound(i: Inputs, overlap: bool, c: Constants | None = None) -> float:
    """An upper bound on utilization whatever m and the codec: the host's upload of its opened
    states alone (no Δ, no recompute, no stalls; coded as `host_openings_bytes` counts them, with
    `c`'s coding ratio) already follows training."""
    ratio = 1.0 if c is None else code_ratio(i, c)
    data = checks_per_contribution(i) * opened_state_bytes(i, ratio) / i.up
    train = i.H * step_seconds(i)
    return train / (max(train, data) if overlap else train + data)


def sample_settings(i: Inputs, n: int) -> list[tuple[int, int]]:
    """What the sweep varies of the sampling rule, as (s, w): s (segments) or w (windows), ≤ n."""
    if i.windowed:
        return [(i.s, w) for w in SWEEP_W if w <= n]
    return [(s, i.w) for s in SWEEP_S if s <= n]


def sweep(i: Inputs, c: Constants, floors: Floors, *, overlap: bool = True, top: int = 5) -> list[Plan]:
    """The `top` cheapest settings of (H, k, s or w, v, m, codec) meeting the floors, cheapest
    first (cost, then bytes a host uploads). Cheap checks (security, disk) prune before timing."""
    found: list[Plan] = []
    tolerance = i.replay is ReplayMode.TOLERANCE
    for steps in sorted({*SWEEP_H, i.H}):
        if steps > floors.max_H:
            continue
        for k in SWEEP_K:
            if steps % k or (tolerance and k > 10):
                continue
            n = steps // k
            for s, w in sample_settings(i, n):
                for v in SWEEP_V:
                    if v > i.verifiers:
                        continue
                    shaped = replace(i, H=steps, k=k, s=s, w=w, v=v)
                    if lazy_detection(shaped, i.fake_fraction) < floors.detection:
                        continue
                    if not collusion_floor_met(shaped, i.dishonest_stake, floors.collusion_success):
                        continue
                    if utilization_bound(shaped, overlap, c) < floors.utilization:
                        continue
                    for m in SWEEP_M if i.pipeline is Pipeline.SPARSE else (1,):
                        if m > n:
                            continue
                        for codec in Codec:
                            if c.codec_error.get(codec, 1.0) > floors.codec_error:
                                continue
                            cand = replace(shaped, m=m, codec=codec, phases=None)
                            if disk_bytes(cand, c) > i.disk_budget:
                                continue
                            tl = timeline(cand, c)
                            if (
                                utilization(tl.train, tl.overlapped if overlap else tl.sequential)
                                < floors.utilization
                            ):
                                continue
                            p = plan(cand, c, overlap=overlap)
                            if meets(p, floors, overlap):
                                found.append(p)
    found.sort(key=lambda p: (round(p.cost, 4), p.network["host_upload_bytes"]))
    return found[:top]


# ---------------------------------------------------------------- the planner's window


REPLAY_BUDGET = 0.25
"""Verifiers' replay ÷ the hosts' training compute that `choose_window` may spend (issue 34)."""
WALL_SLACK = 0.005
"""Windows whose overlapped period is within this of the best count as equally fast."""


@dataclass(frozen=True)
class WindowOption:
    w: int
    blocks: int
    replay_share: float
    overlapped_s: float
    recompute_segments: float
    one_segment_detection: float


@dataclass(frozen=True)
class WindowChoice:
    """The planner's w (`choose_window`) and how its checks should start."""

    w: int
    blocks: int
    replay_share: float
    budget: float
    within_budget: bool
    """False when no w keeps replay within the budget: then the least replay (w = 1) is shown."""
    overlapped_s: float
    recompute_segments: float
    """The host's recompute after the challenge at this w and the planned m (its alignment with the
    persisted boundaries moves the period more than anything else that depends on w)."""
    one_segment_detection: float
    half_fake_detection: float
    w_one_segment_floor: int | None
    """The same choice among the w that also catch a one-segment fake in ≥ 20% of outer steps
    (`ONE_SEGMENT_CAUGHT`); None when no w in the budget does."""
    start: str
    """"download" (each check fetches its block's start) or "from-0" (replays from G_n)."""
    download_check_s: float
    download_check_bytes: float
    download_segments: float
    from_zero_check_s: float | None
    """None in tolerance mode: honest noise grows over a long replay (DESIGN §2), so a tolerance
    check starts from its block's claimed start."""
    from_zero_check_bytes: float
    from_zero_segments: float
    options: list[WindowOption]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def window_options(i: Inputs, c: Constants) -> list[WindowOption]:
    """Every w of 1..n under sampling windows: its replay share and overlapped period."""
    out = []
    for w in range(1, i.n + 1):
        cand = replace(i, sampling=Sampling.WINDOWS, w=w)
        out.append(WindowOption(w, cand.blocks, replay_share(cand), timeline(cand, c).overlapped,
                                opening_recompute(cand), one_segment_detection(cand)))  # fmt: skip
    return out


def fastest_largest(options: list[WindowOption]) -> WindowOption | None:
    """Of these, the ones within 0.5% of the least overlapped period, and of those the largest w."""
    if not options:
        return None
    best = min(o.overlapped_s for o in options)
    return max((o for o in options if o.overlapped_s <= best * (1 + WALL_SLACK)), key=lambda o: o.w)


def check_seconds(i: Inputs, bytes_: float, segments: float) -> float:
    """One check, fetch then replay: its bytes at its share of the host's uplink (every check of a
    contribution fetches at once) or its own downlink, whichever is slower, then the replay."""
    rate = min(i.down, i.up / max(1.0, checks_per_contribution(i)))
    return bytes_ / rate + segments * i.k * (step_seconds(i) + step_overhead_seconds(i))


def choose_window(i: Inputs, c: Constants, budget: float = REPLAY_BUDGET) -> WindowChoice:
    """The planner's w: among w whose replay share (checks · (n/B) · k/H) fits the compute budget
    and that catch a one-segment fake in ≥ 20% of outer steps (the security floor; if none does,
    every w in the budget), those within 0.5% of the least overlapped period, and of those the
    largest w (fewest blocks: the most detection of a small fake). Then, for that w, whether a
    check is faster starting from a downloaded block start or replaying from segment 0 (no state
    download). `w_one_segment_floor` is the choice with the floor, reported beside it."""
    options = window_options(i, c)
    fit = [o for o in options if o.replay_share <= budget]
    floor = fastest_largest([o for o in fit if o.one_segment_detection >= ONE_SEGMENT_CAUGHT])
    pick = floor or fastest_largest(fit) or min(options, key=lambda o: (o.replay_share, o.overlapped_s))
    chosen = replace(i, sampling=Sampling.WINDOWS, w=pick.w)
    down_bytes = window_bytes_per_check(chosen, c)
    down_segments = replay_segments_per_check(chosen)
    down_s = check_seconds(chosen, down_bytes, down_segments)
    zero_bytes = from_zero_check_bytes(i.params, carried_ef_bytes(chosen), i.moments)
    zero_segments = from_zero_segments(chosen.n, pick.w)
    zero_s = check_seconds(chosen, zero_bytes, zero_segments) if i.replay is ReplayMode.BITWISE else None
    return WindowChoice(
        w=pick.w, blocks=pick.blocks, replay_share=pick.replay_share, budget=budget, within_budget=bool(fit),
        overlapped_s=pick.overlapped_s, recompute_segments=pick.recompute_segments,
        one_segment_detection=pick.one_segment_detection, half_fake_detection=lazy_detection(chosen, 0.5),
        w_one_segment_floor=None if floor is None else floor.w,
        start="from-0" if zero_s is not None and zero_s < down_s else "download",
        download_check_s=down_s, download_check_bytes=down_bytes, download_segments=down_segments,
        from_zero_check_s=zero_s, from_zero_check_bytes=zero_bytes, from_zero_segments=zero_segments,
        options=options,
    )  # fmt: skip
