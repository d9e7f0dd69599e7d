"""verifier.toml: what a verifier operator configures, validated with named errors.

Same shape as host.toml (DEVELOPERS-nodes.md; one model, `nodekit.config.NodeConfig`) so one
orchestrator writes both; `threads` is the replay thread count (bitwise mode needs the run's), and
the pool bounds are the verifier's own.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from nodekit.config import ConfigError, KeySource, NodeConfig, load_node_config

__all__ = ["ConfigError", "KeySource", "VerifierConfig", "load_verifier_config"]

STATES_PER_VERIFICATION = 2
"""Besides its worker's model, a verification holds the start state and at most the claimed end."""


class VerifierConfig(NodeConfig):
    """A verifier node's configuration (verifier.toml)."""

    max_concurrent: int = Field(2, ge=1, le=64)
    max_states_in_memory: int = Field(4, ge=STATES_PER_VERIFICATION, le=4096)

    @property
    def workers(self) -> int:
        """Verifications at once: the pool, capped so at most `max_states_in_memory` fetched states live."""
        return max(1, min(self.max_concurrent, self.max_states_in_memory // STATES_PER_VERIFICATION))


def load_verifier_config(path: str | Path) -> VerifierConfig:
    """Read and validate verifier.toml; every failure is a `ConfigError` naming the file and field."""
    return load_node_config(path, VerifierConfig)
