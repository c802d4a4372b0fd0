"""The workload suite's shape generators (load/bench_routing/shapes.py): each shape's sharing structure
holds at several seeds (so at several drawn sizes), sessions grow turn by turn, open-loop interleaving
and arrivals give the counts asked for, and the suite's report ranks shapes worst first."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import pytest

from extproc.models import default_model_dir
from load.bench_routing import shapes, suite_report
from load.bench_routing.trace import RoutedSpec
from load.loadgen.runner import poisson_arrivals
from load.loadgen.text import Vocab, load_vocab

SEEDS = (0, 1, 7)


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return load_vocab(default_model_dir() / "tokenizer.json")


def _ids(spec: RoutedSpec) -> tuple[int, ...]:
    return tuple(i for m in spec.messages for i in m.text.ids)


def _first(spec: RoutedSpec) -> tuple[int, ...]:
    return spec.messages[0].text.ids


@pytest.mark.parametrize("name", shapes.SHAPES)
def test_a_shape_is_deterministic_by_seed_and_its_parameters_vary(vocab: Vocab, name: str) -> None:
    one = shapes.interleave(shapes.make_shape(name, vocab, 0), 60)
    assert one == shapes.interleave(shapes.make_shape(name, vocab, 0), 60)
    assert one != shapes.interleave(shapes.make_shape(name, vocab, 1), 60)
    drawn = [shapes.draw_params(name, seed)[0] for seed in range(6)]
    assert len({repr(p) for p in drawn}) > 1, "the seed must change the shape's size"
    assert all(s.kind == name and s.stream and s.max_tokens > 0 for s in one)


@pytest.mark.parametrize("seed", SEEDS)
def test_system_prompts_bind_each_user_to_one_of_a_few_long_prompts(vocab: Vocab, seed: int) -> None:
    shape = shapes.make_shape("system_prompts", vocab, seed)
    prompts = shape.params["prompt_tokens"]
    assert 2 <= len(prompts) <= 5 and all(n >= 1200 for n in prompts)
    sessions = [shape.session(i) for i in range(80)]
    firsts = {_first(t) for s in sessions for t in s}
    assert len(firsts) <= len(prompts), "every turn starts with one of the shared prompts"
    for s in sessions:
        assert len({t.shares for t in s}) == 1 and len({t.user for t in s}) == 1
        assert len({_first(t) for t in s}) == 1, "a user stays with one prompt"
        _assert_grows(s)
    assert max(len(s) for s in sessions) > 1


@pytest.mark.parametrize("seed", SEEDS)
def test_rag_questions_bring_shared_documents_in_varying_order(vocab: Vocab, seed: int) -> None:
    shape = shapes.make_shape("rag", vocab, seed)
    n_docs = len(shape.params["doc_tokens"])
    specs = shapes.interleave(shape, 300)
    docs = [tuple(m.text.ids for m in s.messages[1:-1]) for s in specs]
    distinct = {d for group in docs for d in group}
    assert len(distinct) == n_docs, "all documents come from one shared set"
    assert all(len(set(g)) == len(g) for g in docs), "a question never repeats a document"
    multi = [g for g in docs if len(g) > 1]
    assert multi and len({g[0] for g in multi}) > 1
    # The same set of documents appears in more than one order.
    orders = Counter(frozenset(g) for g in multi)
    assert any(len({g for g in multi if frozenset(g) == k}) > 1 for k, c in orders.items() if c > 1)
    questions = [s.messages[-1].text.ids for s in specs]
    assert len(set(questions)) == len(questions), "every question is unique"


@pytest.mark.parametrize("seed", SEEDS)
def test_sessions_share_nothing_across_sessions_and_grow_within_one(vocab: Vocab, seed: int) -> None:
    shape = shapes.make_shape("sessions", vocab, seed)
    sessions = [shape.session(i) for i in range(30)]
    firsts = [_first(s[0]) for s in sessions]
    assert len(set(firsts)) == len(firsts)
    lo, _ = shape.params["turns"]
    assert all(len(s) >= lo >= 4 for s in sessions)
    for s in sessions:
        _assert_grows(s)


@pytest.mark.parametrize("seed", SEEDS)
def test_agentic_contexts_grow_by_a_call_and_a_tool_result_per_turn(vocab: Vocab, seed: int) -> None:
    shape = shapes.make_shape("agentic", vocab, seed)
    sessions = [shape.session(i) for i in range(20)]
    assert len({_first(t) for s in sessions for t in s}) == 1, "one shared tool preamble"
    assert len({s[0].messages[1].text.ids for s in sessions}) == len(sessions), "unique tasks"
    lo_result = shape.params["result_tokens"][0]
    for s in sessions:
        _assert_grows(s)
        for a, b in itertools.pairwise(s):
            assert len(b.messages) == len(a.messages) + 2
            assert [m.role for m in b.messages[-2:]] == ["assistant", "user"]
            assert b.prompt_tokens - a.prompt_tokens >= lo_result


@pytest.mark.parametrize("seed", SEEDS)
def test_no_sharing_prompts_share_no_block(vocab: Vocab, seed: int) -> None:
    specs = shapes.interleave(shapes.make_shape("no_sharing", vocab, seed), 200)
    # No two prompts share their first 16 content tokens: nothing for a cache to hit beyond markup.
    heads = [_ids(s)[:16] for s in specs]
    assert len(set(heads)) == len(heads)
    assert all(len(s.messages) == 2 for s in specs)


@pytest.mark.parametrize("seed", SEEDS)
def test_zipf_popularity_is_skewed_over_many_prefixes(vocab: Vocab, seed: int) -> None:
    shape = shapes.make_shape("zipf", vocab, seed)
    n = len(shape.params["prefix_tokens"])
    specs = shapes.interleave(shape, 2000)
    counts = Counter(s.shares for s in specs)
    top = counts["prefix-0"] / len(specs)
    s_ = shape.params["exponent"]
    expected = 1 / sum(1 / (k + 1) ** s_ for k in range(n))
    assert top == pytest.approx(expected, abs=0.04), "the hottest prefix's share follows Zipf"
    assert counts["prefix-0"] > 3 * counts.get("prefix-9", 0)
    assert len(counts) > n // 3
    for s in specs:
        assert (
            _first(s)
            == shape.text(shape.params["prefix_tokens"][int(s.shares[7:])], "prefix", int(s.shares[7:])).ids
        )


@pytest.mark.parametrize("seed", SEEDS)
def test_long_answers_are_decode_heavy_chats_on_a_few_shared_prompts(vocab: Vocab, seed: int) -> None:
    shape = shapes.make_shape("long_answers", vocab, seed)
    p = shape.params
    assert 1 <= len(p["prompt_tokens"]) <= 4
    assert 4 <= shape.clients_per_engine <= 8, "more clients per engine than the prefill shapes' 3"
    sessions = [shape.session(i) for i in range(80)]
    firsts = {_first(t) for s in sessions for t in s}
    assert len(firsts) <= len(p["prompt_tokens"]), "every chat starts with one of the shared prompts"
    answers = [t.max_tokens for s in sessions for t in s]
    lo, hi = p["output_tokens"]
    assert 64 <= lo and hi <= 384 and all(lo <= n <= hi for n in answers)
    assert min(answers) >= 64 > 48, "longer than every other shape's answers"
    assert len(set(answers)) > 10, "answer lengths vary request by request"
    for s in sessions:
        assert len({t.user for t in s}) == 1 and len({_first(t) for t in s}) == 1
        _assert_grows(s)
        # The history re-sends an answer as long as the one asked for (its first word, re-encoded without
        # its leading space, can take a few tokens).
        for a, b in itertools.pairwise(s):
            assert a.max_tokens <= len(b.messages[len(a.messages)].text.ids) <= a.max_tokens + 3
    assert max(len(s) for s in sessions) > 1 or p["turns"] == (1, 1)


def test_the_prefill_shapes_keep_three_closed_loop_clients_per_engine(vocab: Vocab) -> None:
    for name in shapes.SHAPES:
        if name != "long_answers":
            assert shapes.make_shape(name, vocab, 0).clients_per_engine == shapes.CLIENTS_PER_ENGINE == 3


def test_interleave_keeps_each_sessions_turns_in_order(vocab: Vocab) -> None:
    shape = shapes.make_shape("system_prompts", vocab, 3)
    specs = shapes.interleave(shape, 150)
    assert len(specs) == 150
    by_user: dict[str, list[RoutedSpec]] = {}
    for s in specs:
        by_user.setdefault(s.user, []).append(s)
    assert len(by_user) > shape.active
    for user, turns in by_user.items():
        i = int(user.split("-")[1])
        assert tuple(turns) == shape.session(i)[: len(turns)]


@pytest.mark.parametrize("rate,duration", [(3.0, 20.0), (11.5, 14.0)])
def test_open_loop_arrival_counts_follow_the_rate(rate: float, duration: float) -> None:
    # As the suite builds them: Poisson arrivals cut at the run's end.
    arrivals = [t for t in poisson_arrivals(rate, int(rate * duration * 1.5) + 10, 0) if t < duration]
    expected = rate * duration
    assert abs(len(arrivals) - expected) < 4 * math.sqrt(expected)
    assert arrivals == sorted(arrivals) and arrivals[-1] < duration


def _assert_grows(session: tuple[RoutedSpec, ...]) -> None:
    """Each turn re-sends the previous turn's whole prompt, then more."""
    for a, b in itertools.pairwise(session):
        assert b.messages[: len(a.messages)] == a.messages
        assert b.prompt_tokens > a.prompt_tokens


