"""The routing benchmark: every engine-picking policy of ours and SMG's cache_aware on the same simulated
engines and the same arrival trace (`python -m load.bench_routing`; docs/routing-benchmark.md)."""
