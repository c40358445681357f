"""Compile the partition kernels (tensor-core, FMA, simple and its warp split-K) for sm_90a on
a machine without a GPU and fail on local memory (spills or a stack frame) or a call left in
the code; for the tensor-core kernel also on a missing or serialised HGMMA. The warp tensor-core kernel
(``mma_sync``, and its 32-row block's split-role form) is built for sm_80 and sm_89 (Ampere,
Ada) and must hold its mma.sync and their HMMA. A kernel that launch.py builds as a whole program (the dispatcher's
``whole_program``: the seesaw kernel's converter warpgroup, for ``setmaxnreg``) is built by a
toolkit's ``ptxas`` where one is found (nvJitLink would drop the instruction), and must keep
both ``USETMAXREG``; without a ``ptxas`` it is reported and not built.

Needs ``pip install "numba-cuda[cu13]" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`` (NVVM,
nvJitLink, cuobjdump and its nvdisasm).
Usage: python scripts/build_check.py      (exit status 1 on any failure, 77 when NVVM or
nvJitLink is not installed: nothing was checked)
       python scripts/build_check.py --part 2/4
    builds only every 4th kernel, from the third (parts 0/4 to 3/4 together build them all:
    tests/test_build.py runs the four as tests, which pytest-xdist spreads over the cores)
       python scripts/build_check.py --ptx-hashes > FILE
    prints, for every kernel above, a SHA-256 of its PTX in place of the verdict, without
    building it: run it before and after a change meant to leave the kernels as they are,
    and ``diff`` the two files (the PTX is the same from run to run; mangled names are
    replaced by their order of appearance, so that a device function added elsewhere does
    not change a kernel's hash). A refactor whose kernels' PTX is unchanged needs no new GPU
    run.
       python scripts/build_check.py --only seesaw,seesaw8 --sass DIR
    builds only the kernels of those names (the first column of the report: mma, seesaw,
    listed, runs, seesaw8, tr8x32, simt, msync, mroles, ...) and writes each one's SASS into
    DIR, one file a kernel named by its report line (``--only`` and ``--sass`` also apart):
    read a kernel's machine code without a GPU (docs/tools.md).
"""
import glob
import hashlib
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numba.cuda.dispatcher as _dispatcher


class _Hopper:  # compile as if for an H200 without touching a device
    compute_capability = (9, 0)


_dispatcher.get_current_device = lambda: _Hopper()

import numba_mla as nm  # noqa: E402
from numba import cuda, types  # noqa: E402
from numba_mla import factory, selector  # noqa: E402
from numba_mla.kernels import seesaw, simple  # noqa: E402

CASES = [  # (mask, score mod, dtype tag, cache, heads, direct, tma)
    (nm.NullMask(), nm.IdentityScoreMod(), "bf16", nm.PagedKVCache, 128, True, True),
    (nm.NullMask(), nm.IdentityScoreMod(), "bf16", nm.PagedKVCache, 16, False, False),
    (nm.CausalMask(), nm.SoftCapScoreMod(2.0), "f16", nm.ContiguousKVCache, 16, False, True),
    (nm.ChunkedMask(4) | nm.SlidingWindowCausalMask(2), nm.AlibiScoreMod(8), "bf16",
     nm.PagedKVCache, 1, False, False),
]


SIMT_CASES = [  # (mask, score mod, dtype tag, cache, rows per block, heads, direct)
    (nm.NullMask(), nm.IdentityScoreMod(), "bf16", nm.PagedKVCache, 32, 128, True),
    (nm.NullMask(), nm.IdentityScoreMod(), "bf16", nm.PagedKVCache, 16, 16, False),
    (nm.CausalMask(), nm.SoftCapScoreMod(2.0), "f32", nm.ContiguousKVCache, 16, 16, False),
    (nm.ChunkedMask(4) | nm.SlidingWindowCausalMask(2), nm.AlibiScoreMod(8), "f16",
     nm.PagedKVCache, 32, 8, False),
]


