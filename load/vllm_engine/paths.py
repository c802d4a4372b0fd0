"""Where the real-engine assets live: extproc's cache folder (`~/.cache/extproc/vllm`, so every checkout
on a machine shares one 6 GB venv), or `$EXTPROC_VLLM_CACHE`."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    explicit = os.environ.get("EXTPROC_VLLM_CACHE")
    if explicit:
        return Path(explicit)
    from extproc.models import cache_root

    return cache_root() / "vllm"


def venv_dir() -> Path:
    return cache_dir() / "vllm-venv"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def tiny_model_dir() -> Path:
    return cache_dir() / "tiny-llama"


@contextmanager
def build_lock(name: str) -> Iterator[None]:
    """Holds an exclusive lock on `<cache>/<name>.lock` while one process builds an asset: pytest sessions
    sharing the cache (CI beside a developer's run) wait for the build rather than delete it under each
    other. Released when the process dies, so a killed build leaves no stale lock."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
