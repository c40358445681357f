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
    assert src.count("False, st0, 0, chunk") == 1
    assert src.count("part_lse[t_row0, h0 + i, p] = ptx.i32_as_f32(st)") == 1
    assert src.index("sto = _gtimer()") < src.index("part_lse[t_row0, h0 + i, p]")
    py_compile.compile(str(path), doraise=True)
