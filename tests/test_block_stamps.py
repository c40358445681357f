"""scripts/block_stamps.py's diagnostic builds still apply: every line its patches insert
around is in kernels/transposed.py and kernels/seesaw.py, each timer read lands once, and
the patched modules are valid Python (the measurement itself needs a GPU)."""
import importlib.util
import os
import py_compile

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
