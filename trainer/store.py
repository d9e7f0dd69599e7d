"""A content-addressed state store: safetensors files named by their canonical tensor hash.

The name is the hash of the *content* (`protocol.tensors.tensor_hash`), not of the file bytes, so
what a verifier checks is exactly what the chain commits to. Every read re-hashes: a corrupted
file is an error, never a wrong state. Writes are atomic (temp file, fsync, rename). Files live
under one directory per outer step so a finalized step can be pruned as a whole.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load, save
from torch import Tensor

from protocol.tensors import StateKind, tensor_hash

DEFAULT_MAX_BYTES = 2 << 30
_HEX = re.compile(r"^[0-9a-f]{64}$")


class StoreError(ValueError):
    """Missing, oversized, malformed or corrupted state data."""


def state_to_bytes(state: Mapping[str, Tensor]) -> bytes:
    """safetensors bytes (the form served over HTTP); never pickle."""
    return save({k: v.detach().contiguous() for k, v in state.items()})


def state_from_bytes(
    data: bytes,
    expected_hash: str | None = None,
    kind: StateKind = StateKind.TRAINING,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> dict[str, Tensor]:
    """Parse untrusted safetensors bytes, bounded in size, and check the content hash if given."""
    if len(data) > max_bytes:
        raise StoreError(f"state of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        state = load(bytes(data))
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as e:
        raise StoreError(f"not a safetensors state: {e}") from e
    if expected_hash is not None:
        got = tensor_hash(state, kind)
        if got != expected_hash:
            raise StoreError(f"state hash {got[:12]}… does not match the expected {expected_hash[:12]}…")
    return state


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write-to-temp, fsync, rename, fsync the directory: a crash leaves old or new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


class StateStore:
    """`<root>/<outer_step>/<hash>.safetensors`, verified on every read."""

    def __init__(self, root: Path | str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes

    def _path(self, outer_step: int, h: str) -> Path:
        if not _HEX.match(h):
            raise StoreError(f"not a state hash: {h!r}")
        if outer_step < 0:
            raise StoreError("outer_step must be >= 0")
        return self.root / str(outer_step) / f"{h}.safetensors"

    def put(self, state: Mapping[str, Tensor], outer_step: int, kind: StateKind = StateKind.TRAINING) -> str:
        h = tensor_hash(state, kind)
        self.put_hashed(state, outer_step, h)
        return h

    def put_hashed(self, state: Mapping[str, Tensor], outer_step: int, h: str) -> None:
        """Save a state whose hash the caller just computed (saves hashing twice on the hot path)."""
        path = self._path(outer_step, h)
        if not path.exists():
            atomic_write(path, state_to_bytes(state))

    def find(self, h: str, outer_step: int | None = None) -> Path:
        if outer_step is not None:
            path = self._path(outer_step, h)
            if path.is_file():
                return path
        else:
            self._path(0, h)
            for d in sorted(self.root.iterdir(), key=lambda p: p.name):
                if d.is_dir() and (d / f"{h}.safetensors").is_file():
                    return d / f"{h}.safetensors"
        raise StoreError(f"state {h[:12]}… is not in the store")

    def get_bytes(self, h: str, outer_step: int | None = None, kind: StateKind = StateKind.TRAINING) -> bytes:
        """The stored safetensors bytes, after checking they still hash to `h` (what a node serves)."""
        data = self._read(self.find(h, outer_step))
        state_from_bytes(data, h, kind, max_bytes=self.max_bytes)
        return data

    def get(
        self, h: str, outer_step: int | None = None, kind: StateKind = StateKind.TRAINING
    ) -> dict[str, Tensor]:
        return state_from_bytes(self._read(self.find(h, outer_step)), h, kind, max_bytes=self.max_bytes)

    def _read(self, path: Path) -> bytes:
        size = path.stat().st_size
        if size > self.max_bytes:
            raise StoreError(f"{path.name}: {size} bytes exceeds the limit of {self.max_bytes}")
        return path.read_bytes()

    def outer_steps(self) -> list[int]:
        return sorted(int(d.name) for d in self.root.iterdir() if d.is_dir() and d.name.isdigit())

    def prune(self, before: int) -> list[int]:
        """Delete every outer step < `before` (those are finalized); returns what was removed."""
        gone = [n for n in self.outer_steps() if n < before]
        for n in gone:
            shutil.rmtree(self.root / str(n))
        return gone


def clone_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}
