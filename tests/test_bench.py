"""``numba-mla bench``, ``numba-mla plot``, the command line's manners and
``scripts/host_overhead.py`` (and the figure ``plot`` draws from its file): the code paths, on
tiny configurations.

On the CUDA simulator the timings mean nothing; what is checked is that the sweeps run end
to end through the command line (numba_mla's "simt" provider, error against the float64
reference), that the JSON and CSV have the documented schema, that ``plot`` renders every
figure from a JSON file (the one a run here just wrote, and ``tests/data/bench_sample.json``,
the rows of a real H200 run, ``plots/simt_h200.json``, in this schema), that the varlen
sweep's lengths are seeded and inside their stated range, that tables and figures show no
negative overhead as a cost, and that the command line prints its simulator banner only for
the commands that run kernels. The GPU sweep itself is ``@pytest.mark.gpu``.
"""
import csv
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import numba_mla as nm
from numba_mla import _compat, bench, cli, plot
from numba_mla.arrays import to_host
from numba_mla.bench import providers

#: The tiny sweep's code path on the simulator (host arrays, NaN past each length); on a GPU
#: the same code runs with torch tensors, checked by the real run (plots/bench_h200.json).
SIMULATOR_ONLY = pytest.mark.skipif(not _compat.SIMULATOR,
                                    reason="checks the simulator's tiny-sweep data path")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "tests", "data", "bench_sample.json")
H200_RUN = os.path.join(ROOT, "plots", "simt_h200.json")
META_KEYS = ("device", "date", "commit", "versions", "copy_gbps", "matmul_tflops", "skipped",
             "errors", "counting")


def _pngs(directory, leave_out=()):
    return {name: os.path.join(directory, f"{name}.png") for name in plot.FIGURES
            if name not in leave_out}


