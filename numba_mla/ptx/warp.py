"""Warp-level operations, and the simulator's warp exchange that their twins are made of.

- ``shfl_xor(v, mask, tid)``: the float32 ``v`` of lane ``lane ^ mask`` (full warp). ``tid`` is
  the thread's index in its block (the simulator needs it to find the warp).
- ``warp_uniform(v, tid)``: ``v``, which the caller knows is the same in every lane, read
  from lane 0, so ptxas knows it too: values derived from it (e.g. wgmma descriptors that
  depend on the warpgroup) then live in uniform registers, not moved there one by one.
- ``syncwarp(tid)``: the warp's barrier: shared-memory accesses before it are seen by every
  lane after it.

The simulator has no warp functions. It runs a block's threads as Python threads, one block at
a time; here the 32 threads of a warp meet at a barrier, publish their values and read a
partner's (``warp_gather`` gives every lane's value). Two slot buffers used in turn make one
barrier per exchange enough: a lane writes a buffer again only two exchanges later, after a
barrier every lane passes having read it. Each lane counts its exchanges (all lanes of a warp
make the same ones, so they agree on the buffer).

``warp_once(v, fn, tid)`` is the exchange for work the whole warp shares: ``fn`` of every
lane's ``v`` is computed once, by the last lane to arrive (the barrier's action, run before
any lane goes on), and each lane gets the same result. The twins of mma.sync, ldmatrix and
wgmma's register-A form use it: one lane multiplies the warp's tiles, where 32 lanes each
doing the whole product took 20 times as long. The result is kept until the next exchange's
barrier, which no lane reaches before it has read it.
"""
import threading

from numba import cuda

from .._numba import SimBarrier, sim_block
from ._twin import device_with_twin

_warps = {}
_warps_lock = threading.Lock()


class _Warp:
    """(Simulator) A warp's meeting place: its barrier, two slot buffers, the lanes' exchange
    counts, and the shared work of the exchange under way (``fn`` and its ``result``)."""

    def __init__(self, warp, block):
        self.block = block
        self.buffers = ([None] * 32, [None] * 32)
        self.turns = [0] * 32
        self.fn = self.slots = self.result = self.error = None
        self.barrier = SimBarrier(32, self._once, "a warp exchange of warp %d" % warp)

    def _once(self):
        # Run by the last lane to arrive, before the barrier lets any lane go. An error is
        # kept and raised in every lane (raised here, it would break the barrier for good
        # where the lanes are plain threads).
        self.result = self.error = None
        if self.fn is not None:
            try:
                self.result = self.fn(self.slots)
            except Exception as e:  # noqa: BLE001  (re-raised by the lanes)
                self.error = e


def _warp(tid):
    """(Simulator) The warp of thread ``tid`` in the running block."""
    block = sim_block()
    with _warps_lock:
        w = _warps.get(tid // 32)
        if w is None or w.block is not block:
            w = _warps[tid // 32] = _Warp(tid // 32, block)
        return w


def _exchange(v, tid, fn=None):
    """(Simulator) Publish this lane's ``v``; the slots of the whole warp once all wrote
    (``fn`` of them, computed once, when given). Every lane of the warp passes the same ``fn``
    and writes the same ``slots`` and ``fn`` before the barrier; the previous exchange's
    action has run by then."""
    lane = tid % 32
    w = _warp(tid)
    slots = w.buffers[w.turns[lane] % 2]
    w.turns[lane] += 1
    slots[lane] = v
    w.slots, w.fn = slots, fn
    w.barrier.wait()
    if fn is None:
        return slots
    if w.error is not None:
        raise w.error
    return w.result


def warp_gather(v, tid):
    """(Simulator) Every lane's ``v``, in lane order: one warp exchange."""
    return list(_exchange(v, tid))


def warp_once(v, fn, tid):
    """(Simulator) ``fn(every lane's v, in lane order)``, computed once for the warp: one warp
    exchange. The result is shared by the lanes: read it, do not change it."""
    return _exchange(v, tid, fn)


def _shfl_xor_twin(v, mask, tid):
    return _exchange(v, tid)[tid % 32 ^ mask]


@device_with_twin(_shfl_xor_twin)
def shfl_xor(v, mask, tid):
    return cuda.shfl_xor_sync(0xFFFFFFFF, v, mask)


def _warp_uniform_twin(v, tid):
    return v  # the same in every lane, by the caller's word


@device_with_twin(_warp_uniform_twin)
def warp_uniform(v, tid):
    return cuda.shfl_sync(0xFFFFFFFF, v, 0)


def _syncwarp_twin(tid):
    w = _warp(tid)
    w.fn = None  # nothing to compute at this barrier
    w.barrier.wait()


@device_with_twin(_syncwarp_twin)
def syncwarp(tid):
    cuda.syncwarp(0xFFFFFFFF)
