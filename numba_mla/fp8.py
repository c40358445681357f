"""FP8 cache storage: the two byte layouts, their exact dequantization, and the quantizer.

A cache row is 576 values (512 latent, which double as V, then 64 rope). Two FP8 layouts:

- ``"e4m3"`` (per-tensor scale, vLLM's ``kv_cache_dtype="fp8"``): 576 bytes a token, every
  value one float8_e4m3fn code; the value is ``code * kv_scale``, one float32 ``kv_scale`` for
  the whole cache (given to the cache's constructor).
- ``"v32"`` (FlashMLA's DeepSeek-V3.2 layout): 656 bytes a token, byte-compatible with its
  tensors: bytes 0..511 the 512 latent codes (float8_e4m3fn), bytes 512..527 four float32
  scales (little-endian; scale g serves latent dims 128 g .. 128 g + 127: value = code x
  scale), bytes 528..655 the 64 rope dims as bfloat16, not quantized.

The storage is a ``[..., 576]`` or ``[..., 656]`` array of dtype float8_e4m3fn (ml_dtypes or
torch) or uint8 (the raw bytes). The meaning of a row is :func:`dequantize`: each value is the
product, in float64, of its code's exact value and its scale (an e4m3fn code is exact in
float16, float32 and float64; the NaN codes 0x7F and 0xFF give NaN; e4m3fn has no infinity).
A row scale of the ``"v32"`` layout is data, read as it is (a NaN, infinite, zero or negative
one dequantizes by the same product); the quantizer writes only finite positive ones.
"""
import math

import ml_dtypes
import numpy as np

from .arrays import BF16, dtype_of, is_device, shape_of, to_host

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
#: The dtypes an FP8 cache's storage may have: float8 codes, or their raw bytes.
FP8_DTYPES = (E4M3, np.dtype(np.uint8))
E4M3_MAX = 448.0  # the largest finite e4m3fn value
D_LATENT, D_ROPE = 512, 64
D_QK = D_LATENT + D_ROPE
GROUP = 128  # latent dims a "v32" row scale serves
GROUPS = D_LATENT // GROUP
#: Bytes a token, by layout.
ROW_BYTES = {"e4m3": D_QK, "v32": D_LATENT + 4 * GROUPS + 2 * D_ROPE}
LAYOUTS = tuple(ROW_BYTES)
_SCALES_AT = D_LATENT  # byte offset of the "v32" scales
_ROPE_AT = D_LATENT + 4 * GROUPS  # byte offset of the "v32" rope (528)
_F32_MAX = float(np.finfo(np.float32).max)


def is_fp8_dtype(dt):
    return dt is not None and np.dtype(dt) in FP8_DTYPES


def check_layout(fp8_layout):
    """The validated layout name (None means ``"e4m3"``)."""
    if fp8_layout is None:
        return "e4m3"
    if not isinstance(fp8_layout, str) or fp8_layout not in LAYOUTS:
        raise ValueError(f"fp8_layout: expected one of {LAYOUTS}, got {fp8_layout!r}")
    return fp8_layout


def check_kv_scale(kv_scale, fp8_layout):
    """The per-tensor scale as a float: required (finite, > 0, a float32) for ``"e4m3"``,
    refused for ``"v32"`` (whose scales are in the rows)."""
    if fp8_layout == "v32":
        if kv_scale is not None:
            raise ValueError("kv_scale: the 'v32' layout keeps its scales in each row; "
                             "expected None")
        return None
    if kv_scale is None:
        raise ValueError("kv_scale: an FP8 cache of layout 'e4m3' needs its per-tensor scale "
                         "(value = code x kv_scale), got None")
    if isinstance(kv_scale, bool) or not isinstance(kv_scale, (int, float, np.integer,
                                                               np.floating)):
        raise TypeError(f"kv_scale: expected a float, got {type(kv_scale).__name__}")
    s = float(kv_scale)
    # The kernels dequantize in float32: the scale must be a positive normal float32 value.
    if not (math.isfinite(s) and np.finfo(np.float32).tiny <= s <= _F32_MAX):
        raise ValueError(f"kv_scale: expected a finite float32 value > 0, got {kv_scale}")
    return float(np.float32(s))  # what the kernels use, so the reference uses it too


