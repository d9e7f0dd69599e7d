"""The outer step: G_{n+1} = Nesterov(G_n, token-weighted mean of the accepted Δs).

Every node computes it independently and the chain records the hash a majority agrees on, so
the result must be bitwise identical everywhere. Hence: only element-wise IEEE float32 ops
(one rounding each, thread count cannot matter), one fixed order (hosts sorted by address),
separate mul and add (no `alpha=`/fused forms, no sum/mean reductions), and every scalar
rounded to float32 once, by a rule another implementation can reproduce exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from fractions import Fraction

import numpy as np
import torch

from protocol import codecs
from protocol.chunks import DEFAULT_CHUNK_BYTES
from protocol.config import Codec, OuterRule, SparseMean
from protocol.tensors import StateKind, tensor_hash

Tensors = Mapping[str, torch.Tensor]


class OuterError(ValueError):
    """The inputs of an outer step do not fit together (names, shapes, dtypes, weights)."""


def f32_nearest(x: Fraction) -> np.float32:
    """The float32 nearest to the exact rational x, ties to even (Go: big.Rat.Float32)."""
    guess = np.float32(float(x))  # double rounding may be off by one ulp; check the neighbours
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]

    def key(c: np.float32) -> tuple[Fraction, int]:
        return abs(Fraction(float(c)) - x), int(np.array(c).view(np.uint32)) & 1

    return min(candidates, key=key)


def mean_weights(tokens: Sequence[int]) -> list[np.float32]:
    """c_i = w_i / Σw as exact rationals, each rounded once to float32."""
    if any(not isinstance(w, int) or isinstance(w, bool) or w < 0 for w in tokens):
        raise OuterError(f"token counts must be non-negative integers, got {list(tokens)!r}")
    total = sum(tokens)
    if total == 0:
        raise OuterError("accepted contributions carry zero tokens in total")
    return [f32_nearest(Fraction(w, total)) for w in tokens]


def _scalar(x: float | np.floating) -> torch.Tensor:
    return torch.tensor(float(x), dtype=torch.float32)


def _check(reference: Tensors, other: Tensors, what: str) -> None:
    if set(other) != set(reference):
        missing, extra = sorted(set(reference) - set(other)), sorted(set(other) - set(reference))
        raise OuterError(f"{what}: tensor names differ (missing {missing[:3]}, extra {extra[:3]})")
    for name, t in other.items():
        ref = reference[name]
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.shape != ref.shape:
            raise OuterError(f"{what}: {name} must be float32 of shape {tuple(ref.shape)}")


def weighted_mean(deltas: Sequence[tuple[str, int, Tensors]], like: Tensors) -> dict[str, torch.Tensor]:
    """acc = c_0·Δ_0, then acc = acc + c_i·Δ_i in sorted host order (separate mul and add)."""
    ordered = sorted(deltas, key=lambda d: d[0])
    hosts = [h for h, _, _ in ordered]
    if len(set(hosts)) != len(hosts):
        raise OuterError("a host appears twice among the accepted deltas")
    for host, _, delta in ordered:
        _check(like, delta, f"delta of {host}")
    coeffs = [_scalar(c) for c in mean_weights([w for _, w, _ in ordered])]
    mean = {}
    for name in sorted(like):
        acc = torch.mul(ordered[0][2][name], coeffs[0])
        for c, (_, _, delta) in zip(coeffs[1:], ordered[1:], strict=True):
            acc = torch.add(acc, torch.mul(delta[name], c))
        mean[name] = acc
    return mean


def outer_update(
    params: Tensors,
    momentum: Tensors,
    deltas: Sequence[tuple[str, int, Tensors]],
    lr: float,
    mu: float,
    *,
    rule: OuterRule = OuterRule.NESTEROV,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Nesterov as torch.optim.SGD(nesterov=True, dampening=0): b = μ·b + g; p = p − lr·(g + μ·b)
    (or, `rule` AVERAGE, p = p − lr·g with b unchanged).

    `deltas` are (host address, tokens, decoded Δ = θ_global − θ_local). No deltas: G unchanged.
    Inputs are never mutated; new tensors are returned.
    """
    _check(params, momentum, "momentum")
    if not deltas:
        return {n: t.clone() for n, t in params.items()}, {n: t.clone() for n, t in momentum.items()}
    return apply_rule(rule, params, momentum, weighted_mean(deltas, params), lr, mu)


