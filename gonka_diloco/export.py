"""`gonka-diloco model export`: a finished run's final global model, out as a model folder.

Where the bytes come from: the disks of a devnet run folder's nodes (its snapshot.json names the
run, its config and its final model hash), one node's `data_dir` (the chain names them), or the
run's nodes over HTTP (by the chain's hash). Whatever the source, the parameters are read through
the content store's own verified reads: each chunk is checked against digests that hash to the
final model hash the chain adopted, so the exported tensors are exactly G's parameters. The outer
momentum is never exported, nor even fetched from the network (its chunks are skipped).

The folder (written beside its target and renamed into place, so a failed export leaves nothing):
- `model.safetensors`: the inner model's parameters, under Hugging Face names for the `transformers`
  presets and the project's own for the built-in GPT. G's parameters are one contiguous byte range
  of its canonical form, in name order, little-endian float32 — a safetensors data section as it
  is — so a float32 export copies that range chunk by chunk: O(chunk) memory at any model size.
  Another dtype converts one tensor at a time.
- `config.json`: the `transformers` config for `AutoModelForCausalLM.from_pretrained`, or the GPT's
  config; both carry a `gonka_diloco` section (format, the run's `ModelSpec`, provenance) that
  `replay.spec.load_exported` rebuilds the model from.
- `tokenizer.json` (+ `tokenizer_config.json`): the dataset's tokenizer, or for a byte-level run one
  that maps each UTF-8 byte to its own id; left out (and said so) when the dataset is not known.
- `MODEL.md`: where the model came from — run, chain, final hash, outer steps, tokens, loss.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gonka_diloco.report import SNAPSHOT_FILE, ReportError, Snapshot, load_snapshot
from nodekit.globalmodel import GROUP, PARAM
from nodekit.objects import Kind, ObjectRef, model_specs
from nodekit.store import ContentStore, StoreError
from nodekit.storefiles import StoredTensors
from protocol.config import RunConfig
from protocol.tensors import canonical_header, canonical_size, data_offsets
from replay.spec import (
    CONFIG_FILE,
    EXPORT_FORMAT,
    EXPORT_KEY,
    WEIGHTS_FILE,
    BadModelSpec,
    ModelNotAllowed,
    export_name,
    meta_layout,
)

MODEL_FILE = "MODEL.md"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
DTYPES = {
    "float32": (torch.float32, "F32"),
    "bfloat16": (torch.bfloat16, "BF16"),
    "float16": (torch.float16, "F16"),
}
HOLDER_ORDER = {"host": 0, "verifier": 1}
"""A run folder's nodes are read honest hosts first, then honest verifiers, then the rest."""
FETCH_TIMEOUT_S = 60.0


class ExportError(ValueError):
    """The model cannot be exported; one line naming the run, hash, path or URL at fault."""


@dataclass(frozen=True)
class Provenance:
    """What MODEL.md says about where the model came from."""

    run_id: int
    model_hash: str
    outer_steps: int
    tokens_seen: int
    val_loss: float | None
    first_val_loss: float | None
    chain_id: str
    chain_url: str
    read_from: str = ""

    def with_source(self, read_from: str) -> Provenance:
        return Provenance(**{**self.__dict__, "read_from": read_from})


@dataclass(frozen=True)
class Tokenizer:
    """The run's tokenizer as files to ship: `raw` is a tokenizer.json (None: not known)."""

    kind: str  # bytes | tokenizers | unknown
    raw: bytes | None = None
    eot: int | None = None
    note: str = ""


@dataclass
class Final:
    """A finished run's final model: its config, provenance, and the stores that may hold it."""

    cfg: RunConfig
    prov: Provenance
    holders: list[tuple[str, Path]] = field(default_factory=list)  # (who, store root), in order
    dataset: str | None = None  # where the run's dataset is, when the source says


# ---------------------------------------------------------------- sources


