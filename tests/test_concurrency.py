"""Determinism, threads and CUDA streams.

- Determinism: the same inputs give bit-identical out and lse over repeated runs, for every
  kernel backend, paged and contiguous caches, one and several partitions (GPU); a call is not
  influenced by the previous one through the reused split-K workspace (also in CI).
- Threads: kernels compiled and called from several threads at once, each with its own mask,
  score mod and shape, give the right answers (GPU: Numba's CUDA simulator swaps module
  globals while a kernel runs and cannot run kernels from two threads at once). The kernel
  factory's cache, which the threads share, is checked from threads in CI.
- Streams: for torch tensors numba_mla launches on torch's current stream (else on the legacy
  default stream), with a split-K workspace per stream. Calls made under two torch side
  streams (``torch.cuda.stream(s)``) are correct, and a call under a side stream is ordered
  after the stream's earlier work (inputs written there) and before its later work (the
  output read there), without any synchronisation.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import numba_mla as nm
from helpers import (
    BF16,
    DTYPES,
    assert_three_way,
    cuda_torch,
    f64,
    fp32_floor,
    kernel_backends,
    make_problem,
    references,
    run_backend,
    to_numpy,
    to_torch,
)
from numba_mla import factory
from numba_mla.mods import as_mask, as_score_mod


def assert_matches(out, lse, golden, same):
    assert_three_way(out, same[0], golden[0], floor=fp32_floor(golden[0]), what="out")
    assert_three_way(lse, same[1], golden[1], floor=fp32_floor(golden[1]), what="lse")


def bits(x):
    """The bytes of an array (NaN-safe exact comparison)."""
    return np.ascontiguousarray(np.asarray(x)).tobytes()


def backend_cases(dtypes):
    return [pytest.param(dt, be, id=f"{dt}-{be}") for dt in dtypes for be in kernel_backends(dt)]


# ---------------------------------------------------------------------------------------------
# Determinism
# ---------------------------------------------------------------------------------------------
@pytest.mark.kernel
def test_workspace_reuse_does_not_leak_between_calls(rng):
    """Calls share one split-K workspace: B's result is the same bits before and after a call
    with more partitions and rows (A) has filled the workspace with its own partials."""
    a = make_problem(rng, 1, 1, 1, [9], np.float32, "paged", 4)
    b = make_problem(rng, 1, 1, 1, [6], np.float32, "contiguous")
    # b's partial LSE sits at workspace offset 512, inside a's partial outputs [0, 1024).
    first = b.run(nm, num_partitions=1, return_lse=True, backend="simt")
    a.run(nm, num_partitions=2, backend="simt")
    again = b.run(nm, num_partitions=1, return_lse=True, backend="simt")
    assert bits(first[0]) == bits(again[0]) and bits(first[1]) == bits(again[1])
    assert_matches(*again, *references(b))


@pytest.mark.gpu
@pytest.mark.parametrize("num_partitions", [1, 7, None])
@pytest.mark.parametrize("cache_kind", ["paged", "contiguous"])
@pytest.mark.parametrize("dtype,backend", backend_cases(["bf16", "fp16", "fp32"]))
def test_gpu_deterministic(dtype, backend, cache_kind, num_partitions, rng):
    """Five runs, bit-identical out and lse (the combine's sum order is fixed: no atomics)."""
    p = make_problem(rng, 6, 2, 16, [2049, 1000, 2, 0, 333, 4096], DTYPES[dtype], cache_kind, 64)
    mask = nm.CausalMask()
    runs = [run_backend(p, backend, mask=mask, num_partitions=num_partitions, return_lse=True)
            for _ in range(5)]
    for out, lse in runs[1:]:
        assert bits(out) == bits(runs[0][0]), "out differs between runs"
        assert bits(lse) == bits(runs[0][1]), "lse differs between runs"
    assert_matches(*runs[0], *references(p, mask))


# ---------------------------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------------------------
def test_factory_cache_from_threads():
    """8 threads ask the factory for the same 6 configurations at once: one kernel object per
    configuration, shared by all threads, and different configurations get different ones."""
    configs = [(nm.CausalMask(), nm.IdentityScoreMod(), "bf16", nm.PagedKVCache, 16, 2),
               (nm.SlidingWindowCausalMask(7), nm.IdentityScoreMod(), "f16", nm.PagedKVCache,
                16, 2),
               (nm.ChunkedMask(5), nm.SoftCapScoreMod(3.0), "f32", nm.ContiguousKVCache, 16, 3),
               (nm.NullMask(), nm.AlibiScoreMod(4), "bf16", nm.ContiguousKVCache, 32, 4),
               (lambda b, h, q, k: k != q, nm.IdentityScoreMod(), "f32", nm.PagedKVCache, 16, 1),
               (nm.CausalMask() | nm.ChunkedMask(3), nm.IdentityScoreMod(), "f16",
                nm.PagedKVCache, 32, 8)]
    configs = [(as_mask(m), as_score_mod(s), *rest) for m, s, *rest in configs]
    start = threading.Barrier(8)

    def work(seed):
        start.wait()
        order = np.random.default_rng(seed).permutation(len(configs))
        got = {}
        for j in order:
            mask, score_mod, tag, cls, block_m, heads = configs[j]
            got[j] = (factory.partition_kernel(mask, score_mod, tag, cls, block_m, heads),
                      factory.combine_kernel(tag))
        return got

    with ThreadPoolExecutor(8) as ex:
        results = list(ex.map(work, range(8)))
    for j in range(len(configs)):
        assert len({id(r[j][0]) for r in results}) == 1, f"config {j}: several kernels"
        assert len({id(r[j][1]) for r in results}) == 1
    assert len({id(results[0][j][0]) for j in range(len(configs))}) == len(configs)


THREAD_CONFIGS = [  # (mask, score mod, dtype, cache, page, H, Sq, lengths, num_partitions)
    (lambda p: nm.CausalMask(), lambda p: nm.IdentityScoreMod(), "bf16", "paged", 64, 16, 1,
     [1500, 64, 0], None),
    (lambda p: nm.SlidingWindowCausalMask(100), lambda p: nm.AlibiScoreMod(p.heads), "fp16",
     "paged", 16, 8, 2, [2000, 333], 3),
    (lambda p: nm.ChunkedCausalMask(64), lambda p: nm.SoftCapScoreMod(5.0), "fp32",
     "contiguous", 0, 4, 4, [700, 4, 65], 1),
    (lambda p: (lambda b, h, q, k: (k + h) % 3 != 0), lambda p: (lambda s, b, h, q, k: s * 0.5),
     "bf16", "contiguous", 0, 128, 1, [999, 1000], None),
    (lambda p: nm.NullMask(), lambda p: nm.IdentityScoreMod(), "fp16", "paged", 1, 1, 8,
     [513, 8], 5),
    (lambda p: nm.CausalMask() | nm.ChunkedMask(32), lambda p: nm.IdentityScoreMod(), "bf16",
     "paged", 128, 32, 2, [4000, 2], None),
]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["simt", "auto"])
def test_gpu_threads_compile_and_run(backend):
    """Six threads, each its own configuration (so each compiles its own kernels, at the same
    time), three calls each, started together; every result checked against the reference."""
    problems = []
    for j, (mk_mask, mk_mod, dt, kind, page, H, Sq, lengths, P) in enumerate(THREAD_CONFIGS):
        rng = np.random.default_rng(1000 + j)
        p = make_problem(rng, len(lengths), Sq, H, lengths, DTYPES[dt], kind, page or 16)
        mask, mod = mk_mask(p), mk_mod(p)
        problems.append((p, mask, mod, P, references(p, mask, mod)))
    start = threading.Barrier(len(problems))

    def work(j):
        p, mask, mod, P, (golden, same) = problems[j]
        start.wait()
        for _ in range(3):
            out, lse = p.run(nm, mask=mask, score_mod=mod, num_partitions=P, return_lse=True,
                             backend=backend)
            assert_matches(out, lse, golden, same)
        return j

    with ThreadPoolExecutor(len(problems)) as ex:
        assert sorted(ex.map(work, range(len(problems)))) == list(range(len(problems)))


