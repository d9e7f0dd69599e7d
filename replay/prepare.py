"""`gonka-diloco data prepare`: text files or JSONL (a `text` field) into token shards + manifest.

Inputs are streamed (chunks of lines, batches of records), never held whole, and written straight
into shard files while they are hashed, so preparing a corpus costs O(chunk) memory whatever its
size. The last `val_fraction` of every input file (by bytes; JSONL by whole records) becomes the
validation split. Tokenizers: the built-in byte-level one, a local Hugging Face `tokenizers`
`tokenizer.json`, or a byte-level BPE trained here on the training part of the corpus. The
manifest is written last: a folder without one is an unfinished preparation.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from protocol.config import Frozen
from replay.data import DTYPES, MANIFEST, DataError, DatasetManifest, Shard, TokenizerInfo

CHUNK_BYTES = 1 << 20  # text tokenized per call
DEFAULT_SHARD_TOKENS = 100_000_000  # nanoGPT/FineWeb-style shards: 200 MB of uint16
MAX_TOKENIZER_BYTES = 64 << 20
MAX_RECORD_BYTES = 64 << 20
BYTES_ID = hashlib.sha256(b"gonka-diloco/tokenizer/bytes/v1").hexdigest()
EOT_CANDIDATES = ("<|endoftext|>", "</s>", "<|im_end|>", "<eos>", "<|end_of_text|>")
TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".json", ".text")

Progress = Callable[[int], None]
"""Called with the number of input bytes just consumed."""


class PrepareOptions(Frozen):
    name: str = Field("dataset", min_length=1, max_length=128)
    tokenizer: str = Field("bytes", description="'bytes' or the path of a tokenizer.json")
    train_bpe: int | None = Field(None, ge=257, le=1 << 24, description="train a byte-level BPE of this size")
    dtype: Literal["auto", "uint16", "uint32"] = "auto"
    val_fraction: float = Field(0.05, ge=0, lt=1)
    shard_tokens: int = Field(DEFAULT_SHARD_TOKENS, ge=1)
    text_field: str = Field("text", min_length=1)
    eot: str = Field("", description="end-of-document token (default: the tokenizer's, if it has one)")
    errors: Literal["strict", "replace", "skip"] = Field(
        "strict",
        description="an input that is not UTF-8: strict stops with its path and byte offset; replace "
        "decodes bad bytes as U+FFFD; skip leaves the whole file out (and says so)",
    )


# ---------------------------------------------------------------- tokenizers


class Tokenizer:
    """What preparation needs of a tokenizer: batch encode, the vocabulary, the end-of-text id."""

    info: TokenizerInfo

    def encode(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """One token per UTF-8 byte (vocabulary 256, no end-of-text token): the built-in GPT's."""

    info = TokenizerInfo(kind="bytes", vocab_size=256, sha256=BYTES_ID)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode()) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode()


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer.json (the exact bytes are hashed into the manifest)."""

    def __init__(self, raw: bytes, eot: str = "", file: str = "tokenizer.json") -> None:
        from tokenizers import Tokenizer as _Tok

        try:
            self.tok = _Tok.from_str(raw.decode())
        except Exception as e:  # tokenizers raises its own Exception type for a bad file
            raise DataError(f"not a tokenizers tokenizer.json: {e}") from None
        self.raw = raw
        eot_id = None
        for name in (eot,) if eot else EOT_CANDIDATES:
            eot_id = self.tok.token_to_id(name)
            if eot_id is not None:
                break
        if eot and eot_id is None:
            raise DataError(f"the tokenizer has no token {eot!r}")
        self.info = TokenizerInfo(
            kind="tokenizers", vocab_size=self.tok.get_vocab_size(with_added_tokens=True),
            sha256=hashlib.sha256(raw).hexdigest(), file=file, eot_token=eot_id,
        )  # fmt: skip

    @classmethod
    def from_file(cls, path: Path, eot: str = "") -> HFTokenizer:
        try:
            if path.stat().st_size > MAX_TOKENIZER_BYTES:
                raise DataError(f"{path} is larger than {MAX_TOKENIZER_BYTES} bytes")
            return cls(path.read_bytes(), eot)
        except OSError as e:
            raise DataError(f"cannot read tokenizer {path}: {e}") from e

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)


def train_bpe(texts: Iterator[str], vocab_size: int) -> HFTokenizer:
    """A byte-level BPE (GPT-2 style, `<|endoftext|>` = id 0) trained on `texts`."""
    from tokenizers import Tokenizer as _Tok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = _Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(texts, trainer=trainer)
    return HFTokenizer(tok.to_str().encode(), "<|endoftext|>")


def load_tokenizer(dataset_dir: Path, manifest: DatasetManifest) -> Tokenizer:
    """The tokenizer a prepared dataset was made with (to decode it), checked against the manifest."""
    info = manifest.tokenizer
    if info.kind == "bytes":
        return ByteTokenizer()
    tok = HFTokenizer.from_file(dataset_dir / info.file)
    if tok.info.sha256 != info.sha256:
        raise DataError(f"{dataset_dir / info.file} is not the tokenizer the manifest names")
    return tok


# ---------------------------------------------------------------- reading inputs


def expand_inputs(inputs: Sequence[str]) -> list[Path]:
    """Files as given, folders as their text/JSONL files in sorted order."""
    out: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES)
            if not found:
                raise DataError(f"{p}: no {', '.join(TEXT_SUFFIXES)} files in this folder")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise DataError(f"{p}: no such file or folder")
    if not out:
        raise DataError("no input files")
    return out


def _decode(raw: bytes, path: Path, offset: int, errors: str = "strict") -> str:
    try:
        return raw.decode("utf-8", errors="replace" if errors == "replace" else "strict")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{path}: not UTF-8 text at byte {offset + e.start} ({e.reason}); --errors replace or "
            "--errors skip to go on"
        ) from None


def utf8_error(path: Path) -> str | None:
    """Where a file stops being UTF-8 ('byte N (reason)'), or None: one streaming pass."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    try:
        with path.open("rb") as f:
            while block := f.read(CHUNK_BYTES):
                decoder.decode(block)
                offset += len(block)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:
        return f"byte {offset + e.start} ({e.reason})"
    return None


