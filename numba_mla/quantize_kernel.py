"""The GPU quantizer: a 16/32-bit cache on the device into an FP8 layout (fp8.py), on the device.

Two kernels, each thread a 4-value word of the output:

- ``"e4m3"``: word w of row r is values 4w..4w+3 divided by the per-tensor scale (float32) and
  rounded to e4m3 (saturating at +-448). Without a given scale, a first kernel takes
  max |kv| (an atomic maximum over the rows' per-thread maxima) and the scale is max / 448.
- ``"v32"``: one warp a (row, group of 128 latent dims): the group's max |x| by shuffles, its
  power-of-two scale, then each lane quantizes its 4 values into one word; group 0's lanes
  also copy the 64 rope dims to bfloat16 and every group's lane 0 stores its scale.

The results equal the host quantizer's (fp8.quantize_host), code for code: both divide in
float32 and round to e4m3 once.
"""
import math

import numpy as np

from . import _compat  # noqa: F401
from . import factory, fp8, ptx
from .arrays import dtype_of, is_torch, shape_of
from numba import cuda, float32

D_QK, D_LATENT, GROUP = fp8.D_QK, fp8.D_LATENT, fp8.GROUP
_THREADS = 128
_kernels = {}


def _make(tag, layout):
    """(amax kernel or None, quantize kernel) for input dtype ``tag`` and the layout."""
    load = factory.converters(tag)[0]
    MAX = float32(fp8.E4M3_MAX)
    if layout == "e4m3":
        WORDS = D_QK // 4

        @cuda.jit
        def amax_kernel(x, out):
            # thread i: max |x| of row i (NaN skipped), then one atomic maximum
            i = cuda.grid(1)
            if i < x.shape[0]:
                m = float32(0.0)
                for d in range(D_QK):
                    a = abs(load(x[i, d]))
                    if a > m:
                        m = a
                cuda.atomic.max(out, 0, m)

        @cuda.jit
        def kernel(x, scale, out, outf, out16):
            # thread i: word w of row r (values 4w .. 4w + 3)
            i = cuda.grid(1)
            r, w = i // WORDS, i % WORDS
            if r < x.shape[0]:
                d = 4 * w
                s = scale[0]
                out[r, w] = ptx.pack_e4m3x4(load(x[r, d]) / s, load(x[r, d + 1]) / s,
                                            load(x[r, d + 2]) / s, load(x[r, d + 3]) / s)

        return amax_kernel, kernel

    if tag == "bf16":
        @cuda.jit(device=True)
        def rope(v):  # (the bits as they are)
            return v
    else:
        @cuda.jit(device=True)
        def rope(v):
            return ptx.f32_to_bf16(load(v))
    ROPE_AT = fp8._ROPE_AT // 2  # the rope's first 16-bit element of a row

    @cuda.jit
    def kernel(x, scale, out, outf, out16):
        # warp (r, g): row r, latent group g; lane l quantizes dims 128 g + 4 l .. + 3
        i = cuda.grid(1)
        lane = cuda.threadIdx.x % 32
        r, g = (i // 32) // fp8.GROUPS, (i // 32) % fp8.GROUPS
        if r >= x.shape[0]:
            return  # whole warps leave (the block is a multiple of 32 threads)
        d = g * GROUP + 4 * lane
        v0, v1, v2, v3 = load(x[r, d]), load(x[r, d + 1]), load(x[r, d + 2]), load(x[r, d + 3])
        m = float32(0.0)
        for v in (v0, v1, v2, v3):
            if abs(v) > m:
                m = abs(v)
        for e in range(5):
            o = ptx.shfl_xor(m, 16 >> e, cuda.threadIdx.x)
            if o > m:
                m = o
        s = float32(1.0)
        if m > 0 and m < math.inf:  # the smallest power of two with m / s <= 448
            s = float32(2.0) ** math.ceil(math.log2(m / MAX))
            if m / s > MAX:
                s *= float32(2.0)
            if m / (s * float32(0.5)) <= MAX:
                s *= float32(0.5)
        out[r, g * (GROUP // 4) + lane] = ptx.pack_e4m3x4(v0 / s, v1 / s, v2 / s, v3 / s)
        if lane == 0:
            outf[r, D_LATENT // 4 + g] = s
        if g == 0:
            out16[r, ROPE_AT + lane] = rope(x[r, D_LATENT + lane])
            out16[r, ROPE_AT + 32 + lane] = rope(x[r, D_LATENT + 32 + lane])

    return None, kernel


def _kernels_for(tag, layout):
    key = (tag, layout)
    if key not in _kernels:
        _kernels[key] = _make(tag, layout)
    return _kernels[key]


def quantize_device(kv, fp8_layout, kv_scale=None):
    """``kv [..., 576]`` on the device -> (``[..., row bytes]`` uint8 on the device: a torch
    tensor for a torch ``kv``, else a Numba device array; kv_scale): fp8.quantize's GPU
    path."""
    from .launch import _as_device

    tag = factory.dtype_tag(dtype_of(kv))
    lead = shape_of(kv)[:-1]
    n = int(np.prod(lead))
    x = _as_device(kv, tag != "f32", shape=(n, D_QK), name="kv")  # 16-bit data as int16 bits
    width = fp8.ROW_BYTES[fp8_layout]
    out = cuda.device_array((n, width // 4), np.int32)
    amax_kernel, kernel = _kernels_for(tag, fp8_layout)
    if fp8_layout == "e4m3":
        if kv_scale is None:
            amax = cuda.to_device(np.zeros(1, np.float32))
            if n:
                amax_kernel[(n + _THREADS - 1) // _THREADS, _THREADS](x, amax)
            kv_scale = fp8.auto_kv_scale(amax.copy_to_host()[0])
        kv_scale = fp8.check_kv_scale(kv_scale, fp8_layout)
        threads = n * (D_QK // 4)
    else:
        if kv_scale is not None:
            fp8.check_kv_scale(kv_scale, fp8_layout)  # raises: the rows carry their scales
        threads = n * fp8.GROUPS * 32
    scale = cuda.to_device(np.array([kv_scale or 1.0], np.float32))
    if n:
        kernel[(threads + _THREADS - 1) // _THREADS, _THREADS](
            x, scale, out, out.view(np.float32), out.view(np.int16))
    res = out.view(np.uint8).reshape(lead + (width,))
    if is_torch(kv):
        import torch

        res = torch.as_tensor(res, device=kv.device)
    return res, kv_scale
