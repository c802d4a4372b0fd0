#!/bin/sh
# Regenerates envoy.json, the gateway Envoy's bootstrap, with `extproc envoy-config` (`make deploy-configs`;
# tests/deploy/test_envoy_configs.py fails when the committed file differs from this output).
#   - clients on 0.0.0.0:8080 (the `gateway` Service), admin on 127.0.0.1:9901 (never exposed);
#   - extproc found by DNS through the headless `extproc-pods` Service (STRICT_DNS: every ready pod);
#   - the engines cluster from extproc over EDS (extproc-pods:18000, base/extproc-env.yaml turns it on):
#     every engine extproc knows, discovered pods included, with the override_host policy so that
#     Envoy follows extproc's list of up to 2 fallbacks when an engine refuses or is down.
#   - the response path on ext_proc: the gateway image's Envoy has no extproc_envoy module to load (see
#     docs/operating.md, "The response path"); a gateway image that carries it can drop that flag.
# Another namespace or cluster domain: change --listen and --xds-listen here and regenerate.
# usage: EXTPROC=.venv/bin/extproc sh deploy/kubernetes/envoy/generate.sh [OUTPUT]
set -eu
here=$(dirname "$0")
exec "${EXTPROC:-extproc}" envoy-config \
    --host 0.0.0.0 --port 8080 --admin-port 9901 \
    --listen extproc-pods.llm-gateway.svc.cluster.local:50051 \
    --xds-listen extproc-pods.llm-gateway.svc.cluster.local:18000 \
    --destination-fallbacks 2 \
    --envoy-access-log \
    --response-path ext_proc \
    -o "${1:-$here/envoy.json}"