def _run(gateway: str, mean: float, p90: float, hit: float) -> dict[str, object]:
    return {
        "gateway": gateway,
        "ttft_ms": {"mean": mean, "p90": p90, "p99": p90},
        "hit_rate": hit,
        "requests_per_s": 1.0,
        "served_max_over_mean": 1.0,
        "in_flight_max_over_mean": 1.0,
    }


def _main_cell(shape: str, points: list[dict[str, object]]) -> dict[str, object]:
    """A main-grid cell of seed 0 on 4 engines x 1,024 blocks."""
    return {"shape": shape, "seed": 0, "sweep": "main", "engines": 4, "num_blocks": 1024, "points": points}


def test_report_leads_with_the_worst_shape_and_checks_targets() -> None:
    def cell(shape: str, ours_mean: float) -> dict[str, object]:
        runs = [_run("smg", 100, 200, 0.9), _run("kv_events", ours_mean, 190, 0.9)]
        return _main_cell(shape, [{"mode": "closed", "load": None, "rate": None, "runs": runs}])

    doc = {
        "ours": [{"name": "kv_events"}],
        "cells": [cell("rag", 80), cell("zipf", 130), cell("agentic", 95)],
    }
    summary = suite_report.analyse(doc)["kv_events"]
    assert [s for s, _ in summary["shapes_worst_first"]] == ["zipf", "agentic", "rag"]
    assert summary["targets"]["mean_every_point"] is False
    assert summary["misses"]["mean"] == ["zipf s0 closed"]
    assert summary["geomean_mean_ratio"] == pytest.approx((0.8 * 1.3 * 0.95) ** (1 / 3))


