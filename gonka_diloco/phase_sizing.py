"""Phase sizing from measured compute (issue 16): a train phase as long as the work, no longer.

The chain closes the train phase at a fixed height (`commit_deadline = open + train_blocks`), so
a phase longer than the training leaves every host idle until the deadline, and a shorter one
makes hosts miss it. The train phase is therefore derived from the seconds one inner step takes,
declared by the run's creator or measured here by timing a few inner steps of the run's own model:

    train_blocks = ⌈(H · t_step · margin + slack_seconds) / block_seconds⌉ + COMMIT_SLACK_BLOCKS

`margin` covers step-time noise and the boundary hashing that shares the host (≈ 2% measured by
`bench.host_overhead`); the slack blocks cover seeing the step open and the commit's inclusion.
With `overlap = "eager"` the train phase is also the period in which the previous step must be
verified and aggregated (`gonka-diloco plan` says whether it fits: its `phases` row and warnings):
the overlapped period is `T + 1` blocks only when the post-training blocks `D ≤ T + 1`
(specs/protocol.md §2.2.1), else `(T + 1 + D) / 2` and hosts wait for the next step to open.

The margin should cover the noise actually measured, not a guess: `noise_margin` turns repeated
timings of the same work under the contention it will see into the factor that covers their
spread (the slowest sample seen, and three standard deviations above the median).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

COMMIT_SLACK_BLOCKS = 2
"""One block to see the step open (hosts poll the chain), one for the commit tx's inclusion."""
DEFAULT_MARGIN = 1.5
"""Step time × 1.5: tens of percent of noise on a shared machine, the boundary hashing beside it."""


NOISE_SIGMAS = 3.0
"""`noise_margin`: the phase covers the median plus this many standard deviations of the samples."""
MIN_MARGIN = 1.05
"""`noise_margin` never goes below this: a handful of samples can look quieter than the run is."""
POST_TRAIN_EXTRA_BLOCKS = 2
"""Blocks of a step's post-training span besides reveal, verify and result: the challenge block
after the commit deadline and the finalizing block (D = reveal + verify + result + 2 when no
escalation, audit or second result round is needed; measured by `bench.overlap`)."""


class PhaseSizingError(ValueError):
    """The inputs cannot size a phase (a non-positive time, step count or margin)."""


def train_phase_seconds(
    inner_steps: int, step_seconds: float, *, margin: float = DEFAULT_MARGIN, slack_seconds: float = 0.0
) -> float:
    """Seconds of training to cover: H · t_step · margin + slack (before rounding to blocks)."""
    if inner_steps < 1:
        raise PhaseSizingError(f"inner_steps must be >= 1, got {inner_steps}")
    if not step_seconds > 0 or not math.isfinite(step_seconds):
        raise PhaseSizingError(f"step seconds must be a positive number, got {step_seconds}")
    if margin < 1:
        raise PhaseSizingError(f"margin must be >= 1 (a phase shorter than the work is missed), got {margin}")
    if slack_seconds < 0:
        raise PhaseSizingError(f"slack seconds must be >= 0, got {slack_seconds}")
    return inner_steps * step_seconds * margin + slack_seconds


def train_phase_blocks(
    inner_steps: int,
    step_seconds: float,
    block_seconds: float,
    *,
    margin: float = DEFAULT_MARGIN,
    slack_seconds: float = 0.0,
    slack_blocks: int = COMMIT_SLACK_BLOCKS,
) -> int:
    """Train-phase blocks for H inner steps of `step_seconds` each (the formula above)."""
    if not block_seconds > 0 or not math.isfinite(block_seconds):
        raise PhaseSizingError(f"block seconds must be a positive number, got {block_seconds}")
    if slack_blocks < 0:
        raise PhaseSizingError(f"slack blocks must be >= 0, got {slack_blocks}")
    seconds = train_phase_seconds(inner_steps, step_seconds, margin=margin, slack_seconds=slack_seconds)
    return max(1, math.ceil(seconds / block_seconds)) + slack_blocks


