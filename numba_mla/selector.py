"""Which kernel runs a call: every backend decision and fallback in one place.

A call names a backend (``"auto"``, ``"simt"``, ``"mma"``, ``"mma_sync"``, ``"simple"``); what
runs is decided here, from the call and a few facts about its arrays:

1. ``"auto"`` is a tensor-core backend for 16-bit data: the wgmma kernels (``"mma"``) where
   wgmma exists (sm_90, or the simulator), the warp tensor-core kernel (``"mma_sync"``) on
   other GPUs of compute capability 8.0 or later (Ampere, Ada, and later ones without wgmma);
   the FMA kernel (``"simt"``) for fp32 and older GPUs; FP8 caches go to a tensor-core kernel
   (``"mma"`` for "e4m3" rows on sm_90, else ``"mma_sync"``: ``select_kernel``). (On the H200 "mma" takes
   0.25-0.87x "mma_sync"'s time on every benchmark shape, so it is the one there.) The FMA
   kernel's block takes 154-226 KB of shared memory: where the GPU gives a block less
   (A100, Ada, older GPUs), ``"auto"`` runs the simple kernel instead and ``"simt"`` is
   refused by name.
2. The tensor-core kernels copy 16-byte pieces: q and the cache must start 16-byte aligned.
   ``"auto"`` falls back to ``"simt"``; an explicit ``"mma"`` is refused.
3. ``decoding_warp_split_k`` runs a warp split-K variant: the FMA kernel's (``"simt"``, 16
   rows a block, 16-bit caches; kernels/simt.py with two groups of warps) under ``"auto"``
   and ``"simt"``, the simple kernel's (kernels/warpsplit.py) under ``"simple"``, and under
   ``"auto"`` for fp32 and FP8 caches; ``"mma"`` and ``"mma_sync"`` refuse it.
   A config (config.py) fixes what it names: ``"auto"`` runs the FMA kernel where the
   tensor-core tiles differ from it; a value the chosen kernel cannot run is refused.
4. The split-K schedule: the caller's factor P (or the config's), split evenly over each
   sequence's tiles, or the balanced schedule (heuristics.balanced_split: ``chunk`` tiles a
   partition, the same for every sequence) for the kernel's tile; one partition means the
   partition kernel writes ``out`` itself (``direct``).
5. Tensor-core tiles come by the copy engine (TMA) where a 64-key tile never straddles pages
   and rows are packed; there the seesaw kernel runs, unless it would spill registers (a mask
   with much arithmetic beside its 160 accumulators), then the lockstep kernel's TMA variant.
   Elsewhere the lockstep kernel copies with cp.async. For spread lengths the seesaw kernel
   may take the listed schedule instead of the balanced one (heuristics.listed_split: each
   sequence cut into as many pieces as a common target length needs, the blocks launched
   longest first from a table, heuristics.list_blocks), where the cost model prefers it
   (also over a one-partition launch, which it turns into a split one).

The result is a :class:`KernelSpec`: the compiled-on-demand kernel and how to launch it.
"""
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import _compat, factory, heuristics
from .config import refuse


@dataclass(frozen=True)
class KernelSpec:
    """A partition kernel and what its launch needs (the factory's description)."""

    backend: str  # what runs: "simt", "simt_warpsplit" (simt, warp split-K), "simple",
    #               "warpsplit" (simple, warp split-K), "mma" (lockstep wgmma), "seesaw" or
    #               "transposed" (wgmma, "e4m3" rows, 16, 32 or 64 query rows a block),
    #               "mma_sync" or "mma_sync_roles" (its 32-row block's split-role form)
    dispatcher: Any  # the Numba kernel (compiled for the argument types at first launch)
    threads: int  # threads a block
    smem: int  # dynamic shared memory a block, bytes
    block_m: int  # query rows a block
    block_n: int  # keys a tile
    groups: int  # row groups a sequence: the grid's y
    num_partitions: int  # split-K factor P: the grid's x
    chunk: int  # tiles a partition (kernels/common.partition_tiles); 0: an even split
    direct: bool  # one partition: writes out and lse itself, no combine
    rows: int  # query rows of the longest sequence (Sq x H): the split model's workspace term
    slots: int  # blocks that run at once (the split model's wave)
    q_pairs: bool  # q read as int32 words of two 16-bit values
    tma: bool  # two tensor maps (q, cache) follow the arguments
    listable: bool = False  # the family may take the listed schedule (heuristics.listed_split)
    work: Any = None  # the listed schedule's blocks (heuristics.list_blocks), or None
    runs: int = 0  # the runs schedule's blocks, its table in ``work`` (heuristics.run_schedule)
    #: with ``runs`` and a workspace: the items that are whole sequences write out and lse
    #: themselves (the kernel takes them after the workspace; the combine skips their rows)
    mixed: bool = False

    def grid(self, batch):
        """The partition kernel's grid: ``(P, G, B)``, or one block a row of the list, or
        one a run."""
        if self.work is not None:
            return (self.runs or len(self.work), 1, 1)
        return (self.num_partitions, self.groups, batch)


