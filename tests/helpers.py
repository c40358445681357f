"""Shared test helpers: the table of masks and score mods with their SPEC rules; random problems
and the comparisons come from numba_mla.testing (shared with `numba-mla validate`).

Problems are adversarial by construction (docs/testing.md): fresh random data (never zeros), NaN in
every cache slot at or past a sequence's length and in every page no sequence uses, a shuffled
block table whose unused entries hold a huge out-of-range page index, and NaN in the parts of a
materialized bias that no valid (query, key) pair reads. Any out-of-bounds read then shows up
in the result.

Each mask / score-mod case carries its SPEC rule as a plain scalar function, written from the
SPEC tables (not from mods.py), so brute-force checks stay independent of the library.
"""
import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import numba_mla as nm

from numba_mla.testing import (  # noqa: F401  (re-exported for the tests)
    BF16, D_QK, D_V, DEEPSEEK_SCALE, DTYPES, UNUSED_PAGE, Problem, assert_close, fp32_floor,
    assert_same_nonfinite, assert_three_way, f64, make_bias, make_problem, randn,
    random_counts, random_lengths, with_fp8_cache)


def simt_tile(rows, dtype):
    """Keys per tile of the FMA kernel for ``rows`` query rows a sequence of ``dtype`` (the
    tests that place lengths or poisoned keys on tile boundaries need it)."""
    from numba_mla import heuristics
    from numba_mla.kernels import simt

    packed = np.dtype(dtype) != np.float32
    return simt.block_n(heuristics.simt_block_m(rows, packed), packed)


# ---------------------------------------------------------------------------------------------
# Masks and score mods: one table, each case with its SPEC rule
# ---------------------------------------------------------------------------------------------
NEG_INF = -math.inf


def _keep(pred):
    """A SPEC boolean rule as an additive scalar rule: 0 where kept, -inf where dropped."""
    return lambda b, h, i, q_pos, k: 0.0 if pred(b, h, q_pos, k) else NEG_INF


def spec_alibi_slope(h, H):
    """SPEC: 2^(-8(h+1)/H) for power-of-two H; else with P the closest power of two below H,
    2^(-8(h+1)/P) for h < P and 2^(-8(2(h-P)+1)/(2P)) after."""
    P = 1
    while P * 2 <= H:
        P *= 2
    if h < P:
        return 2.0 ** (-8.0 * (h + 1) / P)
    return 2.0 ** (-8.0 * (2 * (h - P) + 1) / (2 * P))


# User functions, FlexAttention signatures. One vectorises over NumPy index arrays, the other
# (``and``/``or``, ``math.sin``) only runs element by element: both paths of the reference.
def user_mask_mod(b, h, q_pos, k):
    return ((k + h) % 3 != 1) | (k == q_pos)


def user_mask_mod_scalar(b, h, q_pos, k):
    return k == q_pos or (k + 2 * b + h) % 4 != 0


def user_score_mod(s, b, h, q_pos, k):
    return s * (1.0 + 0.25 * h) - 0.125 * (q_pos - k) + 0.5 * b


def user_score_mod_scalar(s, b, h, q_pos, k):
    return s + 0.5 * math.sin(0.3 * k + h - b)


def _bias_rule(mask):
    bias = np.asarray(mask.array, np.float64)
    if bias.ndim == 4:
        return lambda b, h, i, q_pos, k: float(bias[b, h, i, k])
    return lambda b, h, i, q_pos, k: float(bias[b, i, k])


@dataclass(frozen=True)
class MaskCase:
    """``make(p, rng)`` builds the mask for problem p (what a user passes: a Mask or a plain
    ``mask_mod`` function); ``rule(mask)`` is its SPEC form, a scalar
    ``(b, h, i, q_pos, k) -> additive bias`` (0 kept, -inf dropped, or the bias value).
    ``exact``: the built-in tile classification is exact, not only sound."""

    id: str
    make: Callable
    rule: Callable
    exact: bool = False

    def __repr__(self):
        return self.id


