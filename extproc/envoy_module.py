"""Where the Envoy dynamic module of the response path is (issue 17): the `extproc_envoy` shared object
that `native/envoy-module` builds, which Envoy loads as `libextproc_envoy.so` from a search directory."""

from __future__ import annotations

import os
from pathlib import Path

MODULE_NAME = "extproc_envoy"
# Where extproc leaves each routed request's response plan for the module (core's
# `stream/response_plan.rs`, PLAN_NAMESPACE; the module-path tests fail if the two differ).
RESPONSE_PLAN_NAMESPACE = "extproc.response"
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


def module_path() -> str:
    """The module's shared object, for `response_path = "module"`; an error naming the build step when
    it is not built."""
    directory = module_dir()
    if directory is None:
        raise FileNotFoundError(f"{MODULE_FILE} not found: build it with `make envoy-module`")
    return str(directory / MODULE_FILE)