def mma_supported():
    """wgmma exists on sm_90 (Hopper) only; the simulator runs the kernels' Python twins."""
    if _compat.SIMULATOR:
        return True
    from numba import cuda

    return cuda.get_current_device().compute_capability == (9, 0)


def auto_backend(tag, capability):
    """What ``"auto"`` runs for data of type ``tag`` on a GPU of compute ``capability``
    (None: the simulator, which runs the wgmma kernels' twins)."""
    if tag == "f32":
        return "simt"
    if capability is None or capability == (9, 0):
        return "mma"
    return "mma_sync" if capability >= (8, 0) else "simt"


def resolve_backend(backend, tag):
    """The backend family a call asks for, before the arrays are seen (``"auto"``:
    ``auto_backend``)."""
    if backend == "auto":
        if tag == "f32" or _compat.SIMULATOR:
            return auto_backend(tag, None)
        from numba import cuda

        return auto_backend(tag, cuda.get_current_device().compute_capability)
    if backend == "mma_sync":
        if tag == "f32":
            raise ValueError("backend: 'mma_sync' (tensor cores) needs bfloat16 or float16 data, "
                             "got float32; use 'simt' or 'auto'")
        if not _compat.SIMULATOR:
            from numba import cuda

            cc = cuda.get_current_device().compute_capability
            if cc < (8, 0):
                raise ValueError(f"backend: 'mma_sync' needs a GPU of compute capability 8.0 or "
                                 f"later (mma.sync with bf16), got {cc[0]}.{cc[1]}; use 'simt'")
    if backend == "mma":
        if tag == "f32":
            raise ValueError("backend: 'mma' (tensor cores) needs bfloat16 or float16 data, got "
                             "float32; use 'simt' or 'auto'")
        if not mma_supported():
            from numba import cuda

            cc = cuda.get_current_device().compute_capability
            raise ValueError(f"backend: 'mma' needs an sm_90 GPU (wgmma), got compute capability "
                             f"{cc[0]}.{cc[1]}; use 'simt' or 'auto'")
    return backend


@dataclass(frozen=True)
class ArrayFacts:
    """What the selector needs to know of the call's device arrays."""

    aligned16: bool  # q and the cache both start 16-byte aligned
    cache_aligned16: bool  # the cache does (16-byte copies in the FMA and mma_sync kernels)
    packed_rows: bool  # q and the cache are C-contiguous (TMA sees them as [rows, 576])
    cache_packed: bool = True  # the cache is (its rows back to back: the split-role copy's)


def check_warp_split(warp_split_k, backend):
    """``decoding_warp_split_k`` runs in the FMA kernels: ``"auto"``, ``"simt"`` (16-bit
    caches: see ``check_simt_warp_split``), ``"simple"``, or the reference (no effect on the
    result); the tensor-core kernels split each tile over their warps by dims and keys
    already, so neither takes it."""
    if warp_split_k and backend in ("mma", "mma_sync"):
        raise ValueError(f"decoding_warp_split_k: runs in the FMA kernels only; the "
                         f"{backend!r} kernel splits each key tile over its warps by dims "
                         f"instead. Use backend='auto', 'simt' or 'simple'")


def check_simt_warp_split(tag, fp8):
    """The FMA kernel's warp split-K (kernels/simt.py, two groups of four warps) runs on
    16-bit caches at 16 rows a block: its two groups' tiles fit in a block's shared memory
    there only."""
    if tag == "f32" or fp8:
        kind = "an FP8" if fp8 else "a float32"
        raise ValueError(f"decoding_warp_split_k: the 'simt' kernel splits keys over its warps "
                         f"for bfloat16 and float16 caches only, got {kind} cache; use "
                         f"backend='auto' or 'simple' (the simple kernel's warp split-K)")


#: The warp split-K kernels (``KernelSpec.backend``) and the backend a call names to run each
#: (with ``decoding_warp_split_k``; ``"auto"`` may run either).
WARP_SPLIT_ASKS = {"simt_warpsplit": "simt", "warpsplit": "simple"}

