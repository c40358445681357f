"""The shapes of the operation, as plain numbers.

This module imports nothing, so anything (the NumPy reference, the benchmark's command line,
a build script) can read the widths without pulling in Numba or a GPU stack.

An MLA cache row holds one compressed token, shared by every query head:

    row = [ latent c_kv (D_LATENT = 512) | rope k_pe (D_ROPE = 64) ]      # D_QK = 576 wide
    K   = the whole row,   V = its first D_V = 512 dims

so q is ``[..., H, 576]`` and the output ``[..., H, 512]``.
"""

#: The compressed KV ("nope") part of a row; it doubles as V.
D_LATENT = 512
#: The decoupled rotary part of a row.
D_ROPE = 64
#: The width of q and of a cache row (576).
D_QK = D_LATENT + D_ROPE
#: The width of V and of the output (512): V = K[..., :512].
D_V = D_LATENT
#: Query tokens per sequence that one call may decode (1 for plain decoding; more for
#: speculative decoding or multi-token prediction).
MAX_SQ = 8
