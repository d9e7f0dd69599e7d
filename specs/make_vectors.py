"""Generate the byte-level test vectors in `specs/vectors/*.json` (`make vectors`).

Each vector is {"input": ..., "output": ...} with inputs spelled out exactly (float32 values as
their IEEE bit patterns in hex), so another implementation (a Go chain module) can recompute
every output from the JSON alone. `tests/test_vectors.py` does exactly that with this code base.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chain import queries
from chain.genesis import Genesis, genesis_state
from chain.module import BlockContext, TxContext, begin_block, end_block, process_msg
from chain.state import ChainState, app_hash
from protocol import chunks, codecs, merkle, prf
from protocol.config import Codec, ModelSpec, Numerics, Overlap, Phases, RunConfig, Stake
from protocol.envclass import CLASS_DOMAIN, class_fields, class_pair, replay_decision
from protocol.messages import (
    Coin,
    EnvFingerprint,
    MsgCommitPseudoGradient,
    MsgCreateRun,
    MsgJoinRun,
    MsgReportUnavailable,
    MsgRevealContribution,
    MsgSend,
    MsgSubmitOuterResult,
    MsgSubmitVerdict,
    Reason,
    Role,
    SegmentOpening,
)
from protocol.outer import eager_scale, eager_start, global_model_hash, outer_update
from protocol.tensors import StateKind, canonical_bytes, domain, tensor_hash
from protocol.wire import _MODEL_OF, to_any
from specs.state_vectors import moments_vectors, statecode_vectors
from specs.strict_vectors import modelsize_vectors, strict_vectors
from specs.tolerance_vectors import tolerance_vectors

VECTORS = Path(__file__).resolve().parent / "vectors"
HOST = "gonka1k4swv40ur28fvu54p8mskjj4lxkgsj07u9f8ny"  # test_wallet(0)
BLOCK = hashlib.sha256(b"block 1").hexdigest()


# ---- tensor <-> JSON ---------------------------------------------------------------------------


def tensor_to_json(t: torch.Tensor) -> dict[str, Any]:
    if t.dtype == torch.float32:
        bits = t.contiguous().numpy().view(np.uint32).reshape(-1)
        return {"dtype": "float32", "shape": list(t.shape), "bits": [f"{int(b):08x}" for b in bits]}
    if t.dtype == torch.int64:
        return {"dtype": "int64", "shape": list(t.shape), "values": [int(x) for x in t.reshape(-1)]}
    raise ValueError(f"no JSON form for {t.dtype}")


def tensor_from_json(d: dict[str, Any]) -> torch.Tensor:
    shape = tuple(d["shape"])
    if d["dtype"] == "float32":
        bits = np.array([int(b, 16) for b in d["bits"]], dtype=np.uint32)
        return torch.from_numpy(bits.view(np.float32).copy()).reshape(shape)
    if d["dtype"] == "int64":
        return torch.tensor(d["values"], dtype=torch.int64).reshape(shape)
    raise ValueError(f"unknown dtype {d['dtype']!r}")


def set_to_json(ts: dict[str, torch.Tensor]) -> dict[str, Any]:
    return {n: tensor_to_json(t) for n, t in sorted(ts.items())}


def set_from_json(d: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {n: tensor_from_json(v) for n, v in d.items()}


def ramp(n: int, shape: tuple[int, ...], mul: int = 37, mod: int = 101, div: float = 64.0) -> torch.Tensor:
    """Exactly representable float32 values ((i·mul mod m) − m/2)/div: no platform-dependent math."""
    idx = torch.arange(n, dtype=torch.int64)
    return (((idx * mul) % mod - mod // 2).to(torch.float32) / div).reshape(shape)


# ---- vector builders ---------------------------------------------------------------------------


def tensor_vectors() -> list[dict[str, Any]]:
    sets = {
        "one_scalar": {"step": torch.tensor(7, dtype=torch.int64)},
        "training_state": {
            "param/w": ramp(6, (2, 3)),
            "param/b": ramp(3, (3,), mul=5),
            "exp_avg/w": ramp(6, (2, 3), mul=11) / 1024,
            "exp_avg/b": ramp(3, (3,), mul=13) / 1024,
            "exp_avg_sq/w": ramp(6, (2, 3), mul=17).abs() / 4096,
            "exp_avg_sq/b": ramp(3, (3,), mul=19).abs() / 4096,
            "step": torch.tensor(10, dtype=torch.int64),
        },
    }
    out = []
    for label, ts in sets.items():
        out.append(
            {
                "label": label,
                "input": set_to_json(ts),
                "output": {
                    "canonical_bytes": canonical_bytes(ts).hex(),
                    "hash": {k.value: tensor_hash(ts, k) for k in StateKind},
                },
            }
        )
    return out


def chunk_vectors() -> list[dict[str, Any]]:
    """Chunked content hashes (protocol/chunks.py) at small chunk sizes: digests, tree hash, proofs."""
    state = {
        "param/w": ramp(96, (8, 12)),
        "exp_avg/w": ramp(96, (8, 12), mul=11) / 1024,
        "exp_avg_sq/w": ramp(96, (8, 12), mul=17).abs() / 4096,
        "step": torch.tensor(3.0),
    }
    data = canonical_bytes(state)
    payload = codecs.encode({"w": ramp(96, (8, 12)) / 64}, Codec.INT8, 16)
    out = []
    for label, dom, blob in [
        ("training_state", domain(StateKind.TRAINING), data),
        ("delta", chunks.DELTA_DOMAIN, payload),
    ]:
        for c in (256, 512, 1 << 20):
            h, digests = chunks.hash_stream(dom, [blob], c)
            out.append(
                {
                    "label": label,
                    "input": {"domain": dom.hex(), "chunk_bytes": c, "bytes": blob.hex()},
                    "output": {
                        "digests": _hexes(digests),
                        "tree_hash": chunks.mth(digests).hex(),
                        "content_hash": h,
                        "chunk_proofs": [_hexes(chunks.chunk_proof(digests, i)) for i in range(len(digests))],
                    },
                }
            )
    return out


def _hexes(xs: list[bytes]) -> list[str]:
    return [x.hex() for x in xs]


def merkle_vectors() -> list[dict[str, Any]]:
    out = []
    for n in (1, 2, 3, 4, 5, 7, 8, 11):
        leaves = [hashlib.sha256(f"leaf {i}".encode()).digest() for i in range(n)]
        out.append(
            {
                "input": {"leaves": [x.hex() for x in leaves]},
                "output": {
                    "root": merkle.merkle_root(leaves).hex(),
                    "inclusion_proofs": [_hexes(merkle.inclusion_proof(leaves, i)) for i in range(n)],
                    "pair_proofs": [_hexes(merkle.pair_proof(leaves, i)) for i in range(n - 1)],
                },
            }
        )
    return out


def codec_vectors() -> list[dict[str, Any]]:
    delta = {"a": ramp(21, (3, 7)) / 8, "b": ramp(5, (5,), mul=3) / 1024, "z": torch.zeros(9)}
    out = []
    for codec in (c for c in Codec if c is not Codec.SPARSE):
        payload = codecs.encode(delta, codec, 8)
        layout = {n: tuple(t.shape) for n, t in delta.items()}
        out.append(
            {
                "input": {"codec": codec.value, "block_size": 8, "tensors": set_to_json(delta)},
                "output": {
                    "payload": payload.hex(),
                    "delta_hash": codecs.delta_hash(payload),
                    "decoded": set_to_json(codecs.decode(payload, layout)),
                },
            }
        )
    return out + sparse_codec_vectors(delta)


def sparse_codec_vectors(delta: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """§4.1: the sparse codec (ties, a short last chunk, an all-zero chunk) and error feedback."""
    from protocol.errorfeedback import EFConfig, ef_hash, ef_step

    layout = {n: tuple(t.shape) for n, t in delta.items()}
    ties = {**delta, "t": torch.tensor([1.0, -1.0, 0.5, -1.0, 1.0, 0.25, -0.5, 1.0, 2.0, -2.0, 2.0])}
    out = []
    for tensors, chunk, topk in [(delta, 8, 3), (ties, 8, 2), (delta, 16, 1)]:
        lay = {n: tuple(t.shape) for n, t in tensors.items()}
        payload = codecs.encode(tensors, Codec.SPARSE, chunk, topk)
        out.append({
            "input": {"codec": "sparse", "block_size": chunk, "topk": topk, "tensors": set_to_json(tensors)},
            "output": {"payload": payload.hex(), "delta_hash": codecs.delta_hash(payload),
                       "decoded": set_to_json(codecs.decode(payload, lay))},
        })  # fmt: skip
    e = {n: ramp(int(torch.tensor(s).prod()), s, mul=7) / 256 for n, s in layout.items()}
    for beta in (1.0, 0.95):
        payload, e_next = ef_step(e, delta, EFConfig(8, 3, beta))
        out.append({
            "input": {"codec": "sparse", "block_size": 8, "topk": 3, "ef_decay": beta, "e": set_to_json(e),
                      "tensors": set_to_json(delta)},
            "output": {"payload": payload.hex(), "delta_hash": codecs.delta_hash(payload),
                       "e_next": set_to_json(e_next), "ef_hash": ef_hash(e_next),
                       "decoded": set_to_json(codecs.decode(payload, layout))},
        })  # fmt: skip
    return out


def prf_vectors() -> dict[str, Any]:
    verifiers = [f"gonka1verifier{i}" for i in range(6)] + [HOST]
    return {
        "prf_bytes": [
            {"input": [s, *p], "output": prf.prf_bytes(s, *p).hex()}
            for s, p in [(0, ()), (42, ("a", 1, "b"))]
        ],
        "prf_int": [
            {"input": {"seed": 5, "parts": ["x", i], "bound": b}, "output": prf.prf_int(5, "x", i, bound=b)}
            for i, b in enumerate([1, 2, 7, 1000, 2**63 + 1, 2**65 // 3 + 1, 2**64])
        ],
        "coin": [{"input": ["seed", i], "output": prf.coin("seed", i)} for i in range(4)],
        "shard_index": [
            {"input": {"run_seed": 9, "host": HOST, "n_shards": n}, "output": prf.shard_index(9, HOST, n)}
            for n in (1, 8, 13)
        ],
        "batch_offsets": [
            {
                "input": {
                    "run_seed": 9,
                    "host": HOST,
                    "outer_step": 2,
                    "inner_step": 3,
                    "batch_size": 4,
                    "n_positions": 5000,
                },
                "output": prf.batch_offsets(9, HOST, 2, 3, 4, 5000),
            }
        ],
        "sample_segments": [
            {
                "input": {"block_hash": BLOCK, "host": HOST, "n_segments": n, "s": s},
                "output": prf.sample_segments(BLOCK, HOST, n, s),
            }
            for n, s in [(1, 1), (10, 1), (10, 3), (10, 10), (50, 4)]
        ],
        "draw_windows": [  # sampling windows: each checker slot's window start (specs §5)
            {
                "input": {"block_hash": BLOCK, "host": HOST, "n_segments": n, "w": w, "slots": c},
                "output": {"windows": prf.draw_windows(BLOCK, HOST, n, w, c),
                           "opened": prf.windows_opened(prf.draw_windows(BLOCK, HOST, n, w, c), n, w)},
            }
            for n, w, c in [(1, 1, 1), (6, 2, 5), (10, 3, 2), (10, 4, 7), (100, 3, 7), (100, 100, 3)]
        ],
        "prf_int_wide": [  # bounds above 2^64 (sums of stakes) read two or more words per sample
            {"input": {"seed": 5, "parts": ["w", i], "bound": b}, "output": prf.prf_int(5, "w", i, bound=b)}
            for i, b in enumerate([2**64 + 1, 3 * 2**100 + 7, 2**200 - 1])
        ],
        "assign_verifiers": [
            {
                "input": {"block_hash": BLOCK, "host": HOST, "stakes": stakes, "v": v, "round": r,
                          "exclude": exclude},
                "output": prf.assign_verifiers(BLOCK, HOST, stakes, v, r, exclude),
            }
            for stakes in (dict.fromkeys(verifiers, 10**9), {a: (i + 1) ** 3 * 10**9 for i, a in
                                                                enumerate(verifiers)})
            for v, r, exclude in [(1, 0, []), (2, 0, []), (2, 1, verifiers[:2]), (3, 2, verifiers[1:4]),
                                  (10, 0, [])]
        ],
        "seed_from_blocks": [
            {"input": hashes, "output": prf.seed_from_blocks(hashes)}
            for hashes in ([BLOCK], [hashlib.sha256(f"block {i}".encode()).hexdigest() for i in range(1, 4)])
        ],
        "audited": [
            {"input": {"seed": BLOCK, "host": f"gonka1host{i}", "audit_bps": bps},
             "output": prf.audited(BLOCK, f"gonka1host{i}", bps)}
            for i, bps in enumerate([0, 1, 2500, 5000, 9999, 10_000, 5000, 5000])
        ],
    }


def outer_vectors() -> list[dict[str, Any]]:
    params = {"w": ramp(6, (2, 3)), "b": ramp(3, (3,), mul=7)}
    momentum = {"w": ramp(6, (2, 3), mul=3) / 512, "b": torch.zeros(3)}
    deltas = [
        ("gonka1hostb", 300, {"w": ramp(6, (2, 3), mul=11) / 256, "b": ramp(3, (3,), mul=13) / 256}),
        ("gonka1hosta", 100, {"w": ramp(6, (2, 3), mul=17) / 256, "b": ramp(3, (3,), mul=19) / 256}),
        ("gonka1hostc", 7, {"w": ramp(6, (2, 3), mul=23) / 256, "b": ramp(3, (3,), mul=29) / 256}),
    ]
    out = sparse_outer_vectors(params, momentum, deltas)
    for lr, mu, ds in [(0.7, 0.9, deltas), (0.7, 0.9, deltas[:1]), (0.5, 0.0, deltas), (0.7, 0.9, [])]:
        new_p, new_m = outer_update(params, momentum, ds, lr, mu)
        out.append(
            {
                "input": {
                    "lr": lr,
                    "mu": mu,
                    "params": set_to_json(params),
                    "momentum": set_to_json(momentum),
                    "deltas": [{"host": h, "tokens": w, "delta": set_to_json(d)} for h, w, d in ds],
                },
                "output": {
                    "params": set_to_json(new_p),
                    "momentum": set_to_json(new_m),
                    "global_model_hash": global_model_hash(new_p, new_m),
                    "input_global_model_hash": global_model_hash(params, momentum),
                    # §2.2.1: the eager start of the first delta's host, its own Δ standing in (× α)
                    "eager_alpha": float(eager_scale(lr, mu)),
                    "eager_start": None if not ds else set_to_json(
                        eager_start(params, momentum, ds[0][2], lr, mu)
                    ),
                },
            }
        )
    return out + contributors_vectors(params, momentum, deltas)


Deltas = list[tuple[str, int, dict[str, torch.Tensor]]]


def sparse_outer_vectors(params: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor],
                         deltas: Deltas) -> list[dict[str, Any]]:  # fmt: skip
    """§7 over sparse payloads (g from +0, kept entries only), both outer rules."""
    from protocol.config import OuterRule
    from protocol.outer import sparse_outer_update

    payloads = [(h, w, codecs.encode(d, Codec.SPARSE, 8, 3)) for h, w, d in deltas]
    out = []
    cases = [(OuterRule.NESTEROV, 0.7, 0.9, payloads), (OuterRule.AVERAGE, 1.0, 0.9, payloads),
             (OuterRule.AVERAGE, 0.7, 0.0, payloads[:1])]
    for rule, lr, mu, ps in cases:
        new_p, new_m = sparse_outer_update(params, momentum, ps, lr, mu, chunk=8, topk=3, rule=rule)
        out.append({
            "input": {"lr": lr, "mu": mu, "rule": rule.value, "chunk": 8, "topk": 3,
                      "params": set_to_json(params), "momentum": set_to_json(momentum),
                      "payloads": [{"host": h, "tokens": w, "payload": p.hex()} for h, w, p in ps]},
            "output": {"params": set_to_json(new_p), "momentum": set_to_json(new_m),
                       "global_model_hash": global_model_hash(new_p, new_m)},
        })  # fmt: skip
    return out


def contributors_vectors(params: dict[str, torch.Tensor], momentum: dict[str, torch.Tensor],
                         deltas: Deltas) -> list[dict[str, Any]]:  # fmt: skip
    """§4.1 `sparse_mean = "contributors"` (issue 37): each coordinate's mean over the hosts that kept
    it, with unequal tokens (float32 denominators) and equal ones (what the chain admits: a count)."""
    from protocol.config import OuterRule, SparseMean
    from protocol.outer import sparse_outer_update

    equal = [(h, 4096, d) for h, _, d in deltas]
    out = []
    for rule, lr, mu, ds in [(OuterRule.NESTEROV, 0.7, 0.9, deltas), (OuterRule.AVERAGE, 1.0, 0.9, deltas),
                             (OuterRule.NESTEROV, 0.7, 0.9, equal), (OuterRule.AVERAGE, 1.0, 0.0, equal)]:
        ps = [(h, w, codecs.encode(d, Codec.SPARSE, 8, 3)) for h, w, d in ds]
        new_p, new_m = sparse_outer_update(params, momentum, ps, lr, mu, chunk=8, topk=3, rule=rule,
                                           mean=SparseMean.CONTRIBUTORS)  # fmt: skip
        out.append({
            "input": {"lr": lr, "mu": mu, "rule": rule.value, "mean": SparseMean.CONTRIBUTORS.value,
                      "chunk": 8, "topk": 3, "params": set_to_json(params), "momentum": set_to_json(momentum),
                      "payloads": [{"host": h, "tokens": w, "payload": p.hex()} for h, w, p in ps]},
            "output": {"params": set_to_json(new_p), "momentum": set_to_json(new_m),
                       "global_model_hash": global_model_hash(new_p, new_m)},
        })  # fmt: skip
    return out


def wire_vectors() -> list[dict[str, Any]]:
    h = hashlib.sha256(b"x").hexdigest()
    cfg = RunConfig(
        model=ModelSpec(factory="trainer.model:gpt", config={"n_layer": 2, "dropout": 0.1, "act": "gelu"}),
        dataset_manifest_hash=h,
        initial_model_hash=h,
    )
    msgs = [
        MsgCreateRun(creator=HOST, config=cfg),
        MsgCommitPseudoGradient(
            creator=HOST,
            run_id=1,
            outer_step=3,
            base_model_hash=h,
            trajectory_root=h,
            leaf_count=11,
            delta_hash=h,
            final_optimizer_hash=h,
            codec=Codec.INT8,
            tokens=5120,
            env=EnvFingerprint(torch_version="2.13.0", threads=1),
        ),
        MsgCreateRun(creator=HOST, config=cfg.model_copy(update={"numerics": Numerics(precision="bf16")})),
        MsgCommitPseudoGradient(
            creator=HOST, run_id=1, outer_step=3, base_model_hash=h, trajectory_root=h, leaf_count=11,
            delta_hash=h, final_optimizer_hash=h, codec=Codec.INT8, tokens=5120,
            env=EnvFingerprint(**H200, micro_batches=8),
        ),
        MsgSubmitVerdict(
            creator=HOST, run_id=1, outer_step=3, host=HOST, reason=Reason.REPLAY_MISMATCH, evidence_hash=h
        ),
        MsgJoinRun(  # §6.1: bitwise draws prefer the verifiers of a commitment's class
            creator=HOST,
            run_id=1,
            role=Role.VERIFIER,
            endpoint="http://v",
            stake=5 * 10**9,
            replay_class=EnvFingerprint(**H200).replay_class,
        ),
        MsgSend(from_address=HOST, to_address=HOST, amount=[Coin(amount=10**9)]),
        MsgReportUnavailable(creator=HOST, run_id=1, outer_step=3, hosts=[VERIFIER_ADDRESSES[0]]),
        # §2.7: `val_loss_ppm` (field 5) is on the wire only when non-zero
        MsgSubmitOuterResult(creator=HOST, run_id=1, outer_step=3, model_hash=h),
        MsgSubmitOuterResult(creator=HOST, run_id=1, outer_step=3, model_hash=h, val_loss_ppm=2_461_234),
        # §2.2.1: an overlapped run carries `overlap` (field 29); a sequential one leaves it unset
        MsgCreateRun(creator=HOST, config=cfg.model_copy(update={"overlap": Overlap.EAGER})),
        # §2.3.1: `early_close` (Phases field 15) is on the wire only when set
        MsgCreateRun(creator=HOST, config=cfg.model_copy(
            update={"phases": cfg.phases.model_copy(update={"early_close": True})})),
        # §4.1: a sparse run (codec, chunk C, k) and its commit, which names the host's e_next
        # (`final_ef_hash`, field 12; a dense commit leaves it off the wire)
        MsgCreateRun(creator=HOST, config=cfg.model_copy(
            update={"codec": Codec.SPARSE, "codec_block_size": 4096, "codec_topk": 64})),
        MsgCommitPseudoGradient(
            creator=HOST, run_id=1, outer_step=3, base_model_hash=h, trajectory_root=h, leaf_count=11,
            delta_hash=h, final_optimizer_hash=h, codec=Codec.SPARSE, tokens=5120,
            env=EnvFingerprint(torch_version="2.13.0", threads=1),
            final_ef_hash=hashlib.sha256(b"e").hexdigest(),
        ),
    ]
    return [
        {
            "input": {"type_url": m.type_url(), "json": m.model_dump(mode="json")},
            "output": to_any(m).value.hex(),
        }
        for m in msgs
    ]


TORCH_GIT = "cf30153c4c131c8164ee7798e5022d810682e2cb"
CPU_AVX512: dict[str, Any] = {"torch_version": "2.13.0", "torch_git": TORCH_GIT, "threads": 1,
                              "device": "cpu", "cpu_capability": "AVX512"}  # fmt: skip
H200: dict[str, Any] = {
    "torch_version": "2.13.0+cu130", "torch_git": TORCH_GIT, "threads": 1,
    "device": "cuda", "cpu_capability": "AVX512", "gpu_name": "NVIDIA H200", "compute_capability": "9.0",
    "sm_count": 132, "cuda_version": "13.0", "cudnn_version": "92000", "nccl_version": "2.29.7",
}  # fmt: skip


def envclass_vectors() -> dict[str, Any]:
    """Replay classes of fingerprints (§6.1), and the verifier's decision for pairs of them."""
    envs = {
        "cpu-avx512-1t": CPU_AVX512,
        "cpu-avx512-2t": {**CPU_AVX512, "threads": 2},
        "cpu-avx2-1t": {**CPU_AVX512, "cpu_capability": "AVX2"},
        "h200": H200,
        "h200-8t-other-nccl": {**H200, "threads": 8, "nccl_version": "2.27.3", "cpu_capability": "AVX2"},
        "h100": {**H200, "gpu_name": "NVIDIA H100 80GB HBM3"},
        "h200-cuda12.8": {**H200, "cuda_version": "12.8"},
    }
    envs = {name: EnvFingerprint(**env).model_dump(exclude={"replay_class"}) for name, env in envs.items()}
    classes = {
        name: {"class_fields": class_fields(env), "replay_class": EnvFingerprint(**env).replay_class}
        for name, env in envs.items()
    }
    decisions = []
    for mode in ("bitwise", "tolerance"):
        for host in ("cpu-avx512-1t", "h200"):
            for verifier in envs:
                h, v = EnvFingerprint(**envs[host]), EnvFingerprint(**envs[verifier])
                calibrated = [class_pair(h.replay_class, EnvFingerprint(**envs["h100"]).replay_class)]
                decisions.append({
                    "mode": mode, "host": host, "verifier": verifier,
                    "decision": replay_decision(mode, h, v).value,
                    "decision_if_only_host_h100_calibrated": replay_decision(mode, h, v, calibrated).value,
                })  # fmt: skip
    return {"domain": CLASS_DOMAIN.decode("ascii"), "envs": envs, "classes": classes, "decisions": decisions}


