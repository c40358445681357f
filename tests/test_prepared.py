"""``numba_mla.prepare``: a decode prepared once, launched many times on the caller's stream.

On a GPU a prepared call is one cuLaunchKernel per kernel, over a parameter array packed once
(launch._Launch). The GPU tests check that array against what Numba's own launch would pass,
and what a decode loop relies on: results bit-identical to mla_decode's and to Numba's launch
of the same kernels, the same out/lse arrays on every call, new q contents giving new (correct)
results, torch's current stream honoured (a side stream), a call from a thread that has not
used CUDA yet, and the call captured in a CUDA graph (behind a copy into q) and replayed after
q and the cache changed. Every result is checked three ways against the float64 reference.
"""
import ctypes
import threading

import numpy as np
import pytest

import numba_mla as nm
from helpers import (BF16, assert_three_way, cuda_torch, f64, fp32_floor, make_problem, references,
                     to_numpy, to_torch)
from numba_mla import launch


def test_prepare_refuses_host_arrays(rng):
    p = make_problem(rng, 1, 1, 2, [9], BF16, "contiguous")
    with pytest.raises(TypeError, match="^q: prepare"):
        nm.prepare(p.q, p.cache, p.scale)


def test_prepare_refuses_the_reference(rng):
    p = make_problem(rng, 1, 1, 2, [9], BF16, "contiguous")
    with pytest.raises(ValueError, match="^backend"):
        nm.prepare(p.q, p.cache, p.scale, backend="reference")


def test_param_array_packs_values_as_cuda_core_does():
    """The thin path's parameter array holds every value Numba's argument conversion produces
    (ints, bools, ctypes scalars) in the bytes cuda.core's launch (Numba's) would pass."""
    handler = pytest.importorskip("cuda.core._kernel_arg_handler")
    values = [0, 0, 55296, 4, 0x7F1000000000, 12, 16, 288, 18432, 1152, -1,
              ctypes.c_float(0.1352), True, False, ctypes.c_uint16(0x3C00), ctypes.c_double(-2.5),
              ctypes.c_int8(-3), ctypes.c_int32(-7), ctypes.c_uint64(2**64 - 1)]
    params, cvals = launch._param_array(values)
    holder = handler.ParamHolder(values)
    theirs = (ctypes.c_void_p * len(values)).from_address(holder.ptr)
    assert len(params) == len(cvals) == len(values)
    for i, (mine, c) in enumerate(zip(params, cvals)):
        n = ctypes.sizeof(c)
        assert ctypes.string_at(mine, n) == ctypes.string_at(theirs[i], n), f"parameter {i}"
    with pytest.raises(TypeError, match="cannot pack"):
        launch._param_array([np.float32(1.0)])  # Numba's conversion never hands over NumPy scalars


def _needs(backend):
    if backend == "mma" and not launch.mma_supported():
        pytest.skip("backend 'mma' needs an sm_90 GPU (wgmma)")


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
    _needs(backend)
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
    _needs(backend)
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
    """Captured once in torch.cuda.graph behind a copy into q (a decode loop's staging buffer),
    replayed after the staged q and the cache rows changed: the replay computes with the new
    contents (the kernels ordered after the copy inside the graph)."""
    _needs(backend)
    torch = cuda_torch()
    p = make_problem(rng, 2, 1, 16, [257, 130], BF16, "paged", 64, filler=0.0)
    q = to_torch(torch, p.q)
    staged = q.clone()
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
        q.copy_(staged)
        out, lse = step()
    for _ in range(3):
        p.q[...] = rng.standard_normal(p.q.shape).astype(BF16)
        p.cache.storage[...] = rng.standard_normal(p.cache.storage.shape).astype(BF16)
        staged.copy_(to_torch(torch, p.q))
        q.fill_(float("nan"))  # the graph's own copy must bring q back
        pages.copy_(to_torch(torch, p.cache.storage))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert np.isfinite(f64(to_numpy(torch, out))).all()
        _check(torch, p, out, lse, backend)


def _numba_launch(step, stream=0):
    """The prepared kernels launched the old way, through Numba's ``kernel.launch``."""
    for x in step.plan.launches:
        x.kernel.launch(x.args, x.grid, x.block, launch._core_stream(stream), x.smem)


