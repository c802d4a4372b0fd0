"""What the metrics port shows: the data plane's Prometheus text (rendered in Rust, one call per scrape)
followed by the control plane's own few gauges (the engine pools' health checks), and the operator's
engine view (`/engines`, `extproc status`).

Requests are counted in Rust as they end; nothing here runs per request. See docs/observability.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extproc import _native
from extproc.pool import EnginePool

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sample(name: str, labels: Mapping[str, str], value: float) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {value:g}\n"


def control_plane_text(pools: Mapping[str, EnginePool]) -> str:
    """The engine pools' gauges: each configured engine's last health check, each model's readiness."""
    out = [
        "# HELP extproc_health_check_up 1 when the engine's last health check passed.\n",
        "# TYPE extproc_health_check_up gauge\n",
    ]
    for model, pool in pools.items():
        for engine in pool.engines:
            labels = {"model": model, "engine": engine.address, "protocol": engine.protocol or "unknown"}
            out.append(_sample("extproc_health_check_up", labels, 1 if engine.healthy else 0))
    out += [
        "# HELP extproc_model_ready 1 while the model has a healthy engine that is not draining.\n",
        "# TYPE extproc_model_ready gauge\n",
    ]
    for model, pool in pools.items():
        ready = any(e.healthy and not e.draining for e in pool.engines)
        out.append(_sample("extproc_model_ready", {"model": model}, 1 if ready else 0))
    return "".join(out)


def render(gateway: _native.Gateway, pools: Mapping[str, EnginePool]) -> str:
    """The whole `/metrics` text."""
    return gateway.metrics_text() + control_plane_text(pools)


def engine_view(gateway: _native.Gateway, pools: Mapping[str, EnginePool]) -> dict[str, Any]:
    """`/engines`: every model's router endpoints (a data-parallel engine has one per rank), with the
    control plane's word on the engine (why it is out of rotation, if it is)."""
    by_address = {(model, e.address): e for model, pool in pools.items() for e in pool.engines}
    engines = []
    for item in gateway.engines():
        address = str(item["engine"]).rsplit("#", 1)[0]
        engine = by_address.get((str(item["model"]), address))
        item["address"] = address
        item["problem"] = engine.problem if engine is not None else None
        # A discovered engine taking no new requests (not ready, or terminating) while its open ones finish.
        item["draining"] = engine.draining if engine is not None else False
        engines.append(item)
    return {"engines": engines}
