"""scripts/block_stamps.py's diagnostic builds still apply: every line its patches insert
around is in kernels/transposed.py and kernels/seesaw.py, each timer read lands once, and
the patched modules are valid Python (the measurement itself needs a GPU); the pair loop's
words are read back and turned into phases a pair as the kernel writes them."""
import importlib.util
import os
import py_compile
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "block_stamps.py")
spec = importlib.util.spec_from_file_location("_block_stamps", SCRIPT)
stamps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stamps)


def test_patch_applies_to_the_transposed_kernel(tmp_path):
    stamps.patched_copy(str(tmp_path))
    path = tmp_path / "numba_mla" / "kernels" / "transposed.py"
    src = path.read_text(encoding="utf-8")
    for k in range(5):
        assert src.count(f"st{k} = _gtimer()") == 1, f"stamp {k}"
    assert src.count("part_out[t_row0, h0, p,") == 5
    py_compile.compile(str(path), doraise=True)


def test_patch_applies_to_the_seesaw_kernel(tmp_path):
    stamps.patched_copy(str(tmp_path), "seesaw")
    path = tmp_path / "numba_mla" / "kernels" / "seesaw.py"
    src = path.read_text(encoding="utf-8")
    for name in ("st0", "stw", "stq", "ste", "sto"):
        assert src.count(f"{name} = _gtimer()") == 1, name
    assert src.count("sts = _gtimer()") == 1
    # the entry's reading reaches the walk; the readings are stored once, after the output
    assert src.count("0, 0, 0, st0, 0, chunk") == 1
    assert src.count("part_lse[t_row0, h0 + i, p] = ptx.i32_as_f32(st)") == 1
    assert src.index("sto = _gtimer()") < src.index("part_lse[t_row0, h0 + i, p]")
    py_compile.compile(str(path), doraise=True)


def test_patch_applies_to_the_runs_kernel(tmp_path):
    stamps.patched_copy(str(tmp_path), "seesaw-runs")
    src = (tmp_path / "numba_mla" / "kernels" / "seesaw.py").read_text(encoding="utf-8")
    assert "st0" not in src and "0, 0, 0, 0, 0, chunk" in src  # (the runs kernel scans there)
    assert src.count("enumerate((stw, stq, sts, ste, sto, _gtimer()))") == 1
    py_compile.compile(str(tmp_path / "numba_mla" / "kernels" / "seesaw.py"), doraise=True)


