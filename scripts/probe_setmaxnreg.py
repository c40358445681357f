"""Probe: does ``setmaxnreg`` survive the way a Numba kernel is built? (A warpgroup that only
converts FP8 codes would give its registers to the two that multiply: docs/fp8.md.)

A kernel of three warpgroups (384 threads, launch bounds (384, 1), so 168 registers a thread
at launch) whose third warpgroup lowers its registers to 40 and whose first two raise theirs
to 232, built three ways:
  - nvJitLink, as Numba links a kernel's PTX into a cubin (and as scripts/build_check.py
    builds): ptxas compiles it as one unit of a link;
  - ptxas alone on the PTX, whole program (where a toolkit's ptxas is found);
  - on a GPU, the driver's JIT on the PTX (``cuModuleLoadDataEx``), as a launcher that loads
    its own module would.
For each it prints whether the cubin's SASS holds ``USETMAXREG`` (nvJitLink, ptxas) or
whether the JIT's logs say the instruction was ignored (driver: no SASS comes back from that
path, so the absence of ptxas's note is the only evidence it was kept).

Usage: python scripts/probe_setmaxnreg.py      (CPU: needs numba-cuda[cu13],
       nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, as build_check.py; GPU: also the
       driver's JIT)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import build_check  # noqa: E402  (its sm_90 stand-in and tools, before numba_mla)

from numba import cuda, float32  # noqa: E402
from numba.cuda import types  # noqa: E402

from numba_mla.ptx._codegen import void_asm  # noqa: E402
from numba_mla._numba import jit_load  # noqa: E402

CONVERTER_REGS, MATH_REGS = 40, 232  # 2 x 232 + 40 = 504 <= 3 x 168
IGNORED = re.compile(r".*setmaxnreg.*ignored.*")


def kernel(out, x):
    tid = cuda.threadIdx.x
    if tid // 128 == 2:
        lower()
        out[tid] = x[tid] * float32(2.0)
    else:
        raise_()
        acc = cuda.local.array(64, float32)
        for i in range(64):
            acc[i] = x[(tid + i) % 384]
        for _ in range(4):
            for i in range(64):
                acc[i] = acc[i] * acc[(i + 1) % 64] + float32(1.0)
        s = float32(0.0)
        for i in range(64):
            s += acc[i]
        out[tid] = s


lower = void_asm(f"setmaxnreg.dec.sync.aligned.u32 {CONVERTER_REGS};")
raise_ = void_asm(f"setmaxnreg.inc.sync.aligned.u32 {MATH_REGS};")


def sass_of(cubin):
    """build_check's SASS of ``cubin``, or "" where cuobjdump is missing (a GPU machine
    without the wheels still runs the driver's JIT)."""
    try:
        return build_check.sass_of(cubin)
    except FileNotFoundError:
        return ""


def report(way, sass, log):
    kept = len(re.findall(r"USETMAXREG", sass))
    notes = [m.group(0).strip() for m in IGNORED.finditer(log)]
    print(f"{way}: USETMAXREG in the SASS: {kept}; {notes[0] if notes else 'no C7504 note'}")


def driver_jit(ptx):
    """The driver JIT's info and error logs for ``ptx`` (its cache off, so that ptxas runs),
    or None where there is no GPU."""
    os.environ["CUDA_CACHE_DISABLE"] = "1"  # (read by the driver at cuInit)
    try:
        from cuda.bindings import driver
        err, = driver.cuInit(0)
    except Exception:  # (no module, or no driver library: no GPU here)
        return None
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    err, dev = driver.cuDeviceGet(0)
    err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
    driver.cuCtxSetCurrent(ctx)
    err, mod, info, error = jit_load(ptx)  # (launch.py's whole-program path loads so too)
    logs = f"{info}\n{error}"
    if err != driver.CUresult.CUDA_SUCCESS:
        return f"cuModuleLoadDataEx failed: {err}\n{logs}"
    driver.cuModuleUnload(mod)
    return logs


def main():
    missing = build_check.toolchain_missing()
    if missing:
        print(f"probe_setmaxnreg: NVVM/nvJitLink not available ({missing})")
        return 77
    ptx, _ = cuda.compile_ptx(kernel, (types.float32[::1], types.float32[::1]),
                              cc=(9, 0, "a"), launch_bounds=(384, 1))
    assert ptx.count("setmaxnreg") == 2, "the intrinsics did not reach the PTX"
    jit = driver_jit(ptx)
    if jit is None:
        print("driver JIT: no GPU here")
    else:
        notes = [m.group(0).strip() for m in IGNORED.finditer(jit)]
        # (no SASS from this path: "no note" means kept only as far as ptxas's log tells)
        print(f"driver JIT: {notes[0] if notes else 'no note that setmaxnreg was ignored'}; "
              f"log: {' | '.join(line for line in jit.splitlines() if line.strip())[-600:]}")
    cubin, log = build_check.link(ptx)
    report("nvJitLink (Numba's link)", sass_of(cubin), log)
    ptxas = shutil.which("ptxas", path=os.pathsep.join([os.environ.get("PATH", ""),
                                                       "/usr/local/cuda/bin"]))
    if ptxas:
        with tempfile.TemporaryDirectory() as d:
            # (a toolkit's ptxas may be older than Numba's PTX version; setmaxnreg needs 8.0)
            text = re.sub(r"^\.version \d+\.\d+", ".version 8.0", ptx, flags=re.M)
            with open(os.path.join(d, "k.ptx"), "w") as f:
                f.write(text)
            r = subprocess.run([ptxas, "-arch=sm_90a", "-v", "k.ptx", "-o", "k.cubin"], cwd=d,
                               capture_output=True, text=True)
            if r.returncode == 0:
                with open(os.path.join(d, "k.cubin"), "rb") as f:
                    report(f"ptxas, whole program ({ptxas})", sass_of(f.read()),
                           r.stdout + r.stderr)
            else:
                print(f"ptxas ({ptxas}) failed: {(r.stdout + r.stderr).strip()[:300]}")
    else:
        print("ptxas: not found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