MEASURE_STEPS = 5
"""Inner steps timed by `run create --measure` and the devnet: their median sizes the phase, their
spread its margin (`noise_margin`)."""


def measure_step_seconds(cfg: Any, *, steps: int = 3, warmup: int = 1, device: str = "cpu") -> float:
    """Median seconds of one inner step of `cfg`'s model (`measure_step_samples`)."""
    return statistics.median(measure_step_samples(cfg, steps=steps, warmup=warmup, device=device))


def measure_step_samples(
    cfg: Any, *, steps: int = MEASURE_STEPS, warmup: int = 1, device: str = "cpu"
) -> list[float]:
    """Seconds of each of `steps` inner steps of `cfg`'s model (a `RunConfig`) on this machine: its
    optimizer, batch shape, numerics and thread count, random tokens (the time does not depend on
    them). The first `warmup` steps (allocation, lazy init) are not counted; each step ends with
    its loss read back, so a GPU step is timed to completion."""
    import torch

    from replay.data import model_vocab
    from replay.spec import build_model
    from replay.step import make_optimizer, train_steps

    if steps < 1 or warmup < 0:
        raise PhaseSizingError(f"measure at least one step (got steps={steps}, warmup={warmup})")
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        model = build_model(cfg.model).to(device)
        opt = make_optimizer(model, cfg.inner)
        g = torch.Generator().manual_seed(0)
        vocab = model_vocab(cfg) or 256
        seconds = []
        for i in range(warmup + steps):
            x = torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len), generator=g)
            y = torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len), generator=g)
            t0 = time.perf_counter()
            train_steps(model, opt, cfg.inner, cfg.numerics, [(x, y)])
            if i >= warmup:
                seconds.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return seconds


def sizing_margin(margin: float, samples: list[float]) -> float:
    """The margin a phase gets: the configured one, or the measured noise where that is larger (one
    sample measures no noise: the configured margin). Lateness is not fraud: a window sized below
    the jitter it will meet makes honest hosts late."""
    return max(margin, noise_margin(samples)) if len(samples) > 1 else margin


def noise_margin(samples: list[float], *, sigmas: float = NOISE_SIGMAS, floor: float = MIN_MARGIN) -> float:
    """The factor over the median of `samples` (repeated timings of the same work under the same
    contention) that covers their measured noise: the larger of the slowest sample ÷ median and
    1 + `sigmas` standard deviations ÷ median, at least `floor`. One sample measures no noise: an
    error (time the work at least twice)."""
    if len(samples) < 2:
        raise PhaseSizingError(
            f"the noise of one sample is unknown: time the work at least twice (got {len(samples)})"
        )
    if not all(x > 0 and math.isfinite(x) for x in samples):
        raise PhaseSizingError(f"timings must be positive numbers, got {samples}")
    if floor < 1:
        raise PhaseSizingError(f"the margin floor must be >= 1, got {floor}")
    median = statistics.median(samples)
    return max(floor, max(samples) / median, 1 + sigmas * statistics.stdev(samples) / median)


def post_training_blocks(reveal: int, verify: int, result: int) -> int:
    """D: blocks from a step's commit deadline to its close when nothing escalates (the spec's D)."""
    if min(reveal, verify, result) < 1:
        raise PhaseSizingError(
            f"phases are at least one block, got reveal={reveal} verify={verify} result={result}"
        )
    return reveal + verify + result + POST_TRAIN_EXTRA_BLOCKS


def overlapped_period_blocks(train: int, post: int) -> float:
    """Blocks per outer step of an overlapped run with `train` = T and `post` = D (§2.2.1): T + 1
    when the post-training phases fit in the next train phase (D ≤ T + 1), else (T + 1 + D) / 2 —
    every other step then waits for its predecessor's predecessor to close."""
    if train < 1 or post < 0:
        raise PhaseSizingError(f"train must be >= 1 block and post >= 0, got {train}, {post}")
    return float(train + 1) if post <= train + 1 else (train + 1 + post) / 2
