"""``numba-mla bench``: time MLA decode, ours beside the peers', and record it as JSON and CSV.

One module a concern:

- ``configs``: the sweeps as data (``Config`` rows, ``SWEEPS``) and ``Settings``;
- ``problems``: a configuration's inputs on the device (the tests' paged layout), the bytes
  and FLOPs a call must move and compute (``count``), the float64 reference;
- ``timing``: the one GPU timer (``Device``, ``time_gpu``: CUDA events, warm-up, median and
  p10/p90, L2 flushed before each run) and the host clocks (``time_host``, ``host_costs``);
- ``providers``: one ``prepare(problem) -> Prepared`` function per provider (numba_mla's
  backends, torch, FlashMLA / FlashInfer / vLLM's Triton decode when importable);
- ``report``: rows, validation, JSON, CSV, the terminal table, the run's metadata;
- ``runner``: ``run`` (configurations x providers).

How bytes and FLOPs are counted, the ceilings and how every figure is timed:
docs/performance.md.
"""
from .configs import (  # noqa: F401
    DTYPES, LENGTHS, MASK_NAMES, PERF_SHAPES, SCALE, SPLITS, SPREADS, SWEEPS, TOLERANCE,
    VARLEN_SHAPES, Config, Settings, default_sweep, lengths_sweep, make_mask, splitk_sweep,
    fp8_sweep, tiny_sweep, varlen_sweep)
from .problems import (  # noqa: F401
    D_QK, D_V, UNUSED_PAGE, Problem, count, draw_lengths, make_problem)
from .providers import (  # noqa: F401
    KERNEL_BACKENDS, Prepared, Provider, Skip, all_providers, select_providers)
from .report import (  # noqa: F401
    COUNTING, ROW_KEYS, clean, device_slug, failures, format_notes, format_table,
    from_bench_simt, git_commit, rel_err, stamp, write_csv, write_json)
from .runner import run  # noqa: F401
from .timing import Device, host_costs, time_gpu, time_host  # noqa: F401
