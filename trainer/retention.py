"""What a host keeps, and serves, across outer steps: once step n is done its opened states go,
Δs stay one step longer (late peers and copycats download them like anyone), and only the
optimizer states the chain chains on (and, overlapped, this host's own pending ones) and the
models the steps in flight still need stay on disk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from nodekit.objects import Kind
from nodekit.store import EF_GROUP, OPTIMIZER_GROUP, delta_group_step
from protocol.config import Codec
from trainer.errorfeedback import FreshEFs

if TYPE_CHECKING:
    from trainer.node import HostNode


class Retention:
    """`prune(n)` after step n; `publish_optimizer()` serves the start states the chain names."""

    def __init__(self, host: HostNode) -> None:
        self.h = host
        self._fresh: FreshEFs | None = None

    @property
    def fresh_efs(self) -> FreshEFs:
        """Accumulators written by a step still training (overlapped runs prune meanwhile)."""
        if self._fresh is None:
            self._fresh = FreshEFs(self.h.lock)
        return self._fresh

    def prune(self, n: int) -> None:
        """Finalized states go; Δs stay one step longer (late peers, copycats download them like
        anyone); only the optimizer state the chain chains on and the last two models stay
        (overlapped runs: what the steps still in flight need as well)."""
        holdings = self.h.holdings
        with self.h.lock:
            if self.h.overlapped:  # the next step's openings are being served to its verifiers
                holdings.withdraw_before(Kind.STATE, n + 1)
            else:
                holdings.withdraw_all(Kind.STATE)
            self.h.store.prune(n + 1)
            holdings.withdraw_before(Kind.DELTA, n)
            for m in holdings.drop_groups(delta_group_step, n):
                self.h.records.path(m).unlink(missing_ok=True)
            keep = self.start_optimizers() | self.own_pending_optimizers(n)
            for h in self.h.content.hashes(Kind.OPTIMIZER, OPTIMIZER_GROUP):
                if h not in keep:
                    holdings.drop(Kind.OPTIMIZER, h, OPTIMIZER_GROUP)
            self.publish_optimizer()
            self.prune_ef(n)
            base = self.h.view.step(n).base_model_hash
            current = self.h.view.run().global_model_hash
            self.h.models.prune(self.models_to_keep([base, current]))

    def own_pending_optimizers(self, n: int) -> set[str]:
        """Overlapped runs: the final optimizer states of this host's later steps (records on disk),
        not yet finalized (the step after the newest too: it may have been trained ahead): each
        becomes a start state two steps on if it is accepted."""
        if not self.h.overlapped:
            return set()
        pending = (
            self.h.records.final_optimizer_hash(m) for m in range(n + 1, self.h.view.run().current_step + 2)
        )
        return {h for h in pending if h is not None}

    def start_optimizers(self) -> set[str]:
        """The optimizer states the chain names as this host's start states: of the current step
        (overlapped runs: of every step in flight, and of the next one)."""
        return self._named_starts(self.h.view.prev_optimizer_hash)

    def publish_optimizer(self) -> None:
        """Serve the optimizer state the chain names as this host's start state: verifiers rebuild
        segment 0 from it and G_n instead of downloading a whole training state."""
        self._serve_only(Kind.OPTIMIZER, OPTIMIZER_GROUP, self.start_optimizers())
        self.publish_ef()

    def _named_starts(self, lookup: Callable[..., str | None]) -> set[str]:
        """The hashes `lookup(address[, step])` gives for this host's start: of the current step
        (overlapped runs: of every step in flight, and of the next one)."""
        if not self.h.overlapped:
            return {h for h in [lookup(self.h.address)] if h}
        run = self.h.view.run()
        steps = {*run.steps_in_flight, run.current_step + 1}
        return {h for n in steps if (h := lookup(self.h.address, n))}

    def _serve_only(self, kind: Kind, group: str, named: set[str]) -> None:
        """Serve what on disk the chain names; withdraw the rest (it stays on disk until pruned)."""
        for h in self.h.content.hashes(kind, group):
            if h in named:
                self.h.holdings.keep(kind, h, group)
            else:
                self.h.holdings.withdraw(kind, h)

    # ---- the error-feedback accumulator (codec sparse, specs §4.1): kept and served like the optimizer

    def start_efs(self) -> set[str]:
        """The accumulators the chain names as this host's start states (as `start_optimizers`)."""
        if self.h.cfg.codec is not Codec.SPARSE:
            return set()
        return self._named_starts(self.h.view.start_ef_hash)

    def own_pending_efs(self, n: int) -> set[str]:
        """Overlapped runs: the e_next of this host's later steps (records on disk), not yet final."""
        if not self.h.overlapped:
            return set()
        pending = (self.h.records.final_ef_hash(m) for m in range(n + 1, self.h.view.run().current_step + 2))
        return {h for h in pending if h is not None}

    def prune_ef(self, n: int) -> None:
        """After step n: only the accumulators a start names (or may name) stay on disk."""
        if self.h.cfg.codec is not Codec.SPARSE:
            return
        with self.h.lock:
            fresh = self.fresh_efs.held(n)
            if fresh is None:  # an e_next is being written right now: prune next time
                return
            self._drop_unnamed_efs(self.start_efs() | self.own_pending_efs(n) | fresh)
        self.publish_ef()

    def _drop_unnamed_efs(self, keep: set[str]) -> None:
        for h in self.h.content.hashes(Kind.ERROR_FEEDBACK, EF_GROUP):
            if h not in keep:
                self.h.holdings.drop(Kind.ERROR_FEEDBACK, h, EF_GROUP)

    def publish_ef(self) -> None:
        """Serve the accumulator the chain names as this host's start: its verifiers need it to
        rebuild C(β·e + Δ) and e_next (one 4 B/param download per verified contribution)."""
        if self.h.cfg.codec is not Codec.SPARSE:
            return
        self._serve_only(Kind.ERROR_FEEDBACK, EF_GROUP, self.start_efs())

    def models_to_keep(self, keep: list[str]) -> list[str]:
        """Overlapped runs also keep the bases of the steps in flight and the latest G (the next
        step's Δs apply to it); sequential runs keep just `keep`."""
        if not self.h.overlapped:
            return keep
        run = self.h.view.run()
        bases = [self.h.view.step(m).base_model_hash for m in run.steps_in_flight]
        return [*keep, run.global_model_hash, *bases]
