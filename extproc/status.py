"""`extproc status`: the engine view of a running gateway (`GET /engines` on its metrics port) as a
terminal table, one row per engine endpoint."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

DEFAULT_URL = "http://127.0.0.1:9464"

COLUMNS = (
    "MODEL",
    "ENGINE",
    "PROTOCOL",
    "HEALTH",
    "IN-FLIGHT",
    "TOKENS",
    "RUNNING",
    "WAITING",
    "KV",
    "BLOCKS",
    "PENALTY",
)


class StatusError(Exception):
    """The gateway's metrics port did not answer with an engine view."""


def fetch(metrics_url: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    url = metrics_url.rstrip("/") + "/engines"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return list(json.load(reply)["engines"])
    except (urllib.error.URLError, OSError) as e:
        raise StatusError(f"cannot read {url}: {e}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise StatusError(f"{url} did not answer with an engine view: {e}") from None


def _row(e: dict[str, Any]) -> tuple[str, ...]:
    health = "draining" if e.get("draining") else "up" if e["healthy"] else "down"
    penalty = str(e["penalty"])
    if e["penalty_failures"]:
        penalty += f" ({e['penalty_failures']} failures)"
    return (
        str(e["model"]),
        str(e["engine"]),
        str(e["protocol"]),
        health,
        str(e["in_flight_requests"]),
        str(e["in_flight_tokens"]),
        str(e["running"]),
        str(e["waiting"]),
        f"{100 * float(e['kv_usage']):.0f}%",
        str(e["cached_blocks"]),
        penalty,
    )


def table(engines: Sequence[dict[str, Any]]) -> str:
    """The engines as aligned columns under a header line; problems listed below the table."""
    rows = [COLUMNS, *(_row(e) for e in engines)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not engines:
        lines.append("(no engines)")
    for e in engines:
        if e.get("problem"):
            lines.append(f"{e['engine']}: {e['problem']}")
    return "\n".join(lines) + "\n"
