"""``numba-mla bench``: time MLA decode, ours beside the peers', and record it as JSON and CSV.

The sweep is data: a list of ``Config`` rows (B, H, L, Sq, page size, dtype, mask, varying
lengths on/off, split-K factor). Each provider sits behind one signature,
``prepare(problem) -> Prepared``: ``run`` (zero arguments, enqueues the work: what is timed),
``result`` (the output, for the error check) and ``host_call`` (one whole Python call, as a
user makes it). Providers: every numba_mla kernel backend (``KERNEL_BACKENDS``), torch (two
``bmm`` on a contiguous cache; gather from pages + ``bmm``), and FlashMLA, FlashInfer and
vLLM's Triton decode when they are importable. A provider that cannot run is skipped with the
reason (recorded in ``meta["skipped"]``).

Timing follows PERFORMANCE.md: CUDA events around ``run`` (torch's when torch is there, else
Numba's), warm-up first, median and p10/p90 of ``iters`` runs, the L2 flushed (a 256 MB buffer
written) before each timed run, fresh random data (never zeros). Every row's output is
compared with the float64 reference (``numba_mla.reference``) on the first ``ref_seqs``
sequences, all heads (``ref_subset`` says which). The device's copy bandwidth (a ~1 GB
device-to-device copy) and dense bf16 rate (torch, 8192^3) are measured once; every row gets
``gbps``/``tflops`` (the fewest bytes and the FLOPs of PERFORMANCE.md over the median time)
and their fractions of those ceilings.

Host latency, per call of the Python entry point a decode loop uses (for numba_mla: the
callable ``numba_mla.prepare`` returns, on device inputs; ``host_path`` in the row): ``host_us`` is the wall time per call over ``host_calls`` calls with one
synchronize at the end (calls pipeline: it is max(Python cost, GPU time) per call);
``host_sync_us`` is the median wall time of one call followed by a synchronize (what a caller
that waits pays); ``overhead_us = host_sync_us - us_warm`` (``us_warm``: the GPU time without the
L2 flush, as in the host loop) is the cost beyond the GPU time.

On Numba's CUDA simulator the code path is the same and the timings are meaningless.
"""
import csv
import datetime
import inspect
import json
import math
import os
import re
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from . import _compat
from .arrays import BF16, to_host

#: numba_mla kernel backends to time; one whose ``launch.Plan`` raises NotImplementedError (or
#: that has no kernel of its own yet) is skipped with the reason.
KERNEL_BACKENDS = ("simt", "mma", "simple")

SCALE = 0.1352  # DeepSeek V3: mscale^2 / sqrt(192)
D_QK, D_V = 576, 512
#: Block-table entry of a page no sequence reads: far outside [0, P).
UNUSED_PAGE = 2**30
DTYPES = {"bfloat16": BF16, "float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}
#: Largest accepted ``rel_err`` (max |out - ref| / max |ref|) of a numba_mla row, per dtype.
TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-3}
#: The keys every JSON row has.
ROW_KEYS = ("provider", "backend", "batch", "heads", "seqlen", "sq", "dtype", "page_size", "us",
            "gbps", "tflops", "rel_err", "device")


def _masks():
    import numba_mla as nm

    return {"null": nm.NullMask, "causal": nm.CausalMask,
            "window256": lambda: nm.SlidingWindowCausalMask(256)}


MASK_NAMES = ("null", "causal", "window256")


