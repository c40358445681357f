"""The kernel factory: one compiled kernel per configuration, mods inlined.

A configuration is (mask, score mod, storage dtype, cache kind, tiles, heads); its key is built
from the mods' ``cache_key()`` and nothing else, so two equal masks share a kernel and no module
global is read at compile time. The factory asks each mod for its device form, hands the
functions to the kernel maker as closure constants (Numba inlines them; no run-time branch
decides which mod runs) and caches the result in-process.
"""
import threading

import numpy as np

from . import _compat  # noqa: F401
from . import kernel_cache, ptx
from .arrays import BF16
from numba import cuda

_lock = threading.Lock()
_kernels = {}


def dtype_tag(dtype):
    dtype = np.dtype(dtype)
    if dtype == BF16:
        return "bf16"
    if dtype == np.float16:
        return "f16"
    if dtype == np.float32:
        return "f32"
    raise TypeError(f"dtype: expected bfloat16, float16 or float32, got {dtype}")


def converters(tag):
    """(load, store): storage element <-> fp32. 16-bit data travels as int16 bits."""
    if tag == "f32":

        @cuda.jit(device=True)
        def identity(x):
            return x

        return identity, identity
    to32, from32 = {"bf16": (ptx.bf16_to_f32, ptx.f32_to_bf16),
                    "f16": (ptx.f16_to_f32, ptx.f32_to_f16)}[tag]

    @cuda.jit(device=True)
    def load(x):
        return to32(x)

    @cuda.jit(device=True)
    def store(x):
        return from32(x)

    return load, store


def _cached(key, build):
    """One kernel per configuration in this process; on disk across processes
    (kernel_cache.py)."""
    with _lock:
        k = _kernels.get(key)
        if k is None:
            k = _kernels[key] = kernel_cache.attach(build(), key)
        return k


def unpacker(tag):
    """Packed 16-bit pair (one int32 word) -> two floats, or None for fp32 storage."""
    return {"bf16": ptx.bf16x2_to_f32, "f16": ptx.f16x2_to_f32, "f32": None}[tag]


def _fold_scale(mask, score_mod):
    """The scale can be folded into LOG2E: a boolean mask and no score mod, so the scores
    need not be seen in natural units."""
    return score_mod.identity and mask.boolean


def _mods_key(mask, score_mod, cache_cls):
    """The cache key part that the mask, score mod and cache make (built on every call:
    cheap; the device functions below are made only to compile)."""
    key = (mask.cache_key(), score_mod.cache_key(), cache_cls.kind, _fold_scale(mask, score_mod))
    positions = getattr(cache_cls, "position_map", None)  # a shard's (sharding.py)
    return key if positions is None else key + (positions.cache_key(),)


def _device_functions(mask, score_mod, cache_cls):
    """What both partition kernels compile in for a mask, score mod and cache. A shard's
    cache (sharding.py) brings a position map: the mask and score mod then take the shard's
    local key indices and see global ones (positions.py)."""
    fns = dict(
        locate=cache_cls.device_locate(),
        mask_apply=mask.device_apply(),
        mask_classify=mask.device_classify(),
        mask_key_range=mask.device_key_range(),
        score_mod=score_mod.device_fn(),
        fold_scale=_fold_scale(mask, score_mod),
    )
    positions = getattr(cache_cls, "position_map", None)
    return fns if positions is None else positions.device_functions(fns)


def _output_store(tag, direct):
    """How a partition kernel stores its output: in the storage dtype when it writes ``out``
    itself (``direct``: one partition), else into the fp32 workspace."""
    return converters(tag if direct else "f32")[1]


