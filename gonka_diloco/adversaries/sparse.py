"""Dishonest error feedback (sparse codec, specs §4.1): payloads that decode fine but are not C(a).

The honest host sends C(a) with a = β·e + Δ and carries e_next = a − decode(C(a)). Each forger
here returns (payload, e_next) like `protocol.errorfeedback.ef_step`, well-formed (it decodes,
its sizes are the layout's) and wrong in one way a host might want:

| name          | what it sends / carries                                           | caught by      |
|---------------|-------------------------------------------------------------------|----------------|
| ef_dropped    | C(Δ): keeps no accumulator (saves its memory), e_next = Δ − C(Δ)   | DELTA_MISMATCH |
| ef_hoard      | the honest payload, but carries a (sent mass counted twice later) | DELTA_MISMATCH |
| topk_shifted  | ranks k+1..2k of every chunk: plausible indices, honest values    | DELTA_MISMATCH |
| scaled        | the honest indices at twice the scale (more weight in the mean)   | DELTA_MISMATCH |
| sign_flip     | the honest indices with their signs flipped                       | DELTA_MISMATCH |
| random_k      | C(noise of a's size): random indices, random values               | DELTA_MISMATCH |

A verifier rebuilds C(a) and e_next from its own replay of θ_H and the e the chain names and
compares both hashes with the commitment (`verify_ef_step`). `ef_dropped` equals the honest
step while e is zero (a host's first step, or after a rejected one): there it *is* honest.
The host adversary `ef_forge` (`adversaries/hosts.py`, `forger=NAME`) commits them from a real
node (`tests/test_sparse_nodes.py`); `bench.sim` runs them in process (`run_diloco(ef_attack=…)`,
`tests/test_errorfeedback.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from protocol import codecs
from protocol.config import Codec
from protocol.errorfeedback import EFConfig, EFSource, ef_step

Forger = Callable[[EFSource, Mapping[str, Tensor], EFConfig], tuple[bytes, dict[str, Tensor]]]


def _accumulated(e: EFSource, delta: Mapping[str, Tensor], cfg: EFConfig) -> dict[str, Tensor]:
    """a = β·e + Δ, exactly as the honest step forms it."""
    out = {}
    for name, d in delta.items():
        carried = torch.zeros_like(d) if e is None else (e(name) if callable(e) else e[name])
        out[name] = torch.add(torch.mul(carried, cfg.beta), d.float())
    return out


def _send(x: Mapping[str, Tensor], a: Mapping[str, Tensor], cfg: EFConfig) -> tuple[bytes, dict[str, Tensor]]:
    """The payload C(x) with e_next = a − decode(C(x)): what it sent, taken off what it holds."""
    payload = codecs.encode(x, Codec.SPARSE, cfg.chunk, cfg.topk)
    sent = codecs.decode(payload, {n: tuple(t.shape) for n, t in x.items()})
    return payload, {n: torch.sub(a[n], sent[n]) for n in a}


def ef_dropped(e: EFSource, delta: Mapping[str, Tensor], cfg: EFConfig) -> tuple[bytes, dict[str, Tensor]]:
    return ef_step(None, delta, cfg)


def ef_hoard(e: EFSource, delta: Mapping[str, Tensor], cfg: EFConfig) -> tuple[bytes, dict[str, Tensor]]:
    payload, _ = ef_step(e, delta, cfg)
    return payload, _accumulated(e, delta, cfg)


def topk_shifted(e: EFSource, delta: Mapping[str, Tensor], cfg: EFConfig) -> tuple[bytes, dict[str, Tensor]]:
    a = _accumulated(e, delta, cfg)
    honest = codecs.decode(
        codecs.encode(a, Codec.SPARSE, cfg.chunk, cfg.topk), {n: tuple(t.shape) for n, t in a.items()}
    )
    rest = {n: torch.where(honest[n] != 0, torch.zeros_like(t), t) for n, t in a.items()}
    return _send(rest, a, cfg)


def scaled(e: EFSource, delta: Mapping[str, Tensor], cfg: EFConfig) -> tuple[bytes, dict[str, Tensor]]:
    a = _accumulated(e, delta, cfg)
    return _send({n: torch.mul(t, 2.0) for n, t in a.items()}, a, cfg)


def sign_flip(e: EFSource, delta: Mapping[str, Tensor], cfg: EFConfig) -> tuple[bytes, dict[str, Tensor]]:
    a = _accumulated(e, delta, cfg)
    return _send({n: torch.neg(t) for n, t in a.items()}, a, cfg)


def random_k(e: EFSource, delta: Mapping[str, Tensor], cfg: EFConfig) -> tuple[bytes, dict[str, Tensor]]:
    a = _accumulated(e, delta, cfg)
    gen = torch.Generator().manual_seed(0)
    noise = {n: torch.randn(t.shape, generator=gen) * float(t.abs().mean()) for n, t in a.items()}
    return _send(noise, a, cfg)


EF_FORGERS: dict[str, Forger] = {
    "ef_dropped": ef_dropped,
    "ef_hoard": ef_hoard,
    "topk_shifted": topk_shifted,
    "scaled": scaled,
    "sign_flip": sign_flip,
    "random_k": random_k,
}