FP8_CASES = [  # (mask, score mod, q dtype tag, cache, rows per block, heads, direct, layout)
    (nm.NullMask(), nm.IdentityScoreMod(), "bf16", nm.PagedKVCache, 16, 16, False, "e4m3"),
    (nm.NullMask(), nm.IdentityScoreMod(), "bf16", nm.PagedKVCache, 32, 128, True, "v32"),
    (nm.CausalMask(), nm.SoftCapScoreMod(2.0), "f16", nm.ContiguousKVCache, 32, 16, False,
     "e4m3"),
]


MMA_SYNC_CASES = [  # (mask, score mod, dtype tag, cache, rows per block, heads)
    (nm.NullMask(), nm.IdentityScoreMod(), "bf16", nm.PagedKVCache, 16, 16),
    (nm.CausalMask(), nm.SoftCapScoreMod(2.0), "f16", nm.ContiguousKVCache, 16, 128),
    (nm.ChunkedMask(4) | nm.SlidingWindowCausalMask(2), nm.AlibiScoreMod(8), "bf16",
     nm.PagedKVCache, 16, 8),
    # the 32-row block (8 warps, two tiles: chosen on GPUs that give a block 188 KB, sm_90 and
    # sm_100 on; built here for the same instructions)
    (nm.NullMask(), nm.IdentityScoreMod(), "bf16", nm.PagedKVCache, 32, 128),
    (nm.CausalMask(), nm.SoftCapScoreMod(2.0), "f16", nm.ContiguousKVCache, 32, 24),
]


def mma_sync_signature(tag, direct, fp8=None):
    """The warp tensor-core kernel's: q as int32 words of two 16-bit values, no tensor maps;
    with ``fp8``, the FP8 kernels' cache and scale."""
    sig = list(fp8_signature(tag, direct) if fp8 else simt_signature(tag, direct))
    sig[0] = types.Array(types.int32, 3, "C")
    return tuple(sig)


def fp8_signature(tag, direct):
    """An FP8 kernel's: the cache as int32 words of four codes, scale + 1j * kv_scale."""
    sig = list(simt_signature(tag, direct))
    sig[2], sig[6] = types.Array(types.int32, 3, "C"), types.complex64
    return tuple(sig)


def simt_signature(tag, direct):
    w16 = tag != "f32"
    word = types.int32 if w16 else types.float32
    out = types.int16 if w16 and direct else types.float32
    return (types.Array(types.int16 if w16 else types.float32, 3, "C"),
            types.Array(types.int32, 1, "C"), types.Array(word, 3, "C"),
            types.Array(types.int32, 2, "C"), types.Array(types.int32, 1, "C"),
            types.Array(types.float32, 3, "C"), types.float32, types.int32,
            types.Array(out, 4, "C"),
            types.Array(types.float32, 3, "C"))


def signature(direct, listed=False, mixed=False):
    """The tensor-core partition kernels' argument types; ``listed``: the schedule argument is
    a table instead of the chunk (int32, 2-D: the listed schedule's [N, 4] or the runs
    schedule's [N + I, 5]); ``mixed``: the mixed runs' out and lse after the workspace."""
    w = types.int32
    return ((types.Array(w, 3, "C"), types.Array(types.int32, 1, "C"), types.Array(w, 3, "C"),
             types.Array(types.int32, 2, "C"), types.Array(types.int32, 1, "C"),
             types.Array(types.float32, 3, "C"), types.float32,
             types.Array(types.int32, 2, "C") if listed else types.int32,
             types.Array(types.int16 if direct else types.float32, 4, "C"),
             types.Array(types.float32, 3, "C"))
            + ((types.Array(types.int16, 4, "C"), types.Array(types.float32, 3, "C"))
               if mixed else ())
            + (types.Array(types.uint8, 1, "C"), types.Array(types.uint8, 1, "C")))