def partition_kernel(mask, score_mod, tag, cache_cls, block_m, heads, direct=False, wide=True,
                     fp8=None, groups=1):
    """The stage-1 FMA kernel (kernels/simt.py) for this configuration; ``direct``: the
    variant that writes the final output (one partition, no combine); ``wide``: the one that
    copies 16-byte pieces of the cache (which must then start 16-byte aligned); ``fp8``: the
    cache's FP8 layout ("e4m3", "v32"; ``tag`` is then q's dtype), or None; ``groups=2``: its
    warp split-K variant (each half of the warps walks half of a partition's tiles)."""

    def build():
        from .kernels.simt import make_partition_kernel

        return make_partition_kernel(load=converters(tag)[0], store=_output_store(tag, direct),
                                     unpack=None if fp8 else unpacker(tag), block_m=block_m,
                                     heads=heads, wide=wide, fp8=fp8, groups=groups,
                                     **_device_functions(mask, score_mod, cache_cls))

    return _cached(("simt", tag, block_m, heads, direct, wide)
                   + ((("fp8", fp8),) if fp8 else ()) + ((("groups", groups),) if groups > 1 else ())
                   + _mods_key(mask, score_mod, cache_cls), build)


def simple_partition_kernel(mask, score_mod, tag, cache_cls, block_m, heads, direct=False,
                            fp8=None):
    """The readable stage-1 kernel (kernels/simple.py) for this configuration; ``direct`` and
    ``fp8`` as above."""

    def build():
        from .kernels.simple import make_partition_kernel

        return make_partition_kernel(load=converters(tag)[0], store=_output_store(tag, direct),
                                     unpack=None if fp8 else unpacker(tag), block_m=block_m,
                                     heads=heads, fp8=fp8,
                                     **_device_functions(mask, score_mod, cache_cls))

    return _cached(("simple", tag, block_m, heads, direct)
                   + ((("fp8", fp8),) if fp8 else ())
                   + _mods_key(mask, score_mod, cache_cls), build)


def warpsplit_partition_kernel(mask, score_mod, tag, cache_cls, heads, direct=False, fp8=None):
    """The simple kernel with warp split-K (kernels/warpsplit.py); ``direct`` and ``fp8`` as
    above."""

    def build():
        from .kernels.warpsplit import BLOCK_M, make_partition_kernel

        return make_partition_kernel(load=converters(tag)[0], store=_output_store(tag, direct),
                                     unpack=None if fp8 else unpacker(tag), block_m=BLOCK_M,
                                     heads=heads, fp8=fp8,
                                     **_device_functions(mask, score_mod, cache_cls))

    return _cached(("warpsplit", tag, heads, direct) + ((("fp8", fp8),) if fp8 else ())
                   + _mods_key(mask, score_mod, cache_cls), build)


def mma_partition_kernel(mask, score_mod, tag, cache_cls, heads, direct=False, tma=False,
                         fp8=None):
    """The stage-1 tensor-core kernel (kernels/mma.py) for this configuration (bf16, f16);
    ``direct``: the variant that writes the final output (one partition, no combine); ``tma``:
    the variant whose tiles the copy engine brings (tiles never straddle pages); ``fp8``:
    "e4m3" rows (cp.async tiles), or None."""

    def build():
        from .kernels.mma import make_partition_kernel

        return make_partition_kernel(tag=tag, heads=heads, store=_output_store(tag, direct),
                                     tma=tma, fp8=fp8,
                                     **_device_functions(mask, score_mod, cache_cls))

    return _cached(("mma", tag, heads, direct, tma) + ((("fp8", fp8),) if fp8 else ())
                   + _mods_key(mask, score_mod, cache_cls), build)


def transposed_partition_kernel(mask, score_mod, tag, cache_cls, heads, direct=False,
                                block_m=16, v_ahead=None):
    """The stage-1 tensor-core kernel for "e4m3" rows at 16, 32 or 64 query rows a block
    (``block_m``; kernels/transposed.py: S^T = K Q^T, O^T = V^T P^T, A from registers);
    ``tag`` q's type (bf16, f16); ``direct`` as for the others; ``v_ahead``: O^T's V codes
    loaded that many steps ahead (None: the block's default)."""

    def build():
        from .kernels.transposed import make_partition_kernel

        return make_partition_kernel(tag=tag, heads=heads, store=_output_store(tag, direct),
                                     block_m=block_m, v_ahead=v_ahead,
                                     **_device_functions(mask, score_mod, cache_cls))

    return _cached(("transposed", tag, heads, direct, block_m)
                   + ((("v_ahead", v_ahead),) if v_ahead is not None else ())
                   + _mods_key(mask, score_mod, cache_cls), build)


