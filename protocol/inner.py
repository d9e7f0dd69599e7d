"""The inner optimizer's shape, in one place (issue 24): AdamW's state names, how a training
state is laid out by them, and what each costs per parameter. The replay engine (`replay.step`),
the stores and transfer sizes (`nodekit.objects`), tolerance mode (`verifier.tolerance`), the
memory check before a model is built (`replay.spec`) and the planner (`gonka_diloco.plan`) all
read these names and sizes from here; the hyperparameters are `protocol.config.InnerOptim`.
"""

from __future__ import annotations

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
"""An optimizer state's bytes per parameter (the carried state a host commits: 8)."""
STATE_BYTES_PER_PARAM = FP32_BYTES * len(STATE_GROUPS)
"""A training state's bytes per parameter (a boundary leaf, an opened state: 12)."""
GRAD_BYTES_PER_PARAM = FP32_BYTES
"""The gradient an inner step holds beside the state."""
