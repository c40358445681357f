"""GPU-only primitives and their plain-Python twins for the CUDA simulator.

On a GPU each primitive is a Numba ``@intrinsic`` that emits LLVM IR or inline PTX and is
inlined at its call site (a few are small device functions). In the simulator
(``NUMBA_ENABLE_CUDASIM=1``) ``@intrinsic`` and the warp functions do not exist, so the same
names are bound to Python functions with the same results; the kernels call these names and
run unchanged in both places. Each module keeps a primitive's twin next to it, chosen when the
module is imported (``_twin.py``).

Modules, by topic (each opens with the list of its primitives):

- ``conversions``: bfloat16 / float16 bits to and from float32, single and packed pairs;
  float8_e4m3fn codes, four a word.
- ``shared``: shared memory through 32-bit addresses (``lds*``, ``sts*``), 4-element stores
  to global memory, asynchronous copies from global memory (``cp.async``, commit, wait), and
  an L2 prefetch.
- ``warp``: shuffles, ``warp_uniform``, ``syncwarp`` (and the simulator's warp exchange).
- ``barriers``: named barriers (``bar.sync``/``bar.arrive``), mbarriers, and the wait of a
  grid launched behind another (``griddepcontrol.wait``).
- ``accumulators``: the tensor-core accumulator fragment and whole-accumulator operations.
- ``wgmma``: Hopper warpgroup products, their descriptors, fences and waits.
- ``tma``: tensor maps and their prefetch, bulk tensor copies into shared memory and bulk
  copies out of it.
- ``mma_sync``: warp products (``mma.sync`` m16n8k16) and ``ldmatrix`` (kernels/mma_sync.py).
- ``arith``: 32-bit ``divmod``, ``rcp`` and ``exp2_ftz`` without subroutine calls; byte
  permutes (``prmt``); a row's address from a 32-bit index.

Every primitive is importable from ``numba_mla.ptx`` itself (``ptx.lds128(...)``).
"""
from .accumulators import (acc_col, acc_row, acc_scale, acc_scale_cols, acc_scale_halves,
                           acc_store, acc_store16, acc_zero)
from .arith import (byte_perm, divmod_u32, exp2_ftz, lt_i32, min_i32, opaque_i32, rcp,
                    row_addr)
from .barriers import (bar_arrive, bar_sync, grid_dependency_wait, mbar_expect_tx,
                       mbar_fence_init, mbar_init, mbar_try_wait, set_max_registers)
from .conversions import (bf16_to_f32, bf16x2_to_f32, f16_to_f32, f16x2_to_f32, f32_to_bf16,
                          f32_to_f16, pack_bf16x2, pack_e4m3x4, pack_f16x2, e4m3x4_to_bf16x4,
                          e4m3x4_to_f16x4, e4m3x4_to_f32, f32_as_i32, i32_as_f32)
from .mma_sync import ldmatrix_x2, ldmatrix_x2_trans, ldmatrix_x4, ldmatrix_x4_trans, mma_m16n8k16
from .shared import (aligned16, aligned_x4, cp_async4_at, cp_async16_at, cp_async16_ca_at,
                     cp_async_commit, cp_async_wait_all, cp_async_wait_one, cp_async_wait_two,
                     global_addr, ld_global_x4, lds32, lds64, lds128, prefetch_bulk_l2,
                     prefetch_l2, prefetch_l2_3d, smem_addr,
                     st_global_x2, st_global_x4, sts32, sts64, sts128)
from .tma import (bulk_commit, bulk_store, bulk_wait_read, prefetch_tensormap, tensor_map,
                  tma_load)
from .warp import shfl_xor, syncwarp, warp_uniform
from .wgmma import (desc_advance, desc_advance_lo, fence_proxy_async, wgmma, wgmma_commit,
                    wgmma_desc, wgmma_fence, wgmma_rs, wgmma_wait, wgmma_wait2,
                    wgmma_wait_pending)

__all__ = [
    # conversions
    "bf16_to_f32", "f16_to_f32", "f32_to_bf16", "f32_to_f16", "bf16x2_to_f32", "f16x2_to_f32",
    "pack_bf16x2", "pack_f16x2", "e4m3x4_to_f32", "pack_e4m3x4", "e4m3x4_to_bf16x4",
    "e4m3x4_to_f16x4",
    "i32_as_f32", "f32_as_i32",
    # shared memory and asynchronous copies
    "smem_addr", "lds32", "sts32", "lds64", "lds128", "sts64", "sts128",
    "aligned_x4", "aligned16", "st_global_x2", "st_global_x4", "ld_global_x4",
    "global_addr", "prefetch_l2", "prefetch_bulk_l2", "prefetch_l2_3d", "cp_async4_at", "cp_async16_at",
    "cp_async16_ca_at", "cp_async_commit",
    "cp_async_wait_all", "cp_async_wait_one", "cp_async_wait_two",
    # warp
    "shfl_xor", "warp_uniform", "syncwarp",
    # barriers
    "bar_sync", "bar_arrive", "mbar_init", "mbar_fence_init", "mbar_expect_tx", "mbar_try_wait",
    "grid_dependency_wait", "set_max_registers",
    # accumulators
    "acc_row", "acc_col", "acc_zero", "acc_scale", "acc_scale_halves", "acc_scale_cols",
    "acc_store", "acc_store16",
    # wgmma
    "wgmma_desc", "desc_advance", "wgmma", "wgmma_rs", "wgmma_fence", "wgmma_commit",
    "desc_advance_lo", "wgmma_wait", "wgmma_wait2", "wgmma_wait_pending", "fence_proxy_async",
    # tma
    "tensor_map", "tma_load", "prefetch_tensormap", "bulk_store", "bulk_commit",
    "bulk_wait_read",
    # mma.sync
    "mma_m16n8k16", "ldmatrix_x2", "ldmatrix_x2_trans", "ldmatrix_x4", "ldmatrix_x4_trans",
    # arithmetic
    "divmod_u32", "rcp", "exp2_ftz", "byte_perm", "opaque_i32", "row_addr",
    "min_i32", "lt_i32",
]
