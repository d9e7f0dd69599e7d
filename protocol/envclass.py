"""Replay classes: which environments reproduce each other's training steps bit for bit.

An environment fingerprint (`protocol.messages.EnvFingerprint`) records everything known to
change the bits of a training step. Its *replay class* is a hash of exactly the fields that
decide bitwise equality (specs/protocol.md §6.1):

- CPU: torch build (version + git hash), the CPU instruction set torch dispatches to (AVX2 and
  AVX-512 kernels reduce in different orders) and the intra-op thread count;
- CUDA: torch build, GPU model, compute capability, SM count (cuBLAS picks kernels and split-K
  by these), CUDA and cuDNN versions. Thread count and CPU ISA do not enter: no float op of a
  CUDA step runs on the CPU.

Not in the class: NCCL's version (the ordered reduction all-gathers, a bitwise copy), the
micro-batch count (a property of the trajectory, replayed as committed, not of the machine),
and the run's numerics (precision, TF32, attention backend: the run config pins them for all).

Pure, no I/O and no pydantic, so `bench/gpu_check.py` uses it on a bare torch install and the
chain can use it to draw verifiers by class (phase 2).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from enum import StrEnum
from typing import Any, Protocol

CLASS_DOMAIN = b"gonka-diloco/replay-class/v1\x00"
CPU_FIELDS = ("torch_version", "torch_git", "cpu_capability", "threads", "deterministic")
CUDA_FIELDS = (
    "torch_version",
    "torch_git",
    "gpu_name",
    "compute_capability",
    "sm_count",
    "cuda_version",
    "cudnn_version",
    "deterministic",
)


class ReplayDecision(StrEnum):
    """What a verifier does with a contribution, given its own class and the host's."""

    BITWISE = "bitwise"  # same class, bitwise mode: the replayed leaf must hash to the committed one
    TOLERANCE = "tolerance"  # tolerance mode: compare every tensor group with its calibrated threshold
    ABSTAIN = "abstain"  # this verifier cannot judge: not the host's fault, no verdict


class Fingerprint(Protocol):
    """What `replay_decision` reads of an `EnvFingerprint` (a frozen model: read-only)."""

    @property
    def replay_class(self) -> str: ...


def class_fields(env: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a fingerprint (as a dict) that decide bitwise equality, plus the device type."""
    device = str(env.get("device", "cpu"))
    names = CUDA_FIELDS if device == "cuda" else CPU_FIELDS
    return {"device": device, **{n: env.get(n) for n in names}}


def replay_class(env: Mapping[str, Any]) -> str:
    """sha256(domain || canonical JSON of `class_fields`) as 64 hex: equal exactly when those fields are."""
    body = json.dumps(class_fields(env), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(CLASS_DOMAIN + body.encode()).hexdigest()


def class_pair(a: str, b: str) -> frozenset[str]:
    """An unordered pair of classes, as tolerance calibrations are keyed (one class: a singleton)."""
    return frozenset((a, b))


def replay_decision(
    mode: str,
    host: Fingerprint,
    verifier: Fingerprint,
    calibrated: Collection[frozenset[str]] | None = None,
) -> ReplayDecision:
    """The class rule of specs/protocol.md §6.1.

    Bitwise mode: only a verifier of the host's class can reproduce the leaf; any other abstains.
    Tolerance mode: any class replays and compares with the run's thresholds; when the run names
    the class pairs its thresholds were calibrated on (`calibrated`), a verifier of an uncalibrated
    pair abstains instead of judging with a threshold nobody measured for it.
    """
    if mode not in ("bitwise", "tolerance"):  # `protocol.config.ReplayMode`'s values
        raise ValueError(f"unknown replay mode {mode!r}")
    same = host.replay_class == verifier.replay_class
    if mode == "bitwise":
        return ReplayDecision.BITWISE if same else ReplayDecision.ABSTAIN
    if same or calibrated is None or class_pair(host.replay_class, verifier.replay_class) in calibrated:
        return ReplayDecision.TOLERANCE
    return ReplayDecision.ABSTAIN