def mma_sync_partition_kernel(mask, score_mod, tag, cache_cls, block_m, heads, direct=False,
                              fp8=None, wide=True, staged=0):
    """The stage-1 kernel on warp tensor cores (kernels/mma_sync.py: mma.sync, sm_80 on) for
    this configuration (``tag`` bf16 or f16: q's; ``block_m`` 16 or 32 rows); ``direct`` as for
    the others; ``fp8`` the cache's FP8 layout ("e4m3", "v32") or None; ``staged`` the stages
    of FP8 rows copied as they are into shared memory (0, 1 or 2: heuristics.mma_sync_fits);
    ``wide``
    whether the cache starts 16-byte aligned (16-byte copies; moot for FP8 rows that are
    loaded, not copied); the key stages swizzled by the module's ``K_SWIZZLE`` (read here,
    so part of the key) for a 16-byte aligned 16-bit cache."""
    from .kernels import mma_sync

    staged = int(staged) if fp8 else 0
    wide = bool(wide or (fp8 and not staged))
    swizzle = bool(mma_sync.K_SWIZZLE and wide and not fp8)

    def build():
        return mma_sync.make_partition_kernel(
            tag=tag, store=_output_store(tag, direct), block_m=block_m, heads=heads, fp8=fp8,
            wide=wide, staged=staged, k_swizzle=swizzle,
            **_device_functions(mask, score_mod, cache_cls))

    return _cached(("mma_sync", tag, block_m, heads, direct, fp8, wide, staged)
                   + ((("k_swizzle", True),) if swizzle else ())
                   + _mods_key(mask, score_mod, cache_cls), build)


