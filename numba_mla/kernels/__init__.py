"""The Numba CUDA kernels of split-K (flash-decoding) MLA decode.

Each module makes its kernels on demand (``make_*`` functions), with the mask, score mod,
cache addressing and tile sizes baked in as closure constants; ``numba_mla.factory`` builds
and caches them, ``numba_mla.launch`` runs them.

Stage 1, the partition kernels: a block owns some query rows of one sequence and one run of
its key tiles, and writes that partition's normalised output and log-sum-exp.

- ``simt.py``: on plain FMA units; any GPU, bf16 / fp16 / fp32 storage.
- ``mma.py``: on Hopper tensor cores (wgmma), the two warpgroups in lockstep; tiles copied
  with cp.async (page sizes that are not a multiple of 64), or by TMA where the seesaw kernel
  would spill registers. 16-bit storage.
- ``seesaw.py``: on Hopper tensor cores for TMA tiles, the two warpgroups taking key tiles in
  turn so that one's softmax overlaps the other's products.
- ``common.py``: what the three share: the score step (score mod, mask, log2 units) and the
  walk over key tiles that skips the ones the mask drops.

Stage 2, ``combine.py``: the partitions of each query row merged by log-sum-exp (skipped when
there is one partition: the partition kernel then writes out and lse itself).
"""
