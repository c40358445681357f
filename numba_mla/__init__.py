"""numba_mla: MLA (DeepSeek V2/V3 multi-head latent attention) decoding in Numba CUDA.

    import numba_mla as nm
    out = nm.mla_decode(q, nm.PagedKVCache(pages, block_table, lengths), scale=0.1352)

See SPEC.md for the contract; ``numba_mla.reference`` is the readable NumPy definition.
"""
from . import _compat  # noqa: F401  (must run before numba.cuda is imported)
from . import _numba  # noqa: F401  (the numba-cuda version check, before anything uses it)
from . import fp8, reference
from .api import flare_mla_decoding, mla_decode, mla_decode_ragged, prepare
from .config import MHAConfig
from .caches import (D_LATENT, D_QK, D_ROPE, D_V, ContiguousKVCache, KVCache, PagedKVCache,
                     RaggedKVCache)
from .mods import (
    EMPTY,
    FULL,
    PARTIAL,
    AlibiScoreMod,
    AndMask,
    CausalMask,
    ChunkedCausalMask,
    ChunkedMask,
    FunctionMask,
    FunctionScoreMod,
    IdentityScoreMod,
    Mask,
    MaterializedMask,
    NullMask,
    OrMask,
    ScoreMod,
    SlidingWindowCausalMask,
    SoftCapScoreMod,
)

__version__ = "0.1.0"

__all__ = [
    "mla_decode", "mla_decode_ragged", "flare_mla_decoding", "prepare", "reference", "fp8",
    "ContiguousKVCache", "PagedKVCache", "RaggedKVCache", "KVCache", "MHAConfig",
    "NullMask", "CausalMask", "SlidingWindowCausalMask", "ChunkedMask", "ChunkedCausalMask",
    "MaterializedMask", "FunctionMask", "AndMask", "OrMask", "Mask",
    "IdentityScoreMod", "AlibiScoreMod", "SoftCapScoreMod", "FunctionScoreMod", "ScoreMod",
    "EMPTY", "PARTIAL", "FULL", "D_QK", "D_V", "D_LATENT", "D_ROPE",
]