#: Key tiles in flight: the FMA and tensor-core kernels double-buffer, "simple" does not.
# "e4m3" rows past 16 query rows a sequence: the transposed kernel's 32-row block (its
# conversion, in registers, hides under the products of the block beside it), or 0 for the
# lockstep kernel (its rows through a 16-bit tile: then past 32 rows too)
TRANSPOSED_PAST_16 = 32
# ... and past 32 query rows a sequence (H = 128): the 64-row block of two warpgroups (each
# tile converted once for 64 rows; 0.94-0.99x the 32-row block's time at 64 and 128 rows a
# sequence on the H200), or 32
TRANSPOSED_PAST_32 = 64
# The 32-row block's V codes loaded this many steps ahead where its build does not spill
# (3.5% less time at 64 x 128 x 4096 on the H200; 4 bytes spilled with a causal mask and soft
# cap, where the block loads them at their step; in the GPU suite at d64a3d2 on an H100 the
# check refused it for a causal mask alone at four tokens of 8 heads, contiguous, too)
TRANSPOSED_V_AHEAD = 1
# Where the 64-row block would run and a tile never straddles a page: the seesaw kernel on
# "e4m3" rows instead (kernels/seesaw.py: each tile converted once, in place, by the
# warpgroup that scores it), unless its build spills
SEESAW_E4M3 = True
# ... with a third warpgroup that converts each tile (kernels/seesaw.py, ``converter``; built
# by the driver's JIT as a whole program, for setmaxnreg), unless its build spills
SEESAW_CONVERTER = False
# The seesaw kernel's runs form on 16-bit rows (kernels/seesaw.py, ``runs``;
# heuristics.run_schedule: one wave of blocks, each walking a run of items that may cross
# sequences, FlashMLA's kind of schedule), unless its build spills: None, where the split is
# the selector's own and the cost model takes it (heuristics.runs_split: few long sequences,
# a modelled gain; or, past one (sequence, row group) pair a multiprocessor, whole sequences
# packed into the runs, heuristics.whole_runs); True, the cut runs wherever the split is the
# selector's own; False, nowhere. Timed on an H100 (the varlen sweep, docs/performance.md,
# "The runs schedule"), the cut runs gained only with spread lengths at 16 x 128 x 32768
# (0.95-0.97x) and 64 x 16 x 4096 at spread 0.5 (0.98-0.99x), and lost up to 10% elsewhere,
# 1.2-1.4x at 128 x 128 x 1024, where the whole runs gain (0.83-0.98x): the model takes
# those five configurations of the sweep, and with heuristics.MIXED_RUNS (the default) the
# mixed runs at 64 x 128 x 4096, spread 0.5 (0.954x the listed schedule's time), and no other.
SEESAW_RUNS = None
# The warp tensor-core kernel's 32-row block on 16-bit rows as its split-role form
# (kernels/mma_sync_roles.py: four warps score with Q in registers, four multiply by V),
# where its shared memory fits and no config names the block's shape: 0.93-0.99x the
# lockstep 32-row block's time at H = 128 (an H100; docs/kernels/mma_sync.md) ...
MMA_SYNC_ROLES = True
# ... also in three stages of key rows where four do not fit (an A100's 163 KB a block):
# never run on a GPU yet (the simulator only), so off
MMA_SYNC_ROLES_THREE_STAGES = False
PIPELINE_STAGES = {"simt": 2, "simt_warpsplit": 2, "mma": 2, "mma_sync": 1, "simple": 1,
                   "warpsplit": 1}


def _simple_tiles(backend):
    """``(block_m, block_n)`` of the simple kernel (``"simple"``) or its warp split-K
    (``"warpsplit"``: a warp's tile of WN keys, NW warps a block)."""
    if backend == "warpsplit":
        from .kernels import warpsplit

        return warpsplit.BLOCK_M, warpsplit.NW * warpsplit.WN
    from .kernels import simple

    return simple.BLOCK_M, simple.BLOCK_N


def _mma_sync_roles(config, rows, fp8):
    """The stages of key rows of the warp tensor-core kernel's split-role block
    (``MMA_SYNC_ROLES``: 32 rows, where a sequence has more than 16; 16-bit rows, no config
    of the block's shape or stages; the most stages whose shared memory fits the device's
    block: 4 on an H100 or H200, 3 on an A100, whose 163 KB do not take the 32-row block, where
    ``MMA_SYNC_ROLES_THREE_STAGES``), or 0: the blocks as they are."""
    from .kernels import mma_sync_roles

    if not (MMA_SYNC_ROLES and rows > 16 and fp8 is None
            and (config is None or (config.num_queries_per_block is None
                                    and config.num_pipeline_stages is None))):
        return 0
    stages = mma_sync_roles.stages_that_fit(heuristics.smem_per_block())
    return stages if stages == 4 or MMA_SYNC_ROLES_THREE_STAGES else 0


