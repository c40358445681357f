"""``numba-mla bench`` and ``numba-mla plot``: the code paths, on a tiny configuration.

On the CUDA simulator the timings mean nothing; what is checked is that the sweep runs end
to end through the command line (numba_mla's "simt" provider, error against the float64
reference), that the JSON and CSV have the documented schema, and that ``plot`` renders every
figure from a JSON file: the one a run here just wrote, and ``tests/data/bench_sample.json``,
the rows of a real H200 run (``plots/simt_h200.json``) in this schema. The GPU sweep itself
is ``@pytest.mark.gpu``.
"""
import csv
import json
import os

import numpy as np
import pytest

import numba_mla as nm
from numba_mla import _compat, bench, cli, plot

#: The tiny sweep's code path on the simulator (host arrays, NaN past each length); on a GPU
#: the same code runs with torch tensors, checked by the real run (plots/bench_h200.json).
SIMULATOR_ONLY = pytest.mark.skipif(not _compat.SIMULATOR,
                                    reason="checks the simulator's tiny-sweep data path")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE = os.path.join(ROOT, "tests", "data", "bench_sample.json")
H200_RUN = os.path.join(ROOT, "plots", "simt_h200.json")
META_KEYS = ("device", "date", "commit", "versions", "copy_gbps", "matmul_tflops", "skipped",
             "errors")


def _pngs(directory):
    return {name: os.path.join(directory, f"{name}.png") for name in plot.FIGURES}


@pytest.mark.kernel
@SIMULATOR_ONLY
def test_bench_cli_end_to_end(tmp_path, capsys):
    """Two tiny configurations (a paged cache over two pages; Sq = 2 under a causal mask with
    NaN past the length) through ``numba-mla bench``, then ``numba-mla plot`` on its JSON."""
    out, csv_path = tmp_path / "b.json", tmp_path / "b.csv"
    rc = cli.main(["bench", "--sweep", "tiny", "--limit", "2", "--providers", "numba_mla:simt",
                   "--out", str(out), "--csv", str(csv_path), "--commit", "test123",
                   "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "numba_mla:simt" in printed and "rel_err" in printed  # the table

    doc = json.loads(out.read_text())
    meta, rows = doc["meta"], doc["rows"]
    for key in META_KEYS:
        assert key in meta, key
    assert meta["commit"] == "test123" and meta["simulator"] is True
    assert {"numba", "numba_cuda", "numpy", "torch"} <= set(meta["versions"])
    assert meta["copy_gbps"] > 0 and meta["errors"] == []
    assert len(rows) == 2
    for r in rows:
        for key in bench.ROW_KEYS:
            assert key in r, key
        assert (r["provider"], r["backend"], r["dtype"]) == ("numba_mla", "simt", "bfloat16")
        assert 0 <= r["rel_err"] < 2e-2
        assert r["us"] > 0 and r["gbps"] > 0 and r["tflops"] > 0
        assert r["host_us"] > 0 and r["ref_subset"] == "all"
    first, second = rows
    assert (first["batch"], first["heads"], first["seqlen"], first["page_size"]) == (1, 2, 16, 8)
    assert (second["sq"], second["mask"]) == (2, "causal")
    # PERFORMANCE.md's counts: cache rows once, q in, out back; 2 * 1088 FLOPs per pair per head
    assert first["bytes"] == 2 * (16 * 576 + 2 * (576 + 512))
    assert first["flops"] == 2 * 2 * 16 * (576 + 512)
    assert second["flops"] == 2 * 1 * (9 + 10) * (576 + 512)  # causal: 9 then 10 keys

    with open(csv_path, newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 2
    assert list(table[0])[:len(bench.ROW_KEYS)] == list(bench.ROW_KEYS)
    assert float(table[1]["rel_err"]) == pytest.approx(second["rel_err"])

    pngs = _pngs(tmp_path / "figs")
    assert cli.main(["plot", "--json", str(out), "--out-dir", str(tmp_path / "figs")]) == 0
    for name, path in pngs.items():
        assert os.path.getsize(path) > 0, name


def test_plot_renders_every_figure_from_the_h200_run(tmp_path, capsys):
    assert cli.main(["plot", "--json", SAMPLE, "--out-dir", str(tmp_path)]) == 0
    assert "skipped" not in capsys.readouterr().out
    for name, path in _pngs(tmp_path).items():
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
    assert bench._clean(bench.from_bench_simt(source)) == sample


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
    assert any("skipped splitk" in s for s in said)
    assert any("skipped host_overhead" in s for s in said)


def test_count_matches_performance_md():
    B, H, L = 64, 16, 4096
    nbytes, flops = bench.count(np.full(B, L), 1, H, nm.NullMask())
    assert nbytes == B * L * 576 * 2 + B * H * 576 * 2 + B * H * 512 * 2
    assert flops == 2 * B * H * L * (576 + 512)
    # a window keeps 256 keys of each sequence
    nbytes, flops = bench.count(np.array([4096]), 1, H, nm.SlidingWindowCausalMask(256))
    assert flops == 2 * H * 256 * (576 + 512)


@SIMULATOR_ONLY
def test_problem_paged_varlen(rng):
    """Varying lengths, a shuffled block table with unused entries out of range, NaN past
    each length: the cache the library gets, the token index torch gets, and the reference."""
    cfg = bench.Config(3, 2, 20, page_size=4, varlen=True, mask="causal", sq=2)
    p = bench.make_problem(cfg, bench.Device(), rng, bench.Settings.simulator(ref_seqs=2))
    lengths = p.lengths_host
    assert lengths.max() == 20 and lengths.min() >= 2 and p.ref_subset.startswith("sequences 0..1")
    used = -(-lengths // 4)
    assert (p.block_table_host[np.arange(5)[None, :] >= used[:, None]] == bench.UNUSED_PAGE).all()
    idx = p.token_index()
    flat = p.pages.reshape(-1, 576)
    for b, n in enumerate(lengths):
        assert np.isfinite(flat[idx[b]].astype(np.float32)).all()   # torch reads finite data
        assert np.array_equal(flat[idx[b, :n]], p.cache.rows(b, n))
    bias = p.keep_bias()
    assert bias.shape == (3, 2, 1, 20)
    assert (bias[:, 1, 0, :] == 0).sum() == lengths.sum()   # last query: every valid key
    assert p.reference().shape == (2, 2, 2, 512)


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
        bench.NumbaMLA("mma").prepare(p)

    class OtherPlan:
        backend, launches, num_partitions = "simt", [], 1

        def __init__(self, call):
            pass

    monkeypatch.setattr(launch, "Plan", OtherPlan)
    with pytest.raises(bench.Skip, match="built backend 'simt'"):
        bench.NumbaMLA("mma").prepare(p)


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
