"""An in-process bench for host behaviours against the verifier's checks, no chain, no network.

A host (honest or adversarial) trains a real outer step through its `HostBehaviour` hooks, its
states land in a real `StateStore`, and a `LabSource` serves them through the behaviour's
`serve_blob` hook exactly as the HTTP server would, parsing with the same bounded decoders. The
tests and `bench.detection` use it to ask one question many times: does `verifier.verify` give
the expected verdict?
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nodekit.globalmodel import GlobalModel
from nodekit.statestore import StateStore, state_from_bytes
from nodekit.store import StoreError
from protocol import codecs
from protocol.config import ModelSpec, RunConfig, tolerance_moments
from protocol.prf import draw_windows, sample_segments, windows_opened
from replay.data import Corpus
from replay.spec import build
from replay.step import State, load_training_state, make_optimizer, optimizer_hash, training_state
from trainer.behaviour import HostBehaviour, OuterContext
from trainer.commit import TrainedStep, openings
from verifier.job import Job, MalformedBlob, MissingData, OpeningData, ReplayContext

TINY_GPT = ModelSpec(
    factory="trainer.model:small_gpt",
    config={"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 32, "seed": 0},
)


def tiny_config(**kw: Any) -> RunConfig:
    """A run small enough to train and replay many times a second on one CPU thread. A tolerance
    run gets float32 moments unless `kw` names them (`protocol.config.tolerance_moments`)."""
    base: dict[str, Any] = dict(
        model=TINY_GPT, dataset_manifest_hash="0" * 64, initial_model_hash="0" * 64,
        batch_size=4, seq_len=32, inner_steps=12, segment_len=2, sampled_segments=2, data_shards=2,
    )  # fmt: skip
    return RunConfig(**tolerance_moments({**base, **kw}))


def synthetic_corpus(n: int = 40_000, seed: int = 0) -> Corpus:
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(97, 123, (n,), generator=g).to(torch.uint8)
    return Corpus(text, text[: n // 10].clone(), "synthetic")


class LabSource:
    """A `BlobSource` over a host's store and Δ blob, passed through its `serve_blob` hook."""

    def __init__(self, store: StateStore, delta_blobs: Mapping[str, bytes], behaviour: HostBehaviour) -> None:
        self.store, self.delta_blobs, self.behaviour = store, delta_blobs, behaviour
        self.bytes_served = 0

    def state(self, leaf_hash: str) -> State:
        try:
            data: bytes | None = self.store.get_bytes(leaf_hash)
        except StoreError:
            data = None
        data = None if data is None else self.behaviour.serve_blob("state", leaf_hash, data)
        if data is None:
            raise MissingData(f"state {leaf_hash[:12]} not served")
        self.bytes_served += len(data)
        try:
            return state_from_bytes(data, leaf_hash, chunk_bytes=self.store.chunk_bytes)
        except StoreError as e:
            raise MalformedBlob(f"state {leaf_hash[:12]}: {e}") from e

    def delta(self, delta_hash: str) -> bytes:
        blob = self.delta_blobs.get(delta_hash)
        blob = None if blob is None else self.behaviour.serve_blob("delta", delta_hash, blob)
        if blob is None:
            raise MissingData(f"Δ {delta_hash[:12]} not served")
        self.bytes_served += len(blob)
        return blob


@dataclass
class HostRun:
    """One host's outer step as the verifier will see it."""

    address: str
    behaviour: HostBehaviour
    contribution: TrainedStep
    store: StateStore
    delta_blobs: dict[str, bytes]
    prev_optimizer_hash: str | None
    final_state: State = field(repr=False)

    def source(self) -> LabSource:
        return LabSource(self.store, self.delta_blobs, self.behaviour)