def _mma_sync_shape(config, rows, fp8):
    """``(block_m, staged, fits)``: the warp tensor-core kernel's rows a block for this call
    (the config's, else heuristics.mma_sync_block_m's), the stages FP8 rows take through
    shared memory (heuristics.mma_sync_fits's, fewer where the config's
    ``num_pipeline_stages`` asks for fewer tiles in flight), and whether the block's shared
    memory fits the device's."""
    from .kernels import mma_sync

    if config is None or config.num_queries_per_block is None:
        block_m = heuristics.mma_sync_block_m(rows, fp8=fp8)
    else:
        block_m = config.num_queries_per_block
        if block_m not in mma_sync.BLOCK_MS:
            return block_m, False, False
    staged, fits = heuristics.mma_sync_fits(block_m, fp8)
    want = None if config is None else config.num_pipeline_stages
    if staged and want is not None and 1 <= want - 1 < staged:
        staged = want - 1  # (this tile's rows and want - 1 tiles' in flight)
    return block_m, staged, fits


def _mma_rows(fp8, packed):
    """The query rows a block that ``"mma"`` runs: the lockstep kernel's 64, and for "e4m3"
    rows with q and the cache C-contiguous (``packed``) the transposed kernel's 16, 32 or 64
    (which then takes a config of 64)."""
    from .kernels import mma, transposed

    if fp8 == "e4m3" and packed:  # (64 there: the transposed kernel's 64-row block)
        return (mma.BLOCK_M,) + tuple(m for m in transposed.BLOCKS if m != mma.BLOCK_M)
    return (mma.BLOCK_M,)


def _tensor_core_honours(config, backend, rows, fp8, packed):
    """Whether a config leaves a tensor-core kernel's fixed tiles alone, on this device
    (``"auto"`` runs the FMA kernel for one that asks otherwise); ``packed``: q and the cache
    C-contiguous, where "e4m3" rows may run the transposed kernel's 16, 32 or 64 rows."""
    from .kernels import mma, mma_sync

    if config is None:
        return True
    if backend == "mma":
        return (config.num_queries_per_block in (None, *_mma_rows(fp8, packed))
                and config.num_keys_per_block in (None, mma.BLOCK_N)
                and config.num_pipeline_stages in (None, PIPELINE_STAGES["mma"]))
    block_m, staged, fits = _mma_sync_shape(config, rows, fp8)
    return (fits and config.num_keys_per_block in (None, mma_sync.BLOCK_N)
            and config.num_pipeline_stages in (None, mma_sync.pipeline_stages(block_m, fp8,
                                                                               staged)))


def _transposed(config, rows, fp8, packed):
    """The rows a block of the transposed kernel (kernels/transposed.py) where ``"mma"`` runs
    it, else 0: "e4m3" rows in a C-contiguous cache (``packed``: it copies a page's run of
    slots as one block of bytes; a cache whose slots lie further apart takes the lockstep
    kernel, which finds each row); the config's rows, else 16 where a sequence has at most
    16, 32 up to 32 and TRANSPOSED_PAST_32 (64: two warpgroups) past that (a
    TRANSPOSED_PAST_16 other than 32 holds past 32 too)."""
    from .kernels import transposed

    if fp8 != "e4m3" or not packed:
        return 0
    want = None if config is None else config.num_queries_per_block
    if want is not None:
        return want if want in transposed.BLOCKS else 0
    assert TRANSPOSED_PAST_16 in (0, *transposed.BLOCKS), TRANSPOSED_PAST_16
    assert TRANSPOSED_PAST_32 in transposed.BLOCKS[1:], TRANSPOSED_PAST_32
    if rows <= transposed.BLOCKS[0]:
        return transposed.BLOCKS[0]
    if rows <= 32 or TRANSPOSED_PAST_16 != 32:
        return TRANSPOSED_PAST_16
    return TRANSPOSED_PAST_32


