"""Size limits (GPU only): caches past 2^31 elements, and allocations that cannot succeed.

- A cache of more than 2^31 elements (bf16: 4.5 GB, its element offsets past int32; fp32:
  9 GB, past int32 in the 4-byte words the kernels read too) with sequences whose rows sit at
  the very end: a kernel that computes an address in 32 bits reads the wrong rows (or faults).
  The reference runs on a small cache holding the same rows.
- A call whose split-K workspace cannot fit in GPU memory (an explicit ``num_partitions`` in the
  millions, or a large q with many partitions) must fail before any launch with a MemoryError
  that says how much memory it needs (README: "A workspace the device cannot hold is a
  MemoryError before launch"), or, where ``num_partitions`` is past a grid's x dimension, the
  ValueError that names ``num_partitions``; either way ``out`` is left untouched and the
  library stays usable.

On the GPU machine: ``python -m pytest tests/test_limits.py -m gpu`` (``slow``: minutes and
~15 GB of GPU memory).
"""
import numpy as np
import pytest

import numba_mla as nm
from helpers import (BF16, DTYPES, assert_three_way, cuda_torch, f64, fp32_floor, kernel_backends,
                     make_problem, to_numpy, to_torch)

PAGE = 64
#: Pages in the big paged cache: 61000 x 64 x 576 = 2.25e9 elements > 2^31.
BIG_PAGES = 61_000
#: Tokens per sequence in the big contiguous cache: sequence 3 starts at 3 x 1.3e6 x 576 =
#: 2.25e9 elements > 2^31.
BIG_S = 1_300_000


def torch_dtype(torch, dtype):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]


def check_against_small(torch, small, big_cache, backend, mask, num_partitions):
    """Run ``backend`` on ``big_cache`` with small's q; three-way against small's references
    (the same rows in a small cache)."""
    kw = dict(mask=mask, return_lse=True)
    golden = small.run(nm.reference, **kw)
    low = small.run(nm.reference, compute_dtype=np.float32, **kw)
    out, lse = nm.mla_decode(to_torch(torch, small.q), big_cache, small.scale,
                             num_partitions=num_partitions, backend=backend, **kw)
    out, lse = to_numpy(torch, out), to_numpy(torch, lse)
    assert_three_way(out, low[0].astype(small.dtype), golden[0], floor=fp32_floor(golden[0]),
                     what="out")
    assert_three_way(lse, low[1], golden[1], floor=fp32_floor(golden[1]), what="lse")


def big_cases():
    return [pytest.param(dt, be, id=f"{dt}-{be}") for dt in ("bf16", "fp32")
            for be in kernel_backends(dt)]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("dtype,backend", big_cases())
def test_gpu_paged_cache_beyond_int32(dtype, backend):
    torch = cuda_torch()
    rng = np.random.default_rng(31)
    lengths = [200, 129, 64, 1]                                     # 4 + 3 + 1 + 1 pages
    small = make_problem(rng, 4, 1, 16, lengths, DTYPES[dtype], "paged", PAGE, spare_pages=0)
    n = small.cache.num_pages
    pages = torch.full((BIG_PAGES, PAGE, 576), float("nan"), dtype=torch_dtype(torch, dtype),
                       device="cuda")
    assert pages.numel() > 2**31
    base = BIG_PAGES - n                                            # the last n pages
    pages[base:] = to_torch(torch, small.cache.pages)
    bt = small.cache.block_table.copy()
    used = bt < n                                                   # unused: a huge index
    bt[used] += base
    assert int(bt[used].min()) * PAGE * 576 > 2**31
    cache = nm.PagedKVCache(pages, to_torch(torch, bt), to_torch(torch, small.lengths))
    for mask, P in ((None, None), (nm.CausalMask(), 3)):
        check_against_small(torch, small, cache, backend, mask, P)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("dtype,backend", big_cases())
def test_gpu_contiguous_cache_beyond_int32(dtype, backend):
    torch = cuda_torch()
    rng = np.random.default_rng(32)
    lengths = [300, 0, 129, 257]
    small = make_problem(rng, 4, 1, 16, lengths, DTYPES[dtype], "contiguous")
    kv = torch.full((4, BIG_S, 576), float("nan"), dtype=torch_dtype(torch, dtype), device="cuda")
    cap = small.cache.capacity
    kv[:, :cap] = to_torch(torch, small.cache.kv)
    assert 3 * BIG_S * 576 > 2**31                                  # sequence 3's first row
    cache = nm.ContiguousKVCache(kv, to_torch(torch, small.lengths))
    for mask, P in ((None, None), (nm.SlidingWindowCausalMask(100), 2)):
        check_against_small(torch, small, cache, backend, mask, P)


IMPOSSIBLE = [  # (B, Sq, H, num_partitions, error, message): a workspace of T x H x P x 513 fp32
    (1, 1, 128, 2**22, MemoryError, "GiB of device memory"),        # 1.1 TB
    (8, 8, 128, 2**16, MemoryError, "GiB of device memory"),        # a large q: 1.1 TB
    (1, 1, 1, 2**40, ValueError, "^num_partitions: at most"),       # more blocks than a grid holds
]


@pytest.mark.gpu
@pytest.mark.parametrize("B,Sq,H,num_partitions,error,message", IMPOSSIBLE)
def test_gpu_impossible_allocation_is_a_clear_error(B, Sq, H, num_partitions, error, message):
    """Refused before any launch: a workspace too large is a MemoryError, a grid too wide a
    ValueError naming num_partitions; out untouched; the next call works."""
    rng = np.random.default_rng(33)
    p = make_problem(rng, B, Sq, H, [max(Sq, 40)] * B, BF16, "paged", 16)
    out = np.full(p.out_shape, 7.0, BF16)
    with pytest.raises(error, match=message):
        p.run(nm, num_partitions=num_partitions, out=out, backend="simt")
    assert np.all(f64(out) == 7.0), "out was written by a refused call"
    small = make_problem(rng, 2, 1, 4, [40, 3], BF16, "paged", 16)
    got = small.run(nm, backend="simt")
    want = small.run(nm.reference)
    low = small.run(nm.reference, compute_dtype=np.float32).astype(BF16)
    assert_three_way(got, low, want, floor=fp32_floor(want))
