"""Where the replayable step runs, and the one place its determinism is pinned. Imports torch only.

Bitwise replay on a device needs, besides the same inputs, the same kernels:

- `configure_determinism` (process-wide, once): thread count, deterministic algorithms, the cuBLAS
  workspace (`CUBLAS_WORKSPACE_CONFIG=:4096:8`, read by cuBLAS when CUDA starts, so it is also set
  when this module is imported), cuDNN deterministic and not benchmarking;
- `pin_numerics` (per segment, from the run config): TF32 on or off, bf16 GEMM reductions in
  float32, and exactly one scaled-dot-product-attention backend. These are process-global torch
  flags, set without restoring: a verifier replays on several threads at once, and a context that
  restores on exit would switch the backend under a replay still running on another thread;
- `forward_context`: bf16 autocast around forward and loss (thread-local), master state float32.

States leave the device only to be hashed and stored: `snapshot_to_host` copies them into pinned
host memory on a side stream, so the GPU keeps training while the copy and the hashing run.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

CUBLAS_WORKSPACE = ":4096:8"
"""One of the two settings under which cuBLAS is deterministic (CUDA docs, "Results reproducibility")."""
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # before anything starts CUDA

STAGE_FRACTION = 0.5
"""A snapshot is staged through device memory when it takes at most this share of what is free."""


class DeviceError(ValueError):
    """A device setting that names no usable device, or determinism that can no longer be pinned."""


_replay_device = torch.device("cpu")


def resolve_device(setting: str, local_rank: int | None = None) -> torch.device:
    """`cpu`, `cuda` (this rank's GPU: `cuda:LOCAL_RANK` under torchrun, else `cuda:0`) or `cuda:N`."""
    try:
        dev = torch.device(setting)
    except RuntimeError as e:
        raise DeviceError(f"device {setting!r}: {e}") from e
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise DeviceError(f"device {setting!r}: only cpu and cuda are supported")
    if not torch.cuda.is_available():
        raise DeviceError(f"device {setting!r}: CUDA is not available on this machine")
    if dev.index is None:
        rank = local_rank if local_rank is not None else int(os.environ.get("LOCAL_RANK", "0"))
        dev = torch.device("cuda", rank)
    if not 0 <= dev.index < torch.cuda.device_count():
        raise DeviceError(f"device {dev}: this machine has {torch.cuda.device_count()} GPUs")
    return dev


def _pin_cublas_workspace() -> None:
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") == CUBLAS_WORKSPACE:
        return
    if torch.cuda.is_initialized():
        raise DeviceError(
            f"CUBLAS_WORKSPACE_CONFIG must be {CUBLAS_WORKSPACE} before CUDA starts "
            f"(it is {os.environ.get('CUBLAS_WORKSPACE_CONFIG')!r}); import replay.device first"
        )
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE


def configure_determinism(threads: int, device: str | torch.device = "cpu") -> torch.device:
    """Pin what bitwise replay depends on, process-wide; the device is what `env_fingerprint` reports."""
    global _replay_device
    dev = torch.device(device)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if dev.type == "cuda":
        _pin_cublas_workspace()
        torch.cuda.set_device(dev)
    _replay_device = dev
    return dev


def pin_device(threads: int, device: str) -> torch.device:
    """A node's device setting resolved (`cuda` is this torchrun rank's GPU) and determinism pinned
    on it; `DeviceError` (the node stops with it) for a device this machine does not have."""
    return configure_determinism(threads, resolve_device(device))


def replay_device() -> torch.device:
    """The device `configure_determinism` was given (cpu unless told otherwise)."""
    return _replay_device


def _set_tf32(on: bool) -> None:
    """The new fp32_precision API where torch has it; mixing it with the legacy flags is an error."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        mode = "tf32" if on else "ieee"
        matmul.fp32_precision = mode
        for kind in ("conv", "rnn"):  # not in every torch that has the matmul flag
            backend = getattr(torch.backends.cudnn, kind, None)
            if backend is not None and hasattr(backend, "fp32_precision"):
                backend.fp32_precision = mode
    else:  # pragma: no cover - torch < 2.9
        matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def pin_numerics(tf32: bool, attention: str) -> None:
    """TF32, bf16 GEMM reductions and the attention backend, as the run config says (idempotent)."""
    _set_tf32(tf32)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    enable = {
        "math": torch.backends.cuda.enable_math_sdp,
        "flash": torch.backends.cuda.enable_flash_sdp,
        "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
        "cudnn": torch.backends.cuda.enable_cudnn_sdp,
    }
    if attention not in enable:
        raise DeviceError(f"unknown attention backend {attention!r}")
    for name, fn in enable.items():  # CPU kernels honour these flags too
        fn(name == attention)


def forward_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast (forward and loss only; gradients land in the float32 master weights) or nothing."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    raise DeviceError(f"unknown precision {precision!r}")


_pinned_ok = True  # page-locked host memory works here (some sandboxes refuse it: then pageable)


def _host_empty(shape: torch.Size, dtype: torch.dtype) -> Tensor:
    """Host memory for a device-to-host copy: pinned (asynchronous copies) where the machine allows."""
    global _pinned_ok
    if _pinned_ok:
        try:
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        except RuntimeError:
            _pinned_ok = False
    return torch.empty(shape, dtype=dtype)


def pinned_memory() -> bool:
    """Whether device-to-host copies go through pinned memory (False once the machine refused it)."""
    return _pinned_ok


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """A CPU batch onto the device without blocking the host (pinned first, so the copy is async)."""
    if device.type != "cuda":
        return t
    if _pinned_ok:
        try:
            return t.pin_memory().to(device, non_blocking=True)
        except RuntimeError:
            pass
    return t.to(device)


def env_facts(device: str | torch.device | None = None) -> dict[str, Any]:
    """The machine's side of an `EnvFingerprint`, as plain data (the fields of specs/protocol.md §6.1)."""
    dev = torch.device(device) if device is not None else _replay_device
    facts: dict[str, Any] = {
        "torch_version": torch.__version__,
        "torch_git": (torch.version.git_version or "")[:64],
        "threads": torch.get_num_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "device": dev.type,
        "cpu_capability": torch.backends.cpu.get_cpu_capability()[:32],
    }
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):  # a build without NCCL
            nccl = ""
        facts.update(
            gpu_name=props.name[:128],
            compute_capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
            cuda_version=torch.version.cuda or "",
            cudnn_version=str(cudnn or ""),
            nccl_version=nccl,
        )
    return facts


