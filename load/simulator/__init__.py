"""A vLLM engine simulator speaking the real `vllm.grpc.engine.VllmEngine` protocol (token ids in,
token ids out), for testing and load-testing the gateway without GPUs.

    cluster = await start_engines(default_model_dir(), count=2, base_port=0)
    ...  # point the gateway at cluster.addresses
    await cluster.stop()

`python -m load.simulator --port 50051 --engines 4` runs the same as a process.
"""

from load.simulator.cluster import SimCluster, SimEngine, start_engines
from load.simulator.engine import EngineStats, VllmEngine
from load.simulator.model import ModelSpec, load_model_spec
from load.simulator.options import SimOptions

__all__ = [
    "EngineStats",
    "ModelSpec",
    "SimCluster",
    "SimEngine",
    "SimOptions",
    "VllmEngine",
    "load_model_spec",
    "start_engines",
]
