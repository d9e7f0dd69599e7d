"""What a host carries into an outer step, as the chain names it, and the copies a verifier keeps.

A contribution is replayed from G_n plus the host's carried state: its AdamW moments, in eager runs
the parent Δ its start was built on, and with codec sparse its error-feedback accumulator e. The
chain names each by hash (`start_optimizer`, `start_state`, `start_ef`, specs §2.2.1, §4.1). A
verifier keeps the optimizer states and accumulators its accepting checks derive (a host's next
start, served to its next verifiers) and drops each once no start still to be verified names it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from nodekit.chainview import ChainView
from nodekit.errorfeedback import EFWriter, ServedEF
from nodekit.holdings import Holdings
from nodekit.objects import Kind
from nodekit.store import EF_GROUP, OPTIMIZER_GROUP, ContentStore
from protocol.config import Codec, Overlap, RunConfig


@dataclass(frozen=True)
class StartNames:
    """The hashes of a host's step-n start state (None: fresh zeros, or no parent)."""

    optimizer_hash: str | None
    parent_delta_hash: str | None
    ef_hash: str | None


class CarriedStarts:
    def __init__(
        self,
        view: ChainView,
        cfg: RunConfig,
        content: ContentStore,
        holdings: Holdings,
        serve: Callable[[Kind, str, str], None],
    ) -> None:
        self.view, self.cfg, self.content, self.holdings, self.serve = view, cfg, content, holdings, serve

    def names(self, host: str, n: int) -> StartNames:
        """As the chain rules it: an eager run's `start_state`, else (sequential) the previous
        optimizer and no parent; codec sparse adds the accumulator."""
        ef = self.view.start_ef_hash(host, n) if self.cfg.codec is Codec.SPARSE else None
        if self.cfg.overlap is not Overlap.EAGER:
            return StartNames(self.view.prev_optimizer_hash(host, n), None, ef)
        s = self.view.start_state(host, n)
        return StartNames(s.optimizer_hash, s.parent_delta_hash, ef)

    def ef_sink(self, layout: Mapping[str, tuple[int, ...]]) -> ServedEF:
        """The e_next a sparse check rebuilds goes to our store: the host's next start, served to
        its next verifiers (`prune` drops it once no start names it)."""
        return ServedEF(EFWriter(self.content, layout), self.serve)

    def prune(self, hosts: list[str], n: int, overlapped: bool) -> None:
        """Keep only the optimizer states and accumulators a start still to be verified names:
        steps n + 1 and n + 2 in overlapped runs (§2.2.1), else each host's next."""
        steps: tuple[int | None, ...] = (n + 1, n + 2) if overlapped else (None,)
        named = {self.view.prev_optimizer_hash(a, m) for a in hosts for m in steps}
        self._keep_only(Kind.OPTIMIZER, OPTIMIZER_GROUP, named)
        if self.cfg.codec is Codec.SPARSE:
            named = {self.view.start_ef_hash(a, m) for a in hosts for m in steps}
            self._keep_only(Kind.ERROR_FEEDBACK, EF_GROUP, named)

    def _keep_only(self, kind: Kind, group: str, named: set[str | None]) -> None:
        for h in self.content.hashes(kind, group):
            if h not in named:
                self.holdings.drop(kind, h, group)