def test_rows_report_the_warm_up_apart_with_its_ratio_to_smg() -> None:
    smg, ours = _run("smg", 100, 200, 0.9), _run("kv_events", 90, 190, 0.9)
    smg["warmup_ttft_ms"] = {"mean": 200.0}
    ours["warmup_ttft_ms"] = {"mean": 300.0}
    cell = {"seed": 0, "points": [{"mode": "open", "load": 1.1, "rate": 44.0, "runs": [smg, ours]}]}
    rows = list(suite_report._rows(cell, {"default_policy": "kv_events"}))
    assert rows[0].endswith("| 200 |") and rows[1].endswith("| 300 (1.50x) |")
    # A run recorded before the warm-up was reported has no such figure.
    del ours["warmup_ttft_ms"]
    assert list(suite_report._rows(cell, {"default_policy": "kv_events"}))[1].endswith("| - |")


def test_the_summary_names_the_worst_cold_start_apart_from_the_targets() -> None:
    # The steady state wins at both loads; the warm-up loses at 90% (3x SMG's) and wins at 50%.
    def point(load: float, ours_warmup: float) -> dict[str, object]:
        smg, ours = _run("smg", 100, 200, 0.9), _run("kv_events", 90, 190, 0.9)
        smg["warmup_ttft_ms"] = {"mean": 200.0}
        ours["warmup_ttft_ms"] = {"mean": ours_warmup}
        return {"mode": "open", "load": load, "rate": 10.0, "runs": [smg, ours]}

    cell = _main_cell("system_prompts", [point(0.5, 100.0), point(0.9, 600.0)])
    doc = {"ours": [{"name": "kv_events"}], "cells": [cell]}
    summary = suite_report.analyse(doc)["kv_events"]
    assert summary["targets"]["mean_every_point"] is True, "the warm-up is not judged"
    assert summary["cold_start"] == {
        "worst": 3.0,
        "worst_at": "system_prompts s0 90%",
        "slower_than_smg": 1,
        "points": 2,
    }
    lines = suite_report._target_lines("kv_events", summary, "")
    assert lines[-1] == (
        "  - cold start (the warm-up, not a target): worst 3.00x of SMG's mean TTFT at "
        "system_prompts s0 90%; slower than SMG's at 1 of 2 points"
    )


