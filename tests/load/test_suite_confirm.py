"""`suite.py --confirm-over`: a point where one of ours missed a target (a mean TTFT over the ratio, a
p90 over 1.05x, hits more than half a point under SMG's) is run again up to `--confirm-runs` runs;
others keep `--repeats`."""

from __future__ import annotations

from typing import Any

import pytest

from load.bench_routing import suite, suite_report


def run(gateway: str, mean_ms: float, p90_ms: float | None = None, hit_rate: float = 0.8) -> dict[str, Any]:
    return {
        "gateway": gateway,
        "ttft_ms": {"mean": mean_ms, "p90": 2 * mean_ms if p90_ms is None else p90_ms, "p99": 3 * mean_ms},
        "hit_rate": hit_rate,
        "requests_per_s": 10.0,
    }


def repeat(
    ours_ms: float,
    smg_ms: float = 100.0,
    rr_ms: float = 500.0,
    ours_p90_ms: float | None = None,
    ours_hits: float = 0.8,
) -> list[dict[str, Any]]:
    """One repeat's runs: SMG, ours and round robin (SMG's and ours' hit rates 0.8 unless given)."""
    return [
        run("smg", smg_ms),
        run("kv_events", ours_ms, ours_p90_ms, ours_hits),
        run("round_robin", rr_ms, hit_rate=0.1),
    ]


def test_without_confirming_a_point_gets_its_repeats() -> None:
    assert suite.runs_wanted([], 1, None, 3) == 1
    assert suite.runs_wanted([repeat(300.0)], 1, None, 3) == 1
    assert suite.runs_wanted([repeat(300.0)], 2, None, 3) == 2


def test_a_run_of_ours_over_the_ratio_asks_for_more_runs() -> None:
    assert suite.runs_wanted([], 1, 0.95, 3) == 1, "nothing measured yet"
    assert suite.runs_wanted([repeat(90.0)], 1, 0.95, 3) == 1, "0.90x: settled"
    assert suite.runs_wanted([repeat(96.0)], 1, 0.95, 3) == 3, "0.96x: confirm"
    # Round robin far over SMG's asks for nothing: only our policies are judged.
    assert suite.runs_wanted([repeat(90.0, rr_ms=10_000.0)], 1, 0.95, 3) == 1
    # The repeats asked for come first, then any of them over the ratio asks for the rest.
    assert suite.runs_wanted([repeat(120.0)], 2, 0.95, 3) == 2
    assert suite.runs_wanted([repeat(90.0), repeat(120.0)], 2, 0.95, 5) == 5
    assert suite.runs_wanted([repeat(90.0), repeat(120.0)], 4, 0.95, 3) == 4, "never fewer than --repeats"


def test_a_p90_or_hit_rate_past_the_targets_asks_for_more_runs() -> None:
    # The mean well under the ratio, but the p90 over 1.05x SMG's (200 ms).
    assert suite.runs_wanted([repeat(80.0, ours_p90_ms=212.0)], 1, 0.95, 3) == 3
    assert suite.runs_wanted([repeat(80.0, ours_p90_ms=209.0)], 1, 0.95, 3) == 1, "1.045x: within"
    # Hits 0.6 points under SMG's over each run's own requests: confirm; 0.4 under: settled.
    assert suite.runs_wanted([repeat(80.0, ours_hits=0.794)], 1, 0.95, 3) == 3
    assert suite.runs_wanted([repeat(80.0, ours_hits=0.796)], 1, 0.95, 3) == 1
    # Over the requests both served (recorded as `twin_hits`), that difference is the one judged.
    twin = repeat(80.0, ours_hits=0.7)
    twin[1]["twin_hits"] = {"pts": 0.0}
    assert suite.runs_wanted([twin], 1, 0.95, 3) == 1
    twin[1]["twin_hits"] = {"pts": -1.0}
    assert suite.runs_wanted([repeat(80.0), twin], 1, 0.95, 3) == 3


def test_the_misses_are_named() -> None:
    runs = repeat(120.0, ours_p90_ms=300.0, ours_hits=0.7)
    assert suite_report.target_misses(runs, 0.95) == [
        "kv_events mean 1.20x",
        "kv_events p90 1.50x",
        "kv_events hits -10.0 pts",
    ]
    assert suite_report.target_misses(repeat(90.0), 0.95) == []


def test_a_failed_or_smg_less_repeat_asks_for_nothing() -> None:
    ours = run("kv_events", 300.0)
    failed = [{"gateway": "smg", "failed": "port taken"}, ours]
    assert suite.runs_wanted([failed], 1, 0.95, 3) == 1
    assert suite.runs_wanted([[ours]], 1, 0.95, 3) == 1


def test_the_flags_are_checked() -> None:
    args = suite.parse_args(["--quick", "--confirm-over", "0.95"])
    assert (args.confirm_over, args.confirm_runs) == (0.95, 3)
    assert suite.parse_args(["--quick"]).confirm_over is None
    with pytest.raises(SystemExit):
        suite.parse_args(["--quick", "--confirm-over", "0"])
    with pytest.raises(SystemExit):
        suite.parse_args(["--quick", "--confirm-over", "0.95", "--confirm-runs", "0"])
