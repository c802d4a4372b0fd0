"""An engine simulator speaking the real engine gRPC protocols (vLLM's `vllm.grpc.engine.VllmEngine` or
SGLang's `sglang.grpc.scheduler.SglangScheduler`; token ids in, token ids out) with a paged, prefix-caching
KV cache and a continuous-batching scheduler, for testing and load-testing the gateway without GPUs.

    cluster = await start_engines(default_model_dir(), count=2, base_port=0)
    ...  # point the gateway at cluster.addresses
    await cluster.stop()

`python -m extproc.simulator --port 50051 --engines 4` runs the same as a process. tests/contract proves the
behaviour against a real vLLM engine; docs/simulator.md describes the model.
"""

from extproc.simulator.cluster import PROTOCOLS, SimCluster, SimEngine, start_engines
from extproc.simulator.core import EngineCore, EngineStats
from extproc.simulator.engine import VllmEngine
from extproc.simulator.faults import FaultPlan, FaultSettings
from extproc.simulator.model import ModelSpec, load_model_spec
from extproc.simulator.options import SimOptions
from extproc.simulator.script import Script, ScriptRule
from extproc.simulator.sglang import SglangEngine

__all__ = [
    "PROTOCOLS",
    "EngineCore",
    "EngineStats",
    "FaultPlan",
    "FaultSettings",
    "ModelSpec",
    "Script",
    "ScriptRule",
    "SglangEngine",
    "SimCluster",
    "SimEngine",
    "SimOptions",
    "VllmEngine",
    "load_model_spec",
    "start_engines",
]
