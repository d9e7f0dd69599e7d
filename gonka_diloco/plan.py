"""The cost model of a run: time, bytes, disk, memory, detection and deterrence per outer step.

Every formula is one small pure function here, named in `specs/protocol.md` §9 ("Cost model"),
so `gonka-diloco plan`, its `--sweep` and the validation benchmark (`bench.plan`) all compute
the same thing. No I/O and no torch: machine constants come in as a `Constants` value
(`gonka_diloco.plan_constants` reads them from `bench/results/*.json`).

Units: bytes, seconds, FLOP/s, bytes per second; stakes and rewards in GNK.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from typing import Any

from chain.params import BLOCK_SECONDS, BPS_DENOMINATOR
from protocol.config import Codec, ReplayMode, RunConfig, Stake
from protocol.inner import GRAD_BYTES_PER_PARAM, OPTIMIZER_BYTES_PER_PARAM, STATE_BYTES_PER_PARAM

# ---------------------------------------------------------------- fixed facts

NGONKA_PER_GNK = 1e9


def run_default(name: str) -> Any:
    """A `RunConfig` field's default: the planner's run and security defaults are the chain's own
    (one source), so `plan` with no flags describes the run `run create` makes of a bare config."""
    return RunConfig.model_fields[name].default


STAKE = Stake()
RUN_CODEC: Codec = run_default("codec")
RUN_REPLAY: ReplayMode = run_default("replay_mode")

FLOPS_PER_PARAM_TOKEN = 6
"""Forward + backward of a dense transformer: ≈ 6 FLOP per parameter per token (Kaplan et al. 2020)."""
GLOBAL_BYTES_PER_PARAM = 8
"""G_n: fp32 parameters + fp32 outer Nesterov momentum (the inner state's sizes: `protocol.inner`)."""
FP32_DELTA_BYTES_PER_PARAM = 4
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
    v: int = run_default("verifiers_per_contribution")
    m: int = 10
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
                           ("replay", ReplayMode)):  # fmt: skip
            object.__setattr__(self, name, kind(getattr(self, name)))

    @property
    def n(self) -> int:
        """Segments per outer step, H/k."""
        return self.H // self.k

    @property
    def verifiers(self) -> int:
        return self.verifier_nodes if self.verifier_nodes is not None else self.hosts


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


def state_bytes(params: float) -> float:
    return STATE_BYTES_PER_PARAM * params


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


def leaf_hash_seconds(params: float, cores: int, chunk_bytes: float, c: Constants) -> float:
    """One boundary leaf: 12·P bytes in chunks over min(cores, chunks) threads (per rank, each
    rank its own shard, so a host's cores work together)."""
    size = state_bytes(params)
    threads = max(1, min(cores, math.ceil(size / chunk_bytes)))
    return size / (threads * c.sha256_bytes_per_s * c.hash_efficiency)


def snapshot_seconds(params: float, gpus: int, pcie: float) -> float:
    """Device → host copy of one boundary state, all ranks in parallel (each its 12·P/G shard)."""
    return state_bytes(params) / (gpus * pcie)


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


def disk_states(i: Inputs) -> float:
    """States a host holds at its peak in one outer step.

    today: all n + 1 boundaries, kept until the step is DONE, plus G_n and G_{n+1} and two
    optimizer states (8·P each, counted as 2/3 state) and the Δ.
    sparse: ⌈n/m⌉ persisted + s recomputed openings + 3 (live snapshot, G_n, optimizer) — the
    scale pipeline's bound H/(k·m) + s + 3.
    """
    if i.pipeline is Pipeline.TODAY:
        return i.n + 1 + 4 * GLOBAL_BYTES_PER_PARAM / STATE_BYTES_PER_PARAM
    return math.ceil(i.n / i.m) + i.s + 3


def disk_bytes(i: Inputs, c: Constants) -> float:
    extra = run_delta_bytes(i, c) if i.pipeline is Pipeline.TODAY else 0.0
    return disk_states(i) * state_bytes(i.params) + extra


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


def verifier_bytes_per_contribution(i: Inputs, c: Constants) -> float:
    """What one verifier downloads to judge one contribution.

    today: s start states + Δ. sparse: s − 1 start states (segment 0's is rebuilt from G_n) +
    the previous optimizer state + Δ only in tolerance mode (bitwise derives Δ from the replay).
    Codec sparse adds the host's carried error-feedback accumulator (4·P: the verifier rebuilds
    C(β·e + Δ) from it).
    """
    S = state_bytes(i.params)
    d = run_delta_bytes(i, c)
    if i.pipeline is Pipeline.TODAY:
        return i.s * S + d
    opt = OPTIMIZER_BYTES_PER_PARAM * i.params
    if i.codec is Codec.SPARSE:
        opt += EF_BYTES_PER_PARAM * i.params
    return (i.s - 1) * S + opt + (d if i.replay is ReplayMode.TOLERANCE else 0.0)


