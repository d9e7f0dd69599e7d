"""The global model G_n (parameters + outer momentum): held, advanced, saved and fetched by hash.

Hosts and verifiers both need it: a host trains from G_n and applies the outer step; a verifier
checks that a revealed start state begins at G_n. The outer step itself is `protocol.outer`'s
(bitwise identical everywhere); this module only feeds it *decoded, accepted* Δs and keeps the
result on disk under its `global_model_hash`, verified on every read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from protocol.codecs import Layout
from protocol.config import OuterOptim
from protocol.outer import global_model_hash, outer_update
from trainer.blobs import BlobClient, tensors_from_bytes, tensors_to_bytes
from trainer.store import atomic_write

PARAM, MOMENTUM = "param/", "momentum/"
_HEX = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_BYTES = 4 << 30
Tensors = Mapping[str, Tensor]


class GlobalModelError(ValueError):
    """A global model that is malformed, does not fit the model, or does not match its hash."""


@dataclass(frozen=True)
class GlobalModel:
    """G_n: float32 parameters and outer momentum by parameter name, and their hash."""

    params: dict[str, Tensor]
    momentum: dict[str, Tensor]
    hash: str

    @classmethod
    def create(cls, params: Tensors, momentum: Tensors | None = None) -> GlobalModel:
        p = {k: v.detach().to("cpu", torch.float32).clone().contiguous() for k, v in params.items()}
        m = (
            {k: torch.zeros_like(v) for k, v in p.items()}
            if momentum is None
            else {k: v.detach().to("cpu", torch.float32).clone().contiguous() for k, v in momentum.items()}
        )  # in host memory whatever device the model trains on: G is hashed, stored and served
        _check_pairs(p, m)
        return cls(p, m, global_model_hash(p, m))

    @classmethod
    def from_module(cls, model: nn.Module) -> GlobalModel:
        """G_0 from a freshly built model: its parameters and zero momentum."""
        return cls.create(dict(model.named_parameters()))

    @property
    def layout(self) -> Layout:
        """Shapes by name: what a Δ payload must match before it is decoded."""
        return {k: tuple(v.shape) for k, v in self.params.items()}

    def numel(self) -> int:
        return sum(v.numel() for v in self.params.values())

    def to_tensors(self) -> dict[str, Tensor]:
        """The served form's names: `param/<n>` and `momentum/<n>`."""
        out = {PARAM + k: v for k, v in self.params.items()}
        out.update({MOMENTUM + k: v for k, v in self.momentum.items()})
        return out

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Tensor], expected_hash: str | None = None) -> GlobalModel:
        params = {k[len(PARAM) :]: v for k, v in tensors.items() if k.startswith(PARAM)}
        momentum = {k[len(MOMENTUM) :]: v for k, v in tensors.items() if k.startswith(MOMENTUM)}
        if len(params) + len(momentum) != len(tensors):
            raise GlobalModelError("global model holds names other than param/* and momentum/*")
        _check_pairs(params, momentum)
        got = global_model_hash(params, momentum)
        if expected_hash is not None and got != expected_hash:
            raise GlobalModelError(f"global model hash {got[:12]} != expected {expected_hash[:12]}")
        return cls(dict(params), dict(momentum), got)

    def check_fits(self, model: nn.Module) -> None:
        """Refuse a G_n whose names/shapes are not this model's (it came from a peer)."""
        want = {n: tuple(p.shape) for n, p in model.named_parameters()}
        if want != dict(self.layout):
            raise GlobalModelError("global model does not match the run's model layout")

    def load_into(self, model: nn.Module) -> None:
        self.check_fits(model)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(self.params[n])

    def apply(self, deltas: Sequence[tuple[str, int, Tensors]], outer: OuterOptim) -> GlobalModel:
        """G_{n+1} from the decoded Δs of the *accepted* hosts only: (host, tokens, Δ).

        With no accepted Δ the model stays as it is (nothing verified to learn from).
        """
        if not deltas:
            return self
        for host, tokens, delta in deltas:
            if tokens <= 0:
                raise GlobalModelError(f"{host}: accepted Δ with {tokens} tokens")
            if {k: tuple(v.shape) for k, v in delta.items()} != dict(self.layout):
                raise GlobalModelError(f"{host}: Δ layout does not match the global model")
        params, momentum = outer_update(self.params, self.momentum, deltas, outer.lr, outer.momentum)
        return GlobalModel.create(params, momentum)


def _check_pairs(params: Mapping[str, Tensor], momentum: Mapping[str, Tensor]) -> None:
    if not params:
        raise GlobalModelError("global model has no parameters")
    if set(params) != set(momentum):
        raise GlobalModelError("parameter and momentum names differ")
    for k, p in params.items():
        m = momentum[k]
        if p.dtype != torch.float32 or m.dtype != torch.float32 or p.shape != m.shape:
            raise GlobalModelError(f"{k}: parameters and momentum must be float32 of one shape")
        if not (bool(torch.isfinite(p).all()) and bool(torch.isfinite(m).all())):
            raise GlobalModelError(f"{k}: NaN or Inf in the global model")


def model_verifier(expected_hash: str, max_tensors: int = 1 << 16):
    """`BlobClient.get` verify callback for a served global model."""

    def verify(data: bytes) -> None:
        GlobalModel.from_tensors(tensors_from_bytes(data, max_tensors), expected_hash)

    return verify


class GlobalStore:
    """`<root>/<hash>.safetensors`: every global model a node holds, re-verified on each read."""

    def __init__(self, root: Path | str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes

    def _path(self, h: str) -> Path:
        if not _HEX.match(h):
            raise GlobalModelError(f"not a global model hash: {h!r}")
        return self.root / f"{h}.safetensors"

    def has(self, h: str) -> bool:
        return self._path(h).is_file()

    def hashes(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob("*.safetensors") if _HEX.match(p.stem))

    def save(self, gm: GlobalModel) -> str:
        path = self._path(gm.hash)
        if not path.exists():
            atomic_write(path, tensors_to_bytes(gm.to_tensors()))
        return gm.hash

    def get_bytes(self, h: str) -> bytes:
        """The stored bytes after checking they still hash to `h` (what the node serves)."""
        path = self._path(h)
        if not path.is_file():
            raise GlobalModelError(f"global model {h[:12]} is not on disk")
        if path.stat().st_size > self.max_bytes:
            raise GlobalModelError(f"{path.name} exceeds {self.max_bytes} bytes")
        data = path.read_bytes()
        model_verifier(h)(data)
        return data

    def load(self, h: str) -> GlobalModel:
        return GlobalModel.from_tensors(tensors_from_bytes(self.get_bytes(h)), h)

    def fetch(self, h: str, client: BlobClient, endpoints: Sequence[str] | None = None) -> GlobalModel:
        """From disk if held, else from peers by its on-chain hash (verified), then kept on disk."""
        if self.has(h):
            try:
                return self.load(h)
            except (GlobalModelError, ValueError):
                self._path(h).unlink(missing_ok=True)  # corrupted on our disk: fetch a good copy
        data = client.get("model", h, model_verifier(h), endpoints=endpoints, max_bytes=self.max_bytes)
        gm = GlobalModel.from_tensors(tensors_from_bytes(data), h)
        atomic_write(self._path(h), data)
        return gm

    def prune(self, keep: Sequence[str]) -> list[str]:
        gone = [h for h in self.hashes() if h not in set(keep)]
        for h in gone:
            self._path(h).unlink(missing_ok=True)
        return gone