# ---------------------------------------------------------------------------------------------
# The sweep, as data
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One benchmark configuration. ``seqlen`` is the longest cache length; with ``varlen`` the
    lengths are drawn uniformly from [seqlen/8, seqlen] (one is seqlen). ``num_partitions``:
    None lets the library choose the split-K factor; an int forces it (providers without a
    split-K knob are not run then)."""

    batch: int
    heads: int
    seqlen: int
    sq: int = 1
    page_size: int = 64
    dtype: str = "bfloat16"
    mask: str = "null"
    varlen: bool = False
    num_partitions: Optional[int] = None
    sweep: str = "default"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {self.dtype!r}")
        if self.mask not in MASK_NAMES:
            raise ValueError(f"mask: expected one of {list(MASK_NAMES)}, got {self.mask!r}")
        if not 1 <= self.sq <= self.seqlen:
            raise ValueError(f"sq: expected 1 <= sq <= seqlen = {self.seqlen}, got {self.sq}")

    @property
    def label(self):
        s = f"{self.batch}x{self.heads}x{self.seqlen}"
        if self.sq != 1:
            s += f" Sq={self.sq}"
        if self.mask != "null":
            s += f" {self.mask}"
        if self.varlen:
            s += " varlen"
        if self.num_partitions is not None:
            s += f" P={self.num_partitions}"
        return s


#: PERFORMANCE.md's shapes (B, H, L): bf16, page size 64, one query token, scale 0.1352.
PERF_SHAPES = ((64, 16, 4096), (128, 16, 8192), (64, 128, 4096), (128, 128, 1024),
               (16, 128, 32768), (1, 128, 65536))
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
SPLITS = (1, 2, 4, 8, 16, 32, 64)


def default_sweep():
    return [Config(B, H, L, sweep="default") for B, H, L in PERF_SHAPES]


def lengths_sweep(batch=64, heads=(16, 128), lengths=LENGTHS):
    """Latency against cache length, per head count."""
    return [Config(batch, H, L, sweep="lengths") for H in heads for L in lengths]


def splitk_sweep(batch=1, heads=128, seqlen=65536, splits=SPLITS):
    """The split-K factor's effect on one long sequence: the library's choice, then each P."""
    return [Config(batch, heads, seqlen, sweep="splitk")] + [
        Config(batch, heads, seqlen, num_partitions=p, sweep="splitk") for p in splits]


def tiny_sweep():
    """Simulator-sized: a paged cache with more than one page, two query tokens under a causal
    mask with NaN past the length, varying lengths, and an explicit split-K factor."""
    return [Config(1, 2, 16, page_size=8, sweep="tiny"),
            Config(1, 1, 10, sq=2, page_size=4, mask="causal", sweep="tiny"),
            Config(2, 1, 12, page_size=4, varlen=True, sweep="tiny"),
            Config(1, 1, 40, page_size=16, num_partitions=2, sweep="tiny")]


SWEEPS = {
    "default": default_sweep,
    "lengths": lengths_sweep,
    "splitk": splitk_sweep,
    "all": lambda: default_sweep() + lengths_sweep() + splitk_sweep(),
    "tiny": tiny_sweep,
}


@dataclass
class Settings:
    """How much to measure. ``gpu()`` for real runs, ``simulator()`` for the code path."""

    iters: int = 30            # timed runs per row (median, p10, p90)
    warmup: int = 3            # untimed runs first (compilation, caches)
    warm_iters: int = 10       # runs timed without the L2 flush (us_warm, for overhead_us)
    host_calls: int = 30       # whole Python calls timed for host_us / host_sync_us
    flush_bytes: int = 256 << 20
    copy_bytes: int = 1 << 30  # the copy-bandwidth measurement copies this much
    matmul_n: int = 8192       # dense bf16 ceiling: an n^3 torch matmul
    ref_seqs: int = 2          # reference on the first ref_seqs sequences, all heads
    nan_unused: bool = False   # NaN in cache slots past each length (peers may read them)

    @classmethod
    def gpu(cls, **kw):
        return cls(**kw)

    @classmethod
    def simulator(cls, **kw):
        base = dict(iters=1, warmup=0, warm_iters=0, host_calls=1, flush_bytes=1 << 20,
                    copy_bytes=1 << 20, matmul_n=0, ref_seqs=4, nan_unused=True)
        base.update(kw)
        return cls(**base)


# ---------------------------------------------------------------------------------------------
# Counting (PERFORMANCE.md)
# ---------------------------------------------------------------------------------------------
def count(lengths, sq, heads, mask, itemsize=2):
    """(bytes, flops) of one call: the fewest bytes that must move (each kept cache row read
    once, q read, out written) and ``2 * (576 + 512)`` FLOPs per kept (query row, key) pair,
    per head. The keys a query keeps are the mask's key range cut to the length (exact for
    the built-in masks). With the null mask and Sq = 1 this is PERFORMANCE.md's
    ``B*L*576*2 + B*H*576*2 + B*H*512*2`` bytes and ``2*B*H*L*(576+512)`` FLOPs."""
    keys_read = pairs = 0
    for L in np.asarray(lengths).tolist():
        if L <= 0:
            continue
        k0, k1 = mask.key_range(L - sq, L - 1)
        keys_read += max(0, min(k1, L) - max(k0, 0))
        for i in range(sq):
            k0, k1 = mask.key_range(L - sq + i, L - sq + i)
            pairs += max(0, min(k1, L) - max(k0, 0))
    B = len(lengths)
    nbytes = itemsize * (keys_read * D_QK + B * sq * heads * (D_QK + D_V))
    flops = 2 * heads * pairs * (D_QK + D_V)
    return int(nbytes), int(flops)


# ---------------------------------------------------------------------------------------------
# The device: events, synchronize, L2 flush, ceilings
# ---------------------------------------------------------------------------------------------
class _WallEvent:
    """The simulator's events record no time; wall time keeps the numbers positive."""

    def record(self):
        self.t = time.perf_counter()