def final_from_snapshot(snap: Snapshot, folder: Path, chain_id: str = "") -> Final:
    """A devnet run folder's final model: the run, config and hash its snapshot records, read from
    its nodes' disks (`<folder>/<node>/store`)."""
    if snap.run_status != "finished":
        raise ExportError(
            f"run {snap.run_id} in {folder} is {snap.run_status or 'not recorded'}, not finished: "
            "only a finished run has a final model"
        )
    done = [s for s in sorted(snap.steps, key=lambda s: s.index) if s.phase == "DONE" and s.result_hash]
    if not done or not snap.config:
        raise ExportError(f"{folder / SNAPSHOT_FILE} records no final model hash or run config")
    cfg = _run_config(snap.config, f"{folder / SNAPSHOT_FILE}")
    devnet = "gonka-devnet" if snap.source == "devnet" else ""  # what every devnet's chain is called
    prov = _provenance(snap, done[-1].result_hash or "", chain_id or snap.chain_id or devnet)
    honest = sorted(
        (n for n in snap.nodes if n.role in HOLDER_ORDER),
        key=lambda n: (n.behaviour not in ("honest", "unknown"), HOLDER_ORDER[n.role], n.name),
    )
    holders = [(f"{n.name}'s disk", folder / n.name / "store") for n in honest]
    dataset = _devnet_dataset(folder)
    return Final(cfg, prov, holders, dataset)


def final_from_folder(folder: Path) -> Final:
    """`model export RUN_FOLDER`: the snapshot.json a devnet wrote at its end."""
    try:
        snap = load_snapshot(folder)
    except ReportError as e:
        raise ExportError(str(e)) from None
    return final_from_snapshot(snap, folder)


def final_from_chain(
    chain: Any, run_id: int, url: str, data_dir: Path | None = None
) -> tuple[Final, list[str]]:
    """A run on a chain (any client with `query`/`height`): its config and final hash from the
    chain, with the endpoints of its participants (who may serve the model). With `data_dir`, the
    model is read from that node's disk instead."""
    from gonka_diloco.collect import collect

    try:
        run = chain.query("run", run_id=run_id)
    except Exception as e:  # transport or unknown run: one clear line
        text = str(e)
        if "404" in text or "ErrUnknownRun" in text or "unknown run" in text.lower():
            raise ExportError(f"no run {run_id} on {url}") from None
        raise ExportError(f"cannot read run {run_id} from the chain at {url}: {_short(e)}") from None
    if run["status"] != "finished":
        raise ExportError(
            f"run {run_id} on {url} is {run['status']} (outer step {run['current_step']}), not finished: "
            "its final model may still change"
        )
    cfg = _run_config(run["config"], f"run {run_id}'s config on {url}")
    try:
        snap = collect(chain, run_id)
        parts = chain.query("participants", run_id=run_id)["participants"]
    except Exception as e:
        raise ExportError(f"cannot read run {run_id} from the chain at {url}: {_short(e)}") from None
    prov = _provenance(snap, run["global_model_hash"], chain_id_of(chain), url)
    endpoints = [p["endpoint"] for p in sorted(parts, key=lambda p: HOLDER_ORDER.get(p["role"], 2))
                 if p.get("endpoint")]  # fmt: skip
    final = Final(cfg, prov)
    if data_dir is not None:
        final.holders = [(f"{data_dir}", data_dir / "store")]
    return final, endpoints


def _run_config(data: Any, where: str) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValueError as e:
        raise ExportError(f"{where}: not a valid run config ({_short(e)})") from None


def _provenance(snap: Snapshot, model_hash: str, chain_id: str, url: str = "") -> Provenance:
    val = snap.val_loss()
    seen = snap.tokens_seen()
    return Provenance(
        run_id=snap.run_id, model_hash=model_hash, outer_steps=sum(s.phase == "DONE" for s in snap.steps),
        tokens_seen=max(seen.values(), default=0), val_loss=list(val.values())[-1] if val else None,
        first_val_loss=next(iter(val.values())) if val else None, chain_id=chain_id,
        chain_url=url or snap.chain_url,
    )  # fmt: skip