@pytest.mark.gpu
def test_gpu_threads_share_one_configuration():
    """Eight threads, one configuration (one kernel, compiled once, raced for), different data:
    each gets its own answer (the split-K workspace is per thread)."""
    rng = np.random.default_rng(7)
    problems = [make_problem(rng, 4, 1, 16, [1024, 77, 2048, 3], BF16, "paged", 64)
                for _ in range(8)]
    refs = [references(p, nm.CausalMask()) for p in problems]
    start = threading.Barrier(8)

    def work(j):
        start.wait()
        for _ in range(4):
            out, lse = problems[j].run(nm, mask=nm.CausalMask(), num_partitions=4,
                                       return_lse=True, backend="simt")
            assert_matches(out, lse, *refs[j])

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(work, range(8)))


# ---------------------------------------------------------------------------------------------
# torch streams
# ---------------------------------------------------------------------------------------------
def torch_problem(torch, p):
    """(q, cache) of problem p as CUDA tensors (made on the current torch stream)."""
    q = to_torch(torch, p.q)
    cache = nm.PagedKVCache(to_torch(torch, p.cache.storage), to_torch(torch, p.cache.block_table),
                            to_torch(torch, p.lengths))
    return q, cache


@pytest.mark.gpu
def test_gpu_two_torch_streams_with_synchronisation():
    """Two problems, each built and run under its own side stream, the inputs synchronised
    before the calls; both calls are in flight before either result is read."""
    torch = cuda_torch()
    rng = np.random.default_rng(11)
    ps = [make_problem(rng, 3, 1, 16, [3000, 64, 1], BF16, "paged", 64),
          make_problem(rng, 2, 2, 128, [1000, 2], BF16, "paged", 64)]
    refs = [references(p, nm.CausalMask()) for p in ps]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    inputs = []
    for s, p in zip(streams, ps):
        with torch.cuda.stream(s):
            inputs.append(torch_problem(torch, p))
    torch.cuda.synchronize()                       # inputs ready for the legacy stream
    results = []
    for s, p, (q, cache) in zip(streams, ps, inputs):
        with torch.cuda.stream(s):
            results.append(nm.mla_decode(q, cache, p.scale, nm.CausalMask(), return_lse=True,
                                         backend="simt"))
    torch.cuda.synchronize()                       # results ready for every stream
    for (out, lse), ref in zip(results, refs):
        assert_matches(to_numpy(torch, out), to_numpy(torch, lse), *ref)
    # The same again, interleaved, with the outputs given by the caller (made on each stream).
    outs = []
    for s, p, (q, cache) in zip(streams, ps, inputs):
        with torch.cuda.stream(s):
            out = torch.full(p.out_shape, float("nan"), dtype=torch.bfloat16, device="cuda")
            outs.append(out)
    torch.cuda.synchronize()
    for s, p, (q, cache), out in zip(streams, ps, inputs, outs):
        with torch.cuda.stream(s):
            nm.mla_decode(q, cache, p.scale, nm.CausalMask(), out=out, backend="simt")
    torch.cuda.synchronize()
    for out, (out0, _) in zip(outs, results):
        np.testing.assert_array_equal(f64(to_numpy(torch, out)), f64(to_numpy(torch, out0)))


