"""The inner optimizer's shape, in one place (issue 24): AdamW's state names, how a training
state is laid out by them, and what each costs per parameter. The replay engine (`replay.step`),
the stores and transfer sizes (`nodekit.objects`), tolerance mode (`verifier.tolerance`), the
memory check before a model is built (`replay.spec`) and the planner (`gonka_diloco.plan`) all
read these names and sizes from here; the hyperparameters are `protocol.config.InnerOptim`.
"""

from __future__ import annotations

from enum import StrEnum


class Moments(StrEnum):
    """How AdamW's two moments are stored between inner steps (`InnerOptim.moments`, specs §6.2.1,
    `protocol.moments`).

    FP32: as torch keeps them (8 B/param). INT8: block-wise 8-bit codes with a float32 absmax scale
    per block of `MOMENT_BLOCK` elements, re-quantized after every step by element-wise, exactly
    specified float32 operations (2.03 B/param): the training state a checker downloads is about
    half the size, and replays stay bitwise."""

    FP32 = "fp32"
    INT8 = "int8"


PARAM = "param"
"""The group of a training state that holds the parameters (`param/<name>`)."""
MOMENTS = ("exp_avg", "exp_avg_sq")
"""AdamW's per-parameter moments, as torch names them (`exp_avg/<name>`, `exp_avg_sq/<name>`): an
optimizer state is these groups and the step counter."""
STATE_GROUPS = (PARAM, *MOMENTS)
"""The tensor groups of a training state, in canonical order; besides them it holds one `step`
counter (torch keeps one per parameter; they are always equal)."""

FP32_BYTES = 4
OPTIMIZER_BYTES_PER_PARAM = FP32_BYTES * len(MOMENTS)
"""An optimizer state's bytes per parameter with float32 moments (the carried state a host
commits: 8); `optimizer_bytes_per_param` for any `InnerOptim.moments`."""
STATE_BYTES_PER_PARAM = FP32_BYTES * len(STATE_GROUPS)
"""A training state's bytes per parameter with float32 moments (a boundary leaf, an opened state:
12); `state_bytes_per_param` for any `InnerOptim.moments`."""
GRAD_BYTES_PER_PARAM = FP32_BYTES
"""The gradient an inner step holds beside the state."""
MOMENT_BLOCK = 256
"""Elements per scale block of int8 moments (`protocol.moments.BLOCK`; here without torch)."""


def optimizer_bytes_per_param(moments: Moments = Moments.FP32) -> float:
    """Bytes per parameter of an optimizer state (both moments): 8 (fp32); with int8 moments one
    code each and a float32 scale per block of 256 each: 2 + 8/256 = 2.03125."""
    if Moments(moments) is Moments.FP32:
        return float(OPTIMIZER_BYTES_PER_PARAM)
    return len(MOMENTS) * (1 + FP32_BYTES / MOMENT_BLOCK)


def state_bytes_per_param(moments: Moments = Moments.FP32) -> float:
    """Bytes per parameter of a training state: float32 parameters + the moments (12 or 6.03125)."""
    return FP32_BYTES + optimizer_bytes_per_param(moments)