def chain_id_of(chain: Any) -> str:
    """The chain's own id (its status route); the in-process chain's attribute."""
    from gonka_diloco.collect import bounded_get

    for base in getattr(chain, "urls", None) or []:
        raw = bounded_get(f"{base.rstrip('/')}/inference/diloco/v1/status", 1 << 20, 5.0)
        try:
            chain_id = json.loads(raw).get("chain_id") if raw else None
        except (ValueError, AttributeError):
            chain_id = None
        if isinstance(chain_id, str) and chain_id:
            return chain_id
    return str(getattr(getattr(chain, "app", None), "chain_id", "") or getattr(chain, "chain_id", ""))


def _devnet_dataset(folder: Path) -> str | None:
    """The dataset a devnet ran on ('' = Shakespeare), from its devnet.json; None if unknown."""
    try:
        data = json.loads((folder / "devnet.json").read_text())
    except (OSError, ValueError):
        return None
    ds = data.get("dataset") if isinstance(data, dict) else None
    return ds if isinstance(ds, str) else None


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


# ---------------------------------------------------------------- the tokenizer


def run_tokenizer(cfg: RunConfig, dataset: str | None) -> Tokenizer:
    """The tokenizer of the run's dataset (`dataset`: its folder, manifest or URL; '' = Shakespeare;
    None = unknown, in which case only the built-in Shakespeare is recognised by its hash)."""
    from replay.data import DataError, open_dataset, read_bounded, shakespeare_manifest, split_source
    from replay.prepare import MAX_TOKENIZER_BYTES

    if dataset is None:
        try:
            if shakespeare_manifest()[1].manifest_hash() == cfg.dataset_manifest_hash:
                return Tokenizer("bytes")
        except DataError:
            pass
        return Tokenizer(
            "unknown",
            note=f"not included: the run's dataset ({cfg.dataset_manifest_hash[:12]}) was not named "
            "(`--dataset DIR|URL` adds its tokenizer)",
        )
    try:
        corpus = open_dataset(dataset)
    except DataError as e:
        raise ExportError(f"--dataset: {e}") from None
    if corpus.manifest_hash != cfg.dataset_manifest_hash:
        raise ExportError(
            f"dataset {dataset or 'Shakespeare'!r} has manifest {corpus.manifest_hash[:12]}, the run's is "
            f"{cfg.dataset_manifest_hash[:12]}"
        )
    info = corpus.manifest.tokenizer if corpus.manifest is not None else None
    if info is None or info.kind == "bytes":
        return Tokenizer("bytes")
    base, _ = split_source(dataset)
    location = f"{base.rstrip('/')}/{info.file}" if "://" in base else str(Path(base) / info.file)
    try:
        raw = read_bounded(location, MAX_TOKENIZER_BYTES)
    except DataError as e:
        raise ExportError(f"--dataset: {e}") from None
    if hashlib.sha256(raw).hexdigest() != info.sha256:
        raise ExportError(f"{location} is not the tokenizer the dataset's manifest names (sha256 differs)")
    return Tokenizer("tokenizers", raw, info.eot_token)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (what the `tokenizers` ByteLevel steps use)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def byte_tokenizer_json() -> bytes:
    """A tokenizer.json whose ids are the UTF-8 bytes themselves (id = byte value, no merges): the
    byte-level runs' tokenizer, so `AutoTokenizer` and `model sample` read every export alike."""
    from tokenizers import Tokenizer as Tok
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tok(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str().encode()


# ---------------------------------------------------------------- writing


def export(
    final: Final, out: Path, *, dtype: str = "float32", tokenizer: Tokenizer | None = None
) -> tuple[Path, str]:
    """Write the folder from the first holder whose copy reads back intact; returns it and who that
    was. `ExportError` naming each holder's reason when none does. `out` must not exist yet (or be
    an empty folder)."""
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} already exists and is not an empty folder: give a new --out")
    h = final.prov.model_hash
    try:
        layout = meta_layout(final.cfg.model)
    except (BadModelSpec, ModelNotAllowed) as e:
        raise ExportError(f"run {final.prov.run_id}'s model: {e}") from None
    tok = tokenizer if tokenizer is not None else run_tokenizer(final.cfg, final.dataset)
    reasons = []
    for who, root in final.holders:
        if not root.is_dir():
            reasons.append(f"{who}: no store at {root}")
            continue
        store = ContentStore(root, final.cfg.state_chunk_bytes)
        if not store.has(Kind.MODEL, h, GROUP):
            reasons.append(f"{who}: not on disk")
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.export-"))
        try:
            _write(store, final, who, layout, tmp, dtype, tok, out.name)
        except StoreError as e:  # this copy is not G's (corrupted, truncated, another layout)
            shutil.rmtree(tmp, ignore_errors=True)
            reasons.append(f"{who}: {_short(e)}")
            continue
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if out.is_dir():
            out.rmdir()  # the empty folder it replaces
        os.replace(tmp, out)
        return out, who
    why = "; ".join(reasons) or "nobody to ask"
    raise ExportError(f"no holder has run {final.prov.run_id}'s final model {h[:12]} intact ({why})")


