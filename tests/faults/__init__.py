"""The fault suite: one module per behaviour of issue 15, each through a real Envoy, extproc and simulated
engines, asserting what a client sees."""