def mma_sync_roles_partition_kernel(mask, score_mod, tag, cache_cls, heads, direct=False,
                                    wide=True, stages=4, packed=True):
    """The warp tensor-core kernel's split-role block (kernels/mma_sync_roles.py: 32 rows,
    four warps score and four multiply by V; 16-bit rows) for this configuration, arguments
    as for ``mma_sync_partition_kernel``; ``stages`` of key rows (4, or 3 on an A100);
    ``packed``: the cache's rows lie back to back (a C-contiguous storage; else each row's
    address follows the strides, as a torch view of a wider buffer needs); its S
    in the module's ``S_CHAINS`` accumulator chains, ahead of P or not (``S_AHEAD``, with four
    stages: the three-stage form's sm_80 build would spill), by ``V_WARPS`` V warps, with
    ``MAX_EARLY``, ``P_FTZ``, ``SUMS_LATE``, ``LANE_MAX``, ``COPY_LANES``, ``COPY_CACHE``,
    ``COPY_CONST_FULL``, ``K_SWIZZLE``, ``SCORE_QUARTERS`` and ``QUARTERS_SKIP_OWN`` (all
    read here, so part of the key)."""
    from .kernels import mma_sync_roles

    chains, ahead = mma_sync_roles.S_CHAINS, mma_sync_roles.S_AHEAD and stages == 4
    v_warps = mma_sync_roles.V_WARPS
    early, ftz, late = mma_sync_roles.MAX_EARLY, mma_sync_roles.P_FTZ, mma_sync_roles.SUMS_LATE
    lane_max = mma_sync_roles.LANE_MAX and early
    lean = bool(wide and packed)
    copy_lanes = mma_sync_roles.COPY_LANES if lean else 8
    copy_cache = mma_sync_roles.COPY_CACHE if lean else "cg"
    const_full = bool(mma_sync_roles.COPY_CONST_FULL and lean)
    # (the swizzle's key is a copying thread's: its rows a multiple of 8 apart)
    swizzle = bool(mma_sync_roles.K_SWIZZLE and lean and 32 * v_warps // copy_lanes % 8 == 0)
    quarters = mma_sync_roles.quarters_at(stages)
    skip_own = bool(mma_sync_roles.QUARTERS_SKIP_OWN and quarters)

    def build():
        return mma_sync_roles.make_partition_kernel(
            tag=tag, store=_output_store(tag, direct), heads=heads, wide=bool(wide),
            stages=stages, s_chains=chains, s_ahead=ahead, v_warps=v_warps,
            max_early=early, p_ftz=ftz, sums_late=late, lane_max=lane_max,
            packed=bool(packed), copy_lanes=copy_lanes, copy_cache=copy_cache,
            copy_const_full=const_full, k_swizzle=swizzle, score_quarters=quarters,
            quarters_skip_own=skip_own,
            **_device_functions(mask, score_mod, cache_cls))

    return _cached(("mma_sync_roles", tag, heads, direct, bool(wide), stages)
                   + ((("s_chains", chains),) if chains != 4 else ())
                   + ((("s_ahead", True),) if ahead else ())
                   + ((("v_warps", v_warps),) if v_warps != 4 else ())
                   + ((("max_early", False),) if not early else ())
                   + ((("p_ftz", False),) if not ftz else ())
                   + ((("sums_late", False),) if not late else ())
                   + ((("lane_max", False),) if not lane_max else ())
                   + ((("packed", False),) if not packed else ())
                   + ((("copy_lanes", copy_lanes),) if copy_lanes != 8 else ())
                   + ((("copy_cache", copy_cache),) if copy_cache != "cg" else ())
                   + ((("copy_const_full", True),) if const_full else ())
                   + ((("k_swizzle", True),) if swizzle else ())
                   + ((("score_quarters", True),) if quarters else ())
                   + ((("quarters_skip_own", True),) if skip_own else ())
                   + _mods_key(mask, score_mod, cache_cls), build)


def seesaw_partition_kernel(mask, score_mod, tag, cache_cls, heads, direct=False, listed=False,
                            fp8=None, converter=False, runs=False, mixed=False, follows=True,
                            rows_ahead=True):
    """The stage-1 tensor-core kernel whose warpgroups take tiles in turn (kernels/seesaw.py),
    for tiles the copy engine brings; ``direct`` as above; ``listed``: its blocks from the
    listed schedule's table (heuristics.list_blocks), writing the workspace; ``fp8``: "e4m3"
    rows (``tag`` is then q's type), or None; ``converter``: with them, a third warpgroup
    converts the tiles (the dispatcher's ``whole_program`` is then True: launch.py builds
    it from its PTX with the driver's JIT, which keeps ``setmaxnreg``); ``runs``: its blocks
    walk the runs schedule's items (heuristics.run_schedule), writing the workspace (or with
    ``direct``, a table of whole sequences, out itself), each item's output from the
    registers where ``seesaw.RUNS_AHEAD``, else staged (with the next item's queries copied
    under it where ``seesaw.RUNS_Q_EARLY``); ``mixed``: with ``runs`` and not ``direct``, an
    item that is a whole sequence writes out and lse itself and the others the workspace
    (the kernel then takes out and lse after the workspace; the combine's ``skips``);
    ``follows``: False for the form that is not launched as the kernel before's programmatic
    dependent where ``seesaw.FOLLOWS`` makes the others so (the selector's form where theirs
    spills); ``rows_ahead``: False for the form that looks up each pair's refill rows in
    their own pair where the others carry them from the pair before (``seesaw.carries_rows``;
    the selector's form where theirs spills)."""
    from .kernels import seesaw

    ahead = runs and seesaw.RUNS_AHEAD
    q_early = runs and not ahead and seesaw.RUNS_Q_EARLY
    follows = follows and seesaw.FOLLOWS and not converter  # (the converter's: Numba's path)
    rows_late = not rows_ahead and seesaw.carries_rows(heads, fp8, converter)
    max_early1 = seesaw.MAX_EARLY1
    s_unroll = seesaw.S_UNROLL or bool(fp8)  # ("e4m3" rows have their own S: S8_UNROLL)
    s8_unroll = seesaw.S8_UNROLL and bool(fp8) and not converter
    s8_pairs = bool(seesaw.S8_PAIRS) and s8_unroll
    codes_wide = bool(seesaw.CODES_WIDE) and bool(fp8) and not converter
    stage8 = bool(seesaw.STAGE8) and bool(fp8) and not converter
    # (each as the build takes it: WHOLE_TILES, EXP_FOLD and ROWS_LEAD on the row types they
    # name (seesaw.for_rows), the first two with a boolean mask and no score mod only, PACK_P
    # on 16-bit rows from LAG_HEADS heads only; so a build where one would do nothing is
    # neither made again nor reported with it)
    fold = _fold_scale(mask, score_mod)
    whole_tiles = seesaw.for_rows(seesaw.WHOLE_TILES, fp8) and fold
    exp_fold = seesaw.for_rows(seesaw.EXP_FOLD, fp8) and fold
    pack_p = bool(seesaw.PACK_P) and not fp8 and heads >= seesaw.LAG_HEADS
    rows_lead = seesaw.for_rows(seesaw.ROWS_LEAD, fp8)

    def build():
        disp = seesaw.make_partition_kernel(tag=tag, heads=heads,
                                            store=_output_store(tag, direct), listed=listed,
                                            fp8=fp8, converter=converter, runs=runs,
                                            ahead=ahead, direct=direct, q_early=q_early,
                                            mixed=mixed, out_store=_output_store(tag, True),
                                            follows=follows, rows_ahead=not rows_late,
                                            max_early1=max_early1,
                                            s_unroll=s_unroll, s8_unroll=s8_unroll,
                                            whole_tiles=whole_tiles, exp_fold=exp_fold,
                                            pack_p=pack_p, rows_lead=rows_lead,
                                            s8_pairs=s8_pairs, codes_wide=codes_wide,
                                            stage8=stage8,
                                            **_device_functions(mask, score_mod, cache_cls))
        disp.whole_program = converter
        disp.follows = follows  # (launch.py: launched to follow)
        disp.rows_late = rows_late
        disp.max_early1 = max_early1
        disp.s_unroll = s_unroll
        disp.s8_unroll = s8_unroll
        disp.s8_pairs = s8_pairs
        disp.codes_wide = codes_wide
        disp.stage8 = stage8
        disp.whole_tiles = whole_tiles
        disp.exp_fold = exp_fold
        disp.pack_p = pack_p
        disp.rows_lead = rows_lead
        if converter:  # (setmaxnreg moves the registers it was launched with)
            disp.launch_registers = seesaw.LAUNCH_REGS
        return disp

    return _cached(("seesaw", tag, heads, direct, listed) + ((("fp8", fp8),) if fp8 else ())
                   + ((("converter", True),) if converter else ())
                   + ((("runs", ahead, q_early),) if runs else ())
                   + ((("mixed", True),) if mixed else ())
                   + ((("e4m3_too", True),) if fp8 and seesaw.E4M3_TOO and not converter
                      else ())
                   + ((("follows", True),) if follows else ())
                   + ((("rows_late", True),) if rows_late else ())
                   + ((("max_early1", True),) if max_early1 else ())
                   + ((("s_loop", True),) if not s_unroll else ())
                   + ((("s8_unroll", True),) if s8_unroll else ())
                   + ((("s8_pairs", True),) if s8_pairs else ())
                   + ((("codes_wide", True),) if codes_wide else ())
                   + ((("stage8", True),) if stage8 else ())
                   + ((("whole_tiles", True),) if whole_tiles else ())
                   + ((("exp_fold", True),) if exp_fold else ())
                   + ((("pack_p", True),) if pack_p else ())
                   + ((("rows_lead", True),) if rows_lead else ())
                   + _mods_key(mask, score_mod, cache_cls), build)


def combine_kernel(tag, follows=False, few=0, skips=False):
    """The combine kernel; ``follows``: the variant launched as the partition kernel's
    programmatic dependent; ``few``: the one-step kernel for at most that many partitions
    (kernels/combine.py, ``variant``); ``skips``: the variant that leaves the rows their
    partition kernel wrote out (kernels/combine.py's ``WRITTEN``)."""
    def build():
        from .kernels.combine import make_combine_kernel

        return make_combine_kernel(converters(tag)[1], follows, few, skips)

    return _cached(("combine", tag, follows, few) + (("skips",) if skips else ()), build)
