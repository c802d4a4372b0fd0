"""Where the real-engine assets live: extproc's cache folder (`~/.cache/extproc/vllm`, so every checkout
on a machine shares one 6 GB venv), or `$EXTPROC_VLLM_CACHE`."""

from __future__ import annotations

import os
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
