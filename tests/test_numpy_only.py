"""The reference and the mods' NumPy forms need NumPy only, not Numba.

Each check runs in a fresh interpreter where importing ``numba`` (or llvmlite) fails: a
meta-path finder refuses those names. The package's ``__init__`` imports the kernels, and so
Numba, so the child loads the modules through a stand-in ``numba_mla`` package object whose
path is the real package directory: ``import numba_mla.reference`` then runs reference.py and
what it imports, and nothing else. The child decodes a tiny problem with the reference and
compares it with a loop over keys written here, and checks that a device form, the one place
that needs Numba, fails for want of it.
"""
import os
import subprocess
import sys
import textwrap

import numba_mla

PACKAGE_DIR = os.path.dirname(os.path.abspath(numba_mla.__file__))

PRELUDE = textwrap.dedent("""
    import importlib, importlib.abc, math, sys, types

    class NoNumba(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("numba", "llvmlite"):
                raise ImportError("blocked for this test: " + name)

    sys.meta_path.insert(0, NoNumba())
    try:
        import numba
    except ImportError:
        pass
    else:
        raise SystemExit("the blocker let numba through")

    package = types.ModuleType("numba_mla")
    package.__path__ = [PACKAGE_DIR]
    sys.modules["numba_mla"] = package

    def loaded_numba():
        return sorted(m for m in sys.modules if m.split(".")[0] in ("numba", "llvmlite"))
""")


def run_without_numba(body):
    """Run ``body`` after the prelude in a child interpreter; return its stdout."""
    code = f"PACKAGE_DIR = {PACKAGE_DIR!r}\n" + PRELUDE + textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"child failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_reference_runs_without_numba():
    out = run_without_numba("""
        import numpy as np
        reference = importlib.import_module("numba_mla.reference")
        mods = importlib.import_module("numba_mla.mods")
        caches = importlib.import_module("numba_mla.caches")

        rng = np.random.default_rng(7)
        B, Sq, H, S, window, cap, scale = 2, 2, 3, 6, 3, 4.0, 0.08
        lengths = np.array([6, 2], np.int32)
        kv = rng.standard_normal((B, S, 576)).astype(np.float32)
        q = rng.standard_normal((B, Sq, H, 576)).astype(np.float32)
        mask = mods.CausalMask() & mods.SlidingWindowCausalMask(window)
        out, lse = reference.mla_decode(q, caches.ContiguousKVCache(kv, lengths), scale,
                                        mask=mask, score_mod=mods.SoftCapScoreMod(cap),
                                        return_lse=True)

        # The same, one (b, i, h) at a time: keys j <= q_pos with q_pos - j < window.
        for b in range(B):
            L = int(lengths[b])
            K = kv[b].astype(np.float64)
            for i in range(Sq):
                q_pos = L - Sq + i
                for h in range(H):
                    keys = [j for j in range(L) if j <= q_pos and q_pos - j < window]
                    s = [cap * math.tanh(scale * float(q[b, i, h].astype(np.float64) @ K[j]) / cap)
                         for j in keys]
                    w = [math.exp(x) for x in s]
                    want = sum(wj * K[j, :512] for wj, j in zip(w, keys)) / sum(w)
                    np.testing.assert_allclose(out[b, i, h], want, rtol=1e-10, atol=1e-12)
                    assert abs(lse[b, i, h] - math.log(sum(w))) < 1e-10

        assert out.shape == (B, Sq, H, 512) and out.dtype == np.float64
        print("numba modules:", loaded_numba())
    """)
    assert "numba modules: []" in out


def test_mods_numpy_forms_without_numba():
    out = run_without_numba("""
        import numpy as np
        mods = importlib.import_module("numba_mla.mods")

        either = mods.ChunkedMask(4) | mods.CausalMask()
        q, k = np.arange(10)[:, None], np.arange(10)[None, :]
        np.testing.assert_array_equal(either.keep(0, 0, q, k), (q // 4 == k // 4) | (k <= q))
        assert either.classify(0, 4, 5, 5) == mods.FULL        # every key <= 5
        assert either.classify(8, 12, 5, 5) == mods.EMPTY      # after 5, other chunk
        assert either.key_range(5, 6) == (0, 8)
        assert mods.AlibiScoreMod(4).apply(np.zeros(2), 0, np.array([0, 3]), 5, 3).shape == (2,)

        # Building a device form is what needs Numba.
        try:
            mods.CausalMask().device_keep()
        except ImportError as e:
            print("device form:", e)
        print("numba modules:", loaded_numba())
    """)
    assert "device form: blocked for this test: numba" in out
    assert "numba modules: []" in out