MASK_CASES = [
    MaskCase("null", lambda p, rng: nm.NullMask(),
             lambda m: _keep(lambda b, h, q, k: True), exact=True),
    MaskCase("causal", lambda p, rng: nm.CausalMask(),
             lambda m: _keep(lambda b, h, q, k: k <= q), exact=True),
    MaskCase("window1", lambda p, rng: nm.SlidingWindowCausalMask(1),
             lambda m: _keep(lambda b, h, q, k: k <= q and q - k < 1), exact=True),
    MaskCase("window3", lambda p, rng: nm.SlidingWindowCausalMask(3),
             lambda m: _keep(lambda b, h, q, k: k <= q and q - k < 3), exact=True),
    MaskCase("chunked3", lambda p, rng: nm.ChunkedMask(3),
             lambda m: _keep(lambda b, h, q, k: q // 3 == k // 3), exact=True),
    MaskCase("chunked_causal4", lambda p, rng: nm.ChunkedCausalMask(4),
             lambda m: _keep(lambda b, h, q, k: q // 4 == k // 4 and k <= q), exact=True),
    MaskCase("bias_B_Sq_S", lambda p, rng: nm.MaterializedMask(make_bias(rng, p, False)),
             _bias_rule),
    MaskCase("bias_B_H_Sq_S", lambda p, rng: nm.MaterializedMask(make_bias(rng, p, True)),
             _bias_rule),
    MaskCase("user_fn", lambda p, rng: user_mask_mod,
             lambda m: _keep(lambda b, h, q, k: bool(user_mask_mod(b, h, q, k)))),
    MaskCase("user_fn_scalar", lambda p, rng: user_mask_mod_scalar,
             lambda m: _keep(user_mask_mod_scalar)),
    MaskCase("causal&user_fn", lambda p, rng: nm.CausalMask() & user_mask_mod,
             lambda m: _keep(lambda b, h, q, k: k <= q and bool(user_mask_mod(b, h, q, k)))),
    MaskCase("chunked4|window2", lambda p, rng: nm.ChunkedMask(4) | nm.SlidingWindowCausalMask(2),
             lambda m: _keep(lambda b, h, q, k: q // 4 == k // 4 or (k <= q and q - k < 2))),
    MaskCase("user_fn_scalar|causal", lambda p, rng: user_mask_mod_scalar | nm.CausalMask(),
             lambda m: _keep(lambda b, h, q, k: user_mask_mod_scalar(b, h, q, k) or k <= q)),
    MaskCase("(chunked3&causal)|window1",
             lambda p, rng: (nm.ChunkedMask(3) & nm.CausalMask()) | nm.SlidingWindowCausalMask(1),
             lambda m: _keep(lambda b, h, q, k: (q // 3 == k // 3 and k <= q)
                             or (k <= q and q - k < 1))),
]
MASKS = {c.id: c for c in MASK_CASES}


@dataclass(frozen=True)
class ScoreModCase:
    """``make(p)`` builds the score mod for problem p (a ScoreMod or a plain ``score_mod``
    function); ``rule(mod, H)`` is its SPEC form, a scalar ``(s, b, h, q_pos, k) -> s'``."""

    id: str
    make: Callable
    rule: Callable

    def __repr__(self):
        return self.id


SCORE_MOD_CASES = [
    ScoreModCase("identity", lambda p: nm.IdentityScoreMod(),
                 lambda m, H: lambda s, b, h, q, k: s),
    ScoreModCase("alibi", lambda p: nm.AlibiScoreMod(p.heads),
                 lambda m, H: lambda s, b, h, q, k: s + spec_alibi_slope(h, H) * (k - q)),
    ScoreModCase("softcap", lambda p: nm.SoftCapScoreMod(2.5),
                 lambda m, H: lambda s, b, h, q, k: 2.5 * math.tanh(s / 2.5)),
    ScoreModCase("user_fn", lambda p: user_score_mod,
                 lambda m, H: user_score_mod),
    ScoreModCase("user_fn_scalar", lambda p: user_score_mod_scalar,
                 lambda m, H: user_score_mod_scalar),
]
SCORE_MODS = {c.id: c for c in SCORE_MOD_CASES}


# ---------------------------------------------------------------------------------------------
# Kernel backends
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _backend_accepts(backend, dtype_name):
    """Whether ``backend`` takes a ``dtype_name`` call on this machine. Asked with a ragged
    call of no query rows: the backend is chosen, nothing is launched (free in the simulator).
    Unsupported means NotImplementedError, or a ValueError naming ``backend`` (e.g. "mma" on a
    GPU without wgmma); any other error means supported but broken, and the tests show it."""
    rng = np.random.default_rng(0)
    p = make_problem(rng, 1, 1, 1, [1], np.dtype(DTYPES[dtype_name]), "contiguous",
                     ragged=True, q_counts=[0])
    try:
        p.run(nm, backend=backend)
    except NotImplementedError:
        return False
    except ValueError as e:
        if str(e).startswith("backend"):
            return False
    except Exception:  # noqa: BLE001  (broken, not unsupported: let the tests fail on it)
        return True
    return True


def dtype_name(dtype):
    """The DTYPES key of a storage dtype ("bf16", "fp16", "fp32")."""
    dtype = np.dtype(dtype)
    return next(k for k, v in DTYPES.items() if v == dtype)


def kernel_backends(dtype):
    """The kernel backends to test for ``dtype`` (a dtype or a DTYPES key): "simt" always,
    "mma" (tensor cores) for 16-bit data where the library accepts it, and "simple" (the
    readable kernel) always, last. Cached per dtype."""
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    out = ["simt"]
    if name != "fp32" and _backend_accepts("mma", name):
        out.append("mma")
    return out + ["simple"]


def run_backend(p, backend, **kwargs):
    """``p.run(numba_mla, backend=backend, ...)``, skipping the test when a backend other than
    "simt" says (NotImplementedError) that it does not support this configuration."""
    try:
        return p.run(nm, backend=backend, **kwargs)
    except NotImplementedError as e:
        if backend == "simt":
            raise
        pytest.skip(f"backend={backend!r} does not support this call: {e}")


# ---------------------------------------------------------------------------------------------
# Which kernel a call built, and references and torch tensors
# ---------------------------------------------------------------------------------------------
def spy_factory(monkeypatch, name, record):
    """Wrap ``factory.<name>``: each call appends ``record(args, kwargs)`` to the list this
    returns, and its kernel to ``spy_factory.kernels[name]``."""
    from numba_mla import factory

    seen, kernels, real = [], [], getattr(factory, name)
    spy_factory.kernels = dict(getattr(spy_factory, "kernels", {}), **{name: kernels})

    def spy(*args, **kwargs):
        seen.append(record(args, kwargs))
        kernels.append(real(*args, **kwargs))
        return kernels[-1]

    monkeypatch.setattr(factory, name, spy)
    return seen


def references(p, mask=None, score_mod=None):
    """(float64 out, float64 lse) and the same-precision run's (out in q's dtype, float32 lse)."""
    kw = dict(mask=mask, score_mod=score_mod, return_lse=True)
    golden = p.run(nm.reference, **kw)
    low_out, low_lse = p.run(nm.reference, compute_dtype=np.float32, **kw)
    return golden, (low_out.astype(p.dtype), low_lse)


def script_module(name):
    """scripts/``name``.py loaded as a module (``_name``)."""
    import importlib.util
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "_" + name, os.path.join(root, "scripts", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_check_module():
    """scripts/build_check.py as a module (``toolchain_missing``, ``build_sass``): for the
    sm_90a build checks that test files run as scripts."""
    return script_module("build_check")


def run_build_script(script, *args):
    """Run ``script`` (a Python file that builds kernels for sm_90a and exits 1 on a failed
    check) with ``args`` in a fresh process without the simulator, with
    ``NUMBA_MLA_BUILD_PYTHON`` (default: this Python); skip the test where NVVM/nvJitLink are
    missing (exit status 77)."""
    import os
    import subprocess
    import sys

    python = os.environ.get("NUMBA_MLA_BUILD_PYTHON", sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([python, os.path.abspath(script), *args], capture_output=True,
                       text=True, env=env, timeout=900)
    if r.returncode == 77:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, r.stdout + r.stderr


def cuda_torch():
    """torch with CUDA, or skip the test."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch was built without CUDA")
    return torch


def to_torch(torch, x, device="cuda"):
    """A NumPy array as a torch tensor on ``device`` (bfloat16 through its int16 bits)."""
    x = np.ascontiguousarray(x)
    if x.dtype == BF16:
        return torch.from_numpy(x.view(np.int16)).to(device).view(torch.bfloat16)
    return torch.from_numpy(x).to(device)


def to_numpy(torch, t):
    """A torch tensor as a NumPy array on the host (bfloat16 as ml_dtypes.bfloat16)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(BF16)
    return t.cpu().numpy()