@pytest.mark.gpu
def test_gpu_inputs_written_on_a_side_stream_without_synchronisation():
    """q is written on a side stream behind a long GPU sleep, and the call is made under that
    stream without synchronising: the kernels, on that stream, read the new q (on the legacy
    stream they would read the old one, NaN, before the copy lands)."""
    torch = cuda_torch()
    rng = np.random.default_rng(12)
    p = make_problem(rng, 2, 1, 16, [2000, 300], BF16, "paged", 64)
    golden, same = references(p)
    q_new, cache = torch_problem(torch, p)
    q = torch.full_like(q_new, float("nan"))
    nm.mla_decode(q_new, cache, p.scale, backend="simt")     # compiled before the race
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(2_000_000_000)                    # ~1 s of GPU time on s
        q.copy_(q_new)
        out, lse = nm.mla_decode(q, cache, p.scale, return_lse=True, backend="simt")
    torch.cuda.synchronize()
    assert_matches(to_numpy(torch, out), to_numpy(torch, lse), golden, same)


@pytest.mark.gpu
def test_gpu_output_read_on_a_side_stream_without_synchronisation():
    """The result is consumed on the calling side stream (a clone) right after the call: the
    kernels are ordered before it on that stream (on another, unordered stream the clone could
    copy an unfinished output)."""
    torch = cuda_torch()
    rng = np.random.default_rng(13)
    p = make_problem(rng, 8, 1, 128, [8000] * 8, BF16, "paged", 64)   # ~ms of kernel time
    golden, same = references(p)
    q, cache = torch_problem(torch, p)
    nm.mla_decode(q, cache, p.scale, backend="simt")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out = torch.full(p.out_shape, float("nan"), dtype=torch.bfloat16, device="cuda")
        s.synchronize()
        nm.mla_decode(q, cache, p.scale, out=out, backend="simt")
        copy = out.clone()
    torch.cuda.synchronize()
    assert_three_way(to_numpy(torch, copy), same[0], golden[0], floor=fp32_floor(golden[0]))