def average(
    params: Tensors, momentum: Tensors, g: Tensors, lr: float, *, consume: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """SparseLoCo's outer step: θ' = θ − lr·g (separate mul and sub), the momentum unchanged (the
    hosts' error-feedback accumulators stand in for it). `consume` as in `nesterov`."""
    lr32 = _scalar(f32_nearest(Fraction(lr)))
    new_params, new_momentum = {}, {}
    for name in sorted(params):
        new_params[name] = torch.sub(params[name], torch.mul(g[name], lr32))
        new_momentum[name] = momentum[name].clone()
        if consume:
            del g[name]  # type: ignore[attr-defined]
    return new_params, new_momentum


def apply_rule(
    rule: OuterRule,
    params: Tensors,
    momentum: Tensors,
    g: Tensors,
    lr: float,
    mu: float,
    *,
    consume: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The run's outer rule (`RunConfig.outer.rule`) applied to the mean g."""
    if OuterRule(rule) is OuterRule.AVERAGE:
        return average(params, momentum, g, lr, consume=consume)
    return nesterov(params, momentum, g, lr, mu, consume=consume)


def nesterov(
    params: Tensors, momentum: Tensors, g: Tensors, lr: float, mu: float, *, consume: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """b' = μ·b + g;  θ' = θ − lr·(g + μ·b'), element-wise float32, name by name (sorted, so
    params/momentum read from disk are read in one pass). With `consume`, each g[name] is dropped
    from `g` once used: G_{n+1} grows as the mean shrinks (aggregation never holds both whole)."""
    lr32, mu32 = _scalar(f32_nearest(Fraction(lr))), _scalar(f32_nearest(Fraction(mu)))
    new_params, new_momentum = {}, {}
    for name in sorted(params):  # a stored G's momentum/* and param/* parts: one pass over each
        gn = g[name]
        buf = torch.add(torch.mul(momentum[name], mu32), gn)
        new_momentum[name] = buf
        step = torch.add(gn, torch.mul(buf, mu32))
        new_params[name] = torch.sub(params[name], torch.mul(step, lr32))
        del gn, step
        if consume:
            del g[name]  # type: ignore[attr-defined]
    return new_params, new_momentum


class Accumulator:
    """The weighted mean of §7 with one Δ in memory at a time: Δs are added in sorted host order,
    tensor by tensor, with exactly the operations of `weighted_mean` (acc = c_0·Δ_0, then
    acc = acc + c_i·Δ_i), so the result has the same bits. The weights need every token count
    up front (c_i = w_i / Σw), which the chain's accepted set gives before any Δ is fetched."""

    def __init__(self, like: Tensors | Mapping[str, tuple[int, ...]], tokens: Mapping[str, int]) -> None:
        """`like`: the model's tensors or just their shapes (a layout)."""
        self.hosts = sorted(tokens)
        self.coeffs = [_scalar(c) for c in mean_weights([tokens[h] for h in self.hosts])]
        self.shapes = {n: tuple(t.shape if isinstance(t, torch.Tensor) else t) for n, t in like.items()}
        self.acc: dict[str, torch.Tensor] = {}
        self.added = 0

    @property
    def next_host(self) -> str | None:
        return self.hosts[self.added] if self.added < len(self.hosts) else None

    def add(self, host: str, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Add `host`'s decoded Δ, tensor by tensor (e.g. `codecs.iter_decode` over a mapped file)."""
        if host != self.next_host:
            raise OuterError(f"Δ of {host} added out of order (expected {self.next_host})")
        c, first, seen = self.coeffs[self.added], self.added == 0, set()
        for name, t in tensors:
            if name not in self.shapes or name in seen:
                raise OuterError(f"delta of {host}: unexpected tensor {name!r}")
            fits = isinstance(t, torch.Tensor) and t.dtype == torch.float32
            if not fits or tuple(t.shape) != self.shapes[name]:
                raise OuterError(f"delta of {host}: {name} must be float32 of shape {self.shapes[name]}")
            seen.add(name)
            term = torch.mul(t, c)
            self.acc[name] = term if first else torch.add(self.acc[name], term)
        if seen != set(self.shapes):
            raise OuterError(f"delta of {host}: missing {sorted(set(self.shapes) - seen)[:3]}")
        self.added += 1

    def finish(
        self, params: Tensors, momentum: Tensors, lr: float, mu: float, rule: OuterRule = OuterRule.NESTEROV
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """G_{n+1}; every accepted Δ must have been added. Consumes the running sum."""
        if self.added != len(self.hosts):
            raise OuterError(f"{len(self.hosts) - self.added} accepted Δs were not added")
        if set(params) != set(self.shapes) or set(momentum) != set(self.shapes):
            raise OuterError("params/momentum names differ from the accumulated Δs")
        return apply_rule(rule, params, momentum, self.acc, lr, mu, consume=True)


def _sparse_header(payload: bytes | memoryview, layout: Mapping[str, tuple[int, ...]], chunk: int, topk: int,
                   host: str) -> codecs.PayloadHeader:  # fmt: skip
    try:
        h = codecs.checked_header(payload, layout)
    except codecs.CodecError as e:
        raise OuterError(f"Δ of {host}: {e}") from e
    if h.codec is not Codec.SPARSE or h.block_size != chunk or h.topk != topk:
        raise OuterError(f"Δ of {host}: {h.codec.value} payload (chunk {h.block_size}, topk {h.topk}), "
                         f"the run aggregates sparse chunk {chunk} topk {topk}")  # fmt: skip
    return h


def _entries(
    payload: bytes | memoryview, h: codecs.PayloadHeader, name: str, host: str
) -> codecs.SparseEntries:
    start, end = h.spans()[name]
    n = int(np.prod(h.shapes[name], dtype=np.int64))
    try:
        return codecs.sparse_decode(memoryview(payload).cast("B")[start:end], n, h.block_size, h.topk, name)
    except codecs.CodecError as e:
        raise OuterError(f"Δ of {host}: {e}") from e


def _add_entries(acc: torch.Tensor, entries: codecs.SparseEntries, c: torch.Tensor) -> None:
    """acc[j] = acc[j] + c·v_j at the kept positions (unique), separate mul and add. Adding c·(+0)
    at the others would change nothing: a sum that starts at +0 is never −0, and x + (+0) = x."""
    flat = acc.view(-1)
    flat[entries.positions] = torch.add(flat[entries.positions], torch.mul(entries.values, c))


_DIVIDE_PIECE = 1 << 22


def count_dtype(hosts: int) -> torch.dtype:
    """The narrowest integer that counts to `hosts`: 1 byte a coordinate up to 255 hosts."""
    return torch.uint8 if hosts <= 255 else torch.int16 if hosts <= 32767 else torch.int32


class Denominators:
    """CONTRIBUTORS' d_j = +0 + c_i over the hosts that kept j, in sorted host order (specs §4.1).

    When every c_i is the same float32 — always on chain, where every accepted contribution
    carries the run's `tokens_per_outer_step` — d_j depends only on how many hosts kept j: a
    count per coordinate (`count_dtype`, 1 byte up to 255 hosts) and a table D[n] of those n-fold
    sums stand in for a float32 per coordinate. Otherwise the float32 sums themselves are kept.
    Both are the same bits."""

    def __init__(self, coeffs: Sequence[torch.Tensor]) -> None:
        self.table: torch.Tensor | None = None
        self.dtype = torch.float32
        if coeffs and len({float(c) for c in coeffs}) == 1:
            sums = [torch.zeros((), dtype=torch.float32)]
            for c in coeffs:
                sums.append(torch.add(sums[-1], c))
            self.table, self.dtype = torch.stack(sums), count_dtype(len(coeffs))

    def zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.dtype)

    def add(self, den: torch.Tensor, positions: torch.Tensor, c: torch.Tensor) -> None:
        """One host's kept positions (unique within a payload) into `den`."""
        flat = den.view(-1)
        if self.table is not None:
            flat[positions] += 1
        else:
            flat[positions] = torch.add(flat[positions], c)

    def divide(self, s: torch.Tensor, den: torch.Tensor) -> None:
        """s_j ← s_j / d_j in place (one float32 division). Where d_j = +0 nobody with a nonzero
        weight kept j, so s_j is +0; it is divided by 1 and stays +0. Element-wise, so it runs in
        pieces: the temporaries (d_j looked up, its int64 index) stay O(piece), not O(tensor)."""
        flat_s, flat_den, one = s.view(-1), den.view(-1), torch.ones((), dtype=torch.float32)
        for lo in range(0, flat_s.numel(), _DIVIDE_PIECE):
            piece = flat_s[lo : lo + _DIVIDE_PIECE]
            d = flat_den[lo : lo + _DIVIDE_PIECE]
            if self.table is not None:
                d = self.table[d.long()]
            torch.div(piece, torch.where(d == 0, one, d), out=piece)


class SparseAccumulator:
    """The mean of sparse Δs (specs §7, sparse codec) host by host in sorted order: g = +0, then
    g = g + c_i·Δ̂_i for each accepted host, each payload's kept entries decoded straight into the
    running sum, so no Δ is ever dense. Holds the sum (the model's size) and one tensor's entries;
    with `mean` CONTRIBUTORS also who kept each coordinate (`Denominators`: 1 byte a coordinate up
    to 255 hosts of equal tokens), by which `finish` divides. Same bits as `sparse_outer_tensors`
    (tensor by tensor, all payloads at hand)."""

    def __init__(self, layout: Mapping[str, tuple[int, ...]], tokens: Mapping[str, int], *, chunk: int,
                 topk: int, mean: SparseMean = SparseMean.HOSTS) -> None:  # fmt: skip
        self.hosts = sorted(tokens)
        self.coeffs = [_scalar(c) for c in mean_weights([tokens[h] for h in self.hosts])]
        self.layout = {n: tuple(int(d) for d in s) for n, s in layout.items()}
        self.chunk, self.topk = chunk, topk
        self.acc = {n: torch.zeros(s, dtype=torch.float32) for n, s in self.layout.items()}
        self.den = Denominators(self.coeffs) if SparseMean(mean) is SparseMean.CONTRIBUTORS else None
        self.kept = {n: self.den.zeros(s) for n, s in self.layout.items()} if self.den is not None else {}
        self.added = 0

    @property
    def next_host(self) -> str | None:
        return self.hosts[self.added] if self.added < len(self.hosts) else None

    def add(self, host: str, payload: bytes | memoryview) -> None:
        """Add `host`'s canonical sparse payload (e.g. a memory-mapped file), tensor by tensor.
        A payload that does not decode raises OuterError and leaves the sum untouched."""
        if host != self.next_host:
            raise OuterError(f"Δ of {host} added out of order (expected {self.next_host})")
        h = _sparse_header(payload, self.layout, self.chunk, self.topk, host)
        decoded = [(name, _entries(payload, h, name, host)) for name in h.shapes]  # all checked first
        c = self.coeffs[self.added]
        for name, entries in decoded:
            _add_entries(self.acc[name], entries, c)
            if self.den is not None:
                self.den.add(self.kept[name], entries.positions, c)
        self.added += 1

    def finish(
        self, params: Tensors, momentum: Tensors, lr: float, mu: float, rule: OuterRule = OuterRule.NESTEROV
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """G_{n+1}; every accepted Δ must have been added. Consumes the running sum."""
        if self.added != len(self.hosts):
            raise OuterError(f"{len(self.hosts) - self.added} accepted Δs were not added")
        _check(params, momentum, "momentum")
        if set(params) != set(self.layout):
            raise OuterError("params names differ from the accumulated Δs")
        if self.den is not None:  # the sum becomes the contributors' mean in place, tensor by tensor
            for name in sorted(self.acc):
                self.den.divide(self.acc[name], self.kept.pop(name))
        return apply_rule(rule, params, momentum, self.acc, lr, mu, consume=True)


def sparse_outer_tensors(
    params: Iterable[tuple[str, torch.Tensor]],
    momentum: Mapping[str, torch.Tensor] | Callable[[str], torch.Tensor],
    payloads: Sequence[tuple[str, int, bytes | memoryview]],
    layout: Mapping[str, tuple[int, ...]],
    *,
    chunk: int,
    topk: int,
    lr: float,
    mu: float,
    rule: OuterRule = OuterRule.NESTEROV,
    mean: SparseMean = SparseMean.HOSTS,
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """G_{n+1} tensor by tensor with every accepted payload at hand (memory-mapped): for each name
    in order, g = +0, then g = g + c_i·Δ̂_i[name] over the hosts in sorted order, then the rule on
    that tensor (`mean` CONTRIBUTORS: g divided by its `Denominators` first). Memory: one dense
    tensor (its sum, θ and b). Same bits as `SparseAccumulator`.
    `params` come in name order; `momentum` is read by name. Every payload's header is checked
    before the first tensor is yielded; a body that fails its decoder raises OuterError."""
    ordered = sorted(payloads, key=lambda p: p[0])
    hosts = [h for h, _, _ in ordered]
    if len(set(hosts)) != len(hosts):
        raise OuterError("a host appears twice among the accepted deltas")
    shapes = {n: tuple(int(d) for d in s) for n, s in layout.items()}
    heads = [_sparse_header(p, shapes, chunk, topk, h) for h, _, p in ordered]
    coeffs = [_scalar(c) for c in mean_weights([w for _, w, _ in ordered])] if ordered else []
    den = Denominators(coeffs) if SparseMean(mean) is SparseMean.CONTRIBUTORS else None
    names = sorted(shapes, key=lambda n: n.encode())
    it = iter(params)
    for name in names:
        got = next(it, None)
        if got is None or got[0] != name:
            raise OuterError(f"params must come in name order; expected {name!r}")
        theta = got[1]
        b = momentum(name) if callable(momentum) else momentum[name]
        for t, what in ((theta, "params"), (b, "momentum")):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != shapes[name]:
                raise OuterError(f"{what}: {name} must be float32 of shape {shapes[name]}")
        if not ordered:
            yield name, theta.clone(), b.clone()
            continue
        g = torch.zeros(shapes[name], dtype=torch.float32)
        kept = den.zeros(shapes[name]) if den is not None else None
        for (host, _, payload), h, c in zip(ordered, heads, coeffs, strict=True):
            entries = _entries(payload, h, name, host)
            _add_entries(g, entries, c)
            if den is not None and kept is not None:
                den.add(kept, entries.positions, c)
        if den is not None and kept is not None:
            den.divide(g, kept)
        p2, m2 = apply_rule(rule, {name: theta}, {name: b}, {name: g}, lr, mu, consume=True)
        yield name, p2[name], m2[name]


def sparse_outer_update(
    params: Tensors,
    momentum: Tensors,
    payloads: Sequence[tuple[str, int, bytes | memoryview]],
    lr: float,
    mu: float,
    *,
    chunk: int,
    topk: int,
    rule: OuterRule = OuterRule.NESTEROV,
    mean: SparseMean = SparseMean.HOSTS,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """`outer_update` for sparse payloads (host, tokens, canonical payload): the vectors' form."""
    _check(params, momentum, "momentum")
    layout = {n: tuple(t.shape) for n, t in params.items()}
    names = sorted(params, key=lambda n: n.encode())
    new_p, new_m = {}, {}
    for name, p2, m2 in sparse_outer_tensors(((n, params[n]) for n in names), momentum, payloads, layout,
                                             chunk=chunk, topk=topk, lr=lr, mu=mu, rule=rule,
                                             mean=mean):  # fmt: skip
        new_p[name], new_m[name] = p2, m2
    return new_p, new_m


def eager_scale(lr: float, mu: float) -> np.float32:
    """α of the eager schedule (specs §2.2.1): α = min(1, 1 / (lr·(1 + μ))), exact rationals of the
    float inputs rounded once to float32. The own Δ then enters the start with coefficient
    α·lr·(1 + μ) = 1: a host's deviation from the others' starts is carried from step to step at
    most once, never amplified (at α = 1 it grows ×lr·(1 + μ) per step, 1.33 at DiLoCo's settings,
    and the loss stalls; below it the start lags the aggregate: bench §1d measures both)."""
    return f32_nearest(min(Fraction(1), 1 / (Fraction(lr) * (1 + Fraction(mu)))))


def eager_start(
    params: Tensors, momentum: Tensors, own_delta: Tensors, lr: float, mu: float
) -> dict[str, torch.Tensor]:
    """The params of an eager start (specs §2.2.1): the outer step applied to G_{n−1} (params and
    momentum) with the host's own decoded step n − 1 Δ, times α = `eager_scale(lr, mu)`, as the
    only Δ (weight 1). Host, verifiers and the host's recomputation all call this: the same bits."""
    alpha = _scalar(eager_scale(lr, mu))
    stand_in = {n: torch.mul(t, alpha) for n, t in own_delta.items()}
    return outer_update(params, momentum, [("own", 1, stand_in)], lr, mu)[0]


def global_model_hash(params: Tensors, momentum: Tensors, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> str:
    """Hash of G = {"param/<n>": θ, "momentum/<n>": b} with kind GLOBAL: what the chain records."""
    _check(params, momentum, "momentum")
    state = {f"param/{n}": t for n, t in params.items()}
    state.update({f"momentum/{n}": t for n, t in momentum.items()})
    return tensor_hash(state, StateKind.GLOBAL, chunk_bytes)
