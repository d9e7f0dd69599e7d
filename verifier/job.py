"""What one verification is about: the job read from the chain, where its data comes from (the
source protocols the node implements over HTTP and tests over a dict), what replay needs besides
it, and what it concludes. The checks themselves are `verifier.verify` and `verifier.delta`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor, nn

from protocol.config import ReplayMode, RunConfig
from protocol.errorfeedback import ef_hash
from protocol.messages import EnvFingerprint, Reason
from replay.data import Corpus
from replay.step import LossFn, State, make_optimizer, training_state


class MissingData(Exception):
    """A revealed blob could not be fetched (unreachable host, 404 after the reveal deadline)."""


class MalformedBlob(Exception):
    """A fetched blob is too large, does not decode, or does not hash to what was asked for."""


class CannotVerify(Exception):
    """This verifier cannot judge the contribution (e.g. its environment differs in bitwise mode).

    Not the host's fault: the node abstains instead of rejecting honest work.
    """


class BlobSource(Protocol):
    """Where revealed data comes from. Implementations verify hashes and bound sizes."""

    def state(self, leaf_hash: str) -> State:
        """The training state whose `training_hash` is `leaf_hash`."""
        ...

    def delta(self, delta_hash: str) -> bytes:
        """The Δ payload whose chunked hash is `delta_hash` (the committed one in tolerance mode; in
        an eager run the parent Δ a start is built on)."""
        ...


class OptimizerSource(Protocol):
    """A `BlobSource` that can also give a host's carried optimizer state by its chain hash, so
    segment 0's start is rebuilt from G_n instead of downloaded (optional: without it, the start
    state is fetched)."""

    def optimizer(self, optimizer_hash: str) -> State:
        """The optimizer state (moments + step) whose OPTIMIZER hash is `optimizer_hash`."""
        ...


class ParamsSource(Protocol):
    """A `BlobSource` that can also give θ alone of a training state (the chunks holding its
    `param/*` tensors, each checked): what a checker whose window does not end at θ_H needs to
    check Δ (optional: without it the whole state is fetched)."""

    def params(self, leaf_hash: str) -> State:
        """The `param/*` tensors of the training state whose `training_hash` is `leaf_hash`."""
        ...


class ErrorFeedbackSource(Protocol):
    """A `BlobSource` that can also give a host's carried error-feedback accumulator by its chain
    hash (codec sparse, specs §4.1): needed to rebuild C(β·e + Δ) and e_next."""

    def error_feedback(self, ef_hash: str) -> Mapping[str, Tensor]:
        """The accumulator (the model's parameter names, float32) whose hash is `ef_hash`."""
        ...


class EFSink(Protocol):
    """Where a verification writes the e_next it rebuilds (the node: its store, served on)."""

    def write(self, name: str, t: Tensor) -> None: ...

    def finish(self) -> str:
        """The hash of what was written (it is kept)."""
        ...

    def abort(self) -> None: ...


class MemoryEF:
    """An `EFSink` in memory (tests, and nodes without a store): hashed with `ef_hash`."""

    def __init__(self, layout: Mapping[str, tuple[int, ...]], chunk_bytes: int) -> None:
        self.tensors: dict[str, Tensor] = {}
        self.chunk_bytes = chunk_bytes

    def write(self, name: str, t: Tensor) -> None:
        self.tensors[name] = t

    def finish(self) -> str:
        return ef_hash(self.tensors, self.chunk_bytes)

    def abort(self) -> None:
        self.tensors = {}


@dataclass(frozen=True)
class OpeningData:
    """One revealed segment; `proof` is None when only the chain (which checked it) had it."""

    segment: int
    start_leaf: str
    end_leaf: str
    proof: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Job:
    """Everything public about one assigned contribution, read from the chain."""

    run_id: int
    outer_step: int
    host: str
    cfg: RunConfig
    trajectory_root: str
    leaf_count: int
    delta_hash: str
    final_optimizer_hash: str
    tokens: int
    env: EnvFingerprint
    sampled: tuple[int, ...]
    openings: tuple[OpeningData, ...]
    prev_optimizer_hash: str | None  # None: the host's first accepted outer step, start fresh
    parent_delta_hash: str | None = None
    """Eager runs (specs §2.2.1): the host's step n − 1 Δ its start is built on (the chain's
    `start_state`); segment 0 starts from Nesterov(G_{n−1}, decoded parent Δ), not G_{n−1}."""
    final_ef_hash: str | None = None
    """Codec sparse (specs §4.1): the committed hash of the host's e_next."""
    start_ef_hash: str | None = None
    """Codec sparse: the accumulator the chain names for the host's start (None: zeros)."""
    window: tuple[int, ...] | None = None
    """The segments this verifier replays (sampling windows: its slot's window, or a dispute
    panel's disputed windows, specs §2.3, §2.5.3); None: every opened segment (sampling segments).
    Only a check that ends at θ_H checks Δ against it (`checks_delta`)."""

    delta_first: bool = False
    """A dispute panel member's check (windows): Δ first, then the disputed windows, so its verdict
    answers the Δ question whatever it finds in them (specs §2.5.3)."""

    @property
    def checks_delta(self) -> bool:
        """Does this check compare Δ with θ_H? Sampling segments (n − 1 is always opened), a dispute
        panel member (Δ first, from θ_H's committed leaf) and a window that replays segment n − 1
        (`RunConfig.window_reaches_end`). A window ending short of θ_H does not: a host faking Δ
        would commit a θ_H to match, which only the replay of segment n − 1 catches (specs §6)."""
        return self.window is None or self.delta_first or self.cfg.n_segments - 1 in self.replays

    @property
    def replays(self) -> list[int]:
        """The segments replayed: every opened one (sampling segments), or `window_replays`."""
        return sorted(self.sampled) if self.window is None else window_replays(self.cfg, self.window)


def window_replays(cfg: RunConfig, window: Sequence[int]) -> list[int]:
    """What a check of a window replays: the window — in tolerance mode, where the last block is
    segment n − 1 alone (`RunConfig.lone_last`), a window ending where it begins replays on into it
    (always opened), so its residual is summed with that window's in one contiguous run (specs §6.4):
    a lone last window would otherwise hold θ_H's boundary to the per-segment bound only."""
    segs, last = set(window), cfg.n_segments - 1
    if cfg.replay_mode is ReplayMode.TOLERANCE and cfg.lone_last and last - 1 in segs:
        segs.add(last)
    return sorted(segs)


@dataclass
class ReplayContext:
    """What replay needs besides the job: the model, its loss, the corpus and G_n's params."""

    model: nn.Module
    loss_fn: LossFn
    data: Corpus
    global_params: Mapping[str, Tensor]  # G_n, keyed by the model's parameter names
    on_replay_steps: Callable[[int], None] = field(default=lambda n: None)
    on_derived: Callable[[State | None, bytes], None] | None = None
    """All checks passed: the host's final state when this check replayed the last segment
    (bitwise mode: our replay, bit for bit; tolerance mode: the claimed end state, checked; None
    otherwise) and the Δ payload (derived from θ_H; in tolerance mode the downloaded one, equal to
    it). The node keeps both: the optimizer state is the host's next start (no fetch next time, and
    others rebuild segment 0 from it) and the Δ is served to everyone who aggregates, so neither
    depends on the author staying online."""
    opt: torch.optim.Optimizer | None = field(default=None, repr=False)
    """The replay optimizer, made once: starts are written into it and the model in place."""
    global_momentum: Mapping[str, Tensor] | None = None
    """G_n's outer momentum: needed only for a job with a parent Δ (the eager start)."""
    ef_sink: Callable[[Mapping[str, tuple[int, ...]]], EFSink] | None = None
    """Codec sparse: where the rebuilt e_next goes (None: `MemoryEF`); kept only if it hashes to
    the committed one."""

    def live(self, job: Job) -> State:
        """The replay model's and optimizer's own tensors as a training state (no copies)."""
        if self.opt is None:
            self.opt = make_optimizer(self.model, job.cfg.inner)
        return training_state(self.model, self.opt)


@dataclass(frozen=True)
class Judgement:
    """A verdict before it is signed: reason, human detail, and the hash that binds our replay."""

    reason: Reason
    detail: str
    evidence_hash: str
    replayed_leaves: tuple[str, ...] = ()
    replay_steps: int = 0
    replay_seconds: float = 0.0

    @property
    def accept(self) -> bool:
        return self.reason is Reason.ACCEPT


class Rejected(Exception):
    """A check failed: the host's fault, with its reason code (a verdict, not an error)."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
