"""The host's first phase, train → commit: H inner steps from the start the chain names (G_n, the
carried optimizer state; in an eager run G_n minus the host's own step n − 1 Δ), the record and
the Δ on disk before the commitment is broadcast, and the same contribution picked back up from
disk after a restart. The optimizer state a step starts from and the one it carries on are read
and written here.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from chain.client import TxFailed
from nodekit.board import NodePhase
from nodekit.chainview import Accepted, ErrDuplicateCommit, Phase, StartState, StepInfo, is_chain_error
from nodekit.eager import EagerStart, eager_start
from nodekit.globalmodel import GlobalModel
from nodekit.node import NodeError
from nodekit.objects import DOMAINS, Kind
from nodekit.store import OPTIMIZER_GROUP, StoreError, TensorSink
from protocol.chunks import verify_manifest
from protocol.codecs import CodecError
from protocol.config import Codec
from replay.step import make_optimizer, optimizer_state, training_state
from trainer.commit import TrainedStep
from trainer.errorfeedback import CarriedEF, EFLost

if TYPE_CHECKING:
    from trainer.node import HostNode


class TrainPhase:
    """Train → commit for one host (`phase(n)`), and the optimizer states it starts from and carries."""

    def __init__(self, host: HostNode) -> None:
        self.h = host

    def phase(self, n: int) -> TrainedStep | None:
        """Train and commit, or pick the commitment back up after a restart."""
        self.h.rt.set(outer_step=n, phase=NodePhase.WAITING)
        info = self.h.view.step(n)
        mine = self.h.view.commitment(self.h.address, n)
        return self.train_and_commit(n, info) if mine is None else self.recover(n, mine)

    def train_and_commit(self, n: int, info: StepInfo) -> TrainedStep | None:
        # the phase, not a height: outer step 0 may be postponed until its participants have joined
        info = self.h.view.wait_step(n, lambda i: i.phase is not Phase.PENDING, info.train_start)
        if info.phase is not Phase.TRAIN or info.height > info.commit_deadline:
            self.h.sit_out(n, "commit deadline passed before training")
            return None
        start = self.h.view.start_state(self.h.address, n) if self.h.overlapped else None
        contribution, gm = self.trained(n, info.base_model_hash, start)
        ctx = self.h.context(n, gm, self.h.opts.get(n))
        try:
            for msg in self.h.behaviour.commit_messages(contribution, ctx):
                self.h.rt.broadcast([msg])
                self.h.metrics.commits.inc()
        except TxFailed as e:
            if not is_chain_error(e, ErrDuplicateCommit):
                self.h.sit_out(n, f"commit refused: {e.log}")
                return None
        contribution = dataclasses.replace(contribution, delta={})  # the payload is enough: 4 B/param
        self.h.count("commits")
        self.h.rt.set(phase=NodePhase.COMMITTED)
        self.h.log(
            "committed", outer_step=n, root=contribution.trajectory_root, delta=contribution.delta_hash
        )
        return contribution

    def train_ahead(self, n: int) -> None:
        """Overlapped runs, after this host's commit of step n − 1: train step n now if the chain
        has already fixed its start (`next_start_state`), instead of idling until the slowest host
        commits and the step opens. Its record names that start; it is committed when the step
        opens only if the chain then names the same one (else trained again from the chain's)."""
        got = self.h.view.next_start_state(self.h.address)
        if got is None or got[0] != n or self.h.records.path(n).exists():
            return
        self.trained(n, got[1].base_model_hash, got[1], ahead=True)

    def trained(
        self, n: int, base: str, start: StartState | None, *, ahead: bool = False
    ) -> tuple[TrainedStep, GlobalModel]:
        """Step n's contribution trained from `start` (the chain's `start_state`; sequential runs:
        None, the base and the last accepted optimizer): from its record if this node already
        trained it from that start (a restart, or trained ahead), else trained now."""
        gm = self.h.models.get(base)
        with self.h.lock:  # G_{n-1}: nobody needs it once G_n is the base (overlapped: §2.2.1 keeps more)
            self.h.models.prune(self.h.retention.models_to_keep([gm.hash]))
        contribution = self.h.records.load(n, start)
        if contribution is None or contribution.base_model_hash != gm.hash:
            self.h.rt.set(outer_step=n, phase=NodePhase.TRAINING)
            for m in [m for m in self.h.opts if m < n - (1 if self.h.overlapped else 0)]:
                del self.h.opts[m]  # a step that was never revealed still held its optimizer: 8 B/param
            opt = self.h.opts[n] = self.start_optimizer(n, start=start)
            ctx = self.h.context(n, gm, opt)
            ctx.start_params = self.eager_start(n, gm, start)
            ctx.ef = self.carried_ef(n, start)
            t0 = time.perf_counter()
            contribution = self.h.behaviour.make_contribution(ctx)
            seconds = time.perf_counter() - t0
            for p in self.h.model.parameters():  # no more backward passes this step: free 4 B/param
                p.grad = None
            self.h.metrics.trained(
                self.h.cfg.inner_steps, contribution.tokens, seconds, contribution.mean_loss
            )
            with self.h.lock:  # the tail's pruning keeps what a record on disk names
                if not self.h.sharded:  # a sharded team's ranks saved their parts of it as they trained
                    self.save_optimizer(contribution, opt)
                self.h.records.save(contribution, start)
            self.h.rt.board.update("training_seconds", lambda x: round((x or 0.0) + seconds, 3))
            self.h.rt.set(loss=contribution.mean_loss)
            self.h.log(
                "trained",
                outer_step=n,
                loss=round(contribution.mean_loss, 4),
                seconds=round(seconds, 3),
                boundary_seconds=round(contribution.boundary_seconds, 3),
                boundary_waits=contribution.boundary_waits,
                step_seconds=round(contribution.train_seconds, 3),
                protocol_seconds=round(contribution.protocol_seconds, 3),
                tokens_per_s=round(contribution.tokens / max(seconds, 1e-9)),
                ahead=ahead,
            )
        return contribution, gm

    def save_optimizer(self, c: TrainedStep, opt: torch.optim.Optimizer) -> None:
        """The carried optimizer state, written from the live tensors; with the digests the
        boundary worker computed when they match the committed hash (no second hashing pass)."""
        state = optimizer_state(training_state(self.h.model, opt))
        length = self.h.objects.length(Kind.OPTIMIZER)
        digests, h = list(c.optimizer_digests), c.final_optimizer_hash
        domain, c_bytes = DOMAINS[Kind.OPTIMIZER], self.h.cfg.state_chunk_bytes
        if digests and verify_manifest(h, domain, c_bytes, length, digests):
            self.h.content.put_tensors(Kind.OPTIMIZER, state, OPTIMIZER_GROUP, h=h, digests=digests)
        else:
            self.h.content.put_tensors(Kind.OPTIMIZER, state, OPTIMIZER_GROUP)

    def recover(self, n: int, mine: dict[str, Any]) -> TrainedStep | None:
        """Restarted after committing: pick the contribution back up from disk."""
        contribution = self.h.records.load(n)
        if contribution is None or contribution.trajectory_root != mine["trajectory_root"]:
            self.h.sit_out(n, "committed on chain but the record is not on disk")
            return None
        self.h.log("resumed", outer_step=n, root=contribution.trajectory_root)
        self.h.rt.set(phase=NodePhase.COMMITTED, loss=contribution.mean_loss)
        return contribution

    def start_optimizer(
        self, n: int, model: nn.Module | None = None, *, start: StartState | None = None
    ) -> torch.optim.Optimizer:
        """The optimizer state the chain says step n starts from: last accepted, or fresh (overlapped
        runs: the one accepted in step n − 2, §2.2.1), for `model` (default: the training model;
        its parameters are G_n's: `run_committed` or the caller loads them). With a sharded team:
        rank 0's part of it (the others load theirs when the team trains)."""
        model = self.h.model if model is None else model
        if model is self.h.model:
            self.h.store.flush()  # a last boundary still being written reads the live model
        prev = self.h.view.prev_optimizer_hash(self.h.address, n) if start is None else start.optimizer_hash
        if self.h.team is not None and self.h.team.shard_state:
            try:
                self.h.team.carry(prev or None, OPTIMIZER_GROUP)
                return self.h.team.shard_optimizer(self.h.model, self.h.cfg, self.h.content)
            except (ValueError, RuntimeError) as e:
                raise NodeError(
                    f"own optimizer state {prev[:12] if prev else 'none'} is lost ({e}); leave and rejoin"
                ) from e
        opt = make_optimizer(model, self.h.cfg.inner)
        if prev:  # read from disk straight into the new optimizer's own tensors (no second copy)
            into = optimizer_state(training_state(model, opt))
            sink = TensorSink.into(into)  # a GPU model's moments: via host tensors, then copied
            try:
                self.h.content.load_into(Kind.OPTIMIZER, prev, sink, OPTIMIZER_GROUP)
            except ValueError as e:
                raise NodeError(f"own optimizer state {prev[:12]} is lost ({e}); leave and rejoin") from e
            with torch.no_grad():
                for k, t in into.items():
                    if sink.tensors[k] is not t:
                        t.copy_(sink.tensors[k])
            for p in model.parameters():  # every parameter carries its own step counter
                opt.state[p]["step"].copy_(into["step"])
        return opt

    def carried_ef(self, n: int, start: StartState | None = None) -> CarriedEF | None:
        """Codec sparse: the error-feedback accumulator the chain names for step n's start (None:
        zeros), read from this host's store; None for the other codecs (specs §4.1)."""
        if self.h.cfg.codec is not Codec.SPARSE:
            return None
        h = self.h.view.start_ef_hash(self.h.address, n) if start is None else start.ef_hash
        try:
            return CarriedEF.of(self.h.content, self.h.cfg, h, n, self.h.retention.fresh_efs)
        except EFLost as e:
            raise NodeError(f"{e}; leave and rejoin") from e

    def eager_start(self, n: int, gm: GlobalModel, s: StartState | None = None) -> EagerStart | None:
        """An eager run's start params of step n (specs §2.2.1), None where the start is G_{n−1}
        (not eager, or no parent: the base alone). The chain names the parent (`start_state`):
        this host's own step n − 1 Δ, decoded from exactly the bytes whose hash it committed (read
        from disk, every chunk checked; fetched by hash from step n − 1's holders if lost), on
        G_{n−1} = `gm`; the start's tensors are computed when read, never held whole."""
        if not self.h.overlapped:
            return None
        s = self.h.view.start_state(self.h.address, n) if s is None else s
        if s.parent_delta_hash is None:
            return None
        if s.base_model_hash != gm.hash:
            raise ValueError(f"step {n} start builds on {s.base_model_hash[:12]}, not {gm.hash[:12]}")
        m = s.parent_outer_step if s.parent_outer_step is not None else n - 1
        payload = self.parent_payload(m, s.parent_delta_hash)
        try:
            return eager_start(gm, payload, self.h.cfg.outer)
        except CodecError as e:  # our own committed Δ does not decode: the chain's start cannot be built
            raise NodeError(f"own step {m} Δ {s.parent_delta_hash[:12]} does not decode: {e}") from e

    def parent_payload(self, m: int, h: str) -> bytes:
        """Our step m Δ payload by its committed hash: from disk (verified on read), else from the
        verifiers and peers that hold it (verified chunk by chunk), kept and served again."""
        if not self.h.content.has(Kind.DELTA, h):
            self.h.log("fetching_parent_delta", outer_step=m, delta=h)
            endpoints = self.h.view.holders(m, exclude=self.h.address).get(self.h.address, [])
            self.h.models.fetch_delta(m, Accepted(self.h.address, h, 1, None), endpoints)
        try:
            return self.h.content.read_bytes(Kind.DELTA, h)
        except (StoreError, ValueError) as e:
            self.h.holdings.evict(Kind.DELTA, h, e)  # fetched again next time
            raise OSError(f"own step {m} Δ {h[:12]} unreadable: {e}") from e
