"""Load generation and benchmarks for extproc: dev tooling, run from a source checkout and not in the wheel.

The engine simulator they drive is part of the product: `extproc.simulator`.
"""