def link(ptx, arch="sm_90a"):
    """(cubin, info log) from nvJitLink for ``arch``."""
    from cuda.bindings import nvjitlink

    h = nvjitlink.create(2, [f"-arch={arch}", "-verbose"])
    nvjitlink.add_data(h, nvjitlink.InputType.PTX, ptx.encode(), len(ptx), "kernel")
    nvjitlink.complete(h)
    log = bytearray(nvjitlink.get_info_log_size(h))
    nvjitlink.get_info_log(h, log)
    cubin = bytearray(nvjitlink.get_linked_cubin_size(h))
    nvjitlink.get_linked_cubin(h, cubin)
    return bytes(cubin), log.decode(errors="replace")


#: --ptx-hashes: the last kernel's PTX hash, shown instead of its verdict (nothing is built)
HASHES = {"on": False, "last": None}
#: --only NAMES: the kernel names built (every kernel where empty); --sass DIR: where each
#: built kernel's SASS goes (None: nowhere)
ONLY = set()
SASS_DIR = [None]
SEEN = set()  # the kernel names met (an --only name never met is an error)


def take(name):
    """Whether this run builds the next kernel, named ``name``: its part (``--part``; the
    order advances for every kernel) and ``--only``."""
    SEEN.add(name)
    return mine() and (not ONLY or name in ONLY)


def option(flag):
    """The value after ``flag`` on the command line (None where the flag is absent)."""
    args = sys.argv[1:]
    if flag not in args:
        return None
    if args.index(flag) + 1 >= len(args):
        raise SystemExit(f"build_check: {flag} needs a value")
    return args[args.index(flag) + 1]


def keep_sass(sass, *label):
    """Write ``sass`` into the ``--sass`` folder, in a file named by ``label``."""
    if SASS_DIR[0] and sass:
        name = re.sub(r"[^\w.=-]+", "_", "_".join(str(x) for x in label)).strip("_")
        with open(os.path.join(SASS_DIR[0], name + ".sass"), "w") as f:
            f.write(sass)


def ptxas():
    """A CUDA toolkit's ptxas (PATH, then /usr/local/cuda*), or None."""
    found = glob.glob("/usr/local/cuda/bin/ptxas") + sorted(glob.glob("/usr/local/cuda-*/bin/ptxas"))
    return shutil.which("ptxas") or (found[-1] if found else None)


def build_whole(ptx, arch="sm_90a"):
    """(SASS, ptxas's log) of ``ptx`` compiled by ptxas as a whole program, as the driver's
    JIT builds it (launch.py's whole-program path); ("", None) without a ptxas."""
    tool = ptxas()
    if tool is None or HASHES["on"]:
        return build_sass(ptx, arch) if HASHES["on"] else ("", None)
    # (a toolkit's ptxas may be older than Numba's PTX version; setmaxnreg needs 8.0)
    text = re.sub(r"^\.version \d+\.\d+", ".version 8.0", ptx, flags=re.M)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.ptx"), "w") as f:
            f.write(text)
        r = subprocess.run([tool, f"-arch={arch}", "-v", "k.ptx", "-o", "k.cubin"], cwd=d,
                           capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"ptxas failed: {(r.stdout + r.stderr)[-2000:]}")
        with open(os.path.join(d, "k.cubin"), "rb") as f:
            return sass_of(f.read()), r.stdout + r.stderr


def normalised(text):
    """``text`` with every mangled name (``_Z...``: Numba numbers its functions in the order
    they are created, so one new device function renames every kernel after it) replaced by
    its rank of first appearance: two kernels whose code is the same compare equal."""
    names = {}
    return re.sub(r"_Z[\w$]+", lambda m: names.setdefault(m.group(0), f"_N{len(names)}"), text)


def build_sass(ptx, arch="sm_90a"):
    """(SASS, nvJitLink's info log) of ``ptx`` built for ``arch``; with --ptx-hashes only the
    hash of its kernel's text is kept, and nothing is built."""
    if HASHES["on"]:
        body = normalised(ptx[ptx.index(".visible .entry"):])
        HASHES["last"] = f"{arch} ptx sha256 {hashlib.sha256(body.encode()).hexdigest()}"
        return "", ""
    cubin, log = link(ptx, arch)
    return sass_of(cubin), log