def test_hits_are_judged_over_the_requests_both_gateways_served() -> None:
    def point(twin_pts: float | None) -> dict[str, object]:
        smg, ours = _run("smg", 100, 200, 0.80), _run("kv_events", 60, 150, 0.79)
        if twin_pts is not None:
            ours["twin_hits"] = {"requests": 80, "a": 0.8, "b": 0.8, "pts": twin_pts}
        return {"mode": "closed", "load": None, "rate": None, "runs": [smg, ours]}

    def hit_misses(twin_pts: float | None) -> list[str]:
        doc = {"ours": [{"name": "kv_events"}], "cells": [_main_cell("agentic", [point(twin_pts)])]}
        return suite_report.analyse(doc)["kv_events"]["misses"]["hit"]

    # One point behind over each run's own requests: the same routing when the same requests agree.
    assert hit_misses(0.0) == []
    assert hit_misses(-0.6) == ["agentic s0 closed"], "behind on the same requests"
    assert hit_misses(None) == ["agentic s0 closed"], "results without twins: the runs' own rates"
    cell = _main_cell("agentic", [point(0.0)])
    header = suite_report.HEADER.splitlines()[0]
    line = list(suite_report._rows(cell, {"default_policy": "kv_events"}))[1]
    cells = dict(zip(header.split("|")[1:-1], line.split("|")[1:-1], strict=True))
    assert (cells[" hit-SMG pts "], cells[" same requests: hit-SMG pts "]) == (" -1.0 ", " +0.0 ")


def test_a_point_measured_on_too_few_requests_is_named_with_its_count() -> None:
    def point(load: float, count: int) -> dict[str, object]:
        smg, ours = _run("smg", 100, 200, 0.9), _run("kv_events", 110, 190, 0.8)
        for run in (smg, ours):
            run["ttft_ms"]["count"] = count  # type: ignore[index]
        return {"mode": "open", "load": load, "rate": 1.0, "runs": [smg, ours]}

    cell = _main_cell("rag", [point(0.5, 13), point(1.1, suite_report.MIN_MEASURED)])
    doc = {"ours": [{"name": "kv_events"}], "cells": [cell]}
    summary = suite_report.analyse(doc)["kv_events"]
    assert summary["misses"]["hit"] == ["rag s0 50% (13 requests)", "rag s0 110%"]
    assert summary["thin"] == ["rag s0 50% (13 requests)"]


