"""Warp tensor cores (Ampere/Ada/Hopper ``mma.sync``) and ``ldmatrix``.

The warp tensor-core kernel (kernels/mma_sync.py, ``backend="mma_sync"``) is built on these:
Ampere and Ada GPUs have no wgmma. Tested on their own in tests/test_ptx_mma_sync.py.

One warp computes D[16 x 8] (fp32) = A[16 x 16] . B[16 x 8] + C with ``mma.sync.aligned.
m16n8k16.row.col.f32``, every operand in registers: unlike wgmma, no descriptor, fence or
warpgroup, so one warp can take any tile and any shared layout with 16-byte rows.

Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), lane
l = 4g + t (g = l // 4, t = l % 4). A word holds two 16-bit elements, the first in its low
half; ``X[r, c:c+2]`` below is such a pair:
    A (16 x 16):  a0 = A[g, 2t:2t+2]    a1 = A[g+8, 2t:2t+2]
                  a2 = A[g, 2t+8:2t+10] a3 = A[g+8, 2t+8:2t+10]
    B (16 x 8):   b0 = B[2t:2t+2, g]    b1 = B[2t+8:2t+10, g]      (pairs along K)
    C, D:         acc[i+k] = D[g + 8*(k//2), 2t + k%2],  k = 0..3
so an ``acc`` holding n8 tiles at i = 0, 4, 8, ... has wgmma's accumulator layout (warp 0 of
``acc_row``/``acc_col``), and ``acc_scale``/``acc_store`` serve it too.

ldmatrix (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): 8 x 8 matrices of 16-bit
elements whose rows are 16 contiguous bytes each, anywhere (16-byte aligned): lane l gives the
address of row l % 8 of matrix l // 8. Word j of lane l is then matrix j's [g, 2t:2t+2],
which is an A word (matrices = A's quarters, K contiguous) or a B word (B stored N x K, K
contiguous). With ``.trans`` it is the column pair [2t, g], [2t+1, g]: B stored K x N (N
contiguous, V) loads straight into its fragment.

- ``mma_m16n8k16(tag)`` -> ``mma(acc, i, a0, a1, a2, a3, b0, b1, tid)``: acc[i:i+4] = A . B +
  acc[i:i+4] (tag "bf16" or "f16"; fragments as int32 words). ``i`` must be a compile-time
  constant (a literal or a global: typing refuses anything else), so acc stays in registers.
- ``ldmatrix_x4(arr, addr, tid)``, ``ldmatrix_x4_trans`` -> 4 int32 words; ``ldmatrix_x2``,
  ``ldmatrix_x2_trans`` -> 2 (only lanes 0-15's addresses are read; pass valid ones in every
  lane all the same, as sm_75 and below require). ``addr = smem_addr(arr) + byte offset``.

The twins gather the warp's fragments or addresses through the warp exchange, compute the
warp's result once (``warp_once``) and give each lane its share as the hardware distributes it.
The mma twin sums in float64 and rounds once to float32: the products of 16-bit values are
exact, but the hardware's order and rounding of the fp32 sum are not specified, so exact is the
one unambiguous choice (the GPU differs by a few fp32 ulps of the largest term).
"""
import ml_dtypes
import numpy as np
from llvmlite import ir
from numba.cuda import types
from numba.cuda.extending import intrinsic

from .._numba import TypingError, element_pointers
from ._codegen import addr32, f32, i32
from ._twin import with_twin
from .warp import warp_once

#: (Simulator) The 16-bit element types by tag.
DTYPES = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}

_G, _T = np.arange(32) // 4, np.arange(32) % 4  # every lane's g and t


def halves(words, dtype):
    """(Simulator) int32 words [...] -> their 16-bit elements as float64 [..., 2] (low half
    first)."""
    w = (np.asarray(words, np.int64) & 0xFFFFFFFF).astype(np.uint32)
    return w.view(np.uint16).view(dtype).astype(np.float64).reshape(w.shape + (2,))


