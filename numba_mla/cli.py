"""The ``numba-mla`` command.

    numba-mla validate [--full|--quick] [--backend B]     kernels vs the float64 reference
    numba-mla bench [--sweep S] [--out JSON] [--csv CSV]  timings, ours beside the peers'
    numba-mla plot [--json JSON] [--out-dir DIR]          figures from a bench JSON
"""
import argparse
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="numba-mla", description="MLA decode kernels in Numba CUDA")
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check the kernels against the NumPy reference",
                       description="Run a sweep of configurations and compare every result with "
                                   "the float64 reference; exits non-zero if any case fails. "
                                   "Tiny shapes on the CUDA simulator (NUMBA_ENABLE_CUDASIM=1), "
                                   "real ones on a GPU.")
    size = v.add_mutually_exclusive_group()
    size.add_argument("--full", dest="full", action="store_true", default=None,
                      help="the GPU-sized sweep (default on a GPU; refused on the simulator, "
                           "where one of its cases would take hours)")
    size.add_argument("--quick", dest="full", action="store_false",
                      help="the simulator-sized sweep (default on the simulator)")
    v.add_argument("--backend", default="auto",
                   choices=["auto", "simt", "mma", "mma_sync", "simple", "reference"],
                   help="kernel to check: auto (the library's choice: wgmma tensor cores for "
                        "16-bit data on sm_90, warp tensor cores on sm_80+, else FMA), simt "
                        "(FMA), mma (wgmma tensor cores), mma_sync (warp tensor cores), "
                        "simple (the readable FMA kernel), reference")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--limit", type=int, default=None, help="run only the first N cases")
    _add_bench(sub)
    _add_plot(sub)
    args = ap.parse_args(argv)  # --help exits here, before any banner
    if args.command in ("validate", "bench"):  # the commands that run kernels
        _ensure_simulator_without_gpu(argv)
    if args.command == "validate":
        from . import _compat, validate

        if _compat.SIMULATOR and args.full:
            print(validate.FULL_ON_SIMULATOR, file=sys.stderr)
            return 2
        return 1 if validate.main(args.full, args.backend, args.seed, args.limit) else 0
    if args.command == "bench":
        return _bench(args)
    if args.command == "plot":
        return _plot(args)
    return 2


def _add_bench(sub):
    import textwrap

    from .bench import KERNEL_BACKENDS, SWEEPS

    b = sub.add_parser(
        "bench", help="time the kernels beside torch and any importable peer; JSON + CSV",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
                    "Time MLA decode on this GPU: every numba_mla kernel backend "
                    f"({', '.join(KERNEL_BACKENDS)}), torch (two bmm on a contiguous cache; "
                    "gather from pages + bmm) and FlashMLA / FlashInfer / vLLM's Triton decode "
                    "when importable (a provider that cannot run is skipped with the reason). "
                    "CUDA events, warm-up, median and p10/p90, the L2 flushed before each timed "
                    "run, fresh random data; every row's error is measured against the float64 "
                    "reference. The copy bandwidth and dense bf16 rate are measured first. "
                    "Prints a table, writes JSON and CSV, and exits 1 when a numba_mla row's "
                    "error exceeds the tolerance (2e-2 for bf16) or a numba_mla run fails.", 79),
        epilog="sweeps:\n"
               "  default  64x16x4096 128x16x8192 64x128x4096 128x128x1024 16x128x32768\n"
               "           1x128x65536 (B x H x L), bf16, page 64\n"
               "  lengths  L = 512 .. 65536 for H = 16 and 128 at B = 64\n"
               "  splitk   B=1 H=128 L=65536: the library's split-K choice, then P = 1 .. 64\n"
               "  varlen   the default shapes with lengths uniform in [L(1-s), L(1+s)],\n"
               "           s = 0, 0.25, 0.5 (seeded; s and the lengths' range in each row)\n"
               "  fp8      64x16x4096 128x16x8192 64x128x4096 128x128x1024 with the cache\n"
               "           in bf16, then quantized: e4m3 (576 bytes a token), v32 (656)\n"
               "  all      default + lengths + splitk\n"
               "  tiny     simulator-sized shapes (the default without a GPU, where the\n"
               "           other sweeps run only with --shapes)\n\n"
               "How bytes and FLOPs are counted, the ceilings and the peers: "
               "docs/performance.md")
    b.add_argument("--sweep", choices=list(SWEEPS), default=None,
                   help="which configurations (default: 'default' on a GPU, 'tiny' on the "
                        "simulator)")
    b.add_argument("--out", default=None, metavar="JSON",
                   help="JSON output (default: plots/bench_<device>.json)")
    b.add_argument("--csv", default=None, metavar="CSV",
                   help="CSV output of the rows (default: the JSON path with .csv)")
    b.add_argument("--providers", default=None, metavar="LIST",
                   help="comma-separated providers (default: all): numba_mla (every kernel "
                        "backend), numba_mla:simt, numba_mla:mma, torch_bmm, torch_gather, "
                        "flash_mla, flashinfer, vllm_triton")
    b.add_argument("--shapes", default=None, metavar="BxHxL,...",
                   help="replace the sweep's shapes (default, varlen, fp8 and tiny sweeps), "
                        "e.g. 2x1x12")
    b.add_argument("--page-size", type=int, default=None,
                   help="page size of every configuration (default 64; tiny: its own)")
    b.add_argument("--iters", type=int, default=None,
                   help="timed runs per row (default 30 on a GPU, 1 on the simulator)")
    b.add_argument("--commit", default=None,
                   help="commit to record (default: git rev-parse --short HEAD of the checkout)")
    b.add_argument("--limit", type=int, default=None, help="run only the first N configurations")
    b.add_argument("--seed", type=int, default=0,
                   help="seed of the random data and of the varlen sweep's lengths")
    b.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")