def _char_boundary(data: bytes, i: int) -> int:
    """The first index >= i that does not split a UTF-8 character."""
    while i < len(data) and (data[i] & 0xC0) == 0x80:
        i += 1
    return i


def _cut(path: Path, val_fraction: float) -> int:
    """Where the held-out tail of a (non-empty) input file starts, in bytes."""
    size = path.stat().st_size
    if size == 0:
        raise DataError(f"{path} is empty")
    return size - int(size * val_fraction)


def _text_docs(
    path: Path, opts: PrepareOptions, progress: Progress | None
) -> Iterator[tuple[str, str, bool]]:
    """(split, text, ends_document) chunks of a plain text file: the whole file is one document."""
    cut = _cut(path, opts.val_fraction)
    pos, buf, split = 0, bytearray(), "train"
    with path.open("rb") as f:
        for line in f:
            start, pos = pos, pos + len(line)
            if progress:
                progress(len(line))
            if split == "train" and pos > cut:  # this line crosses into the held-out tail
                at = _char_boundary(line, cut - start)
                buf += line[:at]
                if buf:
                    yield "train", _decode(bytes(buf), path, start + at - len(buf), opts.errors), False
                buf, split, line = bytearray(), "val", line[at:]
                start += at
            buf += line
            if len(buf) >= CHUNK_BYTES:
                yield split, _decode(bytes(buf), path, pos - len(buf), opts.errors), False
                buf = bytearray()
    yield split, _decode(bytes(buf), path, pos - len(buf), opts.errors), True