def test_patch_applies_to_the_pair_loop(tmp_path):
    """Each phase's stamp lands once a warpgroup, in loop order within its warpgroup's branch
    and outside ``qk`` (no reading between the products), the registers are defined at the
    walk's start, the words have their own area and are written once after the output; the
    patched package imports."""
    stamps.patched_copy(str(tmp_path), "seesaw-pairs")
    path = tmp_path / "numba_mla" / "kernels" / "seesaw.py"
    src = path.read_text(encoding="utf-8")
    assert src.count("def _clk(typingctx)") == 1 and src.count("%clock") == 1
    assert src.count("ACC_OFF = SMEM_BYTES") == 1 and src.count("SMEM_BYTES += 256") == 1
    walk = src.index("    def walk(")
    wg0, wg1 = src.index("            if wg == 0:\n                qk_tile"), \
        src.index("pc = _clk()\n                while True:", walk)
    end = src.index("        # -- the row sums of both warpgroups")
    assert walk < src.index("        _a0 = float32(0.0)\n") < wg0
    assert src.index("    def qk(") < src.index("    def qk8(") < walk
    assert "_clk()" not in src[src.index("    def qk("):walk]
    for wg, lo, hi in ((0, wg0, wg1), (1, wg1, end)):
        body = src[lo:hi]
        ks = [k for k, *names in stamps.PAIR_PHASES if names[wg]]
        at = []
        for k in ks:
            text = f"_a{k} += float32((_c - pc) & 0xFFFFFFFF)"
            assert body.count(text) == 1, (wg, k)
            at.append(body.index(text))
        assert at == sorted(at), wg  # (in loop order)
        for word in (stamps.PAIRS, stamps.S_TILES) + ((stamps.P1V1_PAIRS,) if wg == 0 else ()):
            assert body.count(f"_a{word} += float32(1.0)") == 1, (wg, word)
    assert src.count("pc = _clk()") == 3 and src.count("_gtimer()") == 3  # (start, loop, end)
    assert wg1 < src.index("smf[ACC_OFF // 4 + 32 * wg + 7] = _a7") < end
    assert src.count("part_lse[row0 + r0 // H, r0 % H + i, p]") == 1
    assert src.index("write_rows(part_out", end) < src.index("part_lse[row0 + r0 // H, r0 % H + i")
    py_compile.compile(str(path), doraise=True)
    r = subprocess.run([sys.executable, "-c", "from numba_mla.kernels import seesaw as s; "
                        "print(s.ACC_OFF, s.SMEM_BYTES, s.NEXT_OFF)"], cwd=str(tmp_path),
                       env=dict(os.environ, PYTHONPATH=str(tmp_path)), capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    acc, smem, nxt = (int(v) for v in r.stdout.split())
    assert smem == acc + 256 == nxt and acc % 4 == 0


def test_pair_words_are_read_back_as_phases():
    """A block's 32 words (float32, over its first rows' LSE, each of its two row groups a
    block) give each phase's cycles a pair, S's a tile, and their time at the block's own
    clock; a block that walked no pair (an empty partition: -inf) is left out."""
    import numpy as np

    H, P = 128, 2
    lse = np.full((3, H, P), -np.inf, np.float32)
    rng = np.random.default_rng(0)
    blocks = {}
    ks = [k for k, *_ in stamps.PAIR_PHASES]
    for t, g, p in ((0, 0, 0), (0, 1, 0), (1, 0, 1), (2, 1, 1)):
        w = np.zeros((2, 16), np.float32)
        w[:, ks] = rng.integers(100, 5000, (2, len(ks)))
        w[1, 5] = w[1, 9] = 0  # (warpgroup 1 has no phases 5 and 9)
        w[:, stamps.PAIRS] = 4 + t
        w[:, stamps.S_TILES] = 3 + t
        w[0, stamps.P1V1_PAIRS] = 3 + t
        w[0, stamps.LOOP_CYCLES] = 180000 + t
        w[0, stamps.LOOP_NS] = 100000
        blocks[(t, g, p)] = w
        lse[t, 64 * g:64 * g + 32, p] = w.reshape(-1)
    args = [None] * 12
    args[9] = _Host(lse)
    part = type("Launch", (), {"args": args})()
    st, info = stamps.block_stamps("seesaw-pairs", part, H, len(stamps.PAIR_WORDS))
    assert info is None and st.shape == (12, 32)
    prof = stamps.pair_profile(st)
    assert len(prof["blocks"]) == 4
    for i, b in enumerate(prof["blocks"]):
        w = np.asarray(st[b]).reshape(2, 16)
        key = next(k for k, v in blocks.items() if np.array_equal(v, w))
        t = key[0]
        # (pairs 4 + t; S tiles and warpgroup 0's pairs with P1 V1 3 + t)
        want = np.array([[np.nan if (wg, k) in ((1, 5), (1, 9))
                          else w[wg, k] / (3 + t if k in (5, 7) else 4 + t)
                          for k in ks] for wg in range(2)])
        assert np.allclose(prof["cycles"][i], want, equal_nan=True)
        assert np.allclose(prof["us"][i], want * 100000 / (180000 + t) / 1000, equal_nan=True)
        assert np.isclose(prof["loop_us"][i], 100000 / (4 + t) / 1000)
    assert np.isnan(prof["med_cycles"][1, ks.index(5)]) and prof["sum_cycles"].shape == (2,)


class _Host:
    def __init__(self, a):
        self.a = a

    def copy_to_host(self):
        return self.a.copy()


def test_runs_readings_are_found_item_by_item():
    """The runs kernel's readings are read back where each item of the table wrote them
    (its sequence's row, its row group's first heads, its slot), in the table's order, with
    its block and tiles; an item whose slot holds no readings (marked -inf: it found no
    tile) is left out."""
    import numpy as np

    from numba_mla import heuristics

    H, npoints = 128, 6
    lengths = np.array([640, 200], np.int32)  # 10 tiles, 4 tiles
    offsets = np.arange(3, dtype=np.int32)  # one query row a sequence
    # run 0: sequence 0's tiles [0, 6) into slot 0; run 1: its tiles [6, end) into slot 1,
    # then sequence 1 whole; each run a block for each of the two row groups
    table = heuristics.runs_table([[(0, 0, 0, 6)], [(0, 1, 6, -1), (1, 0, 0, -1)]], 2)
    lse = np.full((2, H, 2), -np.inf, np.float32)
    ran = [(0, 0, 0), (0, 1, 0), (0, 0, 1), (1, 0, 0), (0, 1, 1)]  # (b, g, slot); not (1, 1, 0)
    for k, (b, g, slot) in enumerate(ran):
        st = (np.arange(npoints) * 1000 + 7 * k).astype(np.uint32)
        lse[b, 64 * g:64 * g + npoints, slot] = st.view(np.float32)
    args = [None] * 12
    args[1], args[4], args[7], args[9] = (_Host(offsets), _Host(lengths), _Host(table),
                                          _Host(lse))
    part = type("Launch", (), {"args": args})()
    st, info = stamps.block_stamps("seesaw-runs", part, H, npoints)
    # blocks 0 / 1: run 0's item (6 tiles), 2 / 3: run 1's two items (4 tiles each)
    assert info.tolist() == [[0, 6], [1, 6], [2, 4], [2, 4], [3, 4]]
    assert st.tolist() == [(np.arange(npoints) * 1000 + 7 * k).tolist() for k in range(5)]
