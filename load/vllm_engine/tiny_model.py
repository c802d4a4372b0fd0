"""A tiny random-weight Llama for the real engine: real architecture and tokenizer, no downloads.

2 layers, hidden 256, 4 attention heads, 2 KV heads, bfloat16, the Llama 3 vocabulary (128,256 tokens,
embeddings tied to the output so the weights stay ~70 MB). Weights come from a fixed seed, so every build
is the same model. Tokenizer files, configs and the chat template are the project's default model's
(`extproc.models.default_model_dir()`), so the gateway and the simulator see the same model facts as vLLM.

Building needs torch and transformers, which live only in the vLLM venv: the build runs there as a child
process. A stamp with the recipe's digest marks a finished build.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
from pathlib import Path

from extproc.models import default_model_dir
from load.vllm_engine.paths import build_lock, tiny_model_dir
from load.vllm_engine.venv import ensure_venv

logger = logging.getLogger(__name__)

SEED = 0
# max_position_embeddings matches the launcher's --max-model-len, so vLLM and the simulator given this
# folder agree on the context length without flags.
MAX_MODEL_LEN = 2048
ARCHITECTURE = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": MAX_MODEL_LEN,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
}
# Copied from the default model; config.json is written by transformers from the architecture above.
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")
STAMP_NAME = ".extproc-model-ready"

# Run by the vLLM venv's interpreter: argv = target dir, JSON architecture, seed.
_BUILD = """
import json, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
target, arch, seed = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
base = json.loads(open(sys.argv[4]).read())
torch.manual_seed(seed)
config = LlamaConfig(
    vocab_size=base["vocab_size"], bos_token_id=base["bos_token_id"], eos_token_id=base["eos_token_id"],
    torch_dtype="bfloat16", **arch,
)
model = LlamaForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(target, safe_serialization=True)
"""


def recipe_digest() -> str:
    source = default_model_dir()
    digest = hashlib.sha256(json.dumps([ARCHITECTURE, SEED], sort_keys=True).encode())
    for name in (*COPIED_FILES, "config.json"):
        digest.update((source / name).read_bytes())
    return digest.hexdigest()[:16]


def ensure_tiny_model(*, force: bool = False) -> Path:
    """The model folder, building it first unless a finished build of this recipe is there."""
    target = tiny_model_dir()
    stamp = target / STAMP_NAME
    digest = recipe_digest()
    if not force and stamp.is_file() and stamp.read_text().strip() == digest:
        return target
    python = ensure_venv()
    with build_lock("tiny-llama"):
        # Another process may have built it while this one waited for the lock.
        if not force and stamp.is_file() and stamp.read_text().strip() == digest:
            return target
        _build_tiny_model(python, target, digest)
    return target


def _build_tiny_model(python: Path, target: Path, digest: str) -> None:
    stamp = target / STAMP_NAME
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    source = default_model_dir()
    logger.info("building the tiny Llama at %s", target)
    subprocess.run(
        [python, "-c", _BUILD, target, json.dumps(ARCHITECTURE), str(SEED), source / "config.json"],
        check=True,
    )
    for name in COPIED_FILES:
        # Real copies (the default model's tokenizer.json is a symlink into site-packages).
        shutil.copyfile((source / name).resolve(), target / name)
    _set_chat_template(target)
    # save_pretrained writes its own generation config; the default model's (copied above) wins.
    stamp.write_text(digest + "\n")


def _set_chat_template(target: Path) -> None:
    """Also put the template in tokenizer_config.json, where older readers look for it."""
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = (target / "chat_template.jinja").read_text(encoding="utf-8")
    config["model_max_length"] = MAX_MODEL_LEN
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
