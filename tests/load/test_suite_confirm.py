"""`suite.py --confirm-over`: a point where one of ours measured over the ratio is run again up to
`--confirm-runs` runs; others keep `--repeats`."""

from __future__ import annotations

from typing import Any

import pytest

from load.bench_routing import suite


def repeat(ours_ms: float, smg_ms: float = 100.0, rr_ms: float = 500.0) -> list[dict[str, Any]]:
    """One repeat's runs: SMG, ours (the default and a variant at the same figure) and round robin."""
    return [
        {"gateway": "smg", "ttft_ms": {"mean": smg_ms}},
        {"gateway": "kv_events", "ttft_ms": {"mean": ours_ms}},
        {"gateway": "round_robin", "ttft_ms": {"mean": rr_ms}},
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


def test_a_failed_or_smg_less_repeat_asks_for_nothing() -> None:
    ours = {"gateway": "kv_events", "ttft_ms": {"mean": 300.0}}
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