@pytest.mark.kernel
@SIMULATOR_ONLY
def test_bench_cli_end_to_end(tmp_path, capsys):
    """Two tiny configurations (a paged cache over two pages; Sq = 2 under a causal mask with
    NaN past the length) through ``numba-mla bench``, then ``numba-mla plot`` on its JSON."""
    out, csv_path = tmp_path / "b.json", tmp_path / "b.csv"
    rc = cli.main(["bench", "--sweep", "tiny", "--limit", "2", "--providers", "numba_mla:simple",
                   "--out", str(out), "--csv", str(csv_path), "--commit", "test123",
                   "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "numba_mla:simple" in printed and "rel_err" in printed  # the table

    doc = json.loads(out.read_text())
    meta, rows = doc["meta"], doc["rows"]
    for key in META_KEYS:
        assert key in meta, key
    assert meta["commit"] == "test123" and meta["simulator"] is True
    assert "docs/performance.md" in meta["counting"]
    assert {"numba", "numba_cuda", "numpy", "torch"} <= set(meta["versions"])
    assert meta["copy_gbps"] > 0 and meta["errors"] == []
    assert len(rows) == 2
    for r in rows:
        for key in bench.ROW_KEYS:
            assert key in r, key
        assert (r["provider"], r["backend"], r["dtype"]) == ("numba_mla", "simple", "bfloat16")
        assert 0 <= r["rel_err"] < 2e-2
        assert r["us"] > 0 and r["gbps"] > 0 and r["tflops"] > 0
        assert r["host_us"] > 0 and r["ref_subset"] == "all"
        assert r["blocks"] >= 1 and r["num_partitions"] >= 1  # (the partition kernel's grid)
        assert r["schedule"] == "balanced"
        # the simulator measures no GPU time without the flush: no overhead, not a negative one
        assert r["us_warm"] is None and r["overhead_us"] is None
    first, second = rows
    assert (first["batch"], first["heads"], first["seqlen"], first["page_size"]) == (1, 2, 16, 8)
    assert (second["sq"], second["mask"]) == (2, "causal")
    # docs/performance.md's counts: cache rows once, q in, out back; 2 * 1088 FLOPs per pair
    # per head
    assert first["bytes"] == 2 * (16 * 576 + 2 * (576 + 512))
    assert first["flops"] == 2 * 2 * 16 * (576 + 512)
    assert second["flops"] == 2 * 1 * (9 + 10) * (576 + 512)  # causal: 9 then 10 keys

    with open(csv_path, newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 2
    assert list(table[0])[:len(bench.ROW_KEYS)] == list(bench.ROW_KEYS)
    assert float(table[1]["rel_err"]) == pytest.approx(second["rel_err"])

    figs = tmp_path / "figs"
    assert cli.main(["plot", "--json", str(out), "--out-dir", str(figs)]) == 0
    for name, path in _pngs(figs, leave_out=("host_overhead", "latency_vs_spread")).items():
        assert os.path.getsize(path) > 0, name
    assert not os.path.exists(figs / "host_overhead.png")   # nothing measured, nothing drawn


def test_plot_renders_every_figure_from_the_h200_run(tmp_path, capsys):
    """Every figure but the varlen sweep's, which the run has no rows for (said so)."""
    assert cli.main(["plot", "--json", SAMPLE, "--out-dir", str(tmp_path)]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "skipped" in line]
    assert said == ["numba-mla plot: skipped latency_vs_spread: no rows of the varlen sweep "
                    "(numba-mla bench --sweep varlen)"]
    for name, path in _pngs(tmp_path, leave_out=("latency_vs_spread",)).items():
        assert os.path.isfile(path) and os.path.getsize(path) > 1000, name
    table = (tmp_path / "headline.md").read_text()
    assert "| 64 x 16 x 4096 | 772 (394 GB/s)" in table and "torch_bmm" in table


def test_sample_is_the_h200_run_in_this_schema():
    """The fixture keeps the measured values of plots/simt_h200.json (and says so)."""
    with open(SAMPLE) as f:
        sample = json.load(f)
    with open(H200_RUN) as f:
        source = json.load(f)
    assert "simt_h200.json" in sample["meta"]["source"]
    assert sample["meta"]["device"] == source["meta"]["device"] == "NVIDIA H200"
    assert len(sample["rows"]) == len(source["rows"])
    for got, was in zip(sample["rows"], source["rows"]):
        for key in bench.ROW_KEYS:
            assert key in got, key
        for key in ("provider", "backend", "batch", "heads", "seqlen", "us", "us_p10", "us_p90",
                    "gbps", "tflops", "rel_err", "device"):
            assert got[key] == was[key], key
        assert got["host_us"] == was.get("call_us")
    assert bench.clean(bench.from_bench_simt(source)) == sample


def test_plot_skips_figures_without_rows(tmp_path):
    with open(SAMPLE) as f:
        doc = json.load(f)
    for r in doc["rows"]:
        r.pop("host_us", None)
        r["num_partitions"] = None
    path = tmp_path / "x.json"
    path.write_text(json.dumps(doc))
    said = []
    written = plot.main(str(path), str(tmp_path / "figs"), log=said.append)
    assert sorted(os.path.basename(p) for p in written) == ["latency_vs_length.png",
                                                           "roofline.png"]
    for name in ("splitk", "host_overhead", "latency_vs_spread"):
        assert any(f"skipped {name}" in s for s in said), name


def test_count_matches_the_performance_note():
    B, H, L = 64, 16, 4096
    nbytes, flops = bench.count(np.full(B, L), 1, H, nm.NullMask())
    assert nbytes == B * L * 576 * 2 + B * H * 576 * 2 + B * H * 512 * 2
    assert flops == 2 * B * H * L * (576 + 512)
    # a window keeps 256 keys of each sequence
    nbytes, flops = bench.count(np.array([4096]), 1, H, nm.SlidingWindowCausalMask(256))
    assert flops == 2 * H * 256 * (576 + 512)


@SIMULATOR_ONLY
def test_versions_of_a_peer_built_from_source(monkeypatch, tmp_path):
    """A peer imported from a folder (no installed distribution, as the FlashMLA build the
    H200 runs use) shows its module's version and folder once imported, None before."""
    from numba_mla.bench import report

    monkeypatch.delitem(sys.modules, "flash_mla", raising=False)
    assert report.versions(None)["flash_mla"] is None
    fake = type(sys)("flash_mla")
    fake.__version__, fake.__file__ = "1.0.0", str(tmp_path / "flash_mla" / "__init__.py")
    monkeypatch.setitem(sys.modules, "flash_mla", fake)
    assert report.versions(None)["flash_mla"] == f"1.0.0 from {tmp_path / 'flash_mla'}"


def test_problem_paged_varlen(rng):
    """Spread lengths, a shuffled block table with unused entries out of range, NaN past
    each length: the cache the library gets, the token index torch gets, and the reference."""
    cfg = bench.Config(3, 2, 20, page_size=4, spread=0.5, mask="causal", sq=2)
    p = bench.make_problem(cfg, bench.Device(), rng, bench.Settings.simulator(ref_seqs=2))
    lengths = p.lengths_host
    assert cfg.length_range == (10, 30)
    assert 10 <= lengths.min() and lengths.max() <= 30
    assert p.ref_subset.startswith("sequences 0..1")
    used = -(-lengths // 4)
    width = p.block_table_host.shape[1]
    assert width == used.max()
    unused = np.arange(width)[None, :] >= used[:, None]
    assert (p.block_table_host[unused] == bench.UNUSED_PAGE).all()
    idx = p.token_index()
    pages = to_host(p.pages)  # (a torch tensor where torch and a GPU are there)
    flat = pages.reshape(-1, 576)
    for b, n in enumerate(lengths):
        assert np.isfinite(flat[idx[b]].astype(np.float32)).all()   # torch reads finite data
        assert np.array_equal(flat[idx[b, :n]], p.cache.rows(b, n))
        if n % 4:   # the slots of the last page past the length hold NaN
            tail = pages[p.block_table_host[b, used[b] - 1], n % 4:]
            assert np.isnan(tail.astype(np.float32)).all()
    bias = p.keep_bias()
    assert bias.shape == (3, 2, 1, lengths.max())
    assert (bias[:, 1, 0, :] == 0).sum() == lengths.sum()   # last query: every valid key
    assert p.reference().shape == (2, 2, 2, 512)


def test_varlen_lengths_are_seeded_and_in_range():
    """The varlen sweep: the six shapes at spreads 0, 0.25, 0.5; each length uniform in
    [L(1-s), L(1+s)], the same for the same seed, others for another seed."""
    configs = bench.varlen_sweep()
    assert {(c.batch, c.heads, c.seqlen) for c in configs} == set(bench.PERF_SHAPES)
    assert sorted({c.spread for c in configs}) == [0.0, 0.25, 0.5]
    cfg = bench.Config(64, 128, 4096, spread=0.5, sweep="varlen")
    assert cfg.length_range == (2048, 6144)
    a, b = bench.draw_lengths(cfg, seed=0), bench.draw_lengths(cfg, seed=0)
    assert np.array_equal(a, b) and a.dtype == np.int32
    assert 2048 <= a.min() and a.max() <= 6144 and a.max() - a.min() > 2048  # spread, not flat
    assert not np.array_equal(a, bench.draw_lengths(cfg, seed=1))
    assert (bench.draw_lengths(bench.Config(4, 1, 100), seed=3) == 100).all()
    with pytest.raises(ValueError, match="spread"):
        bench.Config(1, 1, 8, spread=1.0)


@pytest.mark.kernel
@SIMULATOR_ONLY
def test_fp8_rows_beside_bf16_rows():
    """The fp8 sweep's rows on a tiny shape: the cache quantized into each layout (NaN bytes
    past the length), checked against the reference on its exact values, its bytes counted at
    576 / 656 a token; peers skip FP8 rows; plot's table puts them side by side."""
    configs = [bench.Config(1, 2, 20, page_size=8, kv=kv, sweep="fp8")
               for kv in ("same", "e4m3", "v32")]

    def peer(problem):  # a peer that runs wherever it is asked to, here: the 16-bit row
        prep = providers.numba_mla(problem, "simple")
        return dataclasses.replace(prep, host_call=None, info={})

    provs = providers.select_providers("numba_mla:simple") + [providers.Provider("peer", peer)]
    doc = bench.run(configs, provs, progress=False, log=lambda *a: None)
    rows = doc["rows"]
    assert [(r["provider"], r["kv"]) for r in rows] == [
        ("numba_mla", "same"), ("peer", "same"), ("numba_mla", "e4m3"), ("numba_mla", "v32")]
    assert [(s["provider"], s["count"]) for s in doc["meta"]["skipped"]] == [("peer", 2)]
    assert "reads 16-bit caches only" in doc["meta"]["skipped"][0]["reason"]
    rows = [r for r in rows if r["provider"] == "numba_mla"]
    for r, row_bytes in zip(rows, (1152, 576, 656)):
        assert r["row_bytes"] == row_bytes
        assert r["bytes"] == 20 * row_bytes + 2 * 2 * (576 + 512)
        assert 0 < r["rel_err"] < 2e-2
    assert doc["meta"]["errors"] == []
    table = plot.fp8_markdown(doc["meta"], rows)
    assert "numba_mla:simple e4m3" in table and "numba_mla:simple v32" in table
    assert table.count("| 1x2x20 |") == 1


@pytest.mark.kernel
@pytest.mark.parametrize("form, kernel", [("mma_sync_roles", "mma_sync_roles"),
                                          ("mma_sync_lockstep", "mma_sync")])
def test_a_kernel_form_as_a_backend(form, kernel, monkeypatch):
    """``numba_mla:mma_sync_roles`` and ``numba_mla:mma_sync_lockstep`` time the warp
    tensor-core kernel's 32-row block in the form each names (providers.FORMS): planned with
    the selector's flag set their way, whatever it is, and as it was after; where neither
    form runs (16 query rows) the row is skipped with the reason."""
    from numba_mla import selector
    from numba_mla.kernels import mma_sync, mma_sync_roles

    smem = mma_sync_roles.smem_bytes() if kernel == "mma_sync_roles" else mma_sync.smem_bytes(32)
    for flag in (True, False):
        monkeypatch.setattr(selector, "MMA_SYNC_ROLES", flag)
        doc = bench.run([bench.Config(1, 20, 33, page_size=16, sweep="tiny")],
                        providers.select_providers(f"numba_mla:{form}"), progress=False,
                        log=lambda *a: None)
        assert selector.MMA_SYNC_ROLES is flag
        (row,) = doc["rows"]
        assert row["backend"] == form and 0 < row["rel_err"] < 2e-2
        assert row["block_m"] == 32 and row["smem_bytes"] == smem  # (the form's kernel ran)
        assert doc["meta"]["errors"] == [] and doc["meta"]["skipped"] == []
    p = bench.make_problem(bench.Config(1, 16, 33, page_size=16, sweep="tiny"),
                           bench.Device(), np.random.default_rng(0), bench.Settings.simulator())
    other = not providers.FORMS[form].value  # (the flag as the form does not set it)
    monkeypatch.setattr(selector, "MMA_SYNC_ROLES", other)
    with pytest.raises(bench.Skip, match="past 16 query rows"):
        providers.numba_mla(p, form)
    assert selector.MMA_SYNC_ROLES is other


@pytest.mark.kernel
@SIMULATOR_ONLY
def test_varlen_sweep_cli(tmp_path, capsys):
    """``bench --sweep varlen`` on a tiny shape: one row a spread, the spread and the lengths'
    range in each row, then its figure and table from ``plot`` (and nothing else)."""
    out = tmp_path / "v.json"
    rc = cli.main(["bench", "--sweep", "varlen", "--shapes", "2x1x12", "--page-size", "4",
                   "--providers", "numba_mla:simple", "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    rows = json.loads(out.read_text())["rows"]
    assert [r["spread"] for r in rows] == [0.0, 0.25, 0.5]
    for r in rows:
        assert r["sweep"] == "varlen" and r["varlen"] == (r["spread"] > 0)
        lo, hi = bench.Config(2, 1, 12, spread=r["spread"]).length_range
        assert lo <= r["length_min"] <= r["length_max"] <= hi
        assert 0 <= r["rel_err"] < 2e-2
    assert rows[0]["length_min"] == rows[0]["length_max"] == 12
    assert "2x1x12 +-0.5L" in printed
    figs = tmp_path / "f"
    assert cli.main(["plot", "--json", str(out), "--out-dir", str(figs)]) == 0
    assert os.path.getsize(figs / "latency_vs_spread.png") > 0
    assert "| 2x1x12 | 0.5 |" in (figs / "varlen.md").read_text()
    # plotting a varlen run into plots/ replaces no other figure, nor the headline table
    assert sorted(os.listdir(figs)) == ["latency_vs_spread.png", "varlen.md"]


def test_bench_shapes_option_is_checked(capsys):
    assert cli.main(["bench", "--shapes", "2x1", "--no-progress"]) == 2
    assert "--shapes: expected BxHxL" in capsys.readouterr().err
    assert cli.main(["bench", "--sweep", "splitk", "--shapes", "1x1x8", "--no-progress"]) == 2
    assert "not 'splitk'" in capsys.readouterr().err


def test_table_keeps_alignment_and_shows_no_negative_overhead():
    """Simulator-sized times (seconds) and a host overhead below zero (two medians' spread):
    every right-aligned column ends under its header, no minus sign in the overhead column."""
    base = dict(provider="numba_mla", backend="simt", batch=1, heads=2, seqlen=16, sq=1,
                dtype="bfloat16", mask="null", num_partitions=1, us=983402.5,
                us_p10=983402.5, us_p90=1283402.5, gbps=0.01, tflops=1e-5, frac_copy=None,
                frac_dense=None, host_us=2898051.1, overhead_us=-983402.0, rel_err=3e-3)
    rows = [base, dict(base, provider="torch_bmm", backend=None, us=12.5, us_p10=12.0,
                       us_p90=13.0, host_us=40.0, overhead_us=21.0),
            dict(base, overhead_us=None)]
    lines = bench.format_table(rows).splitlines()
    head = lines[0]
    ends = [head.index(h) + len(h) for h in (" us", "host us", "ovh us", "rel_err")]
    for line in lines[2:]:
        for end in ends:
            assert line[end - 1] != " " and (end == len(line) or line[end] == " "), line
    ovh = [line[head.index("host us") + len("host us"):ends[2]].split() for line in lines[2:]]
    assert ovh == [["~0"], ["21"], ["-"]]
    assert "-983402" not in "\n".join(lines)


def _drawn(fn, *args):
    """Render ``fn(meta, rows, path, plt)`` and return (its first axes' bar widths, x label,
    x scale, tick labels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen = {}
    real = plt.Figure.savefig

    def keep(fig, path, **kw):
        ax = fig.axes[0]
        seen.update(widths=[p.get_width() for p in ax.patches], xlabel=ax.get_xlabel(),
                    xscale=ax.get_xscale(),
                    xticks=[t.get_text() for t in ax.get_xticklabels()])
        return real(fig, path, **kw)

    plt.Figure.savefig = keep
    try:
        assert fn(*args, plt) is None
    finally:
        plt.Figure.savefig = real
    return seen


def test_host_overhead_plot_draws_negative_values_as_negative(tmp_path):
    """A negative overhead is a bar left of zero, and the axis says what it is."""
    with open(SAMPLE) as f:
        doc = json.load(f)
    rows = [dict(r, overhead_us=v, us_warm=r["us"], sweep="default")
            for r, v in zip(doc["rows"][:3], (-3.0, 5.0, 12.0))]
    seen = _drawn(plot.host_overhead, doc["meta"], rows, str(tmp_path / "h.png"))
    assert sorted(seen["widths"]) == [-3.0, 5.0, 12.0]
    assert seen["xscale"] == "linear" and "below 0" in seen["xlabel"]


def test_roofline_x_axis_has_plain_tick_labels(tmp_path):
    """The H200 run's intensities (30 to about 1000 FLOP/byte): labels at 1, 2, 5 x 10^k."""
    with open(SAMPLE) as f:
        doc = json.load(f)
    seen = _drawn(plot.roofline, doc["meta"], doc["rows"], str(tmp_path / "r.png"))
    labels = [t for t in seen["xticks"] if t]
    assert len(labels) >= 4 and "20" in labels and "100" in labels
    assert all(float(t) > 0 for t in labels)


def test_failures_and_provider_selection():
    row = dict(provider="numba_mla", backend="simt", batch=1, heads=1, seqlen=8, sq=1,
               dtype="bfloat16", rel_err=1e-3)
    ok = dict(meta=dict(errors=[]), rows=[row, dict(row, provider="torch_bmm", rel_err=0.5)])
    assert bench.failures(ok) == []
    assert len(bench.failures(dict(ok, rows=[dict(row, rel_err=0.05)]))) == 1
    assert len(bench.failures(dict(ok, rows=[dict(row, rel_err=None)]))) == 1
    crashed = dict(meta=dict(errors=[dict(provider="numba_mla", backend="mma", config="c",
                                          error="boom")]), rows=[])
    assert len(bench.failures(crashed)) == 1
    assert [p.key for p in bench.select_providers("numba_mla")] == [
        f"numba_mla:{b}" for b in bench.KERNEL_BACKENDS]
    assert [p.key for p in bench.select_providers("torch_bmm,numba_mla:simt")] == [
        "numba_mla:simt", "torch_bmm"]
    with pytest.raises(ValueError, match="providers"):
        bench.select_providers("cudnn")


def test_backend_without_kernel_is_skipped(monkeypatch, rng):
    """A backend launch.Plan refuses (NotImplementedError), or builds as another backend, is
    skipped with the reason; nothing is launched."""
    from numba_mla import launch

    p = bench.make_problem(bench.Config(1, 1, 8, page_size=4, sweep="tiny"), bench.Device(),
                           rng, bench.Settings.simulator())

    def refuse(call):
        raise NotImplementedError("backend='mma': not built yet")

    monkeypatch.setattr(launch, "Plan", refuse)
    with pytest.raises(bench.Skip, match="not built yet"):
        bench.providers.numba_mla(p, "mma")

    class OtherPlan:
        backend, launches, num_partitions = "simt", [], 1

        def __init__(self, call):
            pass

    monkeypatch.setattr(launch, "Plan", OtherPlan)
    with pytest.raises(bench.Skip, match="built backend 'simt'"):
        bench.providers.numba_mla(p, "mma")


# ---------------------------------------------------------------------------------------------
# The command line's manners: what it prints before it runs, what it refuses
# ---------------------------------------------------------------------------------------------
def _cli(*args):
    """``python -m numba_mla.cli ARGS`` in a fresh process, started as a user without a GPU
    starts it: nothing has chosen the simulator yet."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, "-m", "numba_mla.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


BANNER = "running on the CUDA simulator"
NO_GPU = pytest.mark.skipif(not _compat.SIMULATOR, reason="the banner is the no-GPU path")


@NO_GPU
@pytest.mark.parametrize("args", [["--help"], ["bench", "--help"], ["validate", "--help"]],
                         ids=["top", "bench", "validate"])
def test_help_prints_no_simulator_banner(args):
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
    assert BANNER not in r.stdout + r.stderr and "usage: numba-mla" in r.stdout


@NO_GPU
def test_bench_help_cites_the_performance_note():
    r = _cli("bench", "--help")
    assert "docs/performance.md" in r.stdout and "varlen" in r.stdout


@NO_GPU
def test_plot_prints_no_simulator_banner(tmp_path):
    r = _cli("plot", "--json", SAMPLE, "--out-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert BANNER not in r.stdout + r.stderr and "wrote" in r.stdout


@NO_GPU
def test_validate_full_is_refused_on_the_simulator():
    """The banner (validate runs kernels), then the refusal with its reason; exit status 2."""
    r = _cli("validate", "--full")
    assert r.returncode == 2, r.stdout + r.stderr
    assert BANNER in r.stdout
    assert "--full is refused on the CUDA simulator" in r.stderr and "hours" in r.stderr


def test_validate_table_is_aligned_on_the_reference_backend():
    from numba_mla import validate

    case = validate.Case(2, 2, 1, 21, "bf16", "paged", 1, "null", "identity", None,
                         backend="reference")
    row = dict(case=case, error=None, kernel="reference", out_err=1e-3, out_rel=1e-3,
               out_ref_err=1e-3, lse_err=1e-4, lse_ref_err=1e-4, **{"pass": True})
    line, head = validate._fmt(row), validate.HEADER
    for col in ("dtype", "cache", "mask"):   # left-aligned: each starts under its header
        assert line[head.index(col) - 1] == " " and line[head.index(col)] != " ", col
    for col in ("P", "out err", "lse err"):   # right-aligned: each ends under its header
        end = head.index(f" {col} ") + len(col)
        assert line[end] != " " and line[end + 1] == " ", col
    assert line[head.index("dtype"):].startswith("bf16")
    assert line[head.index("result"):] == "PASS"


# ---------------------------------------------------------------------------------------------
# scripts/host_overhead.py
# ---------------------------------------------------------------------------------------------
def _script(name):
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(ROOT, "scripts", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.kernel
@SIMULATOR_ONLY
def test_host_overhead_script(tmp_path, capsys):
    """One call per path on a tiny shape: a row per path that runs here with both measures,
    the others listed with their reason; meta with device, date, commit and backend (the
    quick ``"simple"`` kernel: the script's paths are what is tested)."""
    out = tmp_path / "h.json"
    mod = _script("host_overhead")
    assert mod.main(["--calls", "1", "--warmup", "0", "--shape", "1x1x8", "--page-size", "4",
                     "--out", str(out), "--commit", "abc1234", "--backend", "simple"]) == 0
    doc = json.loads(out.read_text())
    meta, rows = doc["meta"], doc["rows"]
    assert (meta["device"], meta["commit"]) == ("CUDA simulator", "abc1234") and meta["date"]
    assert meta["backend"] == "simple"
    assert [r["path"] for r in rows] == ["mla_decode", "mla_decode_new_lengths",
                                         "mla_decode_new_cache"]
    for r in rows:
        assert r["call_sync_us"] > 0 and r["enqueue_us"] > 0
    assert {s["path"] for s in meta["skipped"]} == {
        "mla_decode_lengths_in_place", "mla_decode_ragged_device_offsets", "prepare",
        "flash_mla", "torch"}
    assert "mla_decode_new_lengths" in capsys.readouterr().out
    # numba-mla plot draws its figure from this file (and nothing else)
    assert cli.main(["plot", "--json", str(out), "--out-dir", str(tmp_path / "f")]) == 0
    assert os.listdir(tmp_path / "f") == ["host_paths.png"]
    assert os.path.getsize(tmp_path / "f" / "host_paths.png") > 1000


@pytest.mark.gpu
@pytest.mark.slow
def test_default_sweep_on_gpu(tmp_path):
    """The real thing, first configuration only: every provider that is importable."""
    out = tmp_path / "gpu.json"
    assert cli.main(["bench", "--limit", "1", "--iters", "5", "--out", str(out),
                     "--no-progress"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert any(r["provider"] == "numba_mla" for r in rows)
    assert cli.main(["plot", "--json", str(out), "--out-dir", str(tmp_path)]) == 0


def test_schedule_of_a_plan():
    """The bench row's ``schedule``: which split-K schedule the plan's kernel walks."""
    from types import SimpleNamespace

    from numba_mla.bench.providers import schedule_of

    def spec(runs=0, direct=False, work=None, mixed=False):
        return SimpleNamespace(runs=runs, direct=direct, work=work, mixed=mixed)

    assert schedule_of(spec()) == "balanced" and schedule_of(spec(direct=True)) == "balanced"
    assert schedule_of(spec(work=[[0, 0, 0, 2]])) == "listed"
    assert schedule_of(spec(runs=4, work=[[0]])) == "runs"
    assert schedule_of(spec(runs=4, direct=True, work=[[0]])) == "whole runs"
    assert schedule_of(spec(runs=4, work=[[0]], mixed=True)) == "mixed runs"
    assert schedule_of(None) is None and schedule_of(object()) is None