def sass_of(cubin):
    """The SASS text of ``cubin`` (bytes), by cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        tool = cuobjdump()  # (it runs nvdisasm, found beside it in the wheels)
        path = os.pathsep.join([os.path.dirname(tool), os.environ.get("PATH", "")])
        env = dict(os.environ, PATH=path)
        return subprocess.run([tool, "-sass", f.name], capture_output=True, env=env,
                              text=True).stdout


def cuobjdump():
    for base in sys.path:
        hits = glob.glob(os.path.join(base, "nvidia", "**", "bin", "cuobjdump"), recursive=True)
        if hits:
            return hits[0]
    return "cuobjdump"


def _resources(ptx, log):
    """(registers, local-memory bytes, calls) of a kernel built by ``build_sass``: spill stores
    and the stack frame, where an array that was not put in registers lives (its accesses are
    not spills to ptxas, but local memory all the same: the selector's check, where it weighs
    a kernel's forms, refuses both)."""
    regs = re.findall(r"Used (\d+) registers", log)
    local = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", log)) + _stack_frame(log)
    return (regs[0] if regs else "?"), local, len(re.findall(r"\bcall(?:\.uni)?\s", ptx))


def _stack_frame(log):
    """The stack frame's bytes in a build's log (part of ``_resources``' local memory)."""
    return sum(int(n) for n in re.findall(r"(\d+) bytes stack frame", log))


#: The simple kernel's warp split-K keeps each lane's output (8 rows x 16 dims, fp32) in a
#: local array its loops index by variables: a stack frame of this many bytes, as built since
#: it was written (in registers, 128 more a lane beside the 228-231 it takes, it would not
#: fit); anything more, or any spill, fails
WSPLIT_STACK = 512


def toolchain_missing():
    """Why the sm_90a build cannot run here (None when it can)."""
    try:
        from cuda.bindings import nvjitlink, nvrtc
        from numba.cuda.cudadrv import nvvm

        nvvm.NVVM()
        nvrtc.nvrtcVersion()
        nvjitlink.version()
    except Exception as e:  # no NVVM / nvJitLink wheels (numba-cuda[cu13])
        return f"{type(e).__name__}: {e}"
    return None


#: (this part, parts) of ``--part i/n``: the kernels this run builds are those whose place in
#: the order below is i modulo n
PART = [0, 1]
_places = itertools.count()


def mine():
    """Whether this run builds the next kernel in the order (``--part``)."""
    return next(_places) % PART[1] == PART[0]


def verdict(ok):
    return HASHES["last"] if HASHES["on"] else ("ok" if ok else "FAIL")


def main():
    HASHES["on"] = "--ptx-hashes" in sys.argv[1:]
    part, only, SASS_DIR[0] = option("--part"), option("--only"), option("--sass")
    if part is not None:
        PART[:] = map(int, part.split("/"))
        assert 0 <= PART[0] < PART[1], "--part i/n needs 0 <= i < n"
    if only is not None:
        ONLY.update(only.split(","))
    if SASS_DIR[0] is not None:
        os.makedirs(SASS_DIR[0], exist_ok=True)
    missing = toolchain_missing()
    if missing:
        print(f"build_check: NVVM/nvJitLink not available ({missing}); "
              'pip install "numba-cuda[cu13]" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm')
        return 77
    bad = 0
    for mask, mod, tag, cache, heads, direct, tma in CASES:
        # TMA configurations run the seesaw kernel (kernels/seesaw.py) unless it spills, and
        # then the lockstep kernel's TMA variant: both are built
        variants = [("mma", factory.mma_partition_kernel(mask, mod, tag, cache, heads, direct,
                                                          tma))]
        if not tma:  # and its cp.async variant reading "e4m3" rows (converted in the block)
            variants.append(("mma8", factory.mma_partition_kernel(mask, mod, tag, cache, heads,
                                                                  direct, False, "e4m3")))
        if heads <= 16:  # the transposed kernel ("e4m3" rows at up to 16 query rows)
            variants.append(("tr8", factory.transposed_partition_kernel(mask, mod, tag, cache,
                                                                        heads, direct)))
        # and its 32-row block (past 16 query rows a sequence), at every case's heads
        variants.append(("tr8x32", factory.transposed_partition_kernel(mask, mod, tag, cache,
                                                                       heads, direct, 32)))
        # and its form with V's codes a step ahead, which the selector runs unless it spills
        # (spills allowed here: reported, not failed)
        variants.append(("tr8x32a", factory.transposed_partition_kernel(
            mask, mod, tag, cache, heads, direct, 32, selector.TRANSPOSED_V_AHEAD)))
        # and its 64-row block of two warpgroups (past 32), in both forms
        variants.append(("tr8x64", factory.transposed_partition_kernel(mask, mod, tag, cache,
                                                                       heads, direct, 64)))
        variants.append(("tr8x64a", factory.transposed_partition_kernel(
            mask, mod, tag, cache, heads, direct, 64, selector.TRANSPOSED_V_AHEAD)))
        if tma:
            variants.append(("seesaw", factory.seesaw_partition_kernel(mask, mod, tag, cache,
                                                                       heads, direct)))
            if not direct:  # the listed schedule's variant (its blocks from a table)
                variants.append(("listed", factory.seesaw_partition_kernel(
                    mask, mod, tag, cache, heads, False, listed=True)))
                # and the runs schedule's (its blocks walk items across sequences)
                variants.append(("runs", factory.seesaw_partition_kernel(
                    mask, mod, tag, cache, heads, False, runs=True)))
                # and its form for a table of whole sequences, which writes out itself
                variants.append(("runsd", factory.seesaw_partition_kernel(
                    mask, mod, tag, cache, heads, True, runs=True)))
                # and the mixed runs' (heuristics.MIXED_RUNS: whole sequences write out)
                variants.append(("runsm", factory.seesaw_partition_kernel(
                    mask, mod, tag, cache, heads, False, runs=True, mixed=True)))
            # and its form for "e4m3" rows, which the selector runs unless it spills (spills
            # allowed here: reported, not failed)
            variants.append(("seesaw8", factory.seesaw_partition_kernel(
                mask, mod, tag, cache, heads, direct, fp8="e4m3")))
            # and with its converter warpgroup (selector.SEESAW_CONVERTER; a whole program)
            variants.append(("seesaw8c", factory.seesaw_partition_kernel(
                mask, mod, tag, cache, heads, direct, fp8="e4m3", converter=True)))
        for name, kern in variants:
            if not take(name):
                continue
            sig = list(signature(direct or name == "runsd",
                                 name in ("listed", "runs", "runsd", "runsm"), name == "runsm"))
            if name in ("mma8", "tr8", "tr8x32", "tr8x32a", "tr8x64", "tr8x64a", "seesaw8",
                        "seesaw8c"):  # cache: codes;
                # complex scale
                sig[6] = types.complex64
            ptx, _ = cuda.compile_ptx(kern.py_func, tuple(sig), cc=(9, 0, "a"),
                                      launch_bounds=kern.targetoptions.get("launch_bounds"))
            if getattr(kern, "whole_program", False):
                sass, log = build_whole(ptx)
                if log is None:
                    print(f"{name:6} {mask!r:40.40} {tag} {cache.kind:10} H={heads:<3} "
                          f"direct={direct!s:5}  not built: no ptxas for a whole program")
                    continue
            else:
                sass, log = build_sass(ptx)
            regs, local, calls = _resources(ptx, log)
            keep_sass(sass, name, repr(mask), tag, cache.kind, f"H={heads}", f"direct={direct}")
            hgmma = len(re.findall(r"HGMMA\.64x(?:64|32|256|16)x16", sass))
            serial = "serialized" in log
            # lockstep: 36 for S and 4 for P V; transposed: 36 for S^T and 32 for O^T
            # (m64n16k16; the 32-row block's m64n32k16); its 64-row block 18 + 16 a warpgroup
            # (m64n64k16); the seesaw forms: seesaw.wgmma_count of the build's own flags
            counts = {"mma": 40, "mma8": 40, "tr8": 68, "tr8x32": 68, "tr8x32a": 68,
                      "tr8x64": 34, "tr8x64a": 34}
            want = counts[name] if name in counts else seesaw.wgmma_count(
                getattr(kern, "s_unroll", False), getattr(kern, "s8_unroll", False),
                "e4m3" if name.startswith("seesaw8") else None, name == "seesaw8c")
            ok = ((not local or name in ("tr8x32a", "tr8x64a", "seesaw8", "seesaw8c"))
                  and calls == 0 and not serial and hgmma == want)
            if name == "seesaw8c":  # both setmaxnreg kept (whole program)
                ok = ok and len(re.findall(r"USETMAXREG", sass)) == 2 or HASHES["on"]
            if name in ("seesaw", "listed", "runs", "runsd", "runsm"):  # evict-first from LAG_HEADS
                ok = ok and ("createpolicy" in ptx) == (heads >= seesaw.LAG_HEADS)
            bad += not ok
            print(f"{name:6} {mask!r:40.40} {tag} {cache.kind:10} H={heads:<3} "
                  f"direct={direct!s:5} tma={tma!s:5} regs={regs} local={local} "
                  f"calls={calls} HGMMA={hgmma} serialized={serial}  {verdict(ok)}")
    # The FMA kernels: simt at each case's rows per block, simple at its one (simple.BLOCK_M);
    # 16-bit storage, then the FP8 layouts
    fma = [(name, mask, tag, cache, heads, direct, None, simt_signature(tag, direct),
            make(mask, mod, tag, cache, rows or block_m, heads, direct))
           for name, make, rows in (("simt", factory.partition_kernel, None),
                                    ("simple", factory.simple_partition_kernel, simple.BLOCK_M))
           for mask, mod, tag, cache, block_m, heads, direct in SIMT_CASES]
    fma += [("wsplit", mask, tag, cache, heads, direct, None, simt_signature(tag, direct),
             factory.warpsplit_partition_kernel(mask, mod, tag, cache, heads, direct))
            for mask, mod, tag, cache, _, heads, direct in SIMT_CASES]  # warp split-K
    fma += [("simtws", mask, tag, cache, heads, direct, None, simt_signature(tag, direct),
             factory.partition_kernel(mask, mod, tag, cache, 16, heads, direct, groups=2))
            for mask, mod, tag, cache, _, heads, direct in SIMT_CASES
            if tag != "f32"]  # the FMA kernel's warp split-K: 16 rows of 16-bit data
    for mask, mod, _, cache, _, heads, direct in SIMT_CASES[3:]:  # the simple kernel's on FP8
        fma.append(("wsplit", mask, "bf16", cache, heads, direct, "e4m3",
                    fp8_signature("bf16", direct),
                    factory.warpsplit_partition_kernel(mask, mod, "bf16", cache, heads, direct,
                                                       "e4m3")))
    for mask, mod, tag, cache, block_m, heads, direct, layout in FP8_CASES:
        fma += [("simt", mask, tag, cache, heads, direct, layout, fp8_signature(tag, direct),
                 factory.partition_kernel(mask, mod, tag, cache, block_m, heads, direct, True,
                                          layout)),
                ("simple", mask, tag, cache, heads, direct, layout, fp8_signature(tag, direct),
                 factory.simple_partition_kernel(mask, mod, tag, cache, simple.BLOCK_M, heads,
                                                 direct, layout))]
    for name, mask, tag, cache, heads, direct, layout, sig, kern in fma:
        if not take(name):
            continue
        ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0, "a"),
                                  launch_bounds=kern.targetoptions.get("launch_bounds"))
        sass, log = build_sass(ptx)
        regs, local, calls = _resources(ptx, log)
        keep_sass(sass, name, repr(mask), tag, cache.kind, f"H={heads}", f"direct={direct}",
                  f"fp8={layout}")
        allowed = WSPLIT_STACK if name == "wsplit" and _stack_frame(log) == WSPLIT_STACK else 0
        ok = local == allowed and calls == 0
        bad += not ok
        print(f"{name:6} {mask!r:40.40} {tag} {cache.kind:10} H={heads:<3} "
              f"direct={direct!s:5} fp8={layout} regs={regs} local={local} "
              f"calls={calls}  {verdict(ok)}")
    # The warp tensor-core kernel for Ampere and Ada, then reading FP8 rows (sm_89: the e4m3
    # conversions), both layouts, loaded by the warps (Ada) or staged through shared memory
    # (one stage or two)
    builds = [(cc, mask, mod, tag, cache, block_m, heads, direct, None, False)
              for cc in ((8, 0), (8, 9)) for mask, mod, tag, cache, block_m, heads in MMA_SYNC_CASES
              for direct in (False, True)]
    builds += [((8, 9), nm.CausalMask(), nm.SoftCapScoreMod(2.0), tag, nm.PagedKVCache, rows,
                heads, direct, layout, staged)
               for layout, tag in (("e4m3", "bf16"), ("v32", "f16")) for direct in (False, True)
               for rows, heads in ((16, 16), (32, 20)) for staged in (0, 1, 2)]
    # ... and as the H200 runs the FP8 benchmark's "e4m3" rows (sm_90, 16 heads in the 32-row
    # block, two stages; one stage spills there, 72 bytes at 3cd4672, as "v32" rows' one
    # stage does, 84 bytes: they run it, two stages being slower)
    builds += [((9, 0), nm.NullMask(), nm.IdentityScoreMod(), "bf16", nm.PagedKVCache, 32, 16,
                False, "e4m3", 2)]
    for cc, mask, mod, tag, cache, block_m, heads, direct, layout, staged in builds:
        if not take("msync"):
            continue
        kern = factory.mma_sync_partition_kernel(mask, mod, tag, cache, block_m, heads, direct,
                                                 layout, True, staged)
        ptx, _ = cuda.compile_ptx(kern.py_func, mma_sync_signature(tag, direct, layout), cc=cc,
                                  launch_bounds=kern.targetoptions.get("launch_bounds"))
        sass, log = build_sass(ptx, f"sm_{cc[0]}{cc[1]}")
        regs, local, calls = _resources(ptx, log)
        keep_sass(sass, "msync", repr(mask), tag, cache.kind, f"M={block_m}", f"H={heads}",
                  f"direct={direct}", f"sm_{cc[0]}{cc[1]}", f"fp8={layout}", f"staged={staged}")
        mmas = ptx.count("mma.sync.aligned.m16n8k16")
        hmma = len(re.findall(r"HMMA\.16816", sass))
        # 4 a step of S's loop (unrolled as the compiler likes), 32 a step of P V's, every
        # one an HMMA in the SASS
        ok = not local and calls == 0 and mmas >= 36 and hmma >= mmas
        bad += not ok
        stages = f"/staged{staged}" if staged else ""
        print(f"msync  {mask!r:40.40} {tag} {cache.kind:10} M={block_m:<2} H={heads:<3} "
              f"direct={direct!s:5} sm_{cc[0]}{cc[1]} fp8={layout}{stages} "
              f"regs={regs} local={local} "
              f"calls={calls} mma.sync={mmas} HMMA={hmma}  {verdict(ok)}")
    # ... and its 32-row block's split-role form (kernels/mma_sync_roles.py; 16-bit rows),
    # with 3 stages (an A100) and 4 (more shared memory; an Ada GPU's 99 KB take neither), the
    # four-stage form also for sm_90 (where the selector takes it): S and P V written out,
    # every one an HMMA
    # (S of the next sub-tile ahead, the four-stage default, only for sm_90: for sm_80 it
    # spills, and no sm_8x GPU gives a block four stages, so the four-stage sm_80 build, a
    # form no GPU runs today, is S in turn: it checks that form's instructions)
    from numba_mla.kernels import mma_sync_roles

    # (and the form with eight V warps, off: 12 warps a block at 168 registers; and the score
    # work in quarters, off)
    default_ahead, default_v_warps = mma_sync_roles.S_AHEAD, mma_sync_roles.V_WARPS
    default_quarters = mma_sync_roles.SCORE_QUARTERS
    for stages, cc, v_warps, quarters in ((3, (8, 0), 4, False), (4, (8, 0), 4, False),
                                          (4, (9, 0), 4, False), (4, (9, 0), 8, False),
                                          (4, (8, 0), 4, True), (4, (9, 0), 4, True)):
        mma_sync_roles.S_AHEAD = default_ahead and cc >= (9, 0)
        mma_sync_roles.V_WARPS = v_warps
        mma_sync_roles.SCORE_QUARTERS = quarters
        for mask, mod, tag, cache, block_m, heads in MMA_SYNC_CASES:
            for direct in (False, True) if block_m == 32 else ():
                if not take("mroles"):
                    continue
                kern = factory.mma_sync_roles_partition_kernel(mask, mod, tag, cache, heads,
                                                               direct, True, stages)
                ptx, _ = cuda.compile_ptx(kern.py_func, mma_sync_signature(tag, direct), cc=cc,
                                          launch_bounds=kern.targetoptions.get("launch_bounds"))
                sass, log = build_sass(ptx, f"sm_{cc[0]}{cc[1]}")
                regs, local, calls = _resources(ptx, log)
                keep_sass(sass, "mroles", repr(mask), tag, cache.kind, f"H={heads}",
                          f"direct={direct}", f"sm_{cc[0]}{cc[1]}", f"stages={stages}",
                          f"v_warps={v_warps}", f"quarters={quarters}")
                mmas = ptx.count("mma.sync.aligned.m16n8k16")
                hmma = len(re.findall(r"HMMA\.16816", sass))
                # (S: 18 steps of 4; P V: two steps of a V warp's 512 / v_warps / 8 n8 tiles
                # for each of the two m16 tiles)
                ok = (not local and calls == 0 and mmas >= 18 * 4 + 2 * 2 * (512 // v_warps // 8)
                      and hmma >= mmas and kern.form["score_quarters"] == quarters)
                bad += not ok
                print(f"mroles {mask!r:40.40} {tag} {cache.kind:10} H={heads:<3} "
                      f"direct={direct!s:5} sm_{cc[0]}{cc[1]} stages={stages} "
                      f"ahead={kern.form['s_ahead']:d} v_warps={kern.form['v_warps']} "
                      f"quarters={kern.form['score_quarters']:d} regs={regs} "
                      f"local={local} "
                      f"calls={calls} mma.sync={mmas} HMMA={hmma}  {verdict(ok)}")
    mma_sync_roles.S_AHEAD, mma_sync_roles.V_WARPS = default_ahead, default_v_warps
    mma_sync_roles.SCORE_QUARTERS = default_quarters
    # The clamp of device row offsets that runs before a ragged call's partition kernel
    from numba_mla.kernels import offsets

    sig = (types.Array(types.int32, 1, "C"),) * 2 + (types.int32,)
    for cc in ((8, 0), (9, 0, "a")):
        if not take("clamp_offsets"):
            continue
        ptx, _ = cuda.compile_ptx(offsets.clamp_offsets.py_func, sig, cc=cc)
        sass, log = build_sass(ptx, "sm_" + "".join(map(str, cc)))
        regs, local, calls = _resources(ptx, log)
        keep_sass(sass, "clamp_offsets", "sm_" + "".join(map(str, cc)))
        ok = not local and calls == 0
        bad += not ok
        print(f"clamp_offsets sm_{''.join(map(str, cc))} regs={regs} local={local} "
              f"calls={calls}  {verdict(ok)}")
    if ONLY - SEEN:
        print(f"build_check: --only names no kernel: {', '.join(sorted(ONLY - SEEN))} "
              f"(names: {', '.join(sorted(SEEN))})")
        return 1
    return 1 if bad and not HASHES["on"] else 0


if __name__ == "__main__":
    sys.exit(main())