class Device:
    """torch's CUDA events and streams when torch sees a GPU, else Numba's; on the simulator,
    wall time. ``torch`` is the torch module or None (``torch_reason`` says why)."""

    def __init__(self, use_torch=True):
        from numba import cuda

        self.cuda = cuda
        self.simulator = _compat.SIMULATOR
        self.torch, self.torch_reason = None, None
        if self.simulator:
            self.torch_reason = "on the CUDA simulator (torch providers need a real GPU)"
        elif not use_torch:
            self.torch_reason = "torch not used (use_torch=False)"
        else:
            try:
                import torch

                if torch.cuda.is_available():
                    self.torch = torch
                else:
                    self.torch_reason = "torch sees no CUDA device"
            except ImportError:
                self.torch_reason = "torch is not installed"
        self._flush = None
        self.name = self._name()

    def _name(self):
        if self.simulator:
            return "CUDA simulator"
        if self.torch is not None:
            return self.torch.cuda.get_device_name()
        name = self.cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else name

    def sync(self):
        if self.torch is not None:
            self.torch.cuda.synchronize()
        else:
            self.cuda.synchronize()

    def event(self):
        if self.simulator:
            return _WallEvent()
        if self.torch is not None:
            return self.torch.cuda.Event(enable_timing=True)
        return self.cuda.event(timing=True)

    def elapsed_us(self, start, stop):
        if self.simulator:
            return (stop.t - start.t) * 1e6
        if self.torch is not None:
            return start.elapsed_time(stop) * 1e3
        return self.cuda.event_elapsed_time(start, stop) * 1e3

    def _buffers(self, nbytes):
        """Two device byte buffers of ``nbytes`` each (the second for Numba's copy)."""
        if self.torch is not None:
            t = self.torch
            return (t.empty(nbytes, dtype=t.uint8, device="cuda"),
                    t.empty(nbytes, dtype=t.uint8, device="cuda"))
        return (self.cuda.device_array(nbytes, np.uint8), self.cuda.device_array(nbytes, np.uint8))

    def _copy(self, dst, src):
        if self.torch is not None:
            dst.copy_(src)
        else:
            dst.copy_to_device(src)  # device to device

    def flush_l2(self, nbytes):
        """Write ``nbytes`` (torch: zero a buffer; Numba: copy one buffer of half onto another)."""
        if self._flush is None or self._flush[0] != nbytes:
            half = nbytes if self.torch is not None else max(1, nbytes // 2)
            self._flush = (nbytes,) + self._buffers(half)
        _, a, b = self._flush
        if self.torch is not None:
            a.zero_()
        else:
            self._copy(a, b)

    def copy_bandwidth(self, nbytes, iters=10):
        """GB/s of a device-to-device copy of ``nbytes``: (read + written) / median time."""
        src, dst = self._buffers(nbytes)
        if self.torch is not None:
            src.random_(0, 255)
        t = time_gpu(self, lambda: self._copy(dst, src), iters=iters, warmup=2, flush_bytes=0)
        return 2 * nbytes / t[0] / 1e3

    def matmul_tflops(self, n, iters=10):
        """TFLOP/s of an n x n x n bf16 torch matmul (the dense tensor-core ceiling); None
        without torch."""
        if self.torch is None or not n:
            return None
        t = self.torch
        a = t.randn(n, n, dtype=t.bfloat16, device="cuda")
        b = t.randn(n, n, dtype=t.bfloat16, device="cuda")
        us = time_gpu(self, lambda: a @ b, iters=iters, warmup=3, flush_bytes=0)[0]
        return 2 * n**3 / us / 1e6

    def release(self):
        if self.torch is not None:
            self.torch.cuda.empty_cache()


def time_gpu(dev, fn, iters, warmup, flush_bytes):
    """(median, p10, p90) microseconds of ``fn`` between two events, after ``warmup`` untimed
    runs, the L2 flushed before each timed run when ``flush_bytes``."""
    for _ in range(warmup):
        fn()
    dev.sync()
    times = []
    for _ in range(max(1, iters)):
        if flush_bytes:
            dev.flush_l2(flush_bytes)
        start, stop = dev.event(), dev.event()
        start.record()
        fn()
        stop.record()
        dev.sync()
        times.append(dev.elapsed_us(start, stop))
    return (float(np.median(times)), float(np.percentile(times, 10)),
            float(np.percentile(times, 90)))


def time_host(dev, call, n, warm):
    """Host wall time of whole calls: (median of one call + synchronize, per call over ``n``
    calls with one synchronize at the end (None when n < 2)), microseconds."""
    if warm:
        call()
        dev.sync()
    one = []
    for _ in range(max(1, n)):
        t0 = time.perf_counter()
        call()
        dev.sync()
        one.append(time.perf_counter() - t0)
    pipelined = None
    if n >= 2:
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        dev.sync()
        pipelined = (time.perf_counter() - t0) / n * 1e6
    return float(np.median(one)) * 1e6, pipelined


# ---------------------------------------------------------------------------------------------
# Problems: fresh random data on the device, a paged cache with a shuffled block table
# ---------------------------------------------------------------------------------------------
@dataclass
class Problem:
    """One configuration's inputs. ``q``, ``pages``, ``block_table``, ``lengths`` live on the
    device as torch tensors when torch is used, else as NumPy arrays (numba_mla copies those
    in). ``cache`` is the numba_mla PagedKVCache over them."""

    config: Config
    device: Device
    q: Any                      # [B, Sq, H, 576]
    pages: Any                  # [P, page_size, 576]
    block_table: Any            # [B, max_pages] int32 (unused entries UNUSED_PAGE)
    lengths: Any                # [B] int32
    lengths_host: np.ndarray
    block_table_host: np.ndarray
    cache: Any
    mask: Any
    scale: float = SCALE
    ref_seqs: int = 2
    _reference: Any = field(default=None, repr=False)

    @property
    def dtype(self):
        return DTYPES[self.config.dtype]

    @property
    def page_size(self):
        return self.config.page_size

    @property
    def n_ref(self):
        return min(self.ref_seqs, self.config.batch)

    @property
    def ref_subset(self):
        B, n = self.config.batch, self.n_ref
        return "all" if n == B else f"sequences 0..{n - 1} of {B}, all heads"

    def token_index(self):
        """[B, Lmax] int64 flat row of each token in ``pages.reshape(-1, 576)``; positions past a
        length point at the sequence's first token (finite data, masked by the caller)."""
        B, L, page = self.config.batch, self.config.seqlen, self.page_size
        t = np.arange(L)
        idx = np.empty((B, L), np.int64)
        for b in range(B):
            n = int(self.lengths_host[b])
            tt = np.where(t < n, t, 0)
            idx[b] = self.block_table_host[b, tt // page].astype(np.int64) * page + tt % page
        return idx

    def keep_bias(self):
        """float32 [B, Sq, 1, Lmax]: 0 where query (b, i) keeps key k (mask and length), -inf
        elsewhere; None when every key is kept (null mask, all lengths equal to Lmax)."""
        cfg = self.config
        L = cfg.seqlen
        lengths = self.lengths_host
        if cfg.mask == "null" and (lengths == L).all():
            return None
        b = np.arange(cfg.batch)[:, None, None]
        q_pos = lengths[:, None, None] - cfg.sq + np.arange(cfg.sq)[None, :, None]
        k = np.arange(L)[None, None, :]
        keep = np.asarray(self.mask.keep(b, 0, q_pos, k)) & (k < lengths[:, None, None])
        return np.where(keep, 0.0, -np.inf).astype(np.float32)[:, :, None, :]

    def reference(self):
        """float64 out [n, Sq, H, 512] of the first ``n_ref`` sequences (computed once)."""
        if self._reference is None:
            import numba_mla as nm

            n, page = self.n_ref, self.page_size
            qh = np.asarray(to_host(self.q[:n]))
            lengths = self.lengths_host[:n]
            kv = np.zeros((n, max(1, int(lengths.max())), D_QK), self.dtype)
            for b in range(n):
                used = -(-int(lengths[b]) // page)
                rows = np.asarray(self.block_table_host[b, :used], np.int64)
                if self.device.torch is not None:
                    sel = self.pages[self.device.torch.as_tensor(rows, device=self.pages.device)]
                else:
                    sel = self.pages[rows]
                kv[b, :lengths[b]] = np.asarray(to_host(sel)).reshape(-1, D_QK)[:lengths[b]]
            cache = nm.ContiguousKVCache(kv, lengths)
            self._reference = nm.reference.mla_decode(qh, cache, self.scale, mask=self.mask)
        return self._reference


def make_lengths(cfg, rng):
    if not cfg.varlen:
        return np.full(cfg.batch, cfg.seqlen, np.int32)
    lo = max(cfg.sq, cfg.seqlen // 8)
    lengths = rng.integers(lo, cfg.seqlen + 1, size=cfg.batch)
    lengths[rng.integers(cfg.batch)] = cfg.seqlen
    return lengths.astype(np.int32)


def make_problem(cfg, dev, rng, settings):
    """Random inputs for ``cfg``: pages in a shuffled order with one spare page, unused
    block-table entries UNUSED_PAGE; with ``settings.nan_unused`` NaN in every slot past a
    length and in the spare page (numba_mla never reads them; a peer may)."""
    import numba_mla as nm

    B, H, L, sq, page = cfg.batch, cfg.heads, cfg.seqlen, cfg.sq, cfg.page_size
    dtype = DTYPES[cfg.dtype]
    lengths = make_lengths(cfg, rng)
    used = -(-lengths.astype(np.int64) // page)
    max_pages = max(1, -(-L // page))
    num_pages = int(used.sum()) + 1
    order = rng.permutation(num_pages)
    bt = np.full((B, max_pages), UNUSED_PAGE, np.int32)
    bt[np.arange(max_pages)[None, :] < used[:, None]] = order[:int(used.sum())]
    spare = int(order[-1])
    # (page, first unused slot) of each sequence's partly used last page
    tails = [(int(bt[b, used[b] - 1]), int(lengths[b] % page))
             for b in range(B) if used[b] and lengths[b] % page]
    torch = dev.torch
    if torch is not None:
        tdt = {"bfloat16": torch.bfloat16, "float16": torch.float16,
               "float32": torch.float32}[cfg.dtype]
        g = torch.Generator(device="cuda")
        g.manual_seed(int(rng.integers(2**62)))
        pages = torch.randn((num_pages, page, D_QK), dtype=tdt, device="cuda", generator=g)
        q = torch.randn((B, sq, H, D_QK), dtype=tdt, device="cuda", generator=g)
        if settings.nan_unused:
            pages[spare] = float("nan")
            for p, s in tails:
                pages[p, s:] = float("nan")
        block_table = torch.as_tensor(bt, device="cuda")
        lengths_dev = torch.as_tensor(lengths, device="cuda")
    else:
        pages = rng.standard_normal((num_pages, page, D_QK), dtype=np.float32).astype(dtype)
        q = rng.standard_normal((B, sq, H, D_QK), dtype=np.float32).astype(dtype)
        if settings.nan_unused:
            pages[spare] = np.nan
            for p, s in tails:
                pages[p, s:] = np.nan
        block_table, lengths_dev = bt, lengths
    cache = nm.PagedKVCache(pages, block_table, lengths_dev)
    return Problem(cfg, dev, q, pages, block_table, lengths_dev, lengths, bt, cache,
                   _masks()[cfg.mask](), SCALE, settings.ref_seqs)


# ---------------------------------------------------------------------------------------------
# Providers: prepare(problem) -> Prepared
# ---------------------------------------------------------------------------------------------
class Skip(Exception):
    """A provider cannot run this configuration (or at all); the message says why."""


@dataclass
class Prepared:
    run: Callable[[], Any]                 # enqueues the work; this is what is timed
    result: Callable[[], Any]              # out [B, Sq, H, 512] after run (any array kind)
    host_call: Optional[Callable[[], Any]] = None  # one whole Python call, as a user makes it
    info: dict = field(default_factory=dict)       # extra row fields (resources, split)


class Provider:
    name = "?"
    backend = None
    #: Honours Config.num_partitions (others are not run when it is set).
    splits = False

    @property
    def key(self):
        return self.name if self.backend is None else f"{self.name}:{self.backend}"

    def unavailable(self, dev):
        """None when the provider can run on ``dev``, else the reason it cannot."""
        return None

    def prepare(self, problem):
        raise NotImplementedError


class NumbaMLA(Provider):
    """A numba_mla kernel backend: ``check_decode`` + ``launch.Plan`` once, ``plan.launch()``
    timed; ``host_call`` is ``numba_mla.mla_decode`` on the same inputs."""

    name = "numba_mla"
    splits = True

    def __init__(self, backend):
        self.backend = backend

    def prepare(self, p):
        import numba_mla as nm
        from . import checks, launch

        cfg = p.config

        def plan_for(backend):
            call = checks.check_decode(p.q, p.cache, p.scale, p.mask, None, cfg.num_partitions,
                                       True, None, backend)
            return launch.Plan(call)

        try:
            plan = plan_for(self.backend)
        except NotImplementedError as e:
            raise Skip(f"launch.Plan: {e}") from None
        except ValueError as e:  # "backend: 'mma' needs an sm_90 GPU ..." and the like
            if str(e).startswith("backend:"):
                raise Skip(f"launch.Plan: {e}") from None
            raise
        built = getattr(plan, "backend", None)
        if built is not None and built != self.backend:
            raise Skip(f"launch.Plan built backend {built!r} for backend={self.backend!r}")
        if built is None and self.backend != "simt":
            # launch.Plan does not say which backend it built: compare its kernels with simt's.
            simt = plan_for("simt")
            if [id(x.dispatcher) for x in plan.launches] == [id(x.dispatcher) for x in simt.launches]:
                raise Skip(f"backend={self.backend!r}: launch.Plan built the simt kernels "
                           "(no kernel of its own yet)")
        info = dict(num_partitions=plan.num_partitions, block_m=getattr(plan, "block_m", None))
        if plan.launches:
            first = plan.launches[0]
            info["smem_bytes"] = int(first.smem)
            kern = getattr(first, "kernel", None)
            for key, attr in (("registers", "regs_per_thread"),
                              ("local_bytes", "local_mem_per_thread")):
                try:
                    info[key] = int(getattr(kern, attr)) if kern is not None else None
                except Exception:  # not every numba-cuda version has every attribute
                    info[key] = None

        def host_call():
            return nm.mla_decode(p.q, p.cache, p.scale, mask=p.mask,
                                 num_partitions=cfg.num_partitions, backend=self.backend)

        # The host latency is that of the thin path a decode loop uses (``numba_mla.prepare``,
        # device inputs); NumPy inputs can only take the whole ``mla_decode`` call.
        try:
            host = nm.prepare(p.q, p.cache, p.scale, mask=p.mask,
                              num_partitions=cfg.num_partitions, backend=self.backend)
            info["host_path"] = "numba_mla.prepare"
        except TypeError:
            host = host_call
            info["host_path"] = "numba_mla.mla_decode"
        return Prepared(plan.launch, lambda: plan.result()[0], host, info)


def _torch_dtype(p):
    t = p.device.torch
    return {"bfloat16": t.bfloat16, "float16": t.float16, "float32": t.float32}[p.config.dtype]


class _TorchBase(Provider):
    """Two ``bmm`` (q.K^T in the storage dtype, softmax in float32, P.V) over a contiguous
    ``[B, Lmax, 576]`` cache; any mask and varying lengths through an additive bias."""

    def unavailable(self, dev):
        return None if dev.torch is not None else dev.torch_reason

    def _attend(self, p, bias):
        torch = p.device.torch
        B, sq, H, L = p.config.batch, p.config.sq, p.config.heads, p.config.seqlen
        q2 = p.q.reshape(B, sq * H, D_QK)
        scale = p.scale

        def attend(kv):
            s = torch.bmm(q2, kv.transpose(1, 2)).float() * scale   # [B, Sq*H, L]
            if bias is not None:
                s = (s.view(B, sq, H, L) + bias).view(B, sq * H, L)
            pr = torch.softmax(s, dim=-1).to(kv.dtype)
            return torch.bmm(pr, kv[..., :D_V]).view(B, sq, H, D_V)

        return attend

    def _inputs(self, p):
        torch = p.device.torch
        idx = torch.as_tensor(p.token_index(), device="cuda")
        bias = p.keep_bias()
        bias = None if bias is None else torch.as_tensor(bias, device="cuda")
        return idx, bias


class TorchBmm(_TorchBase):
    """torch on a contiguous cache: the gather from pages is done once, before timing (the
    cost a real paged caller would pay is in ``torch_gather``)."""

    name = "torch_bmm"

    def prepare(self, p):
        idx, bias = self._inputs(p)
        B, L = p.config.batch, p.config.seqlen
        kv = p.pages.reshape(-1, D_QK).index_select(0, idx.view(-1)).view(B, L, D_QK)
        attend = self._attend(p, bias)
        state = {}

        def run():
            state["out"] = attend(kv)

        return Prepared(run, lambda: state["out"], run, dict(page_size=None))


class TorchGather(_TorchBase):
    """torch from the paged cache: gather each sequence's rows (index_select), then two bmm."""

    name = "torch_gather"

    def prepare(self, p):
        idx, bias = self._inputs(p)
        B, L = p.config.batch, p.config.seqlen
        flat_idx = idx.view(-1)
        pages = p.pages.reshape(-1, D_QK)
        attend = self._attend(p, bias)
        state = {}

        def run():
            state["out"] = attend(pages.index_select(0, flat_idx).view(B, L, D_QK))

        return Prepared(run, lambda: state["out"], run, {})


# --- Peers, each run only when importable. -------------------------------------------------
# NOT TESTED (none is installed where this was written; no GPU there either): each adapter is
# written from the project's documented call. A peer that raises is reported in
# meta["errors"] (no row) and does not fail the run; only numba_mla rows are validated.
def _import_reason(module):
    try:
        __import__(module)
        return None
    except Exception as e:  # ImportError, or a broken install
        return f"{module} is not importable ({type(e).__name__}: {e})"


class _PeerBase(Provider):
    module = None

    def unavailable(self, dev):
        if dev.torch is None:
            return dev.torch_reason
        return _import_reason(self.module)

    def _common_checks(self, p, page_sizes=None):
        cfg = p.config
        if cfg.dtype not in ("bfloat16", "float16"):
            raise Skip(f"{self.name} takes bf16/fp16 only, not {cfg.dtype}")
        if cfg.mask not in ("null", "causal"):
            raise Skip(f"{self.name}: mask {cfg.mask!r} has no equivalent")
        if page_sizes and cfg.page_size not in page_sizes:
            raise Skip(f"{self.name} needs page size {page_sizes}, not {cfg.page_size}")


class FlashMLA(_PeerBase):
    """deepseek-ai/FlashMLA: ``get_mla_metadata`` once, ``flash_mla_with_kvcache`` timed."""

    name, module = "flash_mla", "flash_mla"

    def prepare(self, p):
        self._common_checks(p, page_sizes=(64,))
        from flash_mla import flash_mla_with_kvcache, get_mla_metadata

        cfg = p.config
        k = p.pages.unsqueeze(2)  # [P, 64, 1, 576]
        meta, splits = get_mla_metadata(p.lengths, cfg.sq * cfg.heads, 1)
        causal = cfg.mask == "causal"
        state = {}

        def run():
            state["out"] = flash_mla_with_kvcache(p.q, k, p.block_table, p.lengths, D_V, meta,
                                                  splits, softmax_scale=p.scale, causal=causal)[0]

        return Prepared(run, lambda: state["out"], run, {})


class FlashInfer(_PeerBase):
    """flashinfer.mla.BatchMLAPagedAttentionWrapper: ``plan`` once, ``run`` timed (latent and
    rope parts of cache and q split into separate contiguous tensors beforehand)."""

    name, module = "flashinfer", "flashinfer"

    def prepare(self, p):
        self._common_checks(p)
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        torch = p.device.torch
        cfg = p.config
        B, sq, H = cfg.batch, cfg.sq, cfg.heads
        used = -(-p.lengths_host.astype(np.int64) // cfg.page_size)
        indices = np.concatenate([p.block_table_host[b, :used[b]] for b in range(B)])
        dev = dict(device="cuda", dtype=torch.int32)
        qo_indptr = torch.arange(B + 1, **dev) * sq
        kv_indptr = torch.as_tensor(np.concatenate([[0], np.cumsum(used)]).astype(np.int32),
                                    device="cuda")
        kv_indices = torch.as_tensor(indices.astype(np.int32), device="cuda")
        ws = torch.empty(128 << 20, dtype=torch.int8, device="cuda")
        wrapper = BatchMLAPagedAttentionWrapper(ws, backend="auto")
        dt = _torch_dtype(p)
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, p.lengths, H, D_V, D_QK - D_V,
                     cfg.page_size, cfg.mask == "causal", p.scale, dt, dt)
        ckv = p.pages[..., :D_V].contiguous()
        kpe = p.pages[..., D_V:].contiguous()
        q3 = p.q.reshape(B * sq, H, D_QK)
        q_nope, q_pe = q3[..., :D_V].contiguous(), q3[..., D_V:].contiguous()
        state = {}

        def run():
            state["out"] = wrapper.run(q_nope, q_pe, ckv, kpe).view(B, sq, H, D_V)

        return Prepared(run, lambda: state["out"], run, {})


class VllmTriton(_PeerBase):
    """vLLM's Triton MLA decode (``decode_attention_fwd``, paged); one query token per
    sequence; ``num_kv_splits`` = Config.num_partitions or 8."""

    name = "vllm_triton"
    splits = True
    MODULES = ("vllm.v1.attention.ops.triton_decode_attention",
               "vllm.attention.ops.triton_decode_attention")

    def unavailable(self, dev):
        if dev.torch is None:
            return dev.torch_reason
        reasons = [_import_reason(m) for m in self.MODULES]
        return None if None in reasons else "; ".join(reasons)

    def prepare(self, p):
        import importlib

        self._common_checks(p)
        cfg = p.config
        if cfg.sq != 1:
            raise Skip("vllm_triton decodes one query token per sequence")
        fn = None
        for m in self.MODULES:
            try:
                fn = importlib.import_module(m).decode_attention_fwd
                break
            except ImportError:
                continue
        torch = p.device.torch
        B, H = cfg.batch, cfg.heads
        splits = cfg.num_partitions or 8
        k_buf = p.pages.unsqueeze(2)                  # [P, page, 1, 576]
        v_buf = k_buf[..., :D_V]                      # [P, page, 1, 512]
        q3 = p.q.reshape(B, H, D_QK)
        o = torch.empty((B, H, D_V), dtype=q3.dtype, device="cuda")
        lse = torch.empty((B, H), dtype=torch.float32, device="cuda")
        logits = torch.empty((B, H, splits, D_V + 1), dtype=torch.float32, device="cuda")
        with_lse = "lse" in inspect.signature(fn).parameters
        head = (q3, k_buf, v_buf, o) + ((lse,) if with_lse else ())

        def run():
            fn(*head, p.block_table, p.lengths, logits, splits, p.scale, cfg.page_size)

        return Prepared(run, lambda: o.view(B, 1, H, D_V), run, dict(num_partitions=splits))


def all_providers():
    return [NumbaMLA(b) for b in KERNEL_BACKENDS] + [
        TorchBmm(), TorchGather(), FlashMLA(), FlashInfer(), VllmTriton()]


def select_providers(spec=None):
    """Providers from a comma-separated list of names (``numba_mla`` = every kernel backend,
    ``numba_mla:simt`` one); None = all."""
    provs = all_providers()
    if not spec:
        return provs
    want = [s.strip() for s in spec.split(",") if s.strip()]
    names = {p.name for p in provs} | {p.key for p in provs}
    bad = [w for w in want if w not in names]
    if bad:
        raise ValueError(f"providers: unknown {bad}; expected names from {sorted(names)}")
    return [p for p in provs if p.name in want or p.key in want]


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------
def rel_err(got, ref):
    """max |got - ref| / max |ref| (NaN when got has NaN where ref is finite)."""
    got = np.asarray(got, np.float64)
    scale = float(np.abs(ref).max(initial=0.0)) or 1.0
    return float(np.abs(got - ref).max(initial=0.0)) / scale


def _versions(dev):
    from importlib import metadata

    import numba_mla

    out = {"numba_mla": numba_mla.__version__}
    for key, dist in (("numba", "numba"), ("numba_cuda", "numba-cuda"), ("numpy", "numpy"),
                      ("ml_dtypes", "ml_dtypes"), ("torch", "torch"), ("flash_mla", "flash_mla"),
                      ("flashinfer", "flashinfer-python"), ("vllm", "vllm"),
                      ("triton", "triton")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = None
    if dev.torch is not None:
        out["torch"] = dev.torch.__version__
        out["cuda_runtime"] = dev.torch.version.cuda
    return out


def git_commit():
    """Short commit of the checkout this package lives in (``+dirty`` when it has changes);
    None outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                             capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def device_slug(name):
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "device"


def _row(cfg, prov, problem, timing, err, info, dev_name, ceilings, host, warm_us):
    us, p10, p90 = timing
    itemsize = DTYPES[cfg.dtype].itemsize
    nbytes, flops = count(problem.lengths_host, cfg.sq, cfg.heads, problem.mask, itemsize)
    copy_gbps, dense_tflops = ceilings
    gbps, tflops = nbytes / us / 1e3, flops / us / 1e6
    host_sync_us, host_pipelined_us = host
    row = dict(
        provider=prov.name, backend=prov.backend, batch=cfg.batch, heads=cfg.heads,
        seqlen=cfg.seqlen, sq=cfg.sq, dtype=cfg.dtype, page_size=cfg.page_size, mask=cfg.mask,
        varlen=cfg.varlen, mean_seqlen=float(problem.lengths_host.mean()), sweep=cfg.sweep,
        num_partitions_requested=cfg.num_partitions, num_partitions=None,
        us=us, us_p10=p10, us_p90=p90, us_warm=warm_us,
        gbps=gbps, tflops=tflops, bytes=nbytes, flops=flops,
        intensity=flops / nbytes if nbytes else None,
        frac_copy=gbps / copy_gbps if copy_gbps else None,
        frac_dense=tflops / dense_tflops if dense_tflops else None,
        host_us=host_pipelined_us if host_pipelined_us is not None else host_sync_us,
        host_sync_us=host_sync_us,
        overhead_us=host_sync_us - (warm_us if warm_us is not None else us),
        rel_err=err, tolerance=TOLERANCE[cfg.dtype], ref_subset=problem.ref_subset,
        device=dev_name)
    row.update(info)
    return row


def run(configs, providers=None, settings=None, seed=0, commit=None, progress=True,
        sweep=None, use_torch=True, log=print):
    """Run ``configs`` x ``providers``; returns ``{"meta": ..., "rows": [...]}``."""
    from tqdm import tqdm

    settings = settings or (Settings.simulator() if _compat.SIMULATOR else Settings.gpu())
    providers = select_providers(providers) if providers is None or isinstance(providers, str) \
        else list(providers)
    dev = Device(use_torch=use_torch)
    rng = np.random.default_rng(seed)
    log(f"numba-mla bench: {len(configs)} configurations x {len(providers)} providers on "
        f"{dev.name}")
    copy_gbps = dev.copy_bandwidth(settings.copy_bytes)
    dense = dev.matmul_tflops(settings.matmul_n)
    log(f"  copy bandwidth {copy_gbps:.0f} GB/s (device-to-device, read + written); dense bf16 "
        f"{'%.0f TFLOP/s' % dense if dense else 'not measured (needs torch on a GPU)'}")
    meta = dict(
        device=dev.name, simulator=dev.simulator, date=datetime.date.today().isoformat(),
        time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=commit or git_commit() or "unknown", versions=_versions(dev), sweep=sweep,
        copy_gbps=copy_gbps, matmul_tflops=dense, settings=asdict(settings), seed=seed,
        scale=SCALE, tolerance=TOLERANCE,
        timing=(f"{'wall clock (simulator)' if dev.simulator else 'CUDA events'} around "
                f"run(), median and p10/p90 of {settings.iters} after {settings.warmup} warm-ups, "
                f"{settings.flush_bytes >> 20} MB written before each to flush the L2"),
        host_timing=(f"host_us: wall time per call over {settings.host_calls} whole Python "
                     "calls, one synchronize at the end; host_sync_us: median of one call + "
                     "synchronize; overhead_us = host_sync_us - us_warm (GPU time, L2 not "
                     "flushed)"),
        counting="PERFORMANCE.md: bytes = kept cache rows*576*2 + B*Sq*H*(576+512)*2; "
                 "FLOPs = 2*(576+512) per head per kept (query, key) pair",
        skipped=[], errors=[])
    if not dev.simulator:
        meta["multiprocessors"] = dev.cuda.get_current_device().MULTIPROCESSOR_COUNT
    rows, skipped = [], {}

    def skip(prov, cfg, reason):
        key = (prov.name, prov.backend, reason)
        if key not in skipped:
            skipped[key] = dict(provider=prov.name, backend=prov.backend, reason=reason,
                                first=cfg.label, count=0)
        skipped[key]["count"] += 1

    unavailable = {p.key: p.unavailable(dev) for p in providers}
    bar = tqdm(total=len(configs) * len(providers), unit="run", disable=not progress,
               leave=False)
    for cfg in configs:
        bar.set_description(cfg.label)
        problem = make_problem(cfg, dev, rng, settings)
        for prov in providers:
            bar.update(1)
            if unavailable[prov.key]:
                skip(prov, cfg, unavailable[prov.key])
                continue
            if cfg.num_partitions is not None and not prov.splits:
                skip(prov, cfg, "no split-K factor to set (rows with a forced num_partitions)")
                continue
            prep = out = None
            try:
                prep = prov.prepare(problem)
                info = dict(prep.info)
                timing = time_gpu(dev, prep.run, settings.iters, settings.warmup,
                                  settings.flush_bytes)
                out = prep.result()
                err = rel_err(to_host(out[:problem.n_ref]), problem.reference())
                warm_us = None
                if settings.warm_iters:
                    warm_us = time_gpu(dev, prep.run, settings.warm_iters, 0, 0)[0]
                host = time_host(dev, prep.host_call or prep.run, settings.host_calls,
                                 warm=settings.warmup > 0)
            except Skip as e:
                skip(prov, cfg, str(e))
                continue
            except Exception as e:  # reported; a failure when the provider is numba_mla
                meta["errors"].append(dict(provider=prov.name, backend=prov.backend,
                                           config=cfg.label, error=f"{type(e).__name__}: {e}"))
                log(f"  {prov.key} {cfg.label}: {type(e).__name__}: {e}")
                continue
            finally:
                prep = out = None  # free the provider's buffers before the next one
                dev.release()
            rows.append(_row(cfg, prov, problem, timing, err, info, dev.name,
                             (copy_gbps, dense), host, warm_us))
        del problem
        dev.release()
    bar.close()
    meta["skipped"] = list(skipped.values())
    return dict(meta=meta, rows=rows)



# ---------------------------------------------------------------------------------------------
# Results: validation, JSON, CSV, the terminal table
# ---------------------------------------------------------------------------------------------
def failures(result):
    """Why validation failed: a numba_mla row whose rel_err is above its dtype's tolerance (or
    not a number), or a numba_mla provider that raised. Empty when all is well."""
    bad = []
    for r in result["rows"]:
        if r.get("provider") != "numba_mla":
            continue
        err, tol = r.get("rel_err"), r.get("tolerance") or TOLERANCE.get(r.get("dtype"), 2e-2)
        if err is None or not err <= tol:
            bad.append(f"numba_mla:{r.get('backend')} {r['batch']}x{r['heads']}x{r['seqlen']} "
                       f"Sq={r.get('sq')} {r.get('mask', 'null')}: rel_err {err} > {tol}")
    for e in result["meta"].get("errors", []):
        if e.get("provider") == "numba_mla":
            bad.append(f"numba_mla:{e.get('backend')} {e.get('config')}: {e.get('error')}")
    return bad


def _clean(x):
    """JSON-safe: NaN and infinities become None, NumPy scalars plain Python."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def write_json(result, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(_clean(result), f, indent=1, allow_nan=False)
        f.write("\n")


def columns(rows):
    """ROW_KEYS first, then every other key in first-seen order."""
    cols = list(ROW_KEYS)
    for r in rows:
        cols += [k for k in r if k not in cols]
    return cols


def write_csv(rows, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns(rows), restval="")
        w.writeheader()
        for r in _clean(rows):
            w.writerow({k: ("" if v is None else v) for k, v in r.items()})


def _fmt(x, spec, none="-"):
    return none if x is None else format(x, spec)


def format_table(rows):
    """A fixed-width table of the rows, one line each."""
    head = (f"{'provider':<22} {'B x H x L':<16} {'Sq':>2} {'mask':<9} {'P':>3} {'us':>9} "
            f"{'p10..p90':>17} {'GB/s':>7} {'TFLOP/s':>7} {'%copy':>5} {'%dense':>6} "
            f"{'host us':>8} {'ovh us':>7} {'rel_err':>8}  ok")
    lines = [head, "-" * len(head)]
    for r in rows:
        name = r["provider"] + (f":{r['backend']}" if r.get("backend") else "")
        shape = f"{r['batch']}x{r['heads']}x{r['seqlen']}" + ("~" if r.get("varlen") else "")
        tol = r.get("tolerance") or TOLERANCE.get(r.get("dtype"), 2e-2)
        err = r.get("rel_err")
        ok = "ok" if err is not None and err <= tol else ("FAIL" if r["provider"] == "numba_mla"
                                                          else "(hi)")
        spread = (f"{_fmt(r.get('us_p10'), '.1f')}..{_fmt(r.get('us_p90'), '.1f')}"
                  if r.get("us_p10") is not None else "-")
        pct = lambda f: _fmt(None if f is None else 100 * f, ".0f")  # noqa: E731
        lines.append(
            f"{name:<22} {shape:<16} {r.get('sq', 1):>2} {r.get('mask', 'null'):<9} "
            f"{_fmt(r.get('num_partitions'), 'd'):>3} {_fmt(r.get('us'), '.1f'):>9} "
            f"{spread:>17} {_fmt(r.get('gbps'), '.0f'):>7} {_fmt(r.get('tflops'), '.1f'):>7} "
            f"{pct(r.get('frac_copy')):>5} {pct(r.get('frac_dense')):>6} "
            f"{_fmt(r.get('host_us'), '.0f'):>8} {_fmt(r.get('overhead_us'), '.0f'):>7} "
            f"{_fmt(err, '.1e'):>8}  {ok}")
    return "\n".join(lines)


def format_notes(meta):
    """Skipped providers and errors, one line each."""
    lines = []
    for s in meta.get("skipped", []):
        who = s["provider"] + (f":{s['backend']}" if s.get("backend") else "")
        lines.append(f"skipped {who} ({s['count']} runs, first {s['first']}): {s['reason']}")
    for e in meta.get("errors", []):
        who = e["provider"] + (f":{e['backend']}" if e.get("backend") else "")
        lines.append(f"ERROR {who} {e['config']}: {e['error']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Rows of scripts/bench_simt.py (plots/simt_h200.json) in this schema
# ---------------------------------------------------------------------------------------------
#: The H200's ceilings as PERFORMANCE.md gives them (measured 2026-11-30 on the same machine).
H200_COPY_GBPS, H200_DENSE_TFLOPS = 4300.0, 785.0


def from_bench_simt(doc, source="plots/simt_h200.json", copy_gbps=H200_COPY_GBPS,
                    matmul_tflops=H200_DENSE_TFLOPS):
    """``scripts/bench_simt.py``'s JSON in this module's schema. Every measured value is kept
    as it is; ``call_us`` (wall time per call over 20 calls, one synchronize at the end) is
    ``host_us``; the counts, intensity and ceiling fractions are derived; the ceilings (not
    measured in that run) are PERFORMANCE.md's, as ``meta['ceilings_source']`` says."""
    import numba_mla as nm

    meta = dict(doc["meta"])
    versions = {k: meta.pop(k, None) for k in ("numba_mla", "torch", "numpy", "numba",
                                               "numba_cuda")}
    meta.update(
        versions=versions, simulator=False, sweep="default", copy_gbps=copy_gbps,
        matmul_tflops=matmul_tflops, skipped=[], errors=[], tolerance=TOLERANCE, scale=SCALE,
        source=(f"{source}: rows of scripts/bench_simt.py on {meta.get('device')} "
                f"(commit {meta.get('commit')}, {meta.get('date')}), converted by "
                "numba_mla.bench.from_bench_simt; measured values unchanged"),
        ceilings_source="PERFORMANCE.md (same H200, 2026-11-30); not measured in this run",
        host_timing="host_us: bench_simt's call_us, wall time per numba_mla.mla_decode call "
                    "over 20 calls with one synchronize at the end (numba_mla rows only)")
    rows = []
    for r in doc["rows"]:
        r = dict(r)
        lengths = np.full(r["batch"], r["seqlen"], np.int64)
        nbytes, flops = count(lengths, r.get("sq", 1), r["heads"], nm.NullMask())
        r.setdefault("mask", "null")
        r.setdefault("varlen", False)
        r.setdefault("sweep", "default")
        r.setdefault("num_partitions", None)
        r["bytes"], r["flops"], r["intensity"] = nbytes, flops, flops / nbytes
        r["frac_copy"] = r["gbps"] / copy_gbps
        r["frac_dense"] = r["tflops"] / matmul_tflops
        r["host_us"] = r.pop("call_us", None)
        r["tolerance"] = TOLERANCE[r["dtype"]]
        r["ref_subset"] = f"sequence 0 of {r['batch']}, all heads"
        rows.append(r)
    return dict(meta=meta, rows=rows)
