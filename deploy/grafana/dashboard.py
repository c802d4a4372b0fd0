"""Writes deploy/grafana/extproc-dashboard.json, the Grafana dashboard of extproc's metrics (docs/observability.md):
`python deploy/grafana/dashboard.py` from the repository root. tests/test_metrics_server.py checks that every
metric it queries is one extproc exports."""

# PromQL reads best on one line each.
# ruff: noqa: E501

import json

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
M = 'model=~"$model"'
GM = 'gen_ai_request_model=~"$model"'
RI = "$__rate_interval"


def q(expr, legend):
    return {"expr": expr, "legendFormat": legend, "datasource": DS, "refId": ""}


def pct(metric, sel, legend_prefix=""):
    return [
        q(
            f"histogram_quantile({p}, sum by (le) (rate({metric}_bucket{{{sel}}}[{RI}])))",
            f"{legend_prefix}p{int(p * 100)}",
        )
        for p in (0.5, 0.9, 0.99)
    ]


panels_spec = [
    (
        "Requests/s by status",
        "reqps",
        [q(f"sum by (status) (rate(extproc_requests_total{{{M}}}[{RI}]))", "{{status}}")],
    ),
    ("Time to first token (streamed)", "s", pct("gen_ai_server_time_to_first_token_seconds", GM)),
    ("Request duration", "s", pct("gen_ai_server_request_duration_seconds", GM)),
    ("Time per output token (streamed)", "s", pct("gen_ai_server_time_per_output_token_seconds", GM)),
    (
        "Tokens/s",
        "short",
        [
            q(f"sum(rate(extproc_prompt_tokens_total{{{M}}}[{RI}]))", "prompt"),
            q(f"sum(rate(extproc_cached_tokens_total{{{M}}}[{RI}]))", "cached"),
            q(f"sum(rate(extproc_completion_tokens_total{{{M}}}[{RI}]))", "completion"),
        ],
    ),
    (
        "In-flight requests per engine",
        "short",
        [q(f"sum by (engine) (extproc_engine_in_flight_requests{{{M}}})", "{{engine}}")],
    ),
    (
        "Prefix cache hit ratio",
        "percentunit",
        [
            q(
                f"sum(rate(extproc_cached_tokens_total{{{M}}}[{RI}])) / sum(rate(extproc_prompt_tokens_total{{{M}}}[{RI}]))",
                "cached / prompt tokens",
            ),
            q(
                f'sum(rate(extproc_routing_decisions_total{{{M},reason="hit"}}[{RI}])) / sum(rate(extproc_routing_decisions_total{{{M},reason=~"hit|miss|spill"}}[{RI}]))',
                "picks with a cached prefix",
            ),
        ],
    ),
    (
        "Routing decisions/s by reason",
        "ops",
        [q(f"sum by (reason) (rate(extproc_routing_decisions_total{{{M}}}[{RI}]))", "{{reason}}")],
    ),
    (
        "Gateway time per phase (p99)",
        "s",
        [
            q(
                f"histogram_quantile(0.99, sum by (le, phase) (rate(extproc_phase_duration_seconds_bucket[{RI}])))",
                "{{phase}}",
            )
        ],
    ),
    (
        "Gateway time per phase (mean)",
        "s",
        [
            q(
                f"sum by (phase) (rate(extproc_phase_duration_seconds_sum[{RI}])) / sum by (phase) (rate(extproc_phase_duration_seconds_count[{RI}]))",
                "{{phase}}",
            )
        ],
    ),
    (
        "Engine health and penalty",
        "short",
        [
            q(f"extproc_engine_healthy{{{M}}}", "healthy {{engine}}"),
            q(f"extproc_engine_penalty_state{{{M}}}", "penalty {{engine}}"),
        ],
    ),
    (
        "Engine load (engine's report)",
        "short",
        [
            q(f"extproc_engine_running_requests{{{M}}}", "running {{engine}}"),
            q(f"extproc_engine_waiting_requests{{{M}}}", "waiting {{engine}}"),
        ],
    ),
    ("KV-cache usage", "percentunit", [q(f"extproc_engine_kv_cache_usage_ratio{{{M}}}", "{{engine}}")]),
    (
        "Tokenizer cache hit ratio",
        "percentunit",
        [
            q(
                f'sum by (level) (rate(extproc_tokenizer_cache_lookups_total{{{M},result="hit"}}[{RI}])) / sum by (level) (rate(extproc_tokenizer_cache_lookups_total{{{M}}}[{RI}]))',
                "{{level}}",
            )
        ],
    ),
    (
        "KV-event batches/s by outcome",
        "ops",
        [
            q(f"sum by (outcome) (rate(extproc_kv_event_batches_total[{RI}]))", "{{outcome}}"),
            q(f"sum(rate(extproc_kv_event_resyncs_total[{RI}]))", "resyncs"),
        ],
    ),
    ("KV-event lag", "s", [q("extproc_kv_event_lag_seconds", "{{engine}}")]),
    ("Prefix index", "bytes", [q(f"extproc_prefix_index_memory_bytes{{{M}}}", "memory {{model}}")]),
    (
        "Errors/s by status",
        "reqps",
        [q(f'sum by (status) (rate(extproc_requests_total{{{M},status!="200"}}[{RI}]))', "{{status}}")],
    ),
]
panels = []
for i, (title, unit, targets) in enumerate(panels_spec):
    for j, t in enumerate(targets):
        t["refId"] = chr(ord("A") + j)
    panels.append(
        {
            "id": i + 1,
            "type": "timeseries",
            "title": title,
            "datasource": DS,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {
                "legend": {"displayMode": "list", "placement": "bottom"},
                "tooltip": {"mode": "multi"},
            },
            "targets": targets,
        }
    )
dash = {
    "__inputs": [
        {
            "name": "DS_PROMETHEUS",
            "label": "Prometheus",
            "type": "datasource",
            "pluginId": "prometheus",
            "pluginName": "Prometheus",
        }
    ],
    "__requires": [
        {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
    ],
    "title": "extproc gateway",
    "uid": "extproc-gateway",
    "tags": ["extproc", "llm", "gateway"],
    "timezone": "browser",
    "schemaVersion": 39,
    "version": 1,
    "refresh": "10s",
    "time": {"from": "now-1h", "to": "now"},
    "templating": {
        "list": [
            {
                "name": "model",
                "label": "model",
                "type": "query",
                "datasource": DS,
                "query": {"query": "label_values(extproc_requests_total, model)", "refId": "model"},
                "definition": "label_values(extproc_requests_total, model)",
                "includeAll": True,
                "multi": True,
                "allValue": ".*",
                "refresh": 2,
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            }
        ]
    },
    "panels": panels,
}
open("deploy/grafana/extproc-dashboard.json", "w").write(json.dumps(dash, indent=2) + "\n")