def _write(
    store: ContentStore, final: Final, who: str, layout: dict[str, tuple[int, ...]], out: Path, dtype: str,
    tok: Tokenizer, name: str,
) -> None:  # fmt: skip
    """Every file of the folder into `out` (a temp folder that becomes `name`)."""
    prov = final.prov.with_source(who)
    spec = final.cfg.model
    weights = write_safetensors(store, prov.model_hash, layout, spec.factory, out / WEIGHTS_FILE, dtype, prov)
    raw = tok.raw if tok.kind == "tokenizers" else byte_tokenizer_json() if tok.kind == "bytes" else None
    section = {
        "format": EXPORT_FORMAT, "model_spec": spec.model_dump(mode="json"),
        "tokenizer": tok.kind, "weights_sha256": weights["sha256"], "dtype": dtype,
        "provenance": {k: v for k, v in prov.__dict__.items() if k != "read_from"},
    }  # fmt: skip
    config = _config_json(final.cfg, section, tok, dtype)
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if raw is not None:
        (out / TOKENIZER_FILE).write_bytes(raw)
        tok_cfg: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": False,
            "model_max_length": _context(final.cfg),
        }
        if tok.eot is not None:
            from tokenizers import Tokenizer as Tok

            tok_cfg["eos_token"] = Tok.from_str(raw.decode()).id_to_token(tok.eot)
        (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / MODEL_FILE).write_text(model_md(final.cfg, prov, weights, tok, name))
    for p in out.iterdir():
        with open(p, "rb") as f:
            os.fsync(f.fileno())


def _context(cfg: RunConfig) -> int:
    c = cfg.model.config
    return int(c.get("block_size") or c.get("max_position_embeddings") or cfg.seq_len)


def _config_json(cfg: RunConfig, section: dict[str, Any], tok: Tokenizer, dtype: str) -> dict[str, Any]:
    """A `transformers` config for the HF presets (AutoModelForCausalLM loads the folder), else the
    GPT's own config; both with the `gonka_diloco` section the project's loader reads."""
    from replay import hf

    arch = hf.FACTORIES.get(cfg.model.factory)
    if arch is None:
        return {"model_type": "gonka_diloco_gpt", **cfg.model.config, EXPORT_KEY: section}
    try:
        hf_cfg = hf.hf_config(arch, **cfg.model.config)
    except ValueError as e:
        raise ExportError(f"run model {cfg.model.factory}: {e}") from None
    hf_cfg.architectures = [hf.ARCHS[arch][1]]
    hf_cfg.use_cache = True  # generation; the maths is the same
    hf_cfg.bos_token_id = None
    hf_cfg.eos_token_id = tok.eot
    hf_cfg.pad_token_id = None
    out = hf_cfg.to_dict()
    out["dtype"] = dtype
    out[EXPORT_KEY] = section
    return out


