"""host.toml: what a host operator configures, on top of what every node shares (`nodekit.config`).

Everything the *run* is bound to comes from the chain; this file only says how the host behaves.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from nodekit.config import ConfigError, KeySource, NodeConfig, load_node_config
from protocol.config import RunConfig, Stake

__all__ = ["ConfigError", "HostConfig", "KeySource", "NodeConfig", "checkpoint_every_for", "load_host_config",
           "load_node_config"]  # fmt: skip

SEGMENTS_CHECKPOINT_EVERY = 4
"""m under sampling segments when host.toml names none: any boundary may be opened there."""


class HostConfig(NodeConfig):
    """A host node's configuration (host.toml); `threads` must equal the run's."""

    stake: int = Field(
        Stake.model_fields["min_host_stake"].default,
        ge=0,
        description="ngonka bonded at MsgJoinRun; default: a run's default min_host_stake",
    )

    checkpoint_every: int | None = Field(
        None, ge=1, le=1_000_000,
        description="m: persist every m-th boundary; opened ones are recomputed. Unset: the run's window "
        "w (sampling windows: every window start is on disk), else 4",
    )  # fmt: skip
    shard_state: bool = Field(
        False,
        description="under torchrun: each rank keeps 1/W of the optimizer moments and hashes and saves "
        "its part of every state (trainer.sharded); the trajectory and hashes are the unsharded ones",
    )


def load_host_config(path: str | Path) -> HostConfig:
    """Read and validate host.toml; every failure is a `ConfigError` naming the file and field."""
    return load_node_config(path, HostConfig)


def checkpoint_every_for(cfg: RunConfig, configured: int | None) -> int:
    """The m a host persists with: host.toml's, else the run's window length under sampling windows
    (every window start then on disk: the reveal recomputes none, where m = 4 beside w = 3
    recomputed two of every three inside the reveal phase and a loaded host missed its deadline),
    else `SEGMENTS_CHECKPOINT_EVERY`."""
    if configured is not None:
        return configured
    return cfg.window_len if cfg.windowed else SEGMENTS_CHECKPOINT_EVERY
