"""The model facts an engine advertises and generates by, read once from a model directory.

The simulator loads no weights: everything an engine needs about "its" model comes from the HF style
config files of the model directory (see `extproc.models`), the same files a real vLLM reads them from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from extproc.models import resolve_model_dir, served_model_name

# vLLM's fallback when a config names no context length.
DEFAULT_MAX_MODEL_LEN = 8192
# The generation-config sampling defaults vLLM advertises in GetModelInfo.
_SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True)
class ModelSpec:
    """What an engine knows about the model it pretends to serve."""

    model_dir: Path
    served_name: str
    max_model_len: int
    vocab_size: int
    # Prompt ids above this are out of vocabulary: vLLM's bound, the larger of the tokenizer's and
    # the model's (a model's embedding may be padded past the tokenizer).
    max_token_id: int
    # The config's EOS ids, in order: what GetModelInfo advertises.
    eos_token_ids: tuple[int, ...]
    # The tokenizer's own EOS: vLLM stops on it without reporting a stop reason.
    tokenizer_eos_id: int | None
    # Config EOS ids other than the tokenizer's: vLLM adds the generation config's (which falls back
    # to config.json's) to every request's stop_token_ids unless ignore_eos, so stopping on one
    # reports it as the matched token.
    extra_stop_ids: tuple[int, ...]
    bos_token_id: int
    pad_token_id: int
    model_type: str
    architectures: tuple[str, ...]
    default_sampling_params_json: str

    @property
    def emitted_eos_id(self) -> int:
        """The EOS id a natural stop emits: the model's first EOS id."""
        if self.eos_token_ids:
            return self.eos_token_ids[0]
        if self.tokenizer_eos_id is not None:
            return self.tokenizer_eos_id
        raise ValueError(f"model {self.model_dir} declares no eos token")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> list[int]:
    """HF configs hold one id or a list of them; negatives and booleans are not ids."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value] if value >= 0 else []
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    return []


def _token_name(value: Any) -> str | None:
    """tokenizer_config names special tokens as a string or an AddedToken-like dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def load_model_spec(
    model_dir: str | Path | None,
    *,
    model_name: str | None = None,
    max_model_len: int | None = None,
    tokenizer: Tokenizer | None = None,
) -> ModelSpec:
    """Read a model directory's configs (no model dir: the default model)."""
    directory = resolve_model_dir(model_dir)
    config = _read_json(directory / "config.json")
    generation = _read_json(directory / "generation_config.json")
    tokenizer_config = _read_json(directory / "tokenizer_config.json")
    if tokenizer is None:
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))

    config_eos = _ids(config.get("eos_token_id"))
    generation_eos = _ids(generation.get("eos_token_id"))
    eos_ids = config_eos or generation_eos

    eos_name = _token_name(tokenizer_config.get("eos_token"))
    tokenizer_eos = tokenizer.token_to_id(eos_name) if eos_name else None
    extra_stop = [i for i in dict.fromkeys([*config_eos, *generation_eos]) if i != tokenizer_eos]

    bos = _ids(config.get("bos_token_id")) or _ids(generation.get("bos_token_id"))
    pad = _ids(config.get("pad_token_id"))
    defaults = {k: generation[k] for k in _SAMPLING_DEFAULT_KEYS if generation.get(k) is not None}

    vocab_size = int(config.get("vocab_size") or tokenizer.get_vocab_size(with_added_tokens=True))
    context = max_model_len or config.get("max_position_embeddings") or DEFAULT_MAX_MODEL_LEN
    return ModelSpec(
        model_dir=directory,
        served_name=served_model_name(directory, model_name),
        max_model_len=int(context),
        vocab_size=vocab_size,
        max_token_id=max(vocab_size, tokenizer.get_vocab_size(with_added_tokens=True)) - 1,
        eos_token_ids=tuple(eos_ids),
        tokenizer_eos_id=tokenizer_eos,
        extra_stop_ids=tuple(extra_stop),
        bos_token_id=bos[0] if bos else 0,
        pad_token_id=pad[0] if pad else 0,
        model_type=str(config.get("model_type") or "llama"),
        architectures=tuple(str(a) for a in config.get("architectures") or ()),
        default_sampling_params_json=json.dumps(defaults, separators=(",", ":")) if defaults else "",
    )