def write_safetensors(
    store: ContentStore, h: str, layout: dict[str, tuple[int, ...]], factory: str, path: Path, dtype: str,
    prov: Provenance,
) -> dict[str, Any]:  # fmt: skip
    """G's parameters as a safetensors file, tensor names `export_name`'d; returns its sha256,
    size and tensor count. The stored header is checked against the run's layout first and every
    chunk read is verified (`StoreError` if the copy is not G's)."""
    specs = model_specs(layout)
    if canonical_size(specs) != store.length(Kind.MODEL, h, GROUP):
        raise StoreError(f"model {h[:12]} on disk does not have the run's layout")
    params = StoredTensors(store, Kind.MODEL, h, specs, GROUP, PARAM)  # digests vs hash, header vs layout
    offsets = {n[len(PARAM) :]: span for n, span in data_offsets(specs).items() if n.startswith(PARAM)}
    torch_dtype, st_dtype = DTYPES[dtype]
    size = torch.tensor([], dtype=torch_dtype).element_size()
    names = sorted(offsets, key=lambda n: n.encode())
    header: dict[str, Any] = {"__metadata__": {
        "format": "pt", "gonka_diloco.run_id": str(prov.run_id), "gonka_diloco.model_hash": h,
        "gonka_diloco.chain_id": prov.chain_id,
    }}  # fmt: skip
    pos = 0
    for n in names:
        nbytes = torch.Size(layout[n]).numel() * size
        span = [pos, pos + nbytes]
        header[export_name(factory, n)] = {"dtype": st_dtype, "shape": list(layout[n]), "data_offsets": span}
        pos += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    digest = hashlib.sha256()
    with open(path, "wb") as f:

        def put(piece: bytes | memoryview) -> None:
            digest.update(piece)
            f.write(piece)

        put(struct.pack("<Q", len(head)) + head)
        if dtype == "float32":  # the stored bytes as they are: one verified chunk at a time
            params.release()  # (it checked the header; its cached chunk is not needed)
            start, end = offsets[names[0]][0], offsets[names[-1]][1]
            contiguous = all(offsets[a][1] == offsets[b][0] for a, b in itertools.pairwise(names))
            if not contiguous or end - start != pos:  # pragma: no cover - the canonical form guarantees it
                raise StoreError(f"model {h[:12]}: parameters are not one contiguous range")
            for piece in store.read(Kind.MODEL, h, start, end, GROUP):
                put(piece)
        else:
            for n in names:
                put(params[n].to(torch_dtype).contiguous().view(torch.uint8).numpy().tobytes())
        params.release()
    return {"sha256": digest.hexdigest(), "bytes": path.stat().st_size, "tensors": len(names),
            "params": sum(torch.Size(s).numel() for s in layout.values())}  # fmt: skip


