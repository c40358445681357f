"""The ``numba-mla`` command: ``numba-mla validate [--full|--quick] [--backend B]``."""
import argparse
import sys


def main(argv=None):
    _ensure_simulator_without_gpu(argv)
    ap = argparse.ArgumentParser(prog="numba-mla", description="MLA decode kernels in Numba CUDA")
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check the kernels against the NumPy reference",
                       description="Run a sweep of configurations and compare every result with "
                                   "the float64 reference; exits non-zero if any case fails. "
                                   "Tiny shapes on the CUDA simulator (NUMBA_ENABLE_CUDASIM=1), "
                                   "real ones on a GPU.")
    size = v.add_mutually_exclusive_group()
    size.add_argument("--full", dest="full", action="store_true", default=None,
                      help="the GPU-sized sweep (default on a GPU)")
    size.add_argument("--quick", dest="full", action="store_false",
                      help="the simulator-sized sweep (default on the simulator)")
    v.add_argument("--backend", default="auto", choices=["auto", "simt", "reference"])
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--limit", type=int, default=None, help="run only the first N cases")
    args = ap.parse_args(argv)
    if args.command == "validate":
        from . import validate

        return 1 if validate.main(args.full, args.backend, args.seed, args.limit) else 0
    return 2


def _ensure_simulator_without_gpu(argv):
    """Without a GPU, run on Numba's CUDA simulator. The choice must precede the first import
    of numba.cuda, which importing this package already did: start again with it set."""
    import os

    from . import _compat

    if _compat.SIMULATOR or "NUMBA_ENABLE_CUDASIM" in os.environ or _compat.gpu_present():
        return
    print("numba-mla: no CUDA GPU found; running on the CUDA simulator (tiny shapes)", flush=True)
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    args = sys.argv[1:] if argv is None else list(argv)
    os.execv(sys.executable, [sys.executable, "-m", "numba_mla.cli", *args])


if __name__ == "__main__":
    sys.exit(main())