# ---- chain scenarios ---------------------------------------------------------------------------


def _address(name: str) -> str:
    from cosmpy.crypto.address import Address

    return str(Address(hashlib.sha256(name.encode()).digest()[:20], prefix="gonka"))


VERIFIER_ADDRESSES = [_address(f"vector verifier {i}") for i in range(4)]
HOST_ADDRESSES = [_address(f"vector host {i}") for i in range(3)]
AUTHORITY = _address("vector authority")
GNK = 10**9


def vector_block_hash(height: int) -> str:
    """The scenarios' block hashes are fixed (not derived from app hashes): easy to replay."""
    return hashlib.sha256(f"gonka-diloco/vector-block/{height}".encode()).hexdigest()


def vector_genesis() -> Genesis:
    funded = dict.fromkeys([AUTHORITY, *HOST_ADDRESSES, *VERIFIER_ADDRESSES], 1000 * GNK)
    return Genesis(authority=AUTHORITY, accounts=funded, reward_pool=10_000 * GNK)


def replay_blocks(blocks: list[dict[str, Any]]) -> ChainState:
    """Run a scenario: each block's begin_block, its messages (all must succeed), end_block."""
    state = genesis_state(vector_genesis())
    height = 0
    if [b["height"] for b in blocks] != sorted({b["height"] for b in blocks}):
        raise ValueError("block heights must increase")
    for b in blocks:
        while height < b["height"]:
            height += 1
            prev = vector_block_hash(height - 1)
            ctx = BlockContext(height=height, time_ns=height * 10**9, prev_block_hash=prev)
            begin_block(state, ctx)
            if height == b["height"]:
                for i, tx in enumerate(b["txs"]):
                    msg = _MODEL_OF[tx["type_url"]].model_validate(tx["json"])
                    tx_hash = hashlib.sha256(f"tx {height} {i}".encode()).hexdigest()
                    signer = msg.creator  # type: ignore[attr-defined]
                    process_msg(state, msg, TxContext(height, height * 10**9, tx_hash, signer))
            end_block(state, ctx)
    return state