def _point(ours_mean: float, hit: float, repeat: int) -> dict[str, object]:
    runs = [_run("smg", 100, 200, 0.5), _run("kv_events", ours_mean, 190, hit)]
    return {"mode": "open", "load": 1.1, "rate": 20.0, "repeat": repeat, "runs": runs}


def _repeated_doc(means: list[float], hits: list[float], time_scale: float = 2.0) -> dict[str, object]:
    cell = {
        "shape": "sessions",
        "seed": 0,
        "sweep": "main",
        "engines": 8,
        "num_blocks": 1024,
        "points": [_point(m, h, k) for k, (m, h) in enumerate(zip(means, hits, strict=True))],
    }
    return {
        "ours": [{"name": "kv_events", "routing_config": None}],
        "settings": {"engine": {"time_scale": time_scale}, "duration_s": 24.0, "repeats": len(means)},
        "cells": [cell],
    }


def test_repeats_of_a_point_are_judged_by_their_median_with_the_worst_quoted() -> None:
    # Past capacity the same arrivals have measured 0.49x in one run and 1.29x in another.
    doc = _repeated_doc([49, 129, 58], [0.6, 0.4, 0.6])
    summary = suite_report.analyse(doc)["kv_events"]
    assert summary["points"] == 1
    assert summary["geomean_mean_ratio"] == pytest.approx(0.58)
    assert summary["targets"]["mean_every_point"] is True, "the median (0.58x) is under 1.0x"
    # The median hit difference is +10 points; the worst repeat's -10 is quoted, not judged.
    assert summary["targets"]["hit_every_point"] is True
    [row] = suite_report.merge_repeats(suite_report.comparisons(doc))
    assert (row["runs"], row["mean_worst"], row["hit_pts_worst"]) == (3, 1.29, pytest.approx(-10.0))
    worse = _repeated_doc([49, 129, 158], [0.6, 0.4, 0.6])
    assert suite_report.analyse(worse)["kv_events"]["misses"]["mean"] == [
        "sessions s0 110% (median of 3: 0.49-1.58x)"
    ]


def test_result_files_combine_into_one_worst_first_table_merging_only_like_settings() -> None:
    a, b = _repeated_doc([80], [0.5]), _repeated_doc([120], [0.5])
    other_scale = _repeated_doc([300], [0.5], time_scale=1.0)
    text = suite_report.combined_markdown([a, b, other_scale], ["a.json", "b.json", "c.json"])
    table = [line for line in text.splitlines() if line.startswith("| sessions")]
    # a and b are repeats of one point (median 1.00x of 0.80 and 1.20); c ran at another time scale.
    assert len(table) == 2
    assert "| 3.00 |" in table[0]
    assert "| 2 | 1.00 (0.80-1.20) |" in table[1]
    assert "2 points" in text and "c.json" in text
    # Misses are judged on the medians and name each point with its engines and blocks.
    assert "mean missed at: sessions s0 110% e8 b1024\n" in text


