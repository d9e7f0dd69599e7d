"""The global model G_n (parameters + outer momentum): held, advanced, saved and fetched by hash.

Hosts and verifiers both need it: a host trains from G_n and applies the outer step; a verifier
rebuilds segment 0's start from it. The outer step itself is `protocol.outer`'s (bitwise identical
everywhere); `next_global` feeds it accepted Δ payloads one at a time, decoded tensor by tensor
(`protocol.outer.Accumulator`), so aggregation holds the running sum, one tensor of one Δ and
G_{n+1} as it is computed. G is stored in the node's `ContentStore` under its chunked hash and
fetched chunk by chunk; a G loaded from the store (`GlobalStore.load`) is read tensor by tensor
from disk when used (`StoredTensors`), so a node does not hold G_n's 8 B/param through a step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nodekit.fetch import BlobClient
from nodekit.flight import FLIGHTS
from nodekit.holdings import fetch_to_store, flight_key
from nodekit.objects import Kind, ObjectRef, model_specs
from nodekit.store import ContentStore, StoreError, TensorSink
from nodekit.storefiles import StoredTensors
from protocol.chunks import DEFAULT_CHUNK_BYTES
from protocol.codecs import Layout
from protocol.config import OuterOptim
from protocol.outer import Accumulator, OuterError, SparseAccumulator, global_model_hash, outer_update
from protocol.tensors import canonical_pieces, canonical_size

PARAM, MOMENTUM = "param/", "momentum/"
GROUP = "global"
Tensors = Mapping[str, Tensor]


class GlobalModelError(ValueError):
    """A global model that is malformed, does not fit the model, or does not match its hash."""


class BadPayload(GlobalModelError):
    """An accepted sparse payload that does not decode (it hashed right: its author's fault)."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(detail)
        self.host = host


@dataclass(frozen=True)
class GlobalModel:
    """G_n: float32 parameters and outer momentum by parameter name, and their hash. The tensors
    are in memory (`create`, `adopt`, a computed G_{n+1}) or read from disk on use (`stored`)."""

    params: Mapping[str, Tensor]
    momentum: Mapping[str, Tensor]
    hash: str
    chunk_bytes: int = DEFAULT_CHUNK_BYTES

    @property
    def stored(self) -> bool:
        """Whether the tensors are read from disk when used (no 8 B/param held)."""
        return isinstance(self.params, StoredTensors)

    @classmethod
    def create(
        cls, params: Tensors, momentum: Tensors | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> GlobalModel:
        p = {k: v.detach().to("cpu", torch.float32).clone().contiguous() for k, v in params.items()}
        m = (
            {k: torch.zeros_like(v) for k, v in p.items()}
            if momentum is None
            else {k: v.detach().to("cpu", torch.float32).clone().contiguous() for k, v in momentum.items()}
        )  # in host memory whatever device the model trains on: G is hashed, stored and served
        _check_pairs(p, m)
        return cls(p, m, global_model_hash(p, m, chunk_bytes), chunk_bytes)

    @classmethod
    def adopt(cls, params: dict[str, Tensor], momentum: dict[str, Tensor], chunk_bytes: int) -> GlobalModel:
        """G from tensors the caller just computed and hands over (no copies: 8 B/param saved)."""
        _check_pairs(params, momentum)
        return cls(params, momentum, global_model_hash(params, momentum, chunk_bytes), chunk_bytes)

    @classmethod
    def from_module(cls, model: nn.Module, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> GlobalModel:
        """G_0 from a freshly built model: its parameters and zero momentum."""
        return cls.create(dict(model.named_parameters()), chunk_bytes=chunk_bytes)

    @property
    def layout(self) -> Layout:
        """Shapes by name: what a Δ payload must match before it is decoded."""
        if isinstance(self.params, StoredTensors):
            return self.params.shapes
        return {k: tuple(v.shape) for k, v in self.params.items()}

    def numel(self) -> int:
        n = 0
        for shape in self.layout.values():
            n += torch.Size(shape).numel()
        return n

    def to_tensors(self) -> dict[str, Tensor]:
        """The served form's names: `param/<n>` and `momentum/<n>`."""
        out = {PARAM + k: v for k, v in self.params.items()}
        out.update({MOMENTUM + k: v for k, v in self.momentum.items()})
        return out

    @classmethod
    def from_tensors(
        cls,
        tensors: Mapping[str, Tensor],
        expected_hash: str | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> GlobalModel:
        params = {k[len(PARAM) :]: v for k, v in tensors.items() if k.startswith(PARAM)}
        momentum = {k[len(MOMENTUM) :]: v for k, v in tensors.items() if k.startswith(MOMENTUM)}
        if len(params) + len(momentum) != len(tensors):
            raise GlobalModelError("global model holds names other than param/* and momentum/*")
        _check_pairs(params, momentum)
        got = global_model_hash(params, momentum, chunk_bytes)
        if expected_hash is not None and got != expected_hash:
            raise GlobalModelError(f"global model hash {got[:12]} != expected {expected_hash[:12]}")
        return cls(dict(params), dict(momentum), got, chunk_bytes)

    def check_fits(self, model: nn.Module) -> None:
        """Refuse a G_n whose names/shapes are not this model's (it came from a peer)."""
        want = {n: tuple(p.shape) for n, p in model.named_parameters()}
        if want != dict(self.layout):
            raise GlobalModelError("global model does not match the run's model layout")

    def load_into(self, model: nn.Module) -> None:
        """Copy the parameters into `model`, one tensor at a time in name order (one pass over a
        stored G's file)."""
        self.check_fits(model)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n in sorted(params):
                params[n].copy_(self.params[n])

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
        params, momentum = outer_update(
            self.params, self.momentum, deltas, outer.lr, outer.momentum, rule=outer.rule
        )
        return GlobalModel.adopt(params, momentum, self.chunk_bytes)

    def apply_streamed(
        self,
        tokens: Mapping[str, int],
        delta_of: Callable[[str], Iterable[tuple[str, Tensor]]],
        outer: OuterOptim,
    ) -> GlobalModel:
        """G_{n+1} with one Δ at a time: `delta_of(host)` yields that host's decoded tensors; hosts
        are asked in sorted order. The same bits as `apply` (protocol.outer.Accumulator)."""
        if not tokens:
            return self
        if any(w <= 0 for w in tokens.values()):
            raise GlobalModelError("an accepted Δ with no tokens")
        acc = Accumulator(self.layout, tokens)
        while acc.next_host is not None:
            acc.add(acc.next_host, delta_of(acc.next_host))
        params, momentum = acc.finish(self.params, self.momentum, outer.lr, outer.momentum, outer.rule)
        del acc  # (finish consumed the running sum tensor by tensor)
        return GlobalModel.adopt(params, momentum, self.chunk_bytes)

    def apply_sparse(
        self,
        tokens: Mapping[str, int],
        payload_of: Callable[[str], bytes | memoryview],
        outer: OuterOptim,
        *,
        chunk: int,
        topk: int,
    ) -> GlobalModel:
        """G_{n+1} over accepted sparse payloads (specs §4.1): g = +0, then each host's kept entries
        added in sorted host order straight from its payload (`payload_of(host)`, asked once each),
        so no Δ is ever dense; then the run's outer rule (NESTEROV or AVERAGE) over the mean its
        `outer.sparse_mean` names. Memory: the running sum (one model's size), with CONTRIBUTORS a
        count per coordinate (1 byte up to 255 hosts), and one payload. The same bits as
        `protocol.outer.sparse_outer_update`."""
        if not tokens:
            return self
        if any(w <= 0 for w in tokens.values()):
            raise GlobalModelError("an accepted Δ with no tokens")
        acc = SparseAccumulator(self.layout, tokens, chunk=chunk, topk=topk, mean=outer.sparse_mean)
        while (host := acc.next_host) is not None:
            try:
                acc.add(host, payload_of(host))
            except OuterError as e:  # it hashes right and does not decode: nobody can use it
                raise BadPayload(host, str(e)) from e
        params, momentum = acc.finish(self.params, self.momentum, outer.lr, outer.momentum, outer.rule)
        del acc
        return GlobalModel.adopt(params, momentum, self.chunk_bytes)


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


class GlobalStore:
    """Every global model a node holds, in its content store (group `global`), verified on read."""

    def __init__(self, store: ContentStore, layout: Layout | None = None) -> None:
        self.store = store
        self.chunk_bytes = store.chunk_bytes
        self.layout = dict(layout) if layout is not None else None

    def has(self, h: str) -> bool:
        return self.store.has(Kind.MODEL, h, GROUP)

    def hashes(self) -> list[str]:
        return self.store.hashes(Kind.MODEL, GROUP)

    def save(self, gm: GlobalModel) -> str:
        if gm.chunk_bytes != self.chunk_bytes:
            raise GlobalModelError(
                f"G hashed with {gm.chunk_bytes}-byte chunks, the store uses {self.chunk_bytes}"
            )
        if not self.has(gm.hash):
            self.store.put_pieces(Kind.MODEL, canonical_pieces(gm.to_tensors()), GROUP)
        return gm.hash

    def get_bytes(self, h: str) -> bytes:
        """The stored bytes, each chunk verified (small models; nodes serve by range instead)."""
        if not self.has(h):
            raise GlobalModelError(f"global model {h[:12]} is not on disk")
        return self.store.read_bytes(Kind.MODEL, h, GROUP)

    def load(self, h: str) -> GlobalModel:
        """G by hash, its tensors read from disk when used (`StoredTensors`: the digests checked
        against `h` and the header against the layout now, each chunk on every read). Without a
        layout (offline tools) it is read whole and checked."""
        if not self.has(h):
            raise GlobalModelError(f"global model {h[:12]} is not on disk")
        try:
            if self.layout is not None:
                specs = model_specs(self.layout)
                params = StoredTensors(self.store, Kind.MODEL, h, specs, GROUP, PARAM)
                momentum = StoredTensors(self.store, Kind.MODEL, h, specs, GROUP, MOMENTUM)
                return GlobalModel(params, momentum, h, self.chunk_bytes)
            tensors = self.store.load_tensors(Kind.MODEL, h, None, GROUP)
        except (StoreError, ValueError) as e:
            raise GlobalModelError(f"global model {h[:12]}: {e}") from e
        return GlobalModel.from_tensors(tensors, h, self.chunk_bytes)

    def fetch(self, h: str, client: BlobClient, endpoints: Sequence[str] | None = None) -> GlobalModel:
        """From disk if held, else from peers by its on-chain hash (each chunk verified), kept on
        disk. One call per hash at a time in this process (the check of a held copy included: a
        thread must not delete a copy another thread is fetching or has just verified); a thread
        whose holders another thread's failed call did not ask tries them."""
        key = ("global", *flight_key(self.store, Kind.MODEL, h))
        sources = [e.rstrip("/") for e in (endpoints if endpoints is not None else client.endpoints)]
        return FLIGHTS.do(key, lambda: self._fetch(h, client, endpoints), sources)[0]

    def _fetch(self, h: str, client: BlobClient, endpoints: Sequence[str] | None) -> GlobalModel:
        if self.has(h):
            try:
                self.store.verify(Kind.MODEL, h, GROUP)  # once, so a corrupted copy is replaced now
                return self.load(h)
            except (GlobalModelError, ValueError):
                self.store.delete(Kind.MODEL, h, GROUP)  # corrupted on our disk: fetch a good copy
        if self.layout is None:
            raise GlobalModelError("fetching a global model needs the run's layout")
        ref = ObjectRef(Kind.MODEL, h, canonical_size(model_specs(self.layout)), self.chunk_bytes)
        fetch_to_store(
            client, self.store, ref, GROUP, endpoints if endpoints is not None else client.endpoints
        )
        return self.load(h)

    def prune(self, keep: Sequence[str]) -> list[str]:
        gone = [h for h in self.hashes() if h not in set(keep)]
        for h in gone:
            self.store.delete(Kind.MODEL, h, GROUP)
        return gone


def model_verifier(expected_hash: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Callable[[bytes], None]:
    """`BlobClient.get` verify callback for a served global model (canonical bytes)."""
    from protocol.tensors import decode_canonical

    def verify(data: bytes) -> None:
        GlobalModel.from_tensors(decode_canonical(data), expected_hash, chunk_bytes)

    return verify


__all__ = ["GROUP", "GlobalModel", "GlobalModelError", "GlobalStore", "TensorSink", "model_verifier"]