def scenario_summary(state: ChainState) -> dict[str, Any]:
    run = state.runs[1]
    eager = {}  # §2.2.1: which own Δ each contribution's start was built on
    if run.config.get("overlap") == "eager":
        eager["parents"] = {str(i): {h: c.parent_delta_hash for h, c in sorted(s.contributions.items())}
                            for i, s in sorted(run.steps.items())}  # fmt: skip
    return {
        **eager,
        "app_hash": app_hash(state).hex(),
        "global_model_hash": run.global_model_hash,
        "steps": {
            str(i): {k: queries.outer_step(state, 1, i)[k] for k in
                     ("phase", "outcomes", "reviews", "accepted", "dropped", "result_round", "result_hash",
                      "result_losses")}
            for i in sorted(run.steps)
        },
        "stakes": {a: p.stake for a, p in sorted(run.participants.items())},
        "rewards": {h: c.reward for h, c in sorted(run.steps[0].contributions.items())},
    }


class _Scenario:
    """Builds a scenario block by block, asking the state who was drawn, and records the txs."""

    def __init__(self, config: RunConfig) -> None:
        self.blocks: list[dict[str, Any]] = []
        self.config = config
        self.add(1, MsgCreateRun(creator=AUTHORITY, config=config))
        stakes = [4 * GNK, 3 * GNK, 2 * GNK, 2 * GNK]  # stake-weighted draws and confirmations
        self.add(2, *[MsgJoinRun(creator=h, run_id=1, role=Role.HOST, endpoint="http://h", stake=10 * GNK)
                      for h in HOST_ADDRESSES],
                 *[MsgJoinRun(creator=v, run_id=1, role=Role.VERIFIER, endpoint="http://v", stake=s)
                   for v, s in zip(VERIFIER_ADDRESSES, stakes, strict=True)])  # fmt: skip

    def add(self, height: int, *msgs: Any) -> None:
        """Append the messages to block `height` (created in height order if new)."""
        txs = [{"type_url": m.type_url(), "json": m.model_dump(mode="json")} for m in msgs]
        for block in self.blocks:
            if block["height"] == height:
                block["txs"] += txs
                return
        self.blocks.append({"height": height, "txs": txs})
        self.blocks.sort(key=lambda b: b["height"])

    def state(self) -> ChainState:
        return replay_blocks(self.blocks)

    def peek(self, height: int) -> ChainState:
        """The state after block `height` (empty blocks up to it), without recording them."""
        last = self.blocks[-1]["height"]
        return replay_blocks(self.blocks if height <= last else [*self.blocks, {"height": height, "txs": []}])

    def step(self) -> dict[str, Any]:
        return queries.outer_step(self.state(), 1)

    def leaves(self, host: str) -> list[bytes]:
        return [hashlib.sha256(f"{host}:{i}".encode()).digest() for i in range(self.config.n_segments + 1)]

    def commit(self, index: int, hosts: list[str]) -> None:
        """`hosts` commit to outer step `index` at its training start (the step must be open)."""
        step = queries.outer_step(self.state(), 1, index)
        self.add(step["train_start"], *[MsgCommitPseudoGradient(
            creator=h, run_id=1, outer_step=index, base_model_hash=step["base_model_hash"],
            trajectory_root=merkle.merkle_root(self.leaves(h)).hex(), leaf_count=self.config.n_segments + 1,
            delta_hash=hashlib.sha256(f"delta {h} {index}".encode()).hexdigest(),
            final_optimizer_hash=hashlib.sha256(f"opt {h} {index}".encode()).hexdigest(),
            codec=self.config.codec, tokens=self.config.tokens_per_outer_step,
            env=EnvFingerprint(torch_version="2.13.0", threads=1),
        ) for h in hosts])  # fmt: skip

    def reveal(self, index: int, hosts: list[str], height: int | None = None) -> None:
        """`hosts` reveal their openings of outer step `index` at `height` (its challenge height)."""
        height = height or queries.outer_step(self.state(), 1, index)["challenge_height"]
        state = self.peek(height)
        reveals = []
        for c in queries.challenges(state, 1, index)["challenges"]:
            if c["host"] not in hosts:
                continue
            lv = self.leaves(c["host"])
            openings = [SegmentOpening(segment=j, start_leaf=lv[j].hex(), end_leaf=lv[j + 1].hex(),
                                       proof=[x.hex() for x in merkle.pair_proof(lv, j)])
                        for j in c["segments"]]
            reveals.append(MsgRevealContribution(creator=c["host"], run_id=1, outer_step=index,
                                                 openings=openings))
        self.add(height, *reveals)  # fmt: skip

    def commit_and_reveal(self) -> None:
        step = self.step()
        self.add(step["train_start"], *[MsgCommitPseudoGradient(
            creator=h, run_id=1, outer_step=0, base_model_hash=step["base_model_hash"],
            trajectory_root=merkle.merkle_root(self.leaves(h)).hex(), leaf_count=self.config.n_segments + 1,
            delta_hash=hashlib.sha256(f"delta {h}".encode()).hexdigest(),
            final_optimizer_hash=hashlib.sha256(f"opt {h}".encode()).hexdigest(), codec=self.config.codec,
            tokens=self.config.tokens_per_outer_step, env=EnvFingerprint(torch_version="2.13.0", threads=1),
        ) for h in HOST_ADDRESSES])  # fmt: skip
        state = self.peek(step["challenge_height"])
        reveals = []
        for c in queries.challenges(state, 1)["challenges"]:
            lv = self.leaves(c["host"])
            openings = [SegmentOpening(segment=j, start_leaf=lv[j].hex(), end_leaf=lv[j + 1].hex(),
                                       proof=[x.hex() for x in merkle.pair_proof(lv, j)])
                        for j in c["segments"]]
            reveals.append(MsgRevealContribution(creator=c["host"], run_id=1, outer_step=0,
                                                 openings=openings))
        self.add(step["challenge_height"], *reveals)  # fmt: skip

    def assigned(self, height: int) -> dict[str, list[str]]:
        state = self.peek(height)
        return {c["host"]: sorted(c["verifier_rounds"]) for c in queries.challenges(state, 1)["challenges"]}

    def verdicts(
        self,
        height: int,
        bad: str | None = None,
        colluders: tuple[str, ...] = (),
        index: int = 0,
        only: tuple[str, ...] | None = None,
    ) -> None:
        """Every assigned verifier without a verdict judges (the hosts in `only`, if given):
        REPLAY_MISMATCH for `bad`, unless it colludes; ACCEPT otherwise."""
        state = self.peek(height)
        msgs = []
        for v in VERIFIER_ADDRESSES:
            for host in queries.assignments(state, 1, v, index)["hosts"]:
                if only is not None and host not in only:
                    continue
                reason = Reason.REPLAY_MISMATCH if host == bad and v not in colluders else Reason.ACCEPT
                ev = hashlib.sha256(f"evidence {v} {host}".encode()).hexdigest()
                msgs.append(MsgSubmitVerdict(creator=v, run_id=1, outer_step=index, host=host, reason=reason,
                                             evidence_hash=ev))  # fmt: skip
        self.add(height, *msgs)

    def run_to(self, height: int) -> None:
        self.add(height)

    def finalized_at(self) -> int:
        """The height at which outer step 0 finalizes if nothing more is sent."""
        h = self.blocks[-1]["height"]
        while (fin := queries.outer_step(self.peek(h), 1, 0)["finalized_height"]) is None:
            h += 1
        return fin


