"""What a host committed, on its own disk: one record per outer step (`commits/<n>.json`), written
with the Δ payload before the commitment is broadcast, so a host killed at any point and
restarted on the same `data_dir` reveals exactly what it committed and never commits twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nodekit.chainview import StartState
from nodekit.objects import Kind
from nodekit.store import ContentStore, StoreError, atomic_write, delta_group
from protocol.config import Codec
from protocol.messages import EnvFingerprint
from trainer.commit import TrainedStep


def start_key(s: StartState) -> list[str | None]:
    return [s.base_model_hash, s.parent_delta_hash, s.optimizer_hash]


@dataclass
class Record:
    """What the node committed in one outer step, on disk before the commit is broadcast (the Δ
    payload itself is in the content store under its hash)."""

    outer_step: int
    base_model_hash: str
    leaves: list[str]
    trajectory_root: str
    delta_hash: str
    codec: str
    final_optimizer_hash: str
    tokens: int
    env: dict[str, Any]
    mean_loss: float
    start: list[str | None] | None = None
    """The start it trained from (base, eager parent Δ, optimizer; `StartState`): a step trained
    before it opened is committed only if the chain names the same start when it opens."""
    final_ef_hash: str = ""
    """Codec sparse: the e_next it committed (the tensors are in the store; specs §4.1)."""

    @classmethod
    def of(cls, c: TrainedStep, start: StartState | None = None) -> Record:
        return cls(
            c.outer_step,
            c.base_model_hash,
            list(c.leaves),
            c.trajectory_root,
            c.delta_hash,
            c.codec.value,
            c.final_optimizer_hash,
            c.tokens,
            c.env.model_dump(),
            c.mean_loss,
            start_key(start) if start is not None else None,
            c.final_ef_hash,
        )

    def contribution(self, payload: bytes) -> TrainedStep:
        return TrainedStep(
            outer_step=self.outer_step,
            base_model_hash=self.base_model_hash,
            leaves=self.leaves,
            trajectory_root=self.trajectory_root,
            delta={},
            payload=payload,
            delta_hash=self.delta_hash,
            codec=Codec(self.codec),
            final_optimizer_hash=self.final_optimizer_hash,
            tokens=self.tokens,
            env=EnvFingerprint(**self.env),
            mean_loss=self.mean_loss,
            losses=[],
            final_ef_hash=self.final_ef_hash,
        )


class Records:
    """The host's commit records (`dir/commits`) and their Δ payloads (in the content store)."""

    def __init__(self, folder: Path, content: ContentStore, log: Callable[..., None]) -> None:
        self.folder, self.content, self.log = folder, content, log

    def path(self, n: int) -> Path:
        return self.folder / f"{n}.json"

    def save(self, c: TrainedStep, start: StartState | None = None) -> None:
        self.content.put_bytes(Kind.DELTA, c.payload, delta_group(c.outer_step))
        atomic_write(self.path(c.outer_step), json.dumps(asdict(Record.of(c, start))).encode())

    def load(self, n: int, start: StartState | None = None) -> TrainedStep | None:
        """What this node trained for step n, if anything; with `start`, only if trained from it."""
        try:
            record = Record(**json.loads(self.path(n).read_bytes()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            self.log("record_unreadable", outer_step=n, error=str(e))
            return None
        if start is not None and record.start is not None and record.start != start_key(start):
            self.log("trained_from_another_start", outer_step=n, trained=record.start, chain=start_key(start))
            return None
        try:  # verified chunk by chunk against the committed Δ hash on the way in
            payload = self.content.read_bytes(Kind.DELTA, record.delta_hash, delta_group(n))
        except (StoreError, ValueError, OSError) as e:
            self.log("record_unreadable", outer_step=n, error=f"payload: {e}")
            self.content.delete(Kind.DELTA, record.delta_hash, delta_group(n))
            return None
        return record.contribution(payload)

    def final_optimizer_hash(self, n: int) -> str | None:
        """The optimizer state step n's record names (the record alone, not its Δ payload)."""
        try:
            return str(json.loads(self.path(n).read_bytes())["final_optimizer_hash"])
        except (OSError, ValueError, KeyError):
            return None

    def final_ef_hash(self, n: int) -> str | None:
        """The error-feedback accumulator step n's record names (None: none, or no record)."""
        try:
            return str(json.loads(self.path(n).read_bytes()).get("final_ef_hash") or "") or None
        except (OSError, ValueError, AttributeError):
            return None
