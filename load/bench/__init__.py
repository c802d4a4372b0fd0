"""Side-by-side benchmark: our stack (Envoy + extproc) vs SMG vs the bare engine, on simulated engines.

`python -m load.bench` (or `--quick`); docs/benchmarks.md explains what is measured and how to read it.
"""