def _add_plot(sub):
    p = sub.add_parser(
        "plot", help="figures (PNG) from a bench JSON file",
        description="Render figures from a `numba-mla bench` JSON file into a directory: "
                    "latency_vs_length.png (GPU time vs cache length per head count and "
                    "provider, log-log), roofline.png (achieved TFLOP/s vs arithmetic intensity "
                    "under the measured copy-bandwidth and dense-bf16 ceilings), splitk.png "
                    "(GPU time vs split-K factor on one long sequence), latency_vs_spread.png "
                    "(GPU time vs the spread of the lengths, from the varlen sweep), "
                    "host_overhead.png (Python call cost beyond the GPU time); headline.md and "
                    "varlen.md (tables); from scripts/host_overhead.py's JSON, host_paths.png. "
                    "Each is stamped with the run's device, date and commit; "
                    "a figure whose rows are absent is skipped with a message.")
    p.add_argument("--json", default=None,
                   help="bench JSON, or scripts/host_overhead.py's (default: the newest "
                        "plots/bench_*.json)")
    p.add_argument("--out-dir", default="plots", help="where the PNGs go (default: plots)")


def _parse_shapes(text):
    """``"64x16x4096,2x1x12"`` -> [(64, 16, 4096), (2, 1, 12)]."""
    shapes = []
    for part in text.split(","):
        try:
            B, H, L = (int(x) for x in part.strip().lower().split("x"))
        except ValueError:
            raise ValueError(f"--shapes: expected BxHxL[,BxHxL...], got {part.strip()!r}") from None
        if min(B, H, L) < 1:
            raise ValueError(f"--shapes: B, H and L must be at least 1, got {part.strip()!r}")
        shapes.append((B, H, L))
    return shapes


def _configs(args, simulator):
    """The configurations a ``bench`` command line asks for, and the sweep's name."""
    import dataclasses

    from . import bench

    sweep = args.sweep or ("tiny" if simulator else "default")
    if args.shapes:
        shapes = _parse_shapes(args.shapes)
        if sweep == "varlen":
            configs = bench.varlen_sweep(shapes)
        elif sweep == "fp8":
            configs = bench.fp8_sweep(shapes)
        elif sweep in ("default", "tiny"):
            configs = [bench.Config(B, H, L, sweep=sweep) for B, H, L in shapes]
        else:
            raise ValueError(f"--shapes: applies to the default, varlen, fp8 and tiny sweeps, "
                             f"not {sweep!r}")
    else:
        if simulator and sweep != "tiny":
            print(f"numba-mla bench: on the CUDA simulator: the 'tiny' sweep instead of {sweep!r} "
                  "(pass --shapes for small shapes of another sweep)")
            sweep = "tiny"
        configs = bench.SWEEPS[sweep]()
    if args.page_size is not None:
        configs = [dataclasses.replace(c, page_size=args.page_size) for c in configs]
    return sweep, configs[:args.limit]


def _bench(args):
    import os

    from . import _compat, bench

    try:
        sweep, configs = _configs(args, _compat.SIMULATOR)
        providers = bench.select_providers(args.providers)
    except ValueError as e:
        print(f"numba-mla bench: {e}", file=sys.stderr)
        return 2
    settings = bench.Settings.simulator() if _compat.SIMULATOR else bench.Settings.gpu()
    if args.iters is not None:
        settings.iters = max(1, args.iters)
    result = bench.run(configs, providers, settings, seed=args.seed, commit=args.commit,
                       progress=args.progress, sweep=sweep)
    slug = bench.device_slug(result["meta"]["device"])
    out = args.out or os.path.join("plots", f"bench_{slug}.json")
    csv_path = args.csv or (os.path.splitext(out)[0] + ".csv")
    bench.write_json(result, out)
    bench.write_csv(result["rows"], csv_path)
    print(bench.format_table(result["rows"]))
    notes = bench.format_notes(result["meta"])
    if notes:
        print(notes)
    print(f"wrote {out} and {csv_path} ({len(result['rows'])} rows)")
    bad = bench.failures(result)
    for line in bad:
        print(f"FAILED {line}")
    if bad:
        print(f"numba-mla bench: validation failed ({len(bad)})")
    return 1 if bad else 0


def _plot(args):
    from . import plot

    try:
        written = plot.main(args.json, args.out_dir)
    except FileNotFoundError as e:
        print(f"numba-mla plot: {e}", file=sys.stderr)
        return 2
    return 0 if written else 1


def _ensure_simulator_without_gpu(argv):
    """Without a GPU, run on Numba's CUDA simulator. The choice must precede the first import
    of numba.cuda, which importing this package already did: start again with it set."""
    import os

    from . import _compat

    if _compat.AUTO_SIMULATOR:  # importing the package chose it: say so here, not as a warning
        _compat.quiet_simulator_notice()
        print("numba-mla: no CUDA GPU found; running on the CUDA simulator (tiny shapes)",
              flush=True)
        return
    if _compat.SIMULATOR or "NUMBA_ENABLE_CUDASIM" in os.environ or _compat.gpu_present():
        return
    print("numba-mla: no CUDA GPU found; running on the CUDA simulator (tiny shapes)", flush=True)
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    args = sys.argv[1:] if argv is None else list(argv)
    os.execv(sys.executable, [sys.executable, "-m", "numba_mla.cli", *args])


if __name__ == "__main__":
    sys.exit(main())
