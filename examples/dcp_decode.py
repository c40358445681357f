"""Decode context parallel with torch.distributed: each rank holds every sequence's tokens
t with t % N == rank (vLLM's interleaved layout), decodes its shard, and the ranks merge.

    torchrun --nproc_per_node=2 examples/dcp_decode.py              # NCCL on 2 GPUs
    torchrun --nproc_per_node=2 examples/dcp_decode.py --gloo       # CPU tensors (simulator)

Every rank draws the same whole cache (a demo: a real engine writes each token to its rank
only), keeps its shard, runs ``numba_mla.distributed.decode`` with a causal mask, and rank 0
checks the merged result against the single-device decode of the whole cache.
"""
import argparse
import datetime
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gloo", action="store_true", help="CPU tensors in a gloo group")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--length", type=int, default=37)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--sq", type=int, default=2)
    ap.add_argument("--page-size", type=int, default=16)
    args = ap.parse_args()
    if args.gloo:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

    import torch
    import torch.distributed as dist

    import numba_mla as nm
    from numba_mla import distributed
    from numba_mla.positions import PositionMap
    from numba_mla.sharding import local_rows, shard_cache

    dist.init_process_group("gloo" if args.gloo else "nccl",
                            timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cpu" if args.gloo else f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}"
    if not args.gloo:
        torch.cuda.set_device(device)

    # The same problem on every rank (fp32 keeps the demo free of bfloat16 plumbing).
    rng = np.random.default_rng(0)
    B, L, H, Sq, P = args.batch, args.length, args.heads, args.sq, args.page_size
    lengths = np.full(B, L, np.int32)
    keys = rng.standard_normal((B, L, nm.D_QK), dtype=np.float32)
    q = rng.standard_normal((B, Sq, H, nm.D_QK), dtype=np.float32)

    # -- this rank's shard: local key j is global key j * world + rank, in its own pages --
    pm = PositionMap.interleaved(rank, world)
    n_local = pm.local_count(lengths).astype(np.int32)
    pages_per_seq = max(1, -(-int(n_local.max()) // P))
    pages = np.zeros((B * pages_per_seq, P, nm.D_QK), np.float32)
    for b in range(B):
        rows = local_rows(keys[b], pm)
        flat = pages[b * pages_per_seq:(b + 1) * pages_per_seq].reshape(-1, nm.D_QK)
        flat[:len(rows)] = rows
    table = np.arange(B * pages_per_seq, dtype=np.int32).reshape(B, pages_per_seq)

    def put(x):  # the cache's arrays: on the GPU (NCCL), or NumPy host arrays (gloo)
        return x if args.gloo else torch.from_numpy(x).to(device)

    local = nm.PagedKVCache(put(pages), put(table), put(n_local))
    shard = shard_cache(local, put(lengths), pm)

    out, lse = distributed.decode(torch.from_numpy(q).to(device), shard, 0.1,
                                  mask=nm.CausalMask(), return_lse=True)

    if rank == 0:  # against the whole cache on one device
        want = nm.mla_decode(q, nm.ContiguousKVCache(keys, lengths), 0.1, mask=nm.CausalMask())
        err = float(np.abs(out.cpu().numpy() - want).max())
        print(f"{world} ranks, {B} x {L} keys, {H} heads, Sq = {Sq}: "
              f"max |merged - whole| = {err:.2e}")
        assert err < 1e-4, err
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