def test_repeats_rerun_every_point_on_the_same_arrivals_into_their_own_logs(
    vocab: Vocab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--repeats 2`: the cell's points, each run twice in turn per gateway. The runs themselves are
    replaced by a recorder (named as such: starting engines and gateways is the suite's own smoke)."""
    from load.bench_routing import suite

    calls: list[tuple[str, object, str]] = []

    def recorder(gw, ctx, cell, shape, arrivals, args, label):  # type: ignore[no-untyped-def]
        calls.append((gw.name, None if arrivals is None else tuple(arrivals), label))
        return {"gateway": gw.name, "requests_per_s": 4.0}

    monkeypatch.setattr(suite, "_guarded", recorder)
    args = suite.parse_args(["--quick", "--no-rr", "--shapes", "rag", "--loads", "0.5", "--repeats", "2"])
    cell = suite.cells(args)[0]
    ctx = suite.Context(
        config=cell.config,
        model="m",
        model_dir=default_model_dir(),
        log_dir=Path("/x"),
        envoy_concurrency=1,
        smg_binary=Path("/smg"),
    )
    out = suite.run_cell(cell, args, ctx, vocab, [suite.ours("kv_events")])
    assert [(p["mode"], p["repeat"]) for p in out["points"]] == [
        ("closed", 0),
        ("closed", 1),
        ("open", 0),
        ("open", 1),
    ]
    assert out["capacity"] == 4.0
    open_runs = [c for c in calls if c[1] is not None]
    assert len({c[1] for c in open_runs}) == 1, "every repeat and gateway meets the same arrivals"
    labels = [(name, label) for name, _, label in calls]
    assert len(set(labels)) == len(labels) == 8, "no repeat overwrites another's logs"
    assert ("smg", "open50-r1") in labels and ("kv_events", "closed") in labels


def test_rows_and_comparisons_report_decoding_beside_ttft() -> None:
    smg, ours = _run("smg", 100, 200, 0.9), _run("kv_events", 90, 190, 0.9)
    smg["tpot_ms"], smg["itl_ms"] = {"mean": 30.0}, {"p99": 400.0}
    ours["tpot_ms"], ours["itl_ms"] = {"mean": 36.0}, {"p99": 200.0}
    cell = _main_cell("long_answers", [{"mode": "closed", "load": None, "rate": None, "runs": [smg, ours]}])
    doc = {"ours": [{"name": "kv_events"}], "cells": [cell], "default_policy": "kv_events"}
    [row] = suite_report.comparisons(doc)
    assert row["tpot"] == pytest.approx(1.2) and row["itl_p99"] == pytest.approx(0.5)
    header = suite_report.HEADER.splitlines()[0]
    line = list(suite_report._rows(cell, doc))[1]
    cells = dict(zip(header.split("|")[1:-1], line.split("|")[1:-1], strict=True))
    decoding = (cells[" TPOT mean ms "], cells[" ITL p99 ms "], cells[" TPOT/SMG "])
    assert decoding == (" 36.0 ", " 200 ", " 1.20 ")
    # Results recorded before decoding was measured have no such figures.
    del ours["tpot_ms"], ours["itl_ms"]
    [row] = suite_report.comparisons(doc)
    assert row["tpot"] is None and row["itl_p99"] is None


def test_a_runs_summary_measures_each_answers_pace_and_its_stalls() -> None:
    from load.bench_routing.run import summarize
    from load.loadgen.records import Record

    def record(start: float, ttft: float, latency: float, tokens: int, itl: list[float]) -> Record:
        return Record("long_answers", True, start, latency, ttft, itl, 200, None, 100, tokens, 0)

    records = [
        # 101 tokens, 3 s after the first: 30 ms a token; one gap is a 0.5 s stall.
        record(5.0, 0.1, 3.1, 101, [0.025] * 99 + [0.5]),
        record(6.0, 0.2, 0.2, 1, []),  # one token: no pace to measure
        record(1.0, 0.1, 1.1, 11, [0.1] * 10),  # in the warm-up: left out
    ]
    out = summarize(records, warmup_s=4.0, end_s=20.0)
    assert out["tpot_ms"]["count"] == 1 and out["tpot_ms"]["mean"] == pytest.approx(30.0)
    assert out["itl_ms"]["count"] == 100
    assert out["itl_ms"]["p50"] == pytest.approx(25.0) and out["itl_ms"]["p99"] > 25.0