@pytest.mark.gpu
@pytest.mark.parametrize("backend,num_partitions", [("mma", 1), ("mma", 3), ("simt", 2)])
def test_gpu_prepared_parameters_are_numbas(backend, num_partitions, rng, monkeypatch):
    """Each launch's packed parameters are byte for byte what Numba's ``kernel.launch`` hands to
    cuda.core for the same arguments (captured by standing in for cuda.core's launch), and its
    grid, block and shared memory are Numba's launch configuration."""
    _needs(backend)
    torch = cuda_torch()
    handler = pytest.importorskip("cuda.core._kernel_arg_handler")
    import numba.cuda.dispatcher as dispatcher

    p = make_problem(rng, 3, 2, 16, [301, 77, 129], BF16, "paged", 64)
    step = nm.prepare(to_torch(torch, p.q), _paged_torch(torch, p), p.scale, nm.CausalMask(),
                      num_partitions=num_partitions, return_lse=True, backend=backend)
    assert step.plan.launches
    calls = []
    monkeypatch.setattr(dispatcher, "launch", lambda *a: calls.append(a))
    for x in step.plan.launches:
        assert x._params is not None, "the thin path is not in use"
        calls.clear()
        x.kernel.launch(x.args, x.grid, x.block, launch._core_stream(0), x.smem)
        assert len(calls) == 1, "Numba's launch no longer calls cuda.core's launch: update the test"
        _, config, _, *values = calls[0]
        assert (tuple(config.grid), tuple(config.block), config.shmem_size) == \
            (x._dims[:3], x._dims[3:6], x._dims[6])
        assert len(x._params) == len(values)
        holder = handler.ParamHolder(values)
        theirs = (ctypes.c_void_p * len(values)).from_address(holder.ptr)
        for i, c in enumerate(x._cvals):
            n = ctypes.sizeof(c)
            assert ctypes.string_at(x._params[i], n) == ctypes.string_at(theirs[i], n), \
                f"{x.dispatcher.py_func.__name__}: parameter {i}"


@pytest.mark.gpu
@pytest.mark.parametrize("backend,num_partitions",
                         [("mma", 1), ("mma", 3), ("mma", None), ("simt", 2), ("simt", None)])
def test_gpu_prepared_matches_mla_decode_and_numbas_launch(backend, num_partitions, rng):
    """The prepared call (raw cuLaunchKernel) gives the same bits as mla_decode on the same
    inputs and as Numba's own launch of the same kernels (the kernels are deterministic), and
    the right result."""
    _needs(backend)
    torch = cuda_torch()
    mask = nm.CausalMask()
    p = make_problem(rng, 3, 2, 16, [301, 77, 129], BF16, "paged", 64)
    q, cache = to_torch(torch, p.q), _paged_torch(torch, p)
    step = nm.prepare(q, cache, p.scale, mask, num_partitions=num_partitions, return_lse=True,
                      backend=backend)
    out, lse = step()
    torch.cuda.synchronize()
    _check(torch, p, out, lse, backend, mask)
    got = (out.clone(), lse.clone())
    ref = nm.mla_decode(q, cache, p.scale, mask, num_partitions=step.plan.num_partitions,
                        return_lse=True, backend=backend)
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    _numba_launch(step)
    torch.cuda.synchronize()
    for what, a, b, c in (("out", got[0], ref[0], out), ("lse", got[1], ref[1], lse)):
        a, b, c = (np.ascontiguousarray(to_numpy(torch, t)).tobytes() for t in (a, b, c))
        assert a == b, f"{what}: the prepared call differs from mla_decode"
        assert a == c, f"{what}: the prepared call differs from Numba's launch"


@pytest.mark.gpu
def test_gpu_prepared_decode_from_a_new_thread(rng):
    """Called from a thread that has not used CUDA yet (it may have no current context, which
    the raw launch then makes current, as Numba's launch does): the right result."""
    torch = cuda_torch()
    p = make_problem(rng, 2, 1, 16, [300, 45], BF16, "paged", 16)
    step = nm.prepare(to_torch(torch, p.q), _paged_torch(torch, p), p.scale, num_partitions=2,
                      return_lse=True)
    torch.cuda.synchronize()
    got, errors = [], []

    def work():
        try:
            got.append(step())
            torch.cuda.synchronize()
        except Exception as e:  # reported in the main thread
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    _check(torch, p, *got[0], step.plan.backend)
