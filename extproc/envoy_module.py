"""Where the Envoy dynamic module of the response path is (issue 17): the `extproc_envoy` shared object
that `native/envoy-module` builds, which Envoy loads as `libextproc_envoy.so` from a search directory."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from extproc.contracts import RESPONSE_PLAN_NAMESPACE

__all__ = ["MODULE_ABI_VERSION", "MODULE_FILE", "RESPONSE_PLAN_NAMESPACE", "module_dir", "module_path"]

MODULE_NAME = "extproc_envoy"
MODULE_FILE = f"lib{MODULE_NAME}.so"
# The dynamic-module ABI the module is written against (native/envoy-module/src/hooks.rs, ABI_VERSION:
# Envoy 1.40's); tests/envoy_module checks the built module says the same.
MODULE_ABI_VERSION = "v0.2.0"
# Callbacks of Envoy's ABI the module calls that came last: an Envoy exporting them has the module
# extension, and its ABI reaches as far as the module's.
_REQUIRED_CALLBACKS = (
    b"envoy_dynamic_module_callback_http_filter_scheduler_new",
    b"envoy_dynamic_module_callback_http_send_response_data",
    b"envoy_dynamic_module_callback_http_get_metadata_string",
)
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


def unsupported_reason(envoy_binary: str) -> str | None:
    """Why the Envoy at `envoy_binary` cannot run the module (None: it can): the module is not built, or
    the binary lacks the callbacks the module calls or declares another dynamic-module ABI version than
    the module's. The binary is read, not run (its exported names and version string, ~0.1 s): no
    process, no config, no port."""
    if module_dir() is None:
        return f"{MODULE_FILE} is not built (make envoy-module)"
    try:
        with open(envoy_binary, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as image:
            missing = [name for name in _REQUIRED_CALLBACKS if image.find(name + b"\0") < 0]
            if missing:
                return f"{envoy_binary} has no dynamic modules (no {missing[0].decode()})"
            if image.find(b"\0" + MODULE_ABI_VERSION.encode() + b"\0") < 0:
                return f"{envoy_binary} does not declare the module's dynamic-module ABI {MODULE_ABI_VERSION}"
    except (OSError, ValueError) as exc:
        return f"cannot read the Envoy binary {envoy_binary}: {exc}"
    return None
