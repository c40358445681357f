"""The benchmark's sweeps, as data: ``Config`` rows (B, H, L, Sq, page size, dtype, mask, length
spread, split-K factor) and ``Settings`` (how much to measure).

The shapes are the six of docs/performance.md (bf16, page size 64, one query token, DeepSeek
V3's scale); ``varlen`` repeats them with lengths drawn uniformly in
[L (1 - spread), L (1 + spread)].
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..arrays import BF16
from ..constants import D_QK
from ..fp8 import LAYOUTS, ROW_BYTES

#: DeepSeek V3's softmax scale: mscale^2 / sqrt(192).
SCALE = 0.1352
DTYPES = {"bfloat16": BF16, "float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}
#: Largest accepted ``rel_err`` (max |out - ref| / max |ref|) of a numba_mla row, per dtype.
TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-3}
MASK_NAMES = ("null", "causal", "window256")
#: The cache's storage: "same" (q's dtype) or an FP8 layout (docs/fp8.md), quantized from it.
KV_NAMES = ("same",) + LAYOUTS


def make_mask(name):
    """The numba_mla mask a configuration names."""
    import numba_mla as nm

    return {"null": nm.NullMask, "causal": nm.CausalMask,
            "window256": lambda: nm.SlidingWindowCausalMask(256)}[name]()


@dataclass(frozen=True)
class Config:
    """One benchmark configuration. ``seqlen`` is the cache length L; with ``spread`` s > 0
    each sequence's length is drawn uniformly from the integers in [L (1 - s), L (1 + s)]
    (at least ``sq``), from a generator seeded by the run's seed and the configuration, so
    every provider and every run with that seed sees the same lengths. ``num_partitions``:
    None lets the library choose the split-K factor; an int forces it (providers without a
    split-K knob are not run then). ``kv``: the cache in q's dtype ("same") or quantized from
    it into an FP8 layout ("e4m3", "v32"; only numba_mla's kernels read those)."""

    batch: int
    heads: int
    seqlen: int
    sq: int = 1
    page_size: int = 64
    dtype: str = "bfloat16"
    mask: str = "null"
    spread: float = 0.0
    num_partitions: Optional[int] = None
    sweep: str = "default"
    kv: str = "same"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {self.dtype!r}")
        if self.mask not in MASK_NAMES:
            raise ValueError(f"mask: expected one of {list(MASK_NAMES)}, got {self.mask!r}")
        if not 1 <= self.sq <= self.seqlen:
            raise ValueError(f"sq: expected 1 <= sq <= seqlen = {self.seqlen}, got {self.sq}")
        if self.kv not in KV_NAMES:
            raise ValueError(f"kv: expected one of {list(KV_NAMES)}, got {self.kv!r}")
        if self.kv != "same" and self.dtype == "float32":
            raise ValueError("kv: an FP8 cache needs q in bfloat16 or float16")
        if not 0.0 <= self.spread < 1.0:
            raise ValueError(f"spread: expected 0 <= spread < 1, got {self.spread}")

    @property
    def varlen(self):
        return self.spread > 0

    @property
    def length_range(self):
        """(shortest, longest) length a sequence may get."""
        lo = max(self.sq, int(np.ceil(self.seqlen * (1 - self.spread))))
        return lo, max(lo, int(np.floor(self.seqlen * (1 + self.spread))))

    @property
    def label(self):
        s = f"{self.batch}x{self.heads}x{self.seqlen}"
        if self.sq != 1:
            s += f" Sq={self.sq}"
        if self.mask != "null":
            s += f" {self.mask}"
        if self.varlen:
            s += f" spread={self.spread:g}"
        if self.num_partitions is not None:
            s += f" P={self.num_partitions}"
        if self.kv != "same":
            s += f" kv={self.kv}"
        return s

    @property
    def row_bytes(self):
        """Bytes of one cache row (token)."""
        return D_QK * DTYPES[self.dtype].itemsize if self.kv == "same" else ROW_BYTES[self.kv]


#: docs/performance.md's shapes (B, H, L).
PERF_SHAPES = ((64, 16, 4096), (128, 16, 8192), (64, 128, 4096), (128, 128, 1024),
               (16, 128, 32768), (1, 128, 65536))
#: The varlen sweep's order: the three shapes timed first against FlashMLA, then the rest.
VARLEN_SHAPES = ((64, 128, 4096), (128, 16, 8192), (64, 16, 4096), (128, 128, 1024),
                 (16, 128, 32768), (1, 128, 65536))
#: Length spreads of the varlen sweep: 0 (equal lengths, the baseline in the same run), then
#: wider; 0.5 is [L/2, 3L/2].
SPREADS = (0.0, 0.25, 0.5)
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


def varlen_sweep(shapes=VARLEN_SHAPES, spreads=SPREADS, page_size=64):
    """Every shape at every length spread (mean length L): what unequal lengths cost."""
    return [Config(B, H, L, page_size=page_size, spread=s, sweep="varlen")
            for B, H, L in shapes for s in spreads]


def fp8_sweep(shapes=PERF_SHAPES[:4], kvs=KV_NAMES):
    """The first four shapes with the cache in bf16 and in each FP8 layout: FP8 rows beside
    the bf16 rows (ours and the peers') of the same shape."""
    return [Config(B, H, L, kv=kv, sweep="fp8") for B, H, L in shapes for kv in kvs]


def tiny_sweep():
    """Simulator-sized: a paged cache with more than one page, two query tokens under a causal
    mask with NaN past the length, spread lengths, and an explicit split-K factor."""
    return [Config(1, 2, 16, page_size=8, sweep="tiny"),
            Config(1, 1, 10, sq=2, page_size=4, mask="causal", sweep="tiny"),
            Config(2, 1, 12, page_size=4, spread=0.5, sweep="tiny"),
            Config(1, 1, 40, page_size=16, num_partitions=2, sweep="tiny")]


SWEEPS = {
    "default": default_sweep,
    "lengths": lengths_sweep,
    "splitk": splitk_sweep,
    "varlen": varlen_sweep,
    "fp8": fp8_sweep,
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