@dataclass
class Lab:
    cfg: RunConfig
    data: Corpus
    root: Path
    run_id: int = 1

    def build(self) -> tuple[torch.nn.Module, Any]:
        built = build(self.cfg.model)
        return built.module, built.loss_fn

    def train(
        self,
        behaviour: HostBehaviour,
        address: str,
        outer_step: int,
        gm: GlobalModel,
        carried: State | None = None,
        prev_optimizer_hash: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> HostRun:
        """One outer step of `behaviour` from G_n with the carried optimizer state (None = fresh)."""
        model, loss_fn = self.build()
        opt = make_optimizer(model, self.cfg.inner)
        if carried is not None:
            load_training_state(model, opt, carried)
        store = StateStore(
            self._fresh_dir(f"{address[-8:]}-{behaviour.name}-{outer_step}"),
            chunk_bytes=self.cfg.state_chunk_bytes,
        )
        ctx = OuterContext(
            cfg=self.cfg, run_id=self.run_id, address=address, outer_step=outer_step, global_model=gm,
            model=model, optimizer=opt, loss_fn=loss_fn, data=self.data, store=store,
            blobs=None, chain=None, extra=dict(extra or {}),  # type: ignore[arg-type]
        )  # fmt: skip
        c = behaviour.make_contribution(ctx)
        # hand-made trajectories save every boundary; a bitwise-mode host does not persist θ_H,
        # which is then the model's live state
        stored = store.has(c.leaves[-1])
        final = store.get(c.leaves[-1]) if stored else training_state(model, opt, copy=True)
        blobs = {c.delta_hash: c.payload}  # nodes serve the committed payload itself
        return HostRun(address, behaviour, c, store, blobs, prev_optimizer_hash, final)

    def _fresh_dir(self, name: str) -> Path:
        """A folder under `root` that no other run wrote: runs sharing one would serve each other's
        states (a bitwise host, which keeps no θ_H, would serve the θ_H a tolerance host with the
        same trajectory left there; tests passed or failed by what ran before them)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for i in itertools.count():
            path = self.root / (name if i == 0 else f"{name}-{i}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return path
        raise AssertionError("unreachable")

    def job(
        self,
        run: HostRun,
        outer_step: int,
        challenge: str,
        *,
        revealed: bool = True,
        with_proofs: bool = True,
        sampled: Sequence[int] | None = None,
        window: Sequence[int] | None = None,
    ) -> Job:
        """The verifier's view: commitment fields, the challenged segments and what was opened.
        `window` (sampling windows): the segments this checker replays; what is opened is then
        every window the challenge drew (`sampled`, else the config's slots) and the last segment."""
        c = run.contribution
        n = self.cfg.n_segments
        if sampled is not None:
            segs = list(sampled)
        elif window is not None:
            starts = draw_windows(challenge, run.address, n, self.cfg.window_len, self.cfg.checker_slots)
            segs = windows_opened([*starts, *window], n, self.cfg.window_len)
        else:
            segs = sample_segments(challenge, run.address, n, self.cfg.sampled_segments)
        opened = []
        if revealed:
            for o in openings(c, segs):
                proof = tuple(o.proof) if with_proofs else None
                opened.append(OpeningData(o.segment, o.start_leaf, o.end_leaf, proof))
        return Job(
            run_id=self.run_id, outer_step=outer_step, host=run.address, cfg=self.cfg,
            trajectory_root=c.trajectory_root, leaf_count=c.leaf_count, delta_hash=c.delta_hash,
            final_optimizer_hash=c.final_optimizer_hash, tokens=c.tokens, env=c.env,
            sampled=tuple(segs), openings=tuple(opened), prev_optimizer_hash=run.prev_optimizer_hash,
            window=None if window is None else tuple(window),
        )  # fmt: skip

    def replay_context(self, gm: GlobalModel) -> ReplayContext:
        model, loss_fn = self.build()
        return ReplayContext(model=model, loss_fn=loss_fn, data=self.data, global_params=gm.params)


def next_global(gm: GlobalModel, runs: Sequence[HostRun], cfg: RunConfig) -> GlobalModel:
    """G_{n+1} from the given (accepted) runs, via the one outer step everyone uses."""
    deltas = [
        (r.address, r.contribution.tokens, codecs.decode(r.contribution.payload, gm.layout)) for r in runs
    ]
    return gm.apply(deltas, cfg.outer)


def carried_optimizer(run: HostRun) -> tuple[State, str]:
    """What the host carries into its next outer step and the hash the chain then expects."""
    return run.final_state, optimizer_hash(run.final_state)
