#!/bin/sh
# Regenerates envoy.json, the gateway Envoy's bootstrap, with `extproc envoy-config` (`make deploy-configs`;
# tests/deploy/test_envoy_configs.py fails when the committed file differs from this output).
#   - clients on 0.0.0.0:8080 (the `gateway` Service), admin on 127.0.0.1:9901 (never exposed);
#   - extproc found by DNS through the headless `extproc-pods` Service (STRICT_DNS: every ready pod);
#   - engines unknown to Envoy: each request goes to the one address extproc puts in
#     x-gateway-destination-endpoint (ORIGINAL_DST), so discovered pods need no Envoy change.
# Another namespace or cluster domain: change --listen here and regenerate.
# usage: EXTPROC=.venv/bin/extproc sh deploy/kubernetes/envoy/generate.sh [OUTPUT]
set -eu
here=$(dirname "$0")
exec "${EXTPROC:-extproc}" envoy-config \
    --host 0.0.0.0 --port 8080 --admin-port 9901 \
    --listen extproc-pods.llm-gateway.svc.cluster.local:50051 \
    --envoy-access-log \
    -o "${1:-$here/envoy.json}"
