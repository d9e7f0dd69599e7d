"""After the challenge: the opened boundaries a host did not persist (sparse checkpoints, host.toml
`checkpoint_every`) recomputed bitwise from the nearest persisted one, checked against the
committed leaves, and every other boundary deleted at once."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from nodekit.objects import Kind
from nodekit.statestore import StateStore
from nodekit.store import TensorSink
from protocol.config import ReplayMode, RunConfig
from protocol.tensors import StateKind, tensor_hash_and_digests
from replay.device import host_view
from replay.step import train_segment, training_state
from trainer.commit import CommitJob
from trainer.sharded import ShardedState


def _save_recomputed(
    store: StateStore,
    outer_step: int,
    leaves: Sequence[str],
    j: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    cfg: RunConfig,
    sharding: ShardedState | None = None,
) -> None:
    """Hash the recomputed boundary j, check it is the committed leaf, and persist it (a sharded
    rank: its part; every rank learns the hash, so all of them refuse a wrong one together)."""
    if sharding is not None:
        local = host_view(sharding.local(model, opt))
        h, digests = sharding.hash(local, StateKind.TRAINING, cfg.state_chunk_bytes)
    else:
        snap = training_state(model, opt)
        h, digests = tensor_hash_and_digests(snap, StateKind.TRAINING, cfg.state_chunk_bytes)
    if h != leaves[j]:
        raise ValueError(f"recomputed boundary {j} hashes to {h[:12]}, committed {leaves[j][:12]}")
    if sharding is not None:
        sharding.save(store.content, StateKind.TRAINING, str(outer_step), h, digests, local)
    else:
        store.put_hashed(snap, outer_step, h, digests)


def load_stored_state(
    store: StateStore, outer_step: int, leaf: str, model: nn.Module, opt: torch.optim.Optimizer
) -> None:
    """A persisted boundary read from disk straight into the model's and optimizer's own tensors
    (each chunk verified on the way, the header compared with the model's layout): no second
    training state in memory."""
    store.flush()
    live = training_state(model, opt)
    store.content.load_into(Kind.STATE, leaf, TensorSink(tensors=live), str(outer_step))
    for p in model.parameters():  # every parameter carries its own step counter
        opt.state[p]["step"].copy_(live["step"])


def needed_boundaries(
    segments: Sequence[int], mode: ReplayMode = ReplayMode.TOLERANCE, windows: Sequence[int] = ()
) -> set[int]:
    """The boundaries a host keeps after the challenge: what a verifier may fetch. Tolerance mode:
    both ends of every opened segment (claimed ends are compared). Bitwise mode: the starts,
    except segment 0's (G_n + the carried optimizer state, which verifiers rebuild); an end is
    never fetched there, the replay reproduces it (a mismatch is REPLAY_MISMATCH either way).
    Sampling windows (`windows`: each slot's start): in bitwise mode only each window's start (its
    checker replays on from it) and θ_H, the last boundary, whose parameters a dispute panel
    fetches to check Δ (a window ending at θ_H replays it; specs §6)."""
    if mode is ReplayMode.BITWISE:
        if windows:
            return {s for s in windows if s > 0} | {max(segments) + 1}
        return {s for s in segments if s > 0}
    return {j for s in segments for j in (s, s + 1)}


@dataclass(frozen=True)
class OpeningPlan:
    """What `materialize_openings` will do: recompute `missing` from the persisted `on_disk`, then
    drop `sources` that are not needed themselves. Plain data: a sharded host sends it to its ranks."""

    needed: tuple[int, ...]
    on_disk: tuple[int, ...]
    missing: tuple[int, ...]
    sources: tuple[int, ...]

    def to_json(self) -> dict[str, list[int]]:
        return {k: list(getattr(self, k)) for k in ("needed", "on_disk", "missing", "sources")}

    @classmethod
    def from_json(cls, d: Mapping[str, Sequence[int]]) -> OpeningPlan:
        return cls(*(tuple(int(x) for x in d[k]) for k in ("needed", "on_disk", "missing", "sources")))


def plan_openings(
    store: StateStore,
    outer_step: int,
    leaves: Sequence[str],
    segments: Sequence[int],
    mode: ReplayMode = ReplayMode.TOLERANCE,
    windows: Sequence[int] = (),
) -> OpeningPlan:
    """Decide what to recompute (`needed_boundaries` in the run's replay mode) and delete, at once,
    every persisted boundary that is neither needed nor the nearest source of a needed one."""
    store.flush()  # the last boundaries may still be being written
    needed = needed_boundaries(segments, mode, windows)
    on_disk = {j for j, h in enumerate(leaves) if store.has(h, outer_step)}
    missing = sorted(needed - on_disk)
    sources = {max((q for q in on_disk if q <= j), default=0) for j in missing}
    keep = {leaves[j] for j in needed | sources}  # leaves may repeat (a host that did not train)
    for h in {leaves[j] for j in on_disk} - keep:
        store.delete(h, outer_step)
    return OpeningPlan(tuple(sorted(needed)), tuple(sorted(on_disk)), tuple(missing), tuple(sorted(sources)))


def recompute_openings(
    job: CommitJob,
    plan: OpeningPlan,
    leaves: Sequence[str],
    start: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
) -> list[int]:
    """Each missing opened boundary, recomputed bitwise from the nearest persisted one below it
    (boundary 0: `start()` rebuilds it from G_n and the carried optimizer) with the same step
    function and the job that trained it, checked against its committed leaf, and saved in the
    job's store. Every rank of a sharded host runs this with the same plan (its part of every
    load, step, hash and save)."""
    store, sharding, outer_step = _store(job), job.sharding, job.outer_step
    k = job.config.segment_len
    on_disk = set(plan.on_disk)
    done: list[int] = []
    at: int | None = None  # the boundary the model currently holds
    model: nn.Module | None = None
    opt: torch.optim.Optimizer | None = None
    for j in plan.missing:
        src = max((q for q in on_disk | set(done) if q <= j), default=0)  # 0: rebuilt by `start`
        if at is None or at > j or at < src:
            model = opt = None  # the previous optimizer goes before `start` makes the next
            model, opt = start()  # boundary 0; a persisted source is read over it, in place
            if src in on_disk or src in done:
                if sharding is not None:
                    sharding.load(store.content, StateKind.TRAINING, leaves[src], str(outer_step), model, opt)
                else:
                    load_stored_state(store, outer_step, leaves[src], model, opt)
            at = src
        assert model is not None and opt is not None
        while at < j:
            train_segment(job, model, opt, at * k, k)
            at += 1
            if at in plan.needed and at not in on_disk and at not in done and at != j:
                _save_recomputed(store, outer_step, leaves, at, model, opt, job.config, sharding)
                done.append(at)
        _save_recomputed(store, outer_step, leaves, j, model, opt, job.config, sharding)
        done.append(j)
    return done


def _store(job: CommitJob) -> StateStore:
    if job.store is None:
        raise ValueError("opened boundaries are recomputed into the host's store: the job has none")
    return job.store


def drop_sources(store: StateStore, outer_step: int, leaves: Sequence[str], plan: OpeningPlan) -> None:
    """The persisted sources that were only kept to recompute from."""
    for h in {leaves[j] for j in set(plan.sources) - set(plan.needed)} - {leaves[j] for j in plan.needed}:
        store.delete(h, outer_step)


def materialize_openings(
    job: CommitJob,
    leaves: Sequence[str],
    segments: Sequence[int],
    start: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
    windows: Sequence[int] = (),
) -> list[int]:
    """After the challenge: every boundary a verifier may fetch in the job's store
    (`needed_boundaries`), nothing else.

    Persisted boundaries that are neither opened nor the nearest source of an opened one go at
    once; each missing opened boundary is recomputed (`recompute_openings`); then the sources go.
    Returns the boundaries that were recomputed. Raises `ValueError` if a recomputed state does
    not hash to its leaf (the host could not reproduce its own trajectory).
    """
    store = _store(job)
    plan = plan_openings(store, job.outer_step, leaves, segments, job.config.replay_mode, windows)
    done = recompute_openings(job, plan, leaves, start)
    drop_sources(store, job.outer_step, leaves, plan)
    return done
