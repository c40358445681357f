"""``numba_mla.prepare``: a decode prepared once, launched many times on the caller's stream.

The GPU tests check what a decode loop relies on: the same out/lse arrays on every call, new q
contents giving new (correct) results, torch's current stream honoured (a side stream), and the
call captured in a CUDA graph and replayed after q changed in place. Every result is checked
three ways against the float64 reference.
"""
import numpy as np
import pytest

import numba_mla as nm
from helpers import (BF16, assert_three_way, cuda_torch, f64, fp32_floor, make_problem, references,
                     to_numpy, to_torch)


def test_prepare_refuses_host_arrays(rng):
    p = make_problem(rng, 1, 1, 2, [9], BF16, "contiguous")
    with pytest.raises(TypeError, match="^q: prepare"):
        nm.prepare(p.q, p.cache, p.scale)


def test_prepare_refuses_the_reference(rng):
    p = make_problem(rng, 1, 1, 2, [9], BF16, "contiguous")
    with pytest.raises(ValueError, match="^backend"):
        nm.prepare(p.q, p.cache, p.scale, backend="reference")


def _check(torch, p, out, lse, backend, mask=None):
    golden, low = references(p, mask)
    for name, a, s, g in (("out", to_numpy(torch, out), low[0], golden[0]),
                          ("lse", to_numpy(torch, lse), low[1], golden[1])):
        assert_three_way(a, s, g, floor=fp32_floor(g, backend), what=name)


def _paged_torch(torch, p):
    return nm.PagedKVCache(to_torch(torch, p.cache.storage), to_torch(torch, p.cache.block_table),
                           to_torch(torch, p.lengths))


@pytest.mark.gpu
@pytest.mark.parametrize("backend,num_partitions", [("mma", 1), ("mma", 3), ("simt", None)])
def test_gpu_prepared_decode_loop(backend, num_partitions, rng):
    """Three calls with new q contents: the same arrays back, each result right."""
    torch = cuda_torch()
    p = make_problem(rng, 3, 2, 16, [301, 77, 129], BF16, "paged", 64)
    q = to_torch(torch, p.q)
    step = nm.prepare(q, _paged_torch(torch, p), p.scale, nm.CausalMask(),
                      num_partitions=num_partitions, return_lse=True, backend=backend)
    first = None
    for _ in range(3):
        p.q[...] = rng.standard_normal(p.q.shape).astype(BF16)
        q.copy_(to_torch(torch, p.q))
        out, lse = step()
        if first is None:
            first = (out, lse)
        assert out is first[0] and lse is first[1]
        torch.cuda.synchronize()
        _check(torch, p, out, lse, backend, nm.CausalMask())


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["mma", "simt"])
def test_gpu_prepared_decode_on_a_side_stream(backend, rng):
    """Under ``torch.cuda.stream(s)`` the kernels are ordered on s: q written on s just before
    (behind a long GPU sleep) is what they read, and out read on s after is what they wrote."""
    torch = cuda_torch()
    p = make_problem(rng, 2, 1, 16, [500, 211], BF16, "paged", 16)
    q = to_torch(torch, p.q)
    step = nm.prepare(q, _paged_torch(torch, p), p.scale, num_partitions=2, return_lse=True,
                      backend=backend)
    new_q = rng.standard_normal(p.q.shape).astype(BF16)
    staged = to_torch(torch, new_q)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)  # the copy below lands late unless the kernels wait for it
        q.copy_(staged)
        out, lse = step()
        host_out = out.clone()
        host_lse = lse.clone()
    s.synchronize()
    p.q[...] = new_q
    _check(torch, p, host_out, host_lse, backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend,num_partitions", [("mma", 1), ("mma", 4), ("simt", 2)])
def test_gpu_prepared_decode_in_a_cuda_graph(backend, num_partitions, rng):
    """Captured once in torch.cuda.graph, replayed after q and the cache rows changed in place:
    the replay computes with the new contents."""
    torch = cuda_torch()
    p = make_problem(rng, 2, 1, 16, [257, 130], BF16, "paged", 64, filler=0.0)
    q = to_torch(torch, p.q)
    pages = to_torch(torch, p.cache.storage)
    cache = nm.PagedKVCache(pages, to_torch(torch, p.cache.block_table),
                            to_torch(torch, p.lengths))
    step = nm.prepare(q, cache, p.scale, num_partitions=num_partitions, return_lse=True,
                      backend=backend)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up on the capture stream (compilation, lazy loading)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for _ in range(2):
        p.q[...] = rng.standard_normal(p.q.shape).astype(BF16)
        p.cache.storage[...] = rng.standard_normal(p.cache.storage.shape).astype(BF16)
        q.copy_(to_torch(torch, p.q))
        pages.copy_(to_torch(torch, p.cache.storage))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert np.isfinite(f64(to_numpy(torch, out))).all()
        _check(torch, p, out, lse, backend)
