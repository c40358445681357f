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
partner's (``warp_gather`` gives every lane's value: the twins of mma.sync, ldmatrix and
wgmma's register-A form use it too). Two slot buffers used in turn make one barrier per
exchange enough: a lane writes a buffer again only two exchanges later, after a barrier every
lane passes having read it. Each lane counts its exchanges (all lanes of a warp make the same
ones, so they agree on the buffer).
"""
import threading

from numba import cuda

from ._twin import device_with_twin

_warps = {}
_warps_lock = threading.Lock()


def _warp(tid):
    """(Simulator) The warp of thread ``tid``: its barrier, two slot buffers, the lanes'
    exchange counts."""
    with _warps_lock:
        if tid // 32 not in _warps:
            _warps[tid // 32] = (threading.Barrier(32), ([None] * 32, [None] * 32), [0] * 32)
        return _warps[tid // 32]


def _exchange(v, tid):
    """(Simulator) Publish this lane's ``v``; the slots of the whole warp once all wrote."""
    lane = tid % 32
    barrier, buffers, turns = _warp(tid)
    slots = buffers[turns[lane] % 2]
    turns[lane] += 1
    slots[lane] = v
    barrier.wait()
    return slots


def warp_gather(v, tid):
    """(Simulator) Every lane's ``v``, in lane order: one warp exchange."""
    return list(_exchange(v, tid))


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
    _warp(tid)[0].wait()


@device_with_twin(_syncwarp_twin)
def syncwarp(tid):
    cuda.syncwarp(0xFFFFFFFF)