def runs_table(keys, block_n, groups, slots, rows, balanced, pieces):
    """The runs schedule's table for a launch whose split is the selector's own, or None: as
    ``SEESAW_RUNS`` says (True: always; None: where heuristics.runs_split takes it over the
    ``balanced`` (chunk, P) or the listed ``pieces``; False: never). The plan's schedule key
    (api._schedule) asks the same, so that key and plan agree."""
    if SEESAW_RUNS:
        return heuristics.run_schedule(-(-np.asarray(keys, np.int64) // block_n), groups,
                                       sms=slots)
    if SEESAW_RUNS is None:
        return heuristics.runs_split(keys, block_n, groups, sms=slots, rows=rows,
                                     balanced=balanced, pieces=pieces)
    return None


def _tiles_in_pages(cache):
    """Whether every 64-key tile aligned to 64 keys lies in one page, so the copy engine can
    bring it as one box a 64 dims (a ragged cache is one page)."""
    from .kernels import mma

    return cache.kind in ("contiguous", "ragged") or cache.page_size % mma.BLOCK_N == 0


def _check_config(config, backend, block_m, block_n, stages=None):
    """Refuse a config value the chosen kernel cannot run (config.py); the FMA kernel's rows
    per block (and the warp tensor-core kernel's) were chosen from the config already."""
    if config is None:
        return
    stages = PIPELINE_STAGES[backend] if stages is None else stages
    for field, value, runs in (("num_queries_per_block", config.num_queries_per_block, block_m),
                               ("num_keys_per_block", config.num_keys_per_block, block_n),
                               ("num_pipeline_stages", config.num_pipeline_stages, stages)):
        if value is not None and value != runs:
            raise refuse(field, value, backend, (runs,))


def _seesaw_fit(spills, make):
    """``make(follows, rows_ahead)``, a KernelSpec of a seesaw form: the first of these whose
    build does not spill, None where all do: the form launched as the programmatic dependent of
    the kernel before it (``seesaw.FOLLOWS``), then the plain form; both first with the rows
    of each pair's refills carried from the pair before (``seesaw.ROWS_AHEAD``, from
    ``LAG_HEADS`` heads), then with them looked up in their own pair. Each costs registers,
    and ptxas's allocation moves with either: a 64-head build with a sliding window and ALiBi
    spilled 40 bytes with the rows carried on an H100, with or without the wait at the start,
    and took 242 registers and no local memory without them. A form the arguments leave as
    another already tried (the factory folds in what does not apply: no wait where
    ``seesaw.FOLLOWS`` is off or with the converter, no carried rows below ``LAG_HEADS``
    heads) is not built twice."""
    tried = []
    for rows_ahead in (True, False):
        for follows in (True, False):
            spec = make(follows, rows_ahead)
            if any(spec.dispatcher is d for d in tried):
                continue
            tried.append(spec.dispatcher)
            if not spills(spec):
                return spec
    return None


def select_kernel(call, tag, rows, keys, facts: ArrayFacts,
                  spills: Callable[[KernelSpec], bool]) -> KernelSpec:
    """The kernel for a checked call. ``rows``: query rows of the longest sequence (Sq x H);
    ``keys``: per sequence, the keys its queries may keep (heuristics.key_counts: what the
    split-K schedule divides);
    ``spills(spec)`` compiles a candidate for the call's argument types and says whether it
    uses local memory (never in the simulator)."""
    fp8 = call.cache.fp8_layout
    if fp8:  # FP8 caches: the FMA kernels and the warp tensor-core one; wgmma's "e4m3" only
        if call.backend == "mma" and fp8 != "e4m3":
            raise ValueError(f"backend: 'mma' reads FP8 caches of the 'e4m3' layout, not "
                             f"'{fp8}'; use 'mma_sync', 'simt', 'simple' or 'auto'")
        # "auto": wgmma's for "e4m3" rows on sm_90 (the transposed kernel, 16 rows a block at up
        # to 16 query rows, 0.43x the warp kernel's time at H = 16; 32 and 64 past that, 0.88x
        # and 0.81x the lockstep kernel's time at H = 128, which was 0.39-0.43x the warp
        # kernel's, on the H200's fp8-sweep shapes: docs/fp8.md), else the warp tensor-core
        # kernel (0.32-0.72x the FMA kernel's time there, both layouts)
        backend = call.backend
        if backend == "auto":
            wgmma = (fp8 == "e4m3" and facts.aligned16
                     and resolve_backend("auto", tag) == "mma")
            backend = "mma" if wgmma else "mma_sync"
        if not _compat.SIMULATOR:  # the kernels convert by cvt.rn.f16x2.e4m3x2 (PTX sm_89)
            from numba import cuda

            cc = cuda.get_current_device().compute_capability
            if cc < (8, 9):
                raise ValueError(f"cache: FP8 caches need a GPU of compute capability 8.9 or "
                                 f"later (e4m3 conversions), got {cc[0]}.{cc[1]}")
    else:
        backend = resolve_backend(call.backend, tag)
    if backend == "mma" and not facts.aligned16:
        if call.backend == "mma":
            raise ValueError("backend: 'mma' copies 16-byte pieces: q and the cache must start "
                             "at 16-byte aligned addresses; use 'simt' or 'auto'")
        backend = "simt"
    sixteen = tag != "f32"
    mask, mod, cache_cls, H = call.mask, call.score_mod, type(call.cache), call.heads
    config = call.config
    if call.warp_split_k:
        # Warp split-K: the FMA kernel's for 16-bit caches, else (and under "simple") the
        # simple kernel's; "auto" takes the simple kernel's also for a config that only it
        # honours (its 8 rows, 8 keys, one stage), as for the tensor-core kernels below
        check_warp_split(True, call.backend)
        if call.backend == "simt":
            check_simt_warp_split(tag, fp8)
        simt_runs = call.backend in ("auto", "simt") and sixteen and not fp8
        if call.backend == "auto" and simt_runs and config is not None:
            simt_runs = (config.num_queries_per_block in (None, 16)
                         and config.num_keys_per_block in (None, 32)
                         and config.num_pipeline_stages in (None, PIPELINE_STAGES["simt"]))
        backend = "simt_warpsplit" if simt_runs else "warpsplit"
    elif (backend in ("mma", "mma_sync") and call.backend == "auto"
          and not _tensor_core_honours(config, backend, rows, fp8, facts.packed_rows)):
        backend = "simt"  # the FMA kernel runs what the config asks (or refuses it below)

    block_t = 0  # the transposed kernel's rows a block where it runs (its 64 is not mma.py's)
    if backend in ("simple", "warpsplit"):
        block_m, block_n = _simple_tiles(backend)
    elif backend == "simt_warpsplit":
        from .kernels import simt

        block_m, block_n = 16, simt.block_n(16, True, groups=2)
    elif backend == "mma":
        from .kernels import mma, seesaw, transposed

        block_t = _transposed(config, rows, fp8, facts.packed_rows)
        if block_t:
            block_m, block_n = block_t, transposed.BLOCK_N
        else:
            block_m, block_n = mma.BLOCK_M, mma.BLOCK_N
        want = None if config is None else config.num_queries_per_block
        runs = _mma_rows(fp8, facts.packed_rows)
        if want is not None and want not in runs:  # (both "e4m3" kernels named where both run)
            raise refuse("num_queries_per_block", want, "mma", runs)
    elif backend == "mma_sync":
        from .kernels import mma_sync

        block_m, staged, fits = _mma_sync_shape(config, rows, fp8)
        roles = _mma_sync_roles(config, rows, fp8)  # (its stages, or 0)
        if roles:
            block_m, staged, fits = 32, 0, True
        block_n = mma_sync.BLOCK_N
        if not fits:  # the config's rows: no such block, or more shared memory than a block gets
            runs = [m for m in mma_sync.BLOCK_MS
                    if m == 16 or heuristics.mma_sync_fits(m, fp8)[1]]
            raise refuse("num_queries_per_block", block_m, "mma_sync", runs)
    else:
        from .kernels import simt

        block_m = heuristics.simt_block_m(rows, sixteen, fp8)
        if config is not None and config.num_queries_per_block is not None:
            block_m = config.num_queries_per_block
            if block_m not in ((16, 32) if sixteen else (16,)):
                raise refuse("num_queries_per_block", block_m, "simt",
                             (16, 32) if sixteen else (16,))
        block_n = simt.block_n(block_m, sixteen, fp8)
    if backend in ("simt", "simt_warpsplit"):
        # The FMA kernel's block takes 154-226 KB of shared memory (an H100's or H200's
        # blocks get 227 KB, an A100's 163, an Ada GPU's 99): where it does not fit, "auto"
        # runs the simple kernel (48 KB, static), and an explicit "simt" is refused by name
        split = backend == "simt_warpsplit"
        need = simt.smem_bytes(block_m, sixteen, fp8, 2 if split else 1)
        limit = heuristics.smem_per_block()
        if need > limit:
            if call.backend != "auto" or (config is not None
                                          and config.num_queries_per_block is not None):
                name = "backend" if call.backend != "auto" else "config.num_queries_per_block"
                raise ValueError(f"{name}: the FMA kernel ('simt'{', warp split-K' if split else ''}) "
                                 f"takes {need // 1024} KB of shared memory a block at {block_m} "
                                 f"rows; this GPU gives a block {limit // 1024} KB. Use "
                                 f"backend='simple' or 'auto'")
            backend = "warpsplit" if split else "simple"
            block_m, block_n = _simple_tiles(backend)
    _check_config(config, backend, block_m, block_n,
                  mma_sync.pipeline_stages(block_m, fp8, staged) if backend == "mma_sync"
                  else None)
    groups = max(1, math.ceil(rows / block_m))
    # The split model's waves: blocks that run at once (one a multiprocessor, but two of the
    # warp tensor-core kernel's where shared memory allows)
    slots = heuristics.sm_count()
    if backend == "mma_sync":
        from .kernels import mma_sync, mma_sync_roles

        slots *= heuristics.resident_blocks(mma_sync_roles.smem_bytes(roles) if roles else
                                            mma_sync.smem_bytes(block_m, fp8, staged),
                                            mma_sync.min_blocks(block_m))
    elif backend == "mma" and block_t:
        slots *= heuristics.resident_blocks(transposed.smem_bytes(block_m), 2)
    fixed = call.num_partitions or (config.num_partitions if config is not None else None)
    if fixed:
        chunk, P = 0, fixed
    elif backend == "warpsplit":  # an even split: its warps share out each partition's tiles
        chunk = 0
        P = heuristics.num_partitions(call.batch, groups, int(np.max(keys, initial=0)), block_n,
                                      rows=rows)
    else:
        chunk, P = heuristics.balanced_split(keys, block_n, groups, sms=slots, rows=rows)
    direct = P == 1
    common = dict(block_m=block_m, block_n=block_n, groups=groups, num_partitions=P,
                  chunk=chunk, direct=direct, rows=rows, slots=slots)

    if backend == "simt":
        disp = factory.partition_kernel(mask, mod, tag, cache_cls, block_m, H, direct,
                                        facts.cache_aligned16, fp8)
        return KernelSpec("simt", disp, simt.NTHREADS, simt.smem_bytes(block_m, sixteen, fp8),
                          q_pairs=False, tma=False, **common)
    if backend == "simt_warpsplit":
        disp = factory.partition_kernel(mask, mod, tag, cache_cls, block_m, H, direct,
                                        facts.cache_aligned16, None, groups=2)
        return KernelSpec("simt_warpsplit", disp, simt.NTHREADS,
                          simt.smem_bytes(block_m, True, None, groups=2), q_pairs=False,
                          tma=False, **common)
    if backend == "warpsplit":
        from .kernels import warpsplit

        disp = factory.warpsplit_partition_kernel(mask, mod, tag, cache_cls, H, direct, fp8)
        return KernelSpec("warpsplit", disp, warpsplit.NTHREADS, 0, q_pairs=False, tma=False,
                          **common)
    if backend == "simple":
        from .kernels import simple

        disp = factory.simple_partition_kernel(mask, mod, tag, cache_cls, block_m, H, direct,
                                               fp8)
        return KernelSpec("simple", disp, simple.NTHREADS, simple.smem_bytes(block_m),
                          q_pairs=False, tma=False, **common)
    if backend == "mma_sync":
        if roles:
            from .kernels import mma_sync_roles

            disp = factory.mma_sync_roles_partition_kernel(mask, mod, tag, cache_cls, H, direct,
                                                           facts.cache_aligned16, roles,
                                                           facts.cache_packed)
            spec = KernelSpec("mma_sync_roles", disp, mma_sync_roles.threads(disp.form["v_warps"]),
                              mma_sync_roles.smem_bytes(roles, disp.form["score_quarters"]),
                              q_pairs=True, tma=False,
                              **common)
            # where the form spills (a score mod with much arithmetic), the lockstep 32-row
            # block, where it fits (the same rows a block and one block a multiprocessor)
            if not spills(spec) or not heuristics.mma_sync_fits(32)[1]:
                return spec
        disp = factory.mma_sync_partition_kernel(mask, mod, tag, cache_cls, block_m, H, direct,
                                                 fp8, facts.cache_aligned16, staged)
        return KernelSpec("mma_sync", disp, mma_sync.threads(block_m),
                          mma_sync.smem_bytes(block_m, fp8, staged),
                          q_pairs=True, tma=False, **common)
    if block_t:  # "e4m3" rows, 16, 32 or 64 query rows a block
        if (SEESAW_E4M3 and block_t == 64 and (config is None
                                               or config.num_queries_per_block is None)
                and _tiles_in_pages(call.cache)):
            # past 32 rows, on tiles the copy engine can bring: the seesaw kernel converts
            # each tile once for both of its warpgroups (kernels/seesaw.py), unless it spills
            def seesaw_spec(follows, rows_ahead, converter):
                disp = factory.seesaw_partition_kernel(
                    mask, mod, tag, cache_cls, H, direct, fp8=fp8, converter=converter,
                    follows=follows, rows_ahead=rows_ahead)
                return KernelSpec("seesaw", disp, seesaw.threads(converter),
                                  seesaw.smem_bytes_e4m3(converter, disp.stage8),
                                  q_pairs=True, tma=True, **common)

            for converter in (True, False) if SEESAW_CONVERTER else (False,):
                spec = _seesaw_fit(spills, lambda follows, rows_ahead: seesaw_spec(
                    follows, rows_ahead, converter))
                if spec is not None:
                    return spec

        def spec_of(v_ahead):
            disp = factory.transposed_partition_kernel(mask, mod, tag, cache_cls, H, direct,
                                                       block_m, v_ahead)
            return KernelSpec("transposed", disp, transposed.threads(block_m),
                              transposed.smem_bytes(block_m), q_pairs=True, tma=False,
                              **common)

        if block_m > transposed.BLOCKS[0]:  # V's codes a step ahead, unless that spills
            spec = spec_of(TRANSPOSED_V_AHEAD)
            if not spills(spec):
                return spec
        return spec_of(None)
    # FP8 rows elsewhere: cp.async
    tma = _tiles_in_pages(call.cache) and facts.packed_rows and not fp8
    if tma:
        # Spread lengths: the listed schedule where the cost model prefers it (one piece count
        # a sequence, blocks launched longest first; it writes the workspace)
        pieces = None if fixed else heuristics.listed_split(keys, block_n, groups, sms=slots,
                                                            rows=rows, balanced=(chunk, P))
        # ... or the runs schedule, where the model prefers it to either (SEESAW_RUNS)
        table = None if fixed or not len(keys) else runs_table(keys, block_n, groups, slots,
                                                               rows, (chunk, P), pieces)
        if table is not None:
            parts = heuristics.runs_partitions(table)
            whole = parts == 1  # (no sequence cut: the items write out themselves, no combine)
            # (heuristics.MIXED_RUNS: where some are cut, those that are not write out too;
            # a table that cuts every sequence runs the plain form)
            mixed = not whole and heuristics.MIXED_RUNS and heuristics.runs_whole_items(table)
            runs = dict(common, num_partitions=parts, chunk=0, direct=whole)
            spec = _seesaw_fit(spills, lambda follows, rows_ahead: KernelSpec(
                "seesaw", factory.seesaw_partition_kernel(
                    mask, mod, tag, cache_cls, H, whole, runs=True, mixed=mixed,
                    follows=follows, rows_ahead=rows_ahead), mma.NTHREADS,
                seesaw.SMEM_BYTES_RUNS, q_pairs=True, tma=True, listable=True, work=table,
                runs=int(table[0, 0]), mixed=mixed, **runs))
            if spec is not None:
                return spec
        if pieces is not None:
            work = heuristics.list_blocks(pieces, -(-np.asarray(keys, np.int64) // block_n),
                                          groups)
            listed = dict(common, num_partitions=int(pieces.max()), chunk=0, direct=False)
            spec = _seesaw_fit(spills, lambda follows, rows_ahead: KernelSpec(
                "seesaw", factory.seesaw_partition_kernel(
                    mask, mod, tag, cache_cls, H, False, listed=True, follows=follows,
                    rows_ahead=rows_ahead),
                mma.NTHREADS, seesaw.SMEM_BYTES, q_pairs=True, tma=True, listable=True,
                work=work, **listed))
            if spec is not None:
                return spec
        spec = _seesaw_fit(spills, lambda follows, rows_ahead: KernelSpec(
            "seesaw", factory.seesaw_partition_kernel(mask, mod, tag, cache_cls, H, direct,
                                                      follows=follows, rows_ahead=rows_ahead),
            mma.NTHREADS, seesaw.SMEM_BYTES, q_pairs=True, tma=True, listable=not fixed,
            **common))
        if spec is not None:
            return spec
    # (``listable`` as the seesaw forms' where they were tried: this fallback's plans then
    # key on the listed and runs schedules too, so that a plan of one of those, made for other
    # lengths of the family where it did not spill, is never taken for one of these)
    disp = factory.mma_partition_kernel(mask, mod, tag, cache_cls, H, direct, tma, fp8)
    return KernelSpec("mma", disp, mma.NTHREADS, mma.smem_bytes(fp8), q_pairs=True, tma=tma,
                      listable=tma and not fixed, **common)
