"""scripts/block_stamps.py's diagnostic build still applies to kernels/transposed.py: every
line its patch inserts after is there, the five timer reads land once each, and the patched
module is valid Python (the measurement itself needs a GPU)."""
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