def _vector_config(**kw: Any) -> RunConfig:
    h = hashlib.sha256(b"vector").hexdigest()
    base: dict[str, Any] = dict(
        model=ModelSpec(factory="trainer.model:tiny", config={"param_count": 1000}),  # declared (§2.4)
        dataset_manifest_hash=h, initial_model_hash=h,
        inner_steps=4, segment_len=2, sampled_segments=1, verifiers_per_contribution=1, audit_bps=0,
        batch_size=2, seq_len=8, codec=Codec.INT8,
        phases=Phases(join_blocks=1, train_blocks=2, reveal_blocks=2, verify_blocks=2, audit_blocks=2,
                      confirm_blocks=2, result_blocks=2, result_rounds=2, epoch_length=1000),
        stake=Stake(min_host_stake=GNK, min_verifier_stake=GNK, reward_per_outer_step=90 * GNK),
    )  # fmt: skip
    return RunConfig(**{**base, **kw})


def _vote(host: str, model: str, index: int = 0, loss_ppm: int = 0) -> MsgSubmitOuterResult:
    return MsgSubmitOuterResult(
        creator=host, run_id=1, outer_step=index, model_hash=hashlib.sha256(model.encode()).hexdigest(),
        val_loss_ppm=loss_ppm,
    )


def chain_vectors() -> list[dict[str, Any]]:
    """Whole outer steps through the state machine: the new result, report, audit and dispute rules.
    An implementation replays `blocks` (block h has prev_block_hash = vector_block_hash(h − 1);
    every message succeeds) and must reach `output`, app hash included."""
    out = []

    # 1. withhold and forge: the withholder votes a made-up model, the others report it unavailable
    sc = _Scenario(_vector_config())
    sc.commit_and_reveal()
    step = sc.step()
    sc.verdicts(step["challenge_height"] + 1)
    fin = step["verify_deadline"] + 1
    good, withholder = HOST_ADDRESSES[:2], HOST_ADDRESSES[2]
    sc.add(fin, _vote(withholder, "forged"), *[MsgReportUnavailable(creator=h, run_id=1, outer_step=0,
                                                                    hosts=[withholder]) for h in good])
    sc.run_to(fin + 2)  # round 0 closes: the withholder is dropped
    # §2.7: each vote carries its voter's validation loss of the model (stored, never counted)
    sc.add(fin + 3, *[_vote(h, "g1 without the withholder", loss_ppm=2_461_234) for h in good])
    out.append({"label": "withhold_and_forge", "blocks": sc.blocks})

    # 2. a lone vote never decides: two result rounds, then G_{n+1} = G_n
    sc = _Scenario(_vector_config())
    sc.commit_and_reveal()
    step = sc.step()
    sc.verdicts(step["challenge_height"] + 1)
    sc.add(step["verify_deadline"] + 1, _vote(HOST_ADDRESSES[0], "forged"))
    sc.run_to(step["verify_deadline"] + 6)
    out.append({"label": "lone_vote_closes_with_g_n", "blocks": sc.blocks})

    # 3. colluding accept, audit, dispute decided by verifier stake, fraud slashes
    sc = _Scenario(_vector_config(audit_bps=10_000))
    sc.commit_and_reveal()
    step = sc.step()
    first = sc.assigned(step["challenge_height"])
    cheat = HOST_ADDRESSES[0]
    colluders = tuple(first[cheat])
    sc.verdicts(step["challenge_height"] + 1, bad=cheat, colluders=colluders)
    audit_height = step["verify_deadline"] + 2
    sc.verdicts(audit_height + 1, bad=cheat, colluders=colluders)  # the auditors
    sc.verdicts(audit_height + 3, bad=cheat, colluders=colluders)  # the dispute panel
    sc.add(sc.finalized_at() + 1, *[_vote(h, "g1 honest") for h in HOST_ADDRESSES[1:]])
    out.append({"label": "audit_catches_collusion", "blocks": sc.blocks})

    # 4. a lone malicious reject is outvoted by stake; the rejecting verifier is slashed
    sc = _Scenario(_vector_config())
    sc.commit_and_reveal()
    step = sc.step()
    first = sc.assigned(step["challenge_height"])
    victim = HOST_ADDRESSES[1]
    liar = first[victim][0]
    state = sc.peek(step["challenge_height"] + 1)
    msgs = []
    for v in VERIFIER_ADDRESSES:
        for host in queries.assignments(state, 1, v)["hosts"]:
            reason = Reason.REPLAY_MISMATCH if v == liar and host == victim else Reason.ACCEPT
            msgs.append(MsgSubmitVerdict(creator=v, run_id=1, outer_step=0, host=host, reason=reason,
                                         evidence_hash=hashlib.sha256(v.encode()).hexdigest()))  # fmt: skip
    sc.add(step["challenge_height"] + 1, *msgs)
    sc.verdicts(step["verify_deadline"] + 1)  # the panel
    sc.add(sc.finalized_at() + 1, *[_vote(h, "g1") for h in HOST_ADDRESSES[:2]])
    out.append({"label": "malicious_reject_outvoted", "blocks": sc.blocks})

    # 5. the overlapped schedule (§2.2.1): step 1 trains while step 0 is verified and voted on; step 2
    # opens the block after step 0 closes, on its result; step 1's Δs (one host missed its reveal:
    # slashed, out of the model) are applied to step 0's result once it is adopted. (The eager
    # schedule, the only overlapped one since issue 22; its parent rule is scenario 6's.)
    sc = _Scenario(_vector_config(overlap=Overlap.EAGER))
    sc.commit(0, HOST_ADDRESSES)
    s0 = sc.step()
    sc.run_to(s0["commit_deadline"] + 1)  # step 1 opens here
    sc.commit(1, HOST_ADDRESSES)
    sc.reveal(0, HOST_ADDRESSES)
    sc.verdicts(s0["challenge_height"] + 1, index=0)
    s1 = queries.outer_step(sc.state(), 1, 1)
    sc.reveal(1, HOST_ADDRESSES[:2])
    sc.verdicts(s1["challenge_height"] + 1, index=1, only=tuple(HOST_ADDRESSES[:2]))
    sc.add(s0["verify_deadline"] + 1, *[_vote(h, "g1", 0) for h in HOST_ADDRESSES[:2]])  # 2 of 3: adopted
    sc.commit(2, HOST_ADDRESSES)  # on g1
    sc.add(s1["verify_deadline"] + 1, *[_vote(h, "g2 = g1 + step 1", 1) for h in HOST_ADDRESSES[:2]])
    sc.run_to(s1["verify_deadline"] + 2)
    out.append({"label": "overlapped_schedule", "blocks": sc.blocks})

    # 6. the eager schedule (§2.2.1): each host's step 1 starts from its own step 0 Δ (its parent).
    # Host 2 misses its step 0 reveal: its step 1 Δ, accepted by its verifiers, is dropped as
    # parent_not_accepted when step 1's result round starts, unslashed; step 2's start has no parent.
    sc = _Scenario(_vector_config(overlap=Overlap.EAGER))
    sc.commit(0, HOST_ADDRESSES)
    s0 = sc.step()
    sc.run_to(s0["commit_deadline"] + 1)  # step 1 opens here
    sc.commit(1, HOST_ADDRESSES)
    sc.reveal(0, HOST_ADDRESSES[:2])
    sc.verdicts(s0["challenge_height"] + 1, index=0, only=tuple(HOST_ADDRESSES[:2]))
    s1 = queries.outer_step(sc.state(), 1, 1)
    sc.reveal(1, HOST_ADDRESSES)
    sc.verdicts(s1["challenge_height"] + 1, index=1)
    sc.add(s0["verify_deadline"] + 1, *[_vote(h, "g1", 0) for h in HOST_ADDRESSES[:2]])
    sc.commit(2, HOST_ADDRESSES)  # on g1; hosts 0 and 1 with their step 1 Δ as parent, host 2 without
    sc.add(s1["verify_deadline"] + 1, *[_vote(h, "g2 = g1 + step 1", 1) for h in HOST_ADDRESSES[:2]])
    sc.run_to(s1["verify_deadline"] + 2)
    out.append({"label": "eager_schedule", "blocks": sc.blocks})

    # 7. early close (§2.3.1): every host commits at the training start, every challenged host
    # reveals at the challenge height and every verifier judges at once, so each window closes in
    # the block its last message landed in and the step is adopted far before its fixed deadlines.
    # A join window of 3 blocks: the verifiers bonded at height 2 have served the bonding delay
    # (§2.3, 4 blocks) by the challenge at height 6 that the train window's early close brings.
    cfg = _vector_config()
    early = cfg.phases.model_copy(update={"early_close": True, "join_blocks": 3})
    sc = _Scenario(cfg.model_copy(update={"phases": early}))
    sc.commit(0, HOST_ADDRESSES)
    sc.reveal(0, HOST_ADDRESSES)
    s0 = sc.step()
    sc.verdicts(s0["challenge_height"] + 1)
    sc.add(sc.finalized_at() + 1, *[_vote(h, "g1") for h in HOST_ADDRESSES[:2]])  # 2 of 3: adopted
    out.append({"label": "early_close", "blocks": sc.blocks})

    # 8. the bonding delay (§2.3): the authority bonds as a verifier, with 125x the others' stake, in
    # the block before step 0's challenge: step 0's pool is fixed 4 blocks before the challenge, so it
    # is drawn for nobody there (nor in step 0's audit or dispute); in step 1 it is drawn like anyone.
    sc = _Scenario(_vector_config())
    s0 = sc.step()
    sc.add(s0["challenge_height"] - 1, MsgJoinRun(creator=AUTHORITY, run_id=1, role=Role.VERIFIER,
                                                  endpoint="http://late", stake=500 * GNK))  # fmt: skip
    sc.commit_and_reveal()
    assert all(AUTHORITY not in vs for vs in sc.assigned(s0["challenge_height"]).values())
    sc.verdicts(s0["challenge_height"] + 1)
    sc.add(sc.finalized_at() + 1, *[_vote(h, "g1") for h in HOST_ADDRESSES[:2]])  # 2 of 3: adopted
    sc.commit(1, HOST_ADDRESSES)
    s1 = queries.outer_step(sc.state(), 1, 1)
    sc.run_to(s1["challenge_height"] + 1)
    step1 = queries.challenges(sc.state(), 1, 1)["challenges"]
    assert any(AUTHORITY in c["verifier_rounds"] for c in step1)
    out.append({"label": "bonding_delay", "blocks": sc.blocks})

    # 9. late is not withheld (§2.2.2): host 2 reveals after the reveal deadline, at the last height
    # of its grace (reveal_closes); it is judged like the others, accepted, paid and not slashed.
    sc = _Scenario(_vector_config())
    sc.commit(0, HOST_ADDRESSES)
    sc.reveal(0, HOST_ADDRESSES[:2])
    s0 = sc.step()
    sc.verdicts(s0["challenge_height"] + 1, only=tuple(HOST_ADDRESSES[:2]))
    assert s0["reveal_closes"] > s0["reveal_deadline"]
    sc.reveal(0, HOST_ADDRESSES[2:], height=s0["reveal_closes"])
    sc.verdicts(s0["reveal_closes"], only=tuple(HOST_ADDRESSES[2:]))  # in the block of the reveal
    assert queries.outer_step(sc.peek(sc.finalized_at()), 1, 0)["accepted"] == sorted(HOST_ADDRESSES)
    sc.add(sc.finalized_at() + 1, *[_vote(h, "g1") for h in HOST_ADDRESSES[:2]])  # 2 of 3: adopted
    out.append({"label": "late_reveal_in_grace", "blocks": sc.blocks})

    # 10. sampling windows (§2.3, §2.5.3): H/k = 6 segments in 3 blocks of w = 2, v = 2 checkers on
    # two distinct blocks. Host 0 faked a segment in its first checker's window: that checker
    # rejects, the other accepts its own clean window; the dispute panel and that other checker (its
    # revote) replay the disputed window and reject. The honest accept of the undisputed window is
    # not slashed, and it is no fraud.
    # Host 1 is honest and its first checker lies: the panel replays its window, accepts, and the
    # liar is slashed. Host 2 is accepted by both of its checkers.
    sc = _Scenario(_vector_config(inner_steps=12, window_segments=2, verifiers_per_contribution=2))
    sc.commit_and_reveal()
    step = sc.step()
    state = sc.peek(step["challenge_height"])
    cheat, victim = HOST_ADDRESSES[0], HOST_ADDRESSES[1]
    chs = {c["host"]: c for c in queries.challenges(state, 1)["challenges"]}
    assert len({chs[cheat]["windows"][i] for i in range(2)}) == 2  # two distinct blocks
    slot0 = {h: next(v for v, i in c["slots"].items() if i == 0) for h, c in chs.items()}
    msgs = []
    for host, c in chs.items():
        for v in c["slots"]:
            reason = Reason.REPLAY_MISMATCH if host in (cheat, victim) and v == slot0[host] else Reason.ACCEPT
            msgs.append(MsgSubmitVerdict(creator=v, run_id=1, outer_step=0, host=host, reason=reason,
                                         evidence_hash=hashlib.sha256(f"{v} {host}".encode()).hexdigest()))
    sc.add(step["challenge_height"] + 1, *msgs)
    # the panel, and the holders of the clean windows (their revotes), replay the disputed ones
    _panel_votes(sc, step["verify_deadline"] + 1,
                 lambda v, host: Reason.REPLAY_MISMATCH if host == cheat else Reason.ACCEPT)  # fmt: skip
    sc.add(sc.finalized_at() + 1, *[_vote(h, "g1 of hosts 1 and 2") for h in HOST_ADDRESSES[1:]])
    out.append({"label": "windows_dispute", "blocks": sc.blocks})

    # 11. a Δ dispute under windows (§2.5.3, §6): only the check of the window ending at θ_H checks
    # Δ. A host whose slots hold that window and a window short of θ_H: the first rejects its Δ
    # (DELTA_MISMATCH), the other accepts its own clean window, which answers nothing of the Δ. The
    # panel checks Δ first and rejects; the short window's holder owes a revote (Δ first) and
    # accepts the fake there: that accept, not its first, contradicts the rejected Δ and is slashed
    # at the fraud rate. The other hosts are accepted by both their checkers.
    cfg = _vector_config(inner_steps=12, window_segments=2, verifiers_per_contribution=2)
    sc = _Scenario(cfg)
    sc.commit_and_reveal()
    step = sc.step()
    state = sc.peek(step["challenge_height"])
    chs = {c["host"]: c for c in queries.challenges(state, 1)["challenges"]}

    def at_end(c: dict[str, Any]) -> list[str]:
        return [v for v, i in c["slots"].items() if cfg.window_reaches_end(c["windows"][i])]

    cheat = next(h for h, c in chs.items() if at_end(c))
    checker = at_end(chs[cheat])[0]
    short = next(v for v in chs[cheat]["slots"] if v != checker)
    assert not cfg.window_reaches_end(chs[cheat]["windows"][chs[cheat]["slots"][short]])
    msgs = []
    for host, c in chs.items():
        for v in c["slots"]:
            reason = Reason.DELTA_MISMATCH if (host, v) == (cheat, checker) else Reason.ACCEPT
            msgs.append(MsgSubmitVerdict(creator=v, run_id=1, outer_step=0, host=host, reason=reason,
                                         evidence_hash=hashlib.sha256(f"{v} {host}".encode()).hexdigest()))
    sc.add(step["challenge_height"] + 1, *msgs)
    # the panel rejects the Δ; the short window's holder, a colluder, accepts it in its revote
    _panel_votes(sc, step["verify_deadline"] + 1,
                 lambda v, host: Reason.ACCEPT if v == short else Reason.DELTA_MISMATCH)  # fmt: skip
    rest = [h for h in HOST_ADDRESSES if h != cheat]
    sc.add(sc.finalized_at() + 1, *[_vote(h, "g1 of the other hosts") for h in rest])
    out.append({"label": "windows_delta_dispute", "blocks": sc.blocks})

    for v in out:
        v["genesis"] = vector_genesis().model_dump(mode="json")
        v["output"] = scenario_summary(replay_blocks(v["blocks"]))
    return out