def a_fragment(h):
    """(Simulator) The warp's A [16 x 16] from its lanes' halves ``h`` [lane, word, 2] (words
    0-3: a0..a3)."""
    a = np.empty((16, 16))
    for e in range(2):
        for w in range(4):  # rows +8 in a1, a3; columns +8 in a2, a3
            a[_G + 8 * (w % 2), 2 * _T + 8 * (w // 2) + e] = h[:, w, e]
    return a


# Lane l's four accumulators: D[g, 2t], D[g, 2t+1], D[g+8, 2t], D[g+8, 2t+1].
_ACC_ROWS = np.stack([_G, _G, _G + 8, _G + 8], axis=1)
_ACC_COLS = np.stack([2 * _T, 2 * _T + 1, 2 * _T, 2 * _T + 1], axis=1)


def _mma_m16n8k16_twin(tag):
    dtype = DTYPES[tag]

    def product(words):  # once a warp: every lane's four elements of A . B
        h = halves(words, dtype)  # [lane, word, half]
        a, b = a_fragment(h), np.empty((16, 8))
        for e in range(2):
            for w in range(2):
                b[2 * _T + 8 * w + e, _G] = h[:, 4 + w, e]
        d = a @ b  # [16, 8], float64 (each product exact)
        return d[_ACC_ROWS, _ACC_COLS]  # [lane, 4]

    def mma(acc, i, a0, a1, a2, a3, b0, b1, tid):
        d = warp_once((a0, a1, a2, a3, b0, b1), product, tid)
        acc[i:i + 4] = d[tid % 32] + acc[i:i + 4]

    return mma


@with_twin(_mma_m16n8k16_twin)
def mma_m16n8k16(tag):
    text = ("mma.sync.aligned.m16n8k16.row.col.f32.%s.%s.f32 {$0,$1,$2,$3}, "
            "{$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};" % (tag, tag))

    @intrinsic
    def mma(typingctx, acc, i, a0, a1, a2, a3, b0, b1, tid):
        # Tried first with non-literal types, then with literals: refusing a non-literal i
        # makes Numba come back with i's value.
        if not isinstance(i, types.IntegerLiteral):
            raise TypingError("mma: the accumulator offset i must be a compile-time "
                              "constant (the accumulators then stay in registers)")
        frags = (a0, a1, a2, a3, b0, b1)
        sig = types.void(acc, i, *(types.unliteral(f) for f in frags), types.unliteral(tid))
        n = i.literal_value

        def cg(ctx, b, s, args):
            ptrs = element_pointers(ctx, b, s.args[0], args[0], 4, start=n)
            ins = [ctx.cast(b, v, t, types.int32) for v, t in zip(args[2:8], s.args[2:8])]
            fty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            # side_effect: a .sync.aligned instruction must not be moved into divergent
            # code (nor dropped); the accumulators go in and out tied (0,1,2,3).
            asm = ir.InlineAsm(fty, text, "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3",
                               side_effect=True)
            r = b.call(asm, ins + [b.load(p) for p in ptrs])
            for k, p in enumerate(ptrs):
                b.store(b.extract_value(r, k), p)
            return ctx.get_dummy_value()

        return sig, cg

    return mma


def _ldmatrix_words(arr, rows, num, trans):
    """(Simulator) Every lane's ``num`` words [lane, num] of ``ldmatrix`` from the rows' byte
    addresses (rows[8j + r]: row r of matrix j)."""
    rows = np.asarray(rows[:8 * num], np.int64)
    assert not (rows % 16).any(), "ldmatrix rows must be 16-byte aligned"
    rows, g, t = rows.reshape(num, 8), _G[:, None], _T[:, None]
    j = np.arange(num)[None, :]
    if trans:  # column g, rows 2t and 2t+1
        lo, hi = (rows[j, 2 * t] + 2 * g) // 2, (rows[j, 2 * t + 1] + 2 * g) // 2
    else:  # row g, columns 2t and 2t+1
        lo = (rows[j, g] + 4 * t) // 2
        hi = lo + 1
    h = np.asarray(arr).view(np.uint16)
    return np.stack([h[lo], h[hi]], axis=-1).view(np.int32)[..., 0]  # [lane, num]


def _ldmatrix_twin(num, trans):
    def load(arr, addr, tid):
        words = warp_once(int(addr), lambda rows: _ldmatrix_words(arr, rows, num, trans), tid)
        return tuple(words[tid % 32])

    return load


@with_twin(_ldmatrix_twin)
def _ldmatrix(num, trans):
    regs = ",".join(f"${k}" for k in range(num))
    text = (f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16 "
            f"{{{regs}}}, [${num}];")

    @intrinsic
    def load(typingctx, arr, addr, tid):
        sig = types.UniTuple(types.int32, num)(arr, addr, tid)

        def cg(ctx, b, s, args):
            # side_effect, as lds32: the load stays between the barriers around it.
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32] * num), [i32]),
                               text, ",".join(["=r"] * num + ["r"]), side_effect=True)
            r = b.call(asm, [addr32(ctx, b, args[1], s.args[1])])
            words = [b.extract_value(r, k) for k in range(num)]
            return ctx.make_tuple(b, s.return_type, words)

        return sig, cg

    return load


ldmatrix_x2, ldmatrix_x2_trans = _ldmatrix(2, False), _ldmatrix(2, True)
ldmatrix_x4, ldmatrix_x4_trans = _ldmatrix(4, False), _ldmatrix(4, True)