# ---------------------------------------------------------------- states to the host


class HostSnapshot(Mapping[str, Tensor]):
    """A training state on its way to host memory. Reading it (any Mapping access) waits for the copy.

    Hand it to a worker thread: the wait happens there, never on the training thread.
    """

    def __init__(self, tensors: dict[str, Tensor], done: Any = None) -> None:
        self._tensors = tensors
        self._done = done  # a torch.cuda.Event recorded after the last copy, or None (already there)
        self._lock = threading.Lock()

    def wait(self) -> dict[str, Tensor]:
        with self._lock:
            if self._done is not None:
                self._done.synchronize()
                self._done = None
        return self._tensors

    @property
    def ready(self) -> bool:
        return self._done is None or bool(self._done.query())

    def __getitem__(self, key: str) -> Tensor:
        return self.wait()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.wait())

    def __len__(self) -> int:
        return len(self._tensors)


_copy_streams: dict[int, Any] = {}


def _copy_stream(device: torch.device) -> Any:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _copy_streams:
        _copy_streams[index] = torch.cuda.Stream(device=index)
    return _copy_streams[index]


def _room_to_stage(nbytes: int, device: torch.device) -> bool:
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return nbytes <= STAGE_FRACTION * (free + cached)


def snapshot_to_host(
    state: Mapping[str, Tensor],
    opt: torch.optim.Optimizer | None = None,
    *,
    stage: bool | None = None,
) -> HostSnapshot:
    """Start copying `state` to host memory; the returned snapshot holds its values as of this call.

    CPU tensors are cloned at once. CUDA tensors are copied into pinned host memory on a side
    stream, in one of two ways:

    - staged (`stage=True`, or None and the state fits in half the free device memory): a device
      clone first, ordered on the compute stream before anything can change the state (HBM
      bandwidth: milliseconds per GB), then the device-to-host copy of the clone in the background;
    - direct: the side stream copies the live tensors while forward and backward run (they only
      read them), and the next `opt.step()` waits for the copy (a one-shot step pre-hook on `opt`;
      without `opt`, the compute stream waits at once). Nothing else may change the state until
      then. No extra device memory: the mode for states as large as the device.
    """
    on_device = [t for t in state.values() if t.is_cuda]
    if not on_device:
        return HostSnapshot({k: v.detach().clone() for k, v in state.items()})
    device = on_device[0].device
    compute = torch.cuda.current_stream(device)
    side = _copy_stream(device)
    if stage is None:
        stage = _room_to_stage(sum(t.numel() * t.element_size() for t in on_device), device)
    sources = {k: (v.detach().clone() if stage and v.is_cuda else v.detach()) for k, v in state.items()}
    side.wait_stream(compute)  # the clones (staged) or the state as of now (direct)
    out: dict[str, Tensor] = {}
    with torch.cuda.stream(side):
        for k, v in sources.items():
            if not v.is_cuda:
                out[k] = v.clone()
                continue
            host = _host_empty(v.shape, v.dtype)
            host.copy_(v, non_blocking=True)  # synchronous if the memory is not pinned: still correct
            if stage:
                v.record_stream(side)  # the allocator must not hand the clone out before the copy is done
            out[k] = host
    done = torch.cuda.Event()
    done.record(side)
    del sources
    if not stage:
        if opt is None:
            compute.wait_event(done)
        else:
            _pending_copies(opt).append((device, done))
    return HostSnapshot(out, done)


_PENDING = "_gonka_pending_copies"


def _pending_copies(opt: torch.optim.Optimizer) -> list[tuple[torch.device, Any]]:
    """Copies the next `opt.step()` must wait for, drained by one step pre-hook registered once.

    (A hook cannot remove itself: torch iterates the hook dict while calling them.)"""
    pending: list[tuple[torch.device, Any]] | None = getattr(opt, _PENDING, None)
    if pending is None:
        pending = []
        setattr(opt, _PENDING, pending)

        def before_update(*_: Any) -> None:
            while pending:
                device, event = pending.pop()
                torch.cuda.current_stream(device).wait_event(event)

        opt.register_step_pre_hook(before_update)
    return pending


def host_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A host copy of `state`, now (blocking): for the cold paths that hash or save at once."""
    return snapshot_to_host(state, stage=False).wait()


def host_view(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """`state` itself when it is already in host memory (no copy), else `host_state(state)`."""
    if not any(t.is_cuda for t in state.values()):
        return dict(state)
    return host_state(state)