def check_fp8_storage(name, x, fp8_layout):
    """Shape [*, *, row bytes] and an FP8 dtype (the caches check the rest)."""
    shape, dt = shape_of(x), dtype_of(x)
    if not is_fp8_dtype(dt):
        raise TypeError(f"{name}: an FP8 cache expects dtype float8_e4m3fn or uint8, got {dt}")
    width = ROW_BYTES[fp8_layout]
    if len(shape) != 3 or shape[2] != width:
        other = {v: k for k, v in ROW_BYTES.items()}.get(shape[-1] if shape else None)
        hint = f" (that is the '{other}' layout's width)" if other else ""
        raise ValueError(f"{name}: the '{fp8_layout}' layout expects shape [*, *, {width}] "
                         f"({width} bytes a token), got {list(shape)}{hint}")
    return shape, dt


def _bytes(rows):
    """A host uint8 view of FP8 rows (codes or bytes)."""
    h = np.ascontiguousarray(to_host(rows))
    return h.view(np.uint8)


def dequantize(rows, fp8_layout="e4m3", kv_scale=None):
    """The exact values of FP8 rows ``[..., row bytes]`` as float64 ``[..., 576]``: the
    definition of an FP8 cache (the reference attends to these)."""
    fp8_layout = check_layout(fp8_layout)
    raw = _bytes(rows)
    codes = raw[..., :D_QK if fp8_layout == "e4m3" else D_LATENT].view(E4M3).astype(np.float64)
    if fp8_layout == "e4m3":
        return codes * float(check_kv_scale(kv_scale, fp8_layout))
    scales = np.ascontiguousarray(raw[..., _SCALES_AT:_ROPE_AT]).view("<f4").astype(np.float64)
    rope = np.ascontiguousarray(raw[..., _ROPE_AT:]).view(BF16).astype(np.float64)
    lead = raw.shape[:-1]
    with np.errstate(invalid="ignore", over="ignore"):
        latent = (codes.reshape(lead + (GROUPS, GROUP)) * scales[..., None]).reshape(
            lead + (D_LATENT,))
    return np.concatenate([latent, rope], axis=-1)


def _to_e4m3(x):
    """float32 values to e4m3fn codes: round to nearest even, saturating at +-448 (NaN stays
    NaN), as the GPU's ``cvt.rn.satfinite`` does."""
    return np.clip(np.asarray(x, np.float32), -E4M3_MAX, E4M3_MAX).astype(E4M3)


def _pow2_scales(amax):
    """For each group's max |x| (float32), the smallest power of two s with amax / s <= 448
    (1 where amax is 0 or not finite): the "v32" row scales."""
    amax = np.asarray(amax, np.float32)
    ok = np.isfinite(amax) & (amax > 0)
    a = np.where(ok, amax, np.float32(1.0)).astype(np.float64)
    s = np.exp2(np.ceil(np.log2(a / E4M3_MAX)))
    s = np.where(a / s > E4M3_MAX, 2 * s, s)  # (log2 rounding at exact powers of two)
    s = np.where(a / (s / 2) <= E4M3_MAX, s / 2, s)
    return np.where(ok, s, 1.0).astype(np.float32)


def auto_kv_scale(amax):
    """The "e4m3" scale for a cache whose max |value| is ``amax``: amax / 448 (nothing
    saturates), or 1 for an all-zero (or non-finite) cache."""
    amax = float(amax)
    return amax / E4M3_MAX if amax > 0 and math.isfinite(amax) else 1.0


