"""The verifier's Prometheus metrics, on the node's own registry (tests build many nodes)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from protocol.messages import Reason


class VerifierMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.verifications = Counter("verifier_verifications", "Contributions checked", registry=r)
        self.verdicts = Counter("verifier_verdicts", "Verdicts submitted by reason", ["reason"], registry=r)
        self.replay_steps = Counter("verifier_replay_steps", "Inner steps replayed", registry=r)
        self.bytes_fetched = Counter("verifier_bytes_fetched", "Blob bytes received", registry=r)
        self.errors = Counter("verifier_errors", "Assignments the node could not judge", ["kind"], registry=r)
        self.verify_seconds = Histogram(
            "verifier_verify_seconds", "Wall time of one verification", registry=r
        )
        self.cost_fraction = Gauge(
            "verifier_cost_fraction",
            "Last verification's replay time as a fraction of the host's estimated training time",
            registry=r,
        )
        self.in_flight = Gauge("verifier_in_flight", "Verifications running now", registry=r)
        for reason in Reason:
            self.verdicts.labels(reason=reason.name)