BUILDERS = {
    "tensors": tensor_vectors,
    "chunks": chunk_vectors,
    "merkle": merkle_vectors,
    "codecs": codec_vectors,
    "prf": prf_vectors,
    "outer": outer_vectors,
    "wire": wire_vectors,
    "envclass": envclass_vectors,
    "chain": chain_vectors,
    "tolerance": tolerance_vectors,  # specs/tolerance_vectors.py (§6.3)
    "modelsize": modelsize_vectors,  # specs/strict_vectors.py (§2.4.1)
    "strict": strict_vectors,  # specs/strict_vectors.py (§1)
    "moments": moments_vectors,  # specs/state_vectors.py (§6.2.1)
    "statecode": statecode_vectors,  # specs/state_vectors.py (§8.2)
}


def _panel_votes(sc: _Scenario, height: int, reason_of: Callable[[str, str], Reason]) -> None:
    """Every verdict the chain asks for at `height` (a dispute's panel and the revotes it owes),
    each verifier's reason for each host from `reason_of(verifier, host)`, in one block."""
    state = sc.peek(height)
    msgs = []
    for v in VERIFIER_ADDRESSES:
        for host in queries.assignments(state, 1, v)["hosts"]:
            ev = hashlib.sha256(f"panel {v} {host}".encode()).hexdigest()
            msgs.append(MsgSubmitVerdict(creator=v, run_id=1, outer_step=0, host=host,
                                         reason=reason_of(v, host), evidence_hash=ev))  # fmt: skip
    sc.add(height, *msgs)


def render(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True) + "\n"


def main() -> None:
    VECTORS.mkdir(parents=True, exist_ok=True)
    for name, build in BUILDERS.items():
        path = VECTORS / f"{name}.json"
        path.write_text(render(build()))
        print(f"{path.relative_to(VECTORS.parent.parent)}  {path.stat().st_size:>8} bytes")


if __name__ == "__main__":
    main()
