"""Where the Envoy dynamic module of the response path is (issue 17): the `extproc_envoy` shared object
that `native/envoy-module` builds, which Envoy loads as `libextproc_envoy.so` from a search directory."""

from __future__ import annotations

import os
from pathlib import Path

MODULE_NAME = "extproc_envoy"
MODULE_FILE = f"lib{MODULE_NAME}.so"
_REPO = Path(__file__).resolve().parent.parent


def module_dir() -> Path | None:
    """The directory holding the module: $EXTPROC_ENVOY_MODULE_DIR, else the package's own copy, else the
    release build of a source checkout; None when there is none (the response path falls back to
    ext_proc)."""
    explicit = os.environ.get("EXTPROC_ENVOY_MODULE_DIR")
    candidates = [Path(explicit)] if explicit else []
    candidates += [Path(__file__).resolve().parent, _REPO / "native" / "target" / "release"]
    for directory in candidates:
        if (directory / MODULE_FILE).is_file():
            return directory
    return None