def _jsonl_docs(
    path: Path, opts: PrepareOptions, progress: Progress | None
) -> Iterator[tuple[str, str, bool]]:
    """(split, text, True) per JSONL record; records starting in the last fraction are held out."""
    cut = _cut(path, opts.val_fraction)
    pos, seen = 0, 0
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            start, pos = pos, pos + len(line)
            if progress:
                progress(len(line))
            if len(line) > MAX_RECORD_BYTES:
                raise DataError(f"{path}:{lineno}: record larger than {MAX_RECORD_BYTES} bytes")
            text_line = _decode(line, path, start, opts.errors).strip()
            if not text_line:
                continue
            try:
                record = json.loads(text_line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            if not isinstance(record, dict) or opts.text_field not in record:
                raise DataError(f"{path}:{lineno}: no {opts.text_field!r} field")
            text = record[opts.text_field]
            if not isinstance(text, str):
                raise DataError(f"{path}:{lineno}: {opts.text_field!r} is not a string")
            if text:
                seen += 1
                yield ("val" if start >= cut and opts.val_fraction > 0 else "train"), text, True
    if not seen:
        raise DataError(f"{path}: no record has any {opts.text_field!r} text")


def iter_docs(
    path: Path, opts: PrepareOptions, progress: Progress | None = None
) -> Iterator[tuple[str, str, bool]]:
    if path.suffix.lower() in (".jsonl", ".json"):
        return _jsonl_docs(path, opts, progress)
    return _text_docs(path, opts, progress)


# ---------------------------------------------------------------- writing shards


class ShardWriter:
    """Appends tokens to `<prefix>-NNNNN.bin` files of at most `shard_tokens`, hashing as it writes."""

    def __init__(self, folder: Path, prefix: str, dtype: str, shard_tokens: int) -> None:
        self.folder, self.prefix, self.shard_tokens = folder, prefix, shard_tokens
        self.np_dtype = np.dtype(DTYPES[dtype]).newbyteorder("<")
        self.shards: list[Shard] = []
        self._f: Any = None
        self._h = hashlib.sha256()
        self._n = 0

    def _open(self) -> None:
        self._name = f"{self.prefix}-{len(self.shards):05d}.bin"
        self._f = (self.folder / self._name).open("wb")
        self._h, self._n = hashlib.sha256(), 0

    def _close(self) -> None:
        if self._f is None:
            return
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        self._f = None
        if self._n:
            self.shards.append(Shard(name=self._name, tokens=self._n, bytes=self._n * self.np_dtype.itemsize,
                                     sha256=self._h.hexdigest()))  # fmt: skip
        else:
            (self.folder / self._name).unlink()

    def add(self, ids: Sequence[int]) -> None:
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(self.np_dtype).max):
            raise DataError(f"token id {int(arr.max())} does not fit {self.np_dtype.name}")
        data = arr.astype(self.np_dtype)
        while data.size:
            if self._f is None:
                self._open()
            take = min(data.size, self.shard_tokens - self._n)
            raw = data[:take].tobytes()
            self._f.write(raw)
            self._h.update(raw)
            self._n += take
            data = data[take:]
            if self._n >= self.shard_tokens:
                self._close()

    def finish(self) -> list[Shard]:
        self._close()
        return self.shards


# ---------------------------------------------------------------- prepare


def _dtype_for(vocab: int, wanted: str) -> str:
    if wanted == "auto":
        return "uint16" if vocab <= 1 << 16 else "uint32"
    if vocab > np.iinfo(DTYPES[wanted]).max + 1:
        raise DataError(f"a vocabulary of {vocab} tokens overflows {wanted}; use --dtype uint32")
    return wanted


def _train_texts(files: list[Path], opts: PrepareOptions) -> Iterator[str]:
    for path in files:
        for split, text, _ in iter_docs(path, opts):
            if split == "train" and text:
                yield text