def model_md(cfg: RunConfig, prov: Provenance, weights: dict[str, Any], tok: Tokenizer, folder: str) -> str:
    """MODEL.md: what a downloaded model says about where it came from, and how to load it."""
    from replay import hf

    loss = "n/a"
    if prov.val_loss is not None:
        ppl = _ppl(prov.val_loss)
        loss = f"{prov.val_loss:.4f} nats/token after the last outer step (perplexity {ppl:.2f})"
        if prov.first_val_loss is not None:
            loss += f"; {prov.first_val_loss:.4f} after the first"
    token_row = {
        "bytes": "byte-level: each UTF-8 byte is its own token id (tokenizer.json maps them)",
        "tokenizers": "the dataset's tokenizer (tokenizer.json, checked against its manifest)",
    }.get(tok.kind, tok.note)
    rows = [
        ("run", f"{prov.run_id}"),
        ("chain", f"`{prov.chain_id or 'unknown'}`" + (f" at {prov.chain_url}" if prov.chain_url else "")),
        ("final global model hash", f"`{prov.model_hash}`"),
        ("outer steps", str(prov.outer_steps)),
        ("tokens seen", f"{prov.tokens_seen:,} (the accepted contributions')"),
        ("validation loss", loss),
        ("model", f"`{cfg.model.factory}`, {weights['params']:,} parameters, {weights['tensors']} tensors"),
        ("initial model (G_0) hash", f"`{cfg.initial_model_hash}`"),
        ("dataset manifest hash", f"`{cfg.dataset_manifest_hash}`"),
        ("tokenizer", token_row),
        ("model.safetensors", f"{weights['bytes']:,} bytes, sha256 `{weights['sha256']}`"),
        ("read from", prov.read_from or "-"),
    ]
    table = "\n".join(["| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows]])
    if cfg.model.factory in hf.FACTORIES:
        load = (
            "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f'model = AutoModelForCausalLM.from_pretrained("{folder}")  # this folder\n'
            + (f'tokenizer = AutoTokenizer.from_pretrained("{folder}")\n' if tok.kind != "unknown" else "")
            + "```"
        )
    else:
        load = (
            "```python\nfrom replay.spec import load_exported  # the gonka-diloco package\n"
            f'model = load_exported("{folder}")  # this folder; model(token_ids) -> logits\n```'
        )
    return f"""# gonka-diloco run {prov.run_id}: final model

{table}

These are the parameters of the global model the chain adopted at the end of the run (the hash a
majority of its accepted hosts computed): every chunk read to write model.safetensors was checked
against chunk digests that hash to the final model hash above. The outer momentum is not included.

## Load it

{load}

or, with gonka-diloco installed: `gonka-diloco model sample {folder} --prompt "..."`.
"""


def _ppl(loss: float) -> float:
    import math

    return math.exp(min(loss, 700.0))


# ---------------------------------------------------------------- fetching from the run's nodes


def fetch_params(final: Final, endpoints: Sequence[str], root: Path) -> tuple[str, Path]:
    """G's header and parameter chunks from the run's nodes into a scratch store at `root`, each
    chunk verified against the digests that hash to the final model hash; the momentum's chunks
    are never asked for (half the bytes). Returns the holder to export from: (who, store root)."""
    from nodekit.fetch import BlobClient, BlobError

    h, run_id = final.prov.model_hash, final.prov.run_id
    if not endpoints:
        raise ExportError(f"no node of run {run_id} has an endpoint to fetch its final model {h[:12]} from")
    try:
        layout = meta_layout(final.cfg.model)
    except (BadModelSpec, ModelNotAllowed) as e:
        raise ExportError(f"run {run_id}'s model: {e}") from None
    specs = model_specs(layout)
    length, chunk = canonical_size(specs), final.cfg.state_chunk_bytes
    ref = ObjectRef(Kind.MODEL, h, length, chunk)
    params = [span for n, span in data_offsets(specs).items() if n.startswith(PARAM)]
    wanted = [(0, len(canonical_header(specs))), (min(a for a, _ in params), max(b for _, b in params))]
    need = {i for a, b in wanted for i in range(a // chunk, -(-b // chunk))}
    store = ContentStore(root, chunk)
    sink = store.begin(Kind.MODEL, h, GROUP, length)
    try:
        with BlobClient(endpoints, FETCH_TIMEOUT_S, 2) as client:
            report = client.fetch(ref, sink, endpoints, have=set(range(ref.n_chunks)) - need)
    except BlobError as e:
        store.abort(sink)
        raise ExportError(f"no node of run {run_id} serves its final model {h[:12]}: {_short(e)}") from None
    store.commit(Kind.MODEL, h, GROUP, sink, report.digests)
    return f"fetched from {len(report.bytes_from)} of the run's {len(endpoints)} nodes", root


def verify_export(folder: Path) -> None:
    """model.safetensors hashes to the sha256 its config.json records (one streaming pass): a file
    corrupted or changed since the export is refused before it is loaded."""
    from replay.spec import ExportedModelError, exported_section

    want = exported_section(folder).get("weights_sha256")
    path = folder / WEIGHTS_FILE
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                digest.update(block)
    except OSError as e:
        raise ExportedModelError(f"{path}: {e.strerror or e}") from None
    if digest.hexdigest() != want:
        raise ExportedModelError(
            f"{path} does not hash to the sha256 its config.json records (corrupted or changed since export)"
        )
