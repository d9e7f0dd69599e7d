"""The host's second phase, reveal: once the chain draws the challenge, the opened boundaries are
recomputed where they were not persisted (bitwise, checked against the committed leaves), served
with the Δ, and their openings revealed on chain. In an overlapped run the recomputing happens
on the replica model while the training model trains the next step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from chain.client import TxFailed
from nodekit.board import NodePhase
from nodekit.chainview import Phase
from nodekit.objects import Kind
from nodekit.store import OPTIMIZER_GROUP, delta_group
from protocol.messages import MsgRevealContribution
from trainer.commit import CommitJob, TrainedStep, load_params, openings
from trainer.recompute import materialize_openings

if TYPE_CHECKING:
    from trainer.node import HostNode


class RevealPhase:
    """Reveal for one host (`phase(n, contribution)`)."""

    def __init__(self, host: HostNode) -> None:
        self.h = host

    def phase(self, n: int, c: TrainedStep) -> None:
        """Once challenged: recompute what is opened, serve it, and reveal the openings."""
        info = self.h.view.wait_step(n, lambda i: i.challenge_seed is not None or i.phase is Phase.DONE)
        if info.challenge_seed is None:
            return
        segments = self.h.view.segments(self.h.address, n)
        if segments is None:
            return
        already = self.h.view.reveal(self.h.address, n) is not None
        ctx = self.h.context(n, self.h.models.get(c.base_model_hash), self.h.opts.get(n))
        if not already and not self.h.behaviour.should_reveal(c, ctx):
            self.h.log("not_revealing", outer_step=n)
            return
        del ctx
        self.h.opts.pop(n, None)  # the last hook that sees it: its moments (8 B/param) go now
        self.materialize(n, c, segments, self.h.view.windows(self.h.address, n))
        # The commit deadline is past, so serving now lets nobody copy; verifiers need it at once.
        self.publish(n, c, segments)
        if not already:
            msg = MsgRevealContribution(
                creator=self.h.address,
                run_id=self.h.config.run_id,
                outer_step=n,
                openings=openings(c, segments),
            )
            try:
                self.h.rt.broadcast([msg])
            except TxFailed as e:
                self.h.log("reveal_refused", outer_step=n, error=e.log)
                return
        self.h.rt.set(phase=NodePhase.REVEALED)
        self.h.log("revealed", outer_step=n, segments=segments)

    def materialize(self, n: int, c: TrainedStep, segments: list[int], windows: list[int]) -> None:
        """Opened boundaries that were not persisted are recomputed from the nearest persisted one
        (sparse checkpoints, host.toml `checkpoint_every`); every other boundary goes at once."""
        gm = self.h.models.get(c.base_model_hash)
        # Overlapped runs recompute on the replica while the training model trains the next step
        # (a sharded team has no replica: it recomputes between that step's training and commit).
        beside = self.h.overlapped and self.h.team is None
        model = self.h.replica_model() if beside else self.h.model

        eager = self.h.train.eager_start(n, gm)  # the same start the step trained from
        params = gm.params if eager is None else eager

        def start() -> tuple[nn.Module, torch.optim.Optimizer]:
            opt = self.h.train.start_optimizer(n, model)
            gm.check_fits(model)
            load_params(model, params)
            return model, opt

        with self.h.replica_lock if beside else contextlib.nullcontext():
            self.recompute(n, c, segments, windows, params, start)

    def recompute(
        self,
        n: int,
        c: TrainedStep,
        segments: list[int],
        windows: list[int],
        params: Mapping[str, Tensor],
        start: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
    ) -> None:
        # the job the step trained with (its slice count committed in the env; a team sets its own)
        job = CommitJob(
            self.h.cfg, self.h.corpus, self.h.address, n, micro_batches=c.env.micro_batches,
            loss_fn=self.h.loss_fn, start_params=params, base_model_hash=c.base_model_hash,
            store=self.h.store,
        )  # fmt: skip
        try:
            if self.h.team is not None and self.h.team.shard_state:
                self.h.team.carry(self.h.view.prev_optimizer_hash(self.h.address, n) or None, OPTIMIZER_GROUP)
                done = self.h.team.materialize(job, self.h.model, c.leaves, segments, windows)
            else:
                done = materialize_openings(job, c.leaves, segments, start, windows)
        except (ValueError, OSError) as e:  # cannot reproduce an own boundary: serve what we have
            self.h.log("recompute_failed", outer_step=n, error=f"{type(e).__name__}: {e}")
            return
        if done:
            self.h.log("recomputed", outer_step=n, boundaries=done)

    def publish(self, n: int, c: TrainedStep, segments: list[int]) -> None:
        """Serve the opened states and the Δ until the step is done (pruning withdraws them)."""
        group = str(n)
        for s in segments:
            for leaf in (c.leaves[s], c.leaves[s + 1]):
                if self.h.content.has(Kind.STATE, leaf, group):
                    self.h.holdings.keep(Kind.STATE, leaf, group, step=n)
        if self.h.content.has(Kind.DELTA, c.delta_hash, delta_group(n)):
            self.h.holdings.keep(Kind.DELTA, c.delta_hash, delta_group(n), step=n)
        else:  # a payload that does not hash to what was committed (an adversary's): as it is
            self.h.holdings.keep_as_is(Kind.DELTA, c.delta_hash, lambda: c.payload, step=n)