def prepare(
    inputs: Sequence[str],
    out_dir: Path,
    opts: PrepareOptions,
    *,
    progress: Progress | None = None,
    on_phase: Callable[[str, int], None] | None = None,
    on_skip: Callable[[Path, str], None] | None = None,
) -> DatasetManifest:
    """Tokenize `inputs` into `out_dir` (new or empty) and write its manifest.json last. With
    `errors = "skip"` every input is checked to be UTF-8 first (a pass over it), and one that is
    not is left out whole, reported to `on_skip(path, where)`; none is half-tokenized."""
    files = expand_inputs(inputs)
    if opts.errors == "skip":
        kept = []
        for path in files:
            where = utf8_error(path)
            if where is None:
                kept.append(path)
            elif on_skip is not None:
                on_skip(path, f"not UTF-8 text at {where}")
        if not kept:
            raise DataError("every input was skipped: none is UTF-8 text")
        files = kept
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise DataError(f"{out_dir} is not empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    if opts.train_bpe is not None and opts.tokenizer != "bytes":
        raise DataError("give either a tokenizer.json or --train-bpe, not both")
    if opts.train_bpe is not None:
        _dtype_for(opts.train_bpe, opts.dtype)  # a vocabulary that cannot fit: say so before training
    total = sum(p.stat().st_size for p in files)
    tok: Tokenizer
    if opts.train_bpe is not None:
        if on_phase:
            on_phase("training BPE", total)
        tok = train_bpe(_train_texts(files, opts), opts.train_bpe)
    elif opts.tokenizer == "bytes":
        tok = ByteTokenizer()
    else:
        tok = HFTokenizer.from_file(Path(opts.tokenizer), opts.eot)
    dtype = _dtype_for(tok.info.vocab_size, opts.dtype)
    if isinstance(tok, HFTokenizer):
        (out_dir / "tokenizer.json").write_bytes(tok.raw)
    writers = {s: ShardWriter(out_dir, s, dtype, opts.shard_tokens) for s in ("train", "val")}
    eot = tok.info.eot_token
    if on_phase:
        on_phase("tokenizing", total)
    try:
        for path in files:
            pending: list[tuple[str, str, bool]] = []
            size = 0
            for doc in iter_docs(path, opts, progress):
                pending.append(doc)
                size += len(doc[1])
                if size >= CHUNK_BYTES:
                    _flush(tok, pending, writers, eot)
                    pending, size = [], 0
            _flush(tok, pending, writers, eot)
        train, val = writers["train"].finish(), writers["val"].finish()
    except BaseException:
        for w in writers.values():
            if w._f is not None:
                w._f.close()
        raise
    if not train:
        raise DataError("the training split is empty: no text in the inputs")
    if not val:
        raise DataError("the validation split is empty: raise --val-fraction or give more text")
    manifest = DatasetManifest(
        name=opts.name, dtype=dtype, tokenizer=tok.info, train=train, val=val,
        total_tokens=sum(s.tokens for s in (*train, *val)),
    )  # fmt: skip
    tmp = out_dir / f".{MANIFEST}.tmp"
    tmp.write_bytes(manifest.to_bytes())
    os.replace(tmp, out_dir / MANIFEST)
    return manifest


def _flush(
    tok: Tokenizer, docs: list[tuple[str, str, bool]], writers: dict[str, ShardWriter], eot: int | None
) -> None:
    if not docs:
        return
    for (split, _, ends), ids in zip(docs, tok.encode([d[1] for d in docs]), strict=True):
        writers[split].add([*ids, eot] if ends and eot is not None else ids)


def remove_partial(out_dir: Path) -> None:
    """After a failed preparation: drop what was written (only our own shard/tokenizer files)."""
    if not out_dir.is_dir() or (out_dir / MANIFEST).exists():
        return
    for p in out_dir.iterdir():
        if p.is_file() and (p.suffix == ".bin" or p.name == "tokenizer.json" or p.name.startswith(".")):
            p.unlink()
    if not any(out_dir.iterdir()):
        shutil.rmtree(out_dir, ignore_errors=True)
