"""A torchft-style DiLoCo wrapper for ANY `nn.Module` and inner optimizer.

It hooks the inner optimizer: every `sync_every` inner steps it computes Δ = θ_global − θ_local,
hands it to a pluggable aggregation (in-process for a simulation, the verified network path in
the node), applies the outer Nesterov step with `protocol.outer.outer_update` (bitwise identical
on every worker), and resets the local parameters to the new global ones.

`eager=True` simulates the overlapped schedule (`Overlap.EAGER`, specs §2.2.1): while step n is
verified and aggregated, step n+1 already trains, so it cannot start from G_{n+1}; Δ_n is measured
against the step's own start and the outer step applies the accepted Δ_n to the LATEST global
model: G_{n+1} = Nesterov(G_n, mean Δ_n) (Streaming DiLoCo's overlapped communication with τ = 1;
Kale et al. 2025). The inner optimizer state carries on. A worker whose step n − 1 Δ is a
*parent* (step n − 1 exists, and its own parent, if any, was accepted) starts step n from
`protocol.outer.eager_start(G_{n−1}, b_{n−1}, own Δ_{n−1})` (the outer step with α·Δ as the only
Δ) — its own Δ standing in for the aggregate not yet known (Kale et al. 2025); without a parent
it starts from G_{n−1}. The `aggregate` callback plays the chain and must apply the parent rule
itself (a Δ whose parent was not accepted does not enter); the wrapper applies it to the starts.
(The one-step-delayed schedule without the stand-in was measured and removed, issue 22:
bench/RESULTS.md §1d.)
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from protocol.outer import eager_start, outer_update

Delta = Mapping[str, Tensor]
Aggregate = Callable[[str, int, Delta], Sequence[tuple[str, int, Delta]]]
"""(worker name, tokens, own Δ) -> every contribution that enters the outer step."""


def solo(name: str, tokens: int, delta: Delta) -> list[tuple[str, int, Delta]]:
    """One worker: DiLoCo degenerates to local SGD with an outer Nesterov step."""
    return [(name, tokens, delta)]


class InProcessGroup:
    """Workers in threads of one process meet at a barrier and all see the same Δ list."""

    def __init__(self, n_workers: int, timeout: float = 600.0) -> None:
        self._barrier = threading.Barrier(n_workers, timeout=timeout)
        self._lock = threading.Lock()
        self._pending: list[tuple[str, int, Delta]] = []
        self._round: list[tuple[str, int, Delta]] = []

    def __call__(self, name: str, tokens: int, delta: Delta) -> list[tuple[str, int, Delta]]:
        with self._lock:
            self._pending.append((name, tokens, {k: v.clone() for k, v in delta.items()}))
        if self._barrier.wait() == 0:  # exactly one thread publishes the round
            self._round, self._pending = self._pending, []
        self._barrier.wait()
        return list(self._round)


class DiLoCo:
    """Wrap a model and its inner optimizer; call `inner_optimizer.step()` as usual."""

    def __init__(
        self,
        model: nn.Module,
        inner_optimizer: torch.optim.Optimizer,
        sync_every: int,
        *,
        aggregate: Aggregate = solo,
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        name: str = "local",
        tokens_per_step: int = 1,
        eager: bool = False,
    ) -> None:
        if sync_every < 1:
            raise ValueError("sync_every must be >= 1")
        self.model, self.sync_every, self.aggregate = model, sync_every, aggregate
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.name, self.tokens_per_step = name, tokens_per_step
        self.inner_steps = 0
        self.outer_steps = 0
        self.global_params = {n: p.detach().float().clone() for n, p in model.named_parameters()}
        self.momentum = {n: torch.zeros_like(t) for n, t in self.global_params.items()}
        # G_{n−1}, G_n (eager) or G_n alone; the oldest is the base the next step builds on
        self._history: deque[dict[str, Tensor]] = deque([self.global_params], maxlen=2 if eager else 1)
        self._momenta: deque[dict[str, Tensor]] = deque([self.momentum], maxlen=2 if eager else 1)
        self.eager = eager
        self._start = self._history[0]  # what the current step trains from and measures Δ against
        self._parent_accepted: bool | None = None  # eager: whether this step's own parent entered
        self._hook = inner_optimizer.register_step_post_hook(lambda *_: self._after_inner_step())

    def _after_inner_step(self) -> None:
        self.inner_steps += 1
        if self.inner_steps % self.sync_every == 0:
            self.sync()

    @property
    def base_params(self) -> dict[str, Tensor]:
        """The params the current step trains from: G_n, or with `eager` the eager start built on
        G_{n−1} (G_{n−1} itself without a parent)."""
        return self._start

    @torch.no_grad()
    def sync(self) -> None:
        """One outer step: aggregate Δs against this step's start, Nesterov on the latest global,
        and restart local training from the next step's start."""
        base = self._start
        delta = {n: base[n] - p.detach().float() for n, p in self.model.named_parameters()}
        deltas = self.aggregate(self.name, self.tokens_per_step * self.sync_every, delta)
        self.global_params, self.momentum = outer_update(
            self.global_params, self.momentum, deltas, self.outer_lr, self.outer_momentum
        )
        self._history.append(self.global_params)
        self._momenta.append(self.momentum)
        self._start = self._next_start(delta, accepted=any(d[0] == self.name for d in deltas))
        for n, p in self.model.named_parameters():
            p.copy_(self._start[n])
        self.outer_steps += 1

    def _next_start(self, own: dict[str, Tensor], accepted: bool) -> dict[str, Tensor]:
        """Sequential: G_n. Eager: the step just synced is the next step's parent unless its own
        parent was rejected (then the start is G_{n−1})."""
        base = self._history[0]
        if not self.eager:
            return base
        is_parent = self._parent_accepted is not False
        self._parent_accepted = accepted if is_parent else None
        if not is_parent:
            return base
        return eager_start(base, self._momenta[0], own, self.outer_lr, self.outer_momentum)

    def close(self) -> None:
        """Detach from the optimizer (the model keeps its current parameters)."""
        self._hook.remove()
