"""The benchmark's PNG plots: a tiny real run (simulator, our stack, the floor; the default concurrency sweep)
draws the latency CDFs and the throughput-vs-concurrency figure; a saved results JSON redraws them; without
matplotlib the run still completes and says why there are no plots."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from load.bench import plots

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ("latency-cdf", "ttft-cdf", "throughput")


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the PNG header; fails unless the file is a PNG."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def pixels_near(path: Path, hex_color: str, tolerance: float = 0.08) -> int:
    """How many pixels of the image are (about) this colour: the lines drawn in it."""
    import matplotlib.image
    import numpy as np

    image = matplotlib.image.imread(path)[..., :3]
    rgb = np.array([int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(image - rgb).max(axis=-1) < tolerance).sum())


def stem_of(out: Path) -> str:
    return next(p.stem for p in out.glob("bench-*.json"))


def test_bench_writes_every_figure_as_a_real_png(quick_bench: tuple[Path, str]) -> None:
    out, stdout = quick_bench
    stem = stem_of(out)
    written = [out / f"{stem}-{name}.png" for name in FIGURES]
    assert "plots: " + ", ".join(str(p) for p in written) in stdout
    for path in written:
        width, height = png_size(path)
        assert width >= 800 and height >= 400
        assert path.stat().st_size > 20_000  # text, axes and lines, not an empty canvas
        # Both targets' lines are drawn, each in its own colour (a legend entry alone is ~100 pixels).
        for target in ("floor", "ours"):
            assert pixels_near(path, plots.TARGET_STYLE[target][1]) > 500, (path.name, target)
        assert pixels_near(path, plots.TARGET_STYLE["smg"][1]) == 0  # SMG did not run


def test_sweep_is_recorded_and_printed(quick_bench: tuple[Path, str]) -> None:
    out, stdout = quick_bench
    report = json.loads((out / "latest.json").read_text())
    sweep = report["sweep"]
    levels = [1, 2, 4, 8, 16]  # the default sweep
    assert sweep["workload"] == "chat" and sweep["levels"] == levels
    measured = {(r["target"], r["concurrency"]) for r in sweep["results"]}
    assert measured == {(t, c) for t in ("floor", "ours") for c in levels}
    for r in sweep["results"]:
        assert r["summary"]["errors"] == 0 and r["summary"]["requests_per_s"] > 0
    # The sweep is not one of the main phases: the comparison table's inputs are unchanged.
    assert {r["phase"] for r in report["results"]} == {"latency", "throughput"}
    assert "concurrency sweep, chat" in stdout
    table = stdout.split("concurrency sweep, chat", 1)[1].splitlines()
    assert [line.split("|")[0].strip() for line in table[4 : 4 + len(levels)]] == [str(n) for n in levels]


def test_phases_keep_latency_quantiles_for_the_cdfs(quick_bench: tuple[Path, str]) -> None:
    out, _ = quick_bench
    report = json.loads((out / "latest.json").read_text())
    for r in report["results"] + report["sweep"]["results"]:
        cdf = r["cdf_ms"]
        assert len(cdf["latency"]) == len(cdf["percentiles"])
        assert cdf["latency"] == sorted(cdf["latency"]) and cdf["latency"][0] > 0
        # The quantiles agree with the phase's own summary.
        median = cdf["latency"][cdf["percentiles"].index(50)]
        assert median == pytest.approx(r["summary"]["latency_ms"]["p50"])
        streamed = r["workload"] == "chat-stream"
        assert bool(cdf["ttft"]) == streamed


def test_a_saved_results_file_redraws(quick_bench: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = quick_bench
    argv = [sys.executable, "-m", "load.bench.plots", str(out / "latest.json"), "--out", str(tmp_path)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"latest-{n}.png" for n in FIGURES)
    assert all(png_size(p)[0] >= 800 for p in tmp_path.iterdir())


def test_no_sweep_no_streams_draws_what_was_measured(quick_bench: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = quick_bench
    report: dict[str, Any] = json.loads((out / "latest.json").read_text())
    del report["sweep"]
    report["results"] = [r for r in report["results"] if r["workload"] == "chat"]
    written = plots.write_plots(report, tmp_path, "run")
    # No streamed workload: no TTFT figure; no sweep: throughput at the phases' own 1 and 8 clients.
    assert [p.name for p in written] == ["run-latency-cdf.png", "run-throughput.png"]
    assert pixels_near(tmp_path / "run-throughput.png", plots.TARGET_STYLE["ours"][1]) > 500


def test_a_results_file_without_quantiles_has_no_cdf(quick_bench: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = quick_bench
    report = json.loads((out / "latest.json").read_text())
    for r in report["results"]:
        del r["cdf_ms"]  # as written before the bench kept quantiles
    del report["sweep"]
    assert [p.name for p in plots.write_plots(report, tmp_path, "old")] == ["old-throughput.png"]


def test_without_matplotlib_the_bench_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from load.bench.__main__ import _plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    assert not plots.available()
    _plot({"results": []}, tmp_path, "bench-x")
    assert capsys.readouterr().out.strip() == plots.MISSING_NOTE
    assert list(tmp_path.iterdir()) == []
