"""Load generation, the engine simulator and benchmarks for extproc."""