def checks_per_contribution(i: Inputs) -> float:
    """Verifier downloads and replays per contribution: v drawn + p·auditors on average."""
    return i.v + i.audit_p * i.auditors


def contributions_per_verifier(i: Inputs) -> float:
    """Mean load of one verifier per outer step (draws are stake-weighted: equal stakes here)."""
    return i.hosts * checks_per_contribution(i) / i.verifiers


def host_upload_bytes(i: Inputs, c: Constants) -> dict[str, float]:
    """Per host per outer step: its openings to every checker, and its Δ to whoever aggregates.

    today the author serves its Δ to the other A − 1 hosts and to every verifier (each computes
    G_{n+1} itself). sparse: multi-source fetching spreads serving, so a host uploads about what
    it downloads, (A − 1)·Δ.
    """
    d = run_delta_bytes(i, c)
    openings = checks_per_contribution(i) * verifier_bytes_per_contribution(i, c)
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

    Downloads are bounded by the host's upload (it serves each of its checkers) and by the
    verifier's download (it fetches all its contributions); replay is s·k inner steps each on
    the verifier's own GPUs; fetch and replay pipeline across contributions.
    """
    per = verifier_bytes_per_contribution(i, c)
    load = max(1.0, contributions_per_verifier(i))
    data = max(checks_per_contribution(i) * per / i.up, load * per / i.down)
    replay = i.s * i.k * t_step
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
    hash_s = leaf_hash_seconds(i.params, i.cpu_cores, i.chunk_bytes, c)
    persist_every = 1 if i.pipeline is Pipeline.TODAY else i.m
    persisted = math.ceil(n / persist_every)
    write_s = state_bytes(i.params) / i.disk_write
    stall = (
        i.H * step_overhead_seconds(i)
        + n * boundary_stall(snapshot_seconds(i.params, i.gpus_per_host, i.pcie), t)
        + (n - persisted) * boundary_stall(hash_s, seg)
        + persisted * boundary_stall(max(hash_s, write_s), seg)
    )
    recompute = 0.0 if i.pipeline is Pipeline.TODAY else recompute_segments(n, i.s, i.m) * seg
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
    learns better per outer step: RESULTS §1t), the sparse codec past that host count (its Δ is
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
    the verifiers' replays (checks × s·k/H of a host's compute)."""
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
    codec: dict[str, Any] = field(default_factory=dict)
    """`codec_advice`: the codec this host count should run, and where each stops fitting."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def plan(i: Inputs, c: Constants, *, overlap: bool = True) -> Plan:
    """Every figure of one setting. `overlap` picks which schedule `cost` is judged on."""
    t = step_seconds(i)
    t_gpu = t + step_overhead_seconds(i)
    tl = timeline(i, c)
    S, d = state_bytes(i.params), run_delta_bytes(i, c)
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
    replay_share = checks_per_contribution(i) * i.s * i.k / i.H * t_gpu / t
    cost = run_cost(util["overlapped" if overlap else "sequential"], replay_share)

    det = detection_probability(i.n, faked_segments(i.n, i.fake_fraction), i.s)
    slash = i.host_stake * i.host_slash_bps / 10_000
    audit_slash = i.host_stake * i.audit_slash_bps / 10_000
    lazy = cheat_outcome(0.0, i.v, i.audit_p, i.auditors, det)
    coll = cheat_outcome(i.dishonest_stake, i.v, i.audit_p, i.auditors, 1.0)
    lazy_gain = cheat_gain(i, i.fake_fraction, tl.train)
    coll_gain = cheat_gain(i, 1.0, tl.train)
    mem = gpu_memory(i)
    hash_s = leaf_hash_seconds(i.params, i.cpu_cores, i.chunk_bytes, c)
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
        share = advice["share"][Codec.INT8.value]
        why = (f"int8's aggregation is {share:.0%} of training (half of it from {limit} hosts)"
               if advice["recommended"] == Codec.SPARSE.value else
               "int8's aggregation fits and it learns better per outer step (RESULTS §1t)")  # fmt: skip
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
            "contributions_per_verifier": contributions_per_verifier(i),
            "fetch_s": ver["data"],
            "replay_s": ver["replay"],
            "window_s": ver["total"],
            "replay_share": replay_share,
        },
        hashing={
            "leaf_s": hash_s,
            "segment_compute_s": i.k * t_gpu,
            "snapshot_s": snapshot_seconds(i.params, i.gpus_per_host, i.pcie),
            "stall_s": tl.stall,
            "host_ram_bytes": S,
        },
        disk={
            "states": disk_states(i),
            "bytes": disk_bytes(i, c),
            "recompute_segments": 0.0 if i.pipeline is Pipeline.TODAY else recompute_segments(i.n, i.s, i.m),
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
            "detection_naive": naive_detection(i.fake_fraction, i.s),
            "lazy_success": lazy.success,
            "lazy_gain": lazy_gain,
            "lazy_profit": expected_profit(lazy, lazy_gain, slash, audit_slash),
            "lazy_min_slash": min_deterrent_slash(lazy, lazy_gain),
            "collusion_success": coll.success,
            "collusion_gain": coll_gain,
            "collusion_profit": expected_profit(coll, coll_gain, slash, audit_slash),
            "collusion_min_slash": min_deterrent_slash(coll, coll_gain),
            "slash": slash,
            "audit_slash": audit_slash,
        },
        chain={"messages": msgs, "chain_s": msgs * c.chain_ms_per_msg / 1000},
        phases=asdict(recommended_phases(tl, i.block_seconds)),
        cost=cost,
        warnings=warnings,
        codec=advice,
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
    deterrence: bool = True
    """Both the lazy host's and the colluder's expected profit must be negative."""
    max_H: int = 500
    """The longest outer step the sweep considers (DiLoCo's H = 500; convergence is not modelled)."""
    codec_error: float = 0.01
    """Largest relative Δ error of a codec the sweep may pick (int4's 9% is excluded by default)."""


SWEEP_H = (100, 200, 250, 500, 1000)
SWEEP_K = (1, 2, 5, 10, 20, 25, 50)
SWEEP_S = tuple(range(1, 17))
SWEEP_V = (1, 2, 3, 4, 5)
SWEEP_M = (1, 2, 5, 10, 20, 50)


def meets(p: Plan, floors: Floors, overlap: bool) -> bool:
    sec = p.security
    util = p.utilization["overlapped" if overlap else "sequential"]
    return (
        not p.warnings
        and util >= floors.utilization
        and sec["detection"] >= floors.detection
        and sec["collusion_success"] <= floors.collusion_success
        and (not floors.deterrence or (sec["lazy_profit"] < 0 and sec["collusion_profit"] < 0))
    )


def utilization_bound(i: Inputs, overlap: bool) -> float:
    """An upper bound on utilization whatever m and the codec: the host's upload of its opened
    states alone (no Δ, no recompute, no stalls) already follows training."""
    S, P = state_bytes(i.params), i.params
    states = i.s * S if i.pipeline is Pipeline.TODAY else (i.s - 1) * S + OPTIMIZER_BYTES_PER_PARAM * P
    data = checks_per_contribution(i) * states / i.up
    train = i.H * step_seconds(i)
    return train / (max(train, data) if overlap else train + data)


def sweep(i: Inputs, c: Constants, floors: Floors, *, overlap: bool = True, top: int = 5) -> list[Plan]:
    """The `top` cheapest settings of (H, k, s, v, m, codec) meeting the floors, cheapest first
    (cost, then bytes a host uploads). Cheap checks (security, disk) prune before timing."""
    found: list[Plan] = []
    tolerance = i.replay is ReplayMode.TOLERANCE
    for steps in sorted({*SWEEP_H, i.H}):
        if steps > floors.max_H:
            continue
        for k in SWEEP_K:
            if steps % k or (tolerance and k > 10):
                continue
            n = steps // k
            for s in SWEEP_S:
                if (
                    s > n
                    or detection_probability(n, faked_segments(n, i.fake_fraction), s) < floors.detection
                ):
                    continue
                for v in SWEEP_V:
                    if v > i.verifiers:
                        continue
                    coll = cheat_outcome(i.dishonest_stake, v, i.audit_p, i.auditors, 1.0)
                    if coll.success > floors.collusion_success:
                        continue
                    if utilization_bound(replace(i, H=steps, k=k, s=s, v=v), overlap) < floors.utilization:
                        continue
                    for m in SWEEP_M if i.pipeline is Pipeline.SPARSE else (1,):
                        if m > n:
                            continue
                        for codec in Codec:
                            if c.codec_error.get(codec, 1.0) > floors.codec_error:
                                continue
                            cand = replace(i, H=steps, k=k, s=s, v=v, m=m, codec=codec, phases=None)
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