def quantize_host(kv, fp8_layout="e4m3", kv_scale=None):
    """Host version of :func:`quantize` (NumPy): returns (codes, kv_scale). Values are divided
    by their scale in float32 and rounded to e4m3 once, as on the GPU."""
    fp8_layout = check_layout(fp8_layout)
    x = np.asarray(to_host(kv))
    if x.shape[-1] != D_QK:
        raise ValueError(f"kv: expected rows of {D_QK} values, got shape {list(x.shape)}")
    xf = x.astype(np.float32)
    if fp8_layout == "e4m3":
        if kv_scale is None:
            kv_scale = auto_kv_scale(np.fmax.reduce(np.abs(xf), axis=None, initial=0.0))
        kv_scale = check_kv_scale(kv_scale, fp8_layout)
        return _to_e4m3(xf / np.float32(kv_scale)), kv_scale
    if kv_scale is not None:
        check_kv_scale(kv_scale, fp8_layout)  # raises: the rows carry their scales
    lead = x.shape[:-1]
    out = np.zeros(lead + (ROW_BYTES["v32"],), np.uint8)
    latent = xf[..., :D_LATENT].reshape(lead + (GROUPS, GROUP))
    # One power of two a group (as FlashMLA's quantizer chooses): code x scale is then exact
    # in float32, and nothing saturates.
    scales = _pow2_scales(np.fmax.reduce(np.abs(latent), axis=-1, initial=0.0))   # [..., 4]
    out[..., :D_LATENT] = _to_e4m3(latent / scales[..., None]).reshape(
        lead + (D_LATENT,)).view(np.uint8)
    out[..., _SCALES_AT:_ROPE_AT] = scales.astype("<f4").view(np.uint8)
    out[..., _ROPE_AT:] = xf[..., D_LATENT:].astype(BF16).view(np.uint8)
    return out, None


def quantization_error(kv, codes, fp8_layout="e4m3", kv_scale=None):
    """How far the dequantized FP8 rows are from the 16-bit (or fp32) rows they came from:
    ``{"max_abs": .., "max_rel": .. (max |error| / max |value|), "rms_rel": ..}``."""
    x = np.asarray(to_host(kv)).astype(np.float64)
    d = dequantize(codes, fp8_layout, kv_scale)
    err = np.abs(d - x)
    amax = float(np.abs(x).max(initial=0.0))
    rms = float(np.sqrt(np.mean(x * x))) if x.size else 0.0
    return {"max_abs": float(err.max(initial=0.0)),
            "max_rel": float(err.max(initial=0.0)) / amax if amax else 0.0,
            "rms_rel": float(np.sqrt(np.mean(err * err))) / rms if rms else 0.0}


def quantize(kv, fp8_layout="e4m3", kv_scale=None, *, error=True):
    """Write a bfloat16/float16/float32 cache ``[..., 576]`` into an FP8 layout.

    Returns ``(codes, kv_scale, error)``: the storage (``[..., 576]`` float8_e4m3fn codes, or
    ``[..., 656]`` uint8 bytes for ``"v32"``), the per-tensor scale (``"e4m3"``: the given one,
    or max |kv| / 448 so that nothing saturates; None for ``"v32"``) and the error the
    quantization introduced (:func:`quantization_error`). Host arrays are quantized by NumPy;
    device arrays by a GPU kernel (the result stays on the device: uint8 bytes for both
    layouts; a torch tensor for a torch ``kv``), with the error measured on the host (a copy
    of both; ``error=False`` skips it and returns None in its place).
    """
    fp8_layout = check_layout(fp8_layout)
    dt = dtype_of(kv)
    if dt not in (BF16, np.dtype(np.float16), np.dtype(np.float32)):
        raise TypeError(f"kv: expected dtype bfloat16, float16 or float32, got {dt}")
    if is_device(kv):
        from .quantize_kernel import quantize_device

        codes, kv_scale = quantize_device(kv, fp8_layout, kv_scale)
    else:
        codes, kv_scale = quantize_host(kv, fp8_layout, kv_scale)
    err = quantization_error(kv, codes, fp8_layout, kv_scale) if error else None
    return codes, kv_scale, err
