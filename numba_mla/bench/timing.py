"""The one GPU timer of the benchmark and the scripts, and the host-side clocks.

``Device`` wraps torch's CUDA events and synchronize when torch sees a GPU, else Numba's, and
on the CUDA simulator the wall clock (its events record no time). ``time_gpu`` is how every
GPU time in the project is taken (docs/performance.md, "How things are timed"): warm-up runs
first (compilation and first-touch excluded), then events around each run, the L2 flushed
before each one by writing a buffer larger than the L2 (so a run reads its inputs from device
memory, as a decode step does), and the median with p10/p90 reported. ``time_host`` and
``host_costs`` time whole Python calls with the host clock.
"""
import time

import numpy as np

from .. import _compat


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

    @property
    def multiprocessors(self):
        return None if self.simulator else self.cuda.get_current_device().MULTIPROCESSOR_COUNT

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


def host_costs(dev, call, calls, warmup):
    """(call + synchronize, enqueue only): median microseconds of one whole call, over
    ``calls`` calls after ``warmup`` untimed ones. "call + synchronize" times the call and the
    wait for its GPU work; "enqueue only" times the call alone and synchronizes after the
    clock stops (what a caller that does not wait pays, as long as the queue stays short)."""
    for _ in range(warmup):
        call()
    dev.sync()
    with_sync, enqueue = [], []
    for _ in range(max(1, calls)):
        t0 = time.perf_counter()
        call()
        dev.sync()
        with_sync.append(time.perf_counter() - t0)
    for _ in range(max(1, calls)):
        t0 = time.perf_counter()
        call()
        enqueue.append(time.perf_counter() - t0)
        dev.sync()
    return float(np.median(with_sync)) * 1e6, float(np.median(enqueue)) * 1e6
