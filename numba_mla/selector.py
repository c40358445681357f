"""Which kernel runs a call: every backend decision and fallback in one place.

A call names a backend (``"auto"``, ``"simt"``, ``"mma"``, ``"simple"``); what runs is decided
here, from the call and a few facts about its arrays:

1. ``"auto"`` is the tensor-core backend for 16-bit data where wgmma exists (sm_90, or the
   simulator), the FMA kernel (``"simt"``) otherwise.
2. The tensor-core kernels copy 16-byte pieces: q and the cache must start 16-byte aligned.
   ``"auto"`` falls back to ``"simt"``; an explicit ``"mma"`` is refused.
3. The split-K factor P: the caller's, or the heuristic's (heuristics.py) for the kernel's
   tile; one partition means the partition kernel writes ``out`` itself (``direct``).
4. Tensor-core tiles come by the copy engine (TMA) where a 64-key tile never straddles pages
   and rows are packed; there the seesaw kernel runs, unless it would spill registers (a mask
   with much arithmetic beside its 160 accumulators), then the lockstep kernel's TMA variant.
   Elsewhere the lockstep kernel copies with cp.async.

The result is a :class:`KernelSpec`: the compiled-on-demand kernel and how to launch it.
"""
import math
from dataclasses import dataclass
from typing import Any, Callable

from . import _compat, factory, heuristics


@dataclass(frozen=True)
class KernelSpec:
    """A partition kernel and what its launch needs (the factory's description)."""

    backend: str  # what runs: "simt", "simple", "mma" (lockstep wgmma) or "seesaw"
    dispatcher: Any  # the Numba kernel (compiled for the argument types at first launch)
    threads: int  # threads a block
    smem: int  # dynamic shared memory a block, bytes
    block_m: int  # query rows a block
    block_n: int  # keys a tile
    groups: int  # row groups a sequence: the grid's y
    num_partitions: int  # split-K factor P: the grid's x
    direct: bool  # one partition: writes out and lse itself, no combine
    q_pairs: bool  # q read as int32 words of two 16-bit values
    tma: bool  # two tensor maps (q, cache) follow the arguments


def mma_supported():
    """wgmma exists on sm_90 (Hopper) only; the simulator runs the kernels' Python twins."""
    if _compat.SIMULATOR:
        return True
    from numba import cuda

    return cuda.get_current_device().compute_capability == (9, 0)


def resolve_backend(backend, tag):
    """The backend family a call asks for, before the arrays are seen: ``"auto"`` is the
    tensor-core kernel for 16-bit data where wgmma exists, the FMA kernel otherwise."""
    if backend == "auto":
        return "mma" if tag != "f32" and mma_supported() else "simt"
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
    cache_aligned16: bool  # the cache does (16-byte copies in the FMA kernel)
    packed_rows: bool  # q and the cache are C-contiguous (TMA sees them as [rows, 576])


def select_kernel(call, tag, rows, longest, facts: ArrayFacts,
                  spills: Callable[[KernelSpec], bool]) -> KernelSpec:
    """The kernel for a checked call. ``rows``: query rows of the longest sequence (Sq x H);
    ``longest``: the most keys a sequence's queries may keep (the heuristic divides it);
    ``spills(spec)`` compiles a candidate for the call's argument types and says whether it
    uses local memory (never in the simulator)."""
    backend = resolve_backend(call.backend, tag)
    if backend == "mma" and not facts.aligned16:
        if call.backend == "mma":
            raise ValueError("backend: 'mma' copies 16-byte pieces: q and the cache must start "
                             "at 16-byte aligned addresses; use 'simt' or 'auto'")
        backend = "simt"
    sixteen = tag != "f32"
    mask, mod, cache_cls, H = call.mask, call.score_mod, type(call.cache), call.heads

    if backend == "mma":
        from .kernels import mma, seesaw

        block_m, block_n = mma.BLOCK_M, mma.BLOCK_N
    elif backend == "simple":
        from .kernels import simple

        block_m, block_n = simple.BLOCK_M, simple.BLOCK_N
    else:
        from .kernels import simt

        block_m = heuristics.simt_block_m(rows, sixteen)
        block_n = simt.block_n(block_m, sixteen)
    groups = max(1, math.ceil(rows / block_m))
    P = call.num_partitions or heuristics.num_partitions(call.batch, groups, longest, block_n)
    direct = P == 1
    common = dict(block_m=block_m, block_n=block_n, groups=groups, num_partitions=P,
                  direct=direct)

    if backend == "simt":
        disp = factory.partition_kernel(mask, mod, tag, cache_cls, block_m, H, direct,
                                        facts.cache_aligned16)
        return KernelSpec("simt", disp, simt.NTHREADS, simt.smem_bytes(block_m, sixteen),
                          q_pairs=False, tma=False, **common)
    if backend == "simple":
        disp = factory.simple_partition_kernel(mask, mod, tag, cache_cls, block_m, H, direct)
        return KernelSpec("simple", disp, simple.NTHREADS, simple.smem_bytes(block_m),
                          q_pairs=False, tma=False, **common)
    tma = ((call.cache.kind == "contiguous" or call.cache.page_size % mma.BLOCK_N == 0)
           and facts.packed_rows)
    if tma:
        spec = KernelSpec("seesaw", factory.seesaw_partition_kernel(mask, mod, tag, cache_cls,
                                                                    H, direct),
                          mma.NTHREADS, seesaw.SMEM_BYTES, q_pairs=True, tma=True, **common)
        if not spills(spec):
            return spec
    disp = factory.mma_partition_kernel(mask, mod, tag, cache_cls, H, direct, tma)
    return KernelSpec("mma", disp, mma.NTHREADS, mma.SMEM_BYTES, q_pairs=True, tma=tma,
                      **common)
