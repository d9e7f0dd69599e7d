"""Block-wise 8-bit AdamW moments (`InnerOptim.moments = int8`, specs §6.2.1).

A training state is 12 B/param with float32 moments; a checker downloads whole states, so the
moments are most of what verification moves. Here each moment tensor is cut into blocks of
`BLOCK` elements of its flattened form (the last may be short), each block gets a float32 scale
s = max |x| over the block, and each element an 8-bit code of r = fl(|x| / s) on a float-like
grid relative to s (as bitsandbytes' 8-bit Adam, with an exactly specified grid):

    mag(j) = (16 − j mod 8) · 2^(−4 − ⌊j/8⌋)         j ≥ 0: 8 values per octave, mag(0) = 1
    exp_avg    (int8,  q ∈ [−127, 127]): value(q) = sign(q) · mag(127 − |q|), value(0) = 0
    exp_avg_sq (uint8, q ∈ [0, 255]):    value(q) = mag(255 − q),            value(0) = 0

so exp_avg keeps 16 octaves below its block's largest magnitude and exp_avg_sq 32 (16 octaves of
√v, the units AdamW divides by), each with a relative step of 1/16 to 1/9. The code of r is the
grid value nearest to r, ties toward the larger value (`quantize`); a value decodes to
fl(value(q) · s). Where exp_avg_sq's code is 0, exp_avg's code is set to 0 too: a coordinate whose
second moment fell below the grid must not take a step of lr·m/ε (the genuine-state rule, §6.3).

Everything is element-wise IEEE float32 (one division, frexp, integer rounding, one
multiplication) plus a block maximum, which is exact in any order: host and verifier get the same
bits on every device of a replay class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from protocol.inner import Moments

BLOCK = 256
"""Elements per scale block (bitsandbytes' block size): 2·4/256 = 0.03 B/param of scales."""
PER_OCTAVE = 8
M_TOP = 127
"""exp_avg: the largest code; codes run −127..127 (−128 is not a code)."""
V_TOP = 255
"""exp_avg_sq: the largest code; codes run 0..255."""

CODE, SCALE = "code", "scale"
M_NAME, V_NAME = "exp_avg", "exp_avg_sq"
INT8_GROUPS: dict[str, tuple[str, str]] = {
    M_NAME: (f"{M_NAME}_{CODE}", f"{M_NAME}_{SCALE}"),
    V_NAME: (f"{V_NAME}_{CODE}", f"{V_NAME}_{SCALE}"),
}
"""Each moment's tensor groups in an int8 state: `<moment>_code/<n>` and `<moment>_scale/<n>`."""
CODE_DTYPES = {M_NAME: torch.int8, V_NAME: torch.uint8}


class MomentCodeError(ValueError):
    """Codes or scales that no quantization produces (a code outside its range, a scale that is
    negative or not finite, a misshapen tensor)."""


def n_blocks(numel: int) -> int:
    return -(-numel // BLOCK) if numel else 0


def mag(j: int) -> float:
    """The grid's j-th magnitude from the top: exact in float32."""
    return float((16 - j % PER_OCTAVE) * 2.0 ** (-4 - j // PER_OCTAVE))


def _table(signed: bool) -> Tensor:
    """value(q) for every code, indexed by q + 127 (exp_avg) or q (exp_avg_sq)."""
    if signed:
        vals = [0.0 if q == 0 else math.copysign(mag(M_TOP - abs(q)), q) for q in range(-M_TOP, M_TOP + 1)]
    else:
        vals = [0.0] + [mag(V_TOP - q) for q in range(1, V_TOP + 1)]
    return torch.tensor(vals, dtype=torch.float32)


M_VALUES = _table(True)
V_VALUES = _table(False)
_TABLES: dict[tuple[bool, torch.device], Tensor] = {}


def _values(signed: bool, device: torch.device) -> Tensor:
    key = (signed, device)
    if key not in _TABLES:
        _TABLES[key] = (M_VALUES if signed else V_VALUES).to(device)
    return _TABLES[key]


def _blocks(x: Tensor) -> Tensor:
    """The flattened tensor as rows of BLOCK, the last row padded with zeros (a copy only if short)."""
    flat = x.reshape(-1)
    pad = n_blocks(flat.numel()) * BLOCK - flat.numel()
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return flat.view(-1, BLOCK)


def _codes(r: Tensor, top: int) -> Tensor:
    """The grid index j (0 = the top, 1.0) nearest to r ∈ [0, 1], ties up, clamped to `top − 1`;
    and whether r reaches the smallest grid value's lower half-way point (else the code is 0)."""
    mant, exp = torch.frexp(r)  # r = mant·2^exp, mant ∈ [0.5, 1): exact
    # nearest of n·2^(exp−4), n = 8..16: n = ⌊16·mant + ½⌋ = (⌊32·mant⌋ + 1) >> 1, all exact
    n = ((mant * 32).to(torch.int32) + 1) >> 1
    j = 16 - n - PER_OCTAVE * exp.to(torch.int32)
    return j.clamp(0, top - 1)


def quantize(x: Tensor, signed: bool) -> tuple[Tensor, Tensor]:
    """(codes, scales) of a float32 moment tensor: codes in x's shape (int8 signed, else uint8),
    one float32 scale (the block's max |x|) per block of BLOCK elements."""
    if x.dtype != torch.float32:
        raise MomentCodeError(f"moments are float32, got {x.dtype}")
    numel = x.numel()
    rows = _blocks(x)
    scales = rows.abs().amax(dim=1)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    r = rows.abs() / safe[:, None]  # every block with s = 0 is all zeros: r = 0
    top = M_TOP if signed else V_TOP
    half_min = mag(top - 1) / 2
    j = _codes(r, top)
    q = torch.where(r >= half_min, top - j, torch.zeros_like(j))
    if signed:
        q = torch.where(rows < 0, -q, q)
        codes = q.to(torch.int8)
    else:
        codes = q.to(torch.uint8)
    return codes.reshape(-1)[:numel].reshape(x.shape), scales


def dequantize(codes: Tensor, scales: Tensor, out: Tensor | None = None) -> Tensor:
    """fl(value(q) · s), float32 in the codes' shape (written into `out` when given)."""
    signed = codes.dtype == torch.int8
    table = _values(signed, codes.device)
    idx = codes.reshape(-1).to(torch.int64) + (M_TOP if signed else 0)
    vals = table[idx]
    numel = vals.numel()
    per = scales.repeat_interleave(BLOCK)[:numel] if numel else scales[:0]
    deq = (vals * per).reshape(codes.shape)
    if out is None:
        return deq
    out.copy_(deq)
    return out


def quantize_pair(m: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(m codes, m scales, v codes, v scales) with the rule that exp_avg's code is 0 wherever
    exp_avg_sq's is (no step of lr·m/ε from a second moment below the grid)."""
    qm, sm = quantize(m, True)
    qv, sv = quantize(v, False)
    qm = torch.where(qv == 0, torch.zeros_like(qm), qm)
    return qm, sm, qv, sv


def check_codes(moment: str, codes: Tensor, scales: Tensor, shape: Sequence[int]) -> None:
    """Refuse codes and scales that `quantize` never produces, with one clear error."""
    numel = 1
    for d in shape:
        numel *= int(d)
    want = CODE_DTYPES[moment]
    if codes.dtype != want or tuple(codes.shape) != tuple(shape):
        raise MomentCodeError(f"{moment} codes: {codes.dtype}{list(codes.shape)}, want {want}{list(shape)}")
    if scales.dtype != torch.float32 or tuple(scales.shape) != (n_blocks(numel),):
        want_s = f"float32[{n_blocks(numel)}]"
        raise MomentCodeError(f"{moment} scales: {scales.dtype}{list(scales.shape)}, want {want_s}")
    if want is torch.int8 and bool((codes == -128).any()):
        raise MomentCodeError(f"{moment} code -128 is not a code")
    if not bool(torch.isfinite(scales).all()) or bool((scales < 0).any()):
        raise MomentCodeError(f"{moment} scales must be finite and non-negative")


# ---------------------------------------------------------------- layouts


def optimizer_names(moments: Moments, name: str) -> list[str]:
    """The optimizer-state tensor names one parameter contributes (besides the shared `step`)."""
    if moments is Moments.FP32:
        return [f"{M_NAME}/{name}", f"{V_NAME}/{name}"]
    return [f"{g}/{name}" for m in (M_NAME, V_NAME) for g in INT8_GROUPS[m]]


def optimizer_specs(
    layout: Mapping[str, tuple[int, ...]], moments: Moments
) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of an optimizer state's tensors (moments + `step`) for float32
    parameters of this layout: what a receiver knows of a state before fetching it."""
    out: list[tuple[str, torch.dtype, tuple[int, ...]]] = [("step", torch.float32, ())]
    for name, shape in layout.items():
        shape = tuple(int(d) for d in shape)
        if moments is Moments.FP32:
            out += [(f"{m}/{name}", torch.float32, shape) for m in (M_NAME, V_NAME)]
            continue
        numel = 1
        for d in shape:
            numel *= d
        for m in (M_NAME, V_NAME):
            code, scale = INT8_GROUPS[m]
            out += [(f"{code}/{name}", CODE_DTYPES[m], shape)]
            out += [(f"{scale}/{name}", torch.float32, (n_blocks(numel),))]
    return sorted(out, key=lambda s: s[0].encode())


def bytes_per_param(moments: Moments, numel: int | None = None) -> float:
    """Bytes the two moments take per parameter: 8 (fp32); 2 + 8/BLOCK for int8 (exact for a
    tensor of `numel` elements, whose last block may be short)."""
    if moments is Moments.FP32:
        return 8.0
    if numel is None:
        return 2.0 + 2 * 4 / BLOCK
    return 2.0 + 2 * 4 * n_blocks(numel) / max(1, numel)


def dequantized(state: Mapping[str, Tensor], name: str) -> tuple[Tensor, Tensor]:
    """(exp_avg, exp_avg_sq) of parameter `name` of an int8 state, as float32, codes checked."""
    out = []
    for m in (M_NAME, V_NAME):
        code, scale = INT8_GROUPS[m]
        c, s = state.get(f"{code}/{name}"), state.get(f"{scale}/{name}")
        if c is None or s is None:
            raise MomentCodeError(f"{m} of {name!r} missing")
        check_codes(m, c, s, tuple(c.shape))
        out.append(dequantize(c, s))
    return out[0], out[1]


def int8_names(state: Mapping[str, Tensor]) -> list[str]:
    """The parameter names an int8 state holds moments for (sorted)."""
    prefix = INT8_GROUPS[M_NAME][0] + "/"
    return sorted(k[len(prefix) :] for k in state if k.startswith(prefix))


def moments_of_state(state: Mapping[str, Tensor]) -> Moments:
    """Which moment format a state's names say it is in."""
    prefix = INT8_GROUPS[M_NAME][0] + "/"
    return Moments.INT8 if any(k.startswith(prefix) for k in state) else Moments.FP32


def as_fp32(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A training or optimizer state with its int8 moments decoded into `exp_avg/<n>`,
    `exp_avg_sq/<n>` (float32); an fp32 state as it is. For tools that do arithmetic on moments
    (adversaries, benchmarks), never for what is hashed."""
    if moments_of_state(state) is Moments.FP32:
        return dict(state)
    groups = {g for pair in INT8_GROUPS.values() for g in pair}
    out = {k: t for k, t in state.items() if k.split("/", 1)[0] not in groups}
    for name in int8_names(state):
        out[f"{M_NAME}/{name}"], out[f"{V_NAME}/{name}"] = dequantized(state, name)
    return out


def as_int8(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A state with float32 moments quantized as one AdamW step leaves them (`quantize_pair`)."""
    out = {k: t for k, t in state.items() if k.split("/", 1)[0] not in (M_NAME, V_NAME)}
    names = sorted(k[len(M_NAME) + 1 :] for k in state if k.startswith(f"{M_NAME}/"))
    for name in names:
        got = quantize_pair(state[f"{M_NAME}/{name}"], state[f"{V_NAME}/{name}"])
        keys = [g for m in (M_NAME, V_NAME) for g in INT8_GROUPS[m]]
        out.update({f"{g}/{name}": t for g, t in zip(keys, got, strict=True)})
    return out
