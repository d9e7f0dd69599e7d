"""Prometheus metrics of one host node, on its own registry (several nodes may share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge

from nodekit.board import HOST_PHASES, NodePhase


class HostMetrics:
    """Throughput, loss, phase, traffic and outcomes, named `gonka_host_*`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.inner_steps = Counter("gonka_host_inner_steps", "inner steps trained", registry=r)
        self.tokens = Counter("gonka_host_tokens", "tokens trained on", registry=r)
        self.steps_per_s = Gauge(
            "gonka_host_inner_steps_per_second", "inner steps/s, last outer step", registry=r
        )
        self.tokens_per_s = Gauge("gonka_host_tokens_per_second", "last outer step's tokens/s", registry=r)
        self.loss = Gauge("gonka_host_train_loss", "mean inner loss of the last outer step", registry=r)
        self.training_seconds = Counter(
            "gonka_host_training_seconds", "seconds spent training (÷ wall seconds = utilization)", registry=r
        )
        self.val_loss = Gauge("gonka_host_val_loss", "global validation loss, last G", registry=r)
        self.outer_step = Gauge("gonka_host_outer_step", "outer step being worked on", registry=r)
        self.phase = Enum(
            "gonka_host_phase", "what the node is doing", states=[p.value for p in HOST_PHASES], registry=r
        )
        self.bytes_sent = Counter("gonka_host_bytes_sent", "blob bytes served", ["kind"], registry=r)
        self.bytes_received = Counter("gonka_host_bytes_received", "blob bytes fetched", registry=r)
        self.commits = Counter("gonka_host_commits", "commit messages broadcast", registry=r)
        self.accepted = Counter("gonka_host_accepted", "own contributions accepted", registry=r)
        self.rejected = Counter("gonka_host_rejected", "own contributions not accepted", registry=r)
        self.phase.state(NodePhase.STARTING)

    def trained(self, steps: int, tokens: int, seconds: float, mean_loss: float) -> None:
        self.inner_steps.inc(steps)
        self.tokens.inc(tokens)
        self.training_seconds.inc(seconds)
        if seconds > 0:
            self.steps_per_s.set(steps / seconds)
            self.tokens_per_s.set(tokens / seconds)
        self.loss.set(mean_loss)
