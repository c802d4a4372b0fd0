"""Engine discovery: where a model's engines come from, and how the set follows changes live.

An entry of `engines` names one source (`targets`): a fixed `grpc://IP:port`, a DNS name
`grpc://NAME:port` re-resolved every `dns_refresh_interval` (`dns`), or a Kubernetes Service's
EndpointSlices `k8s://[NAMESPACE/]SERVICE[:PORT]`, listed and watched (`kubernetes`, over the tiny HTTP
client in `kube_http`, reading slices with `endpointslices`). `model_discovery` merges a model's sources
into one set of engines, each ready or draining, and hands it to the model's engine pool, which probes new
engines before they take traffic. `eds` serves Envoy's engines cluster (every engine the pools know) over
EDS, for an Envoy that follows fallbacks to discovered engines. See docs/discovery.md.

This package's `__init__` imports nothing: the config layer imports `targets` alone.
"""
