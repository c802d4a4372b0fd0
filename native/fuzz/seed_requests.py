"""Writes the hand-written seed corpus of the JSON targets (corpus/request, corpus/template): requests as the
project's tests send them (tests/integration: chat, completions, tokenize, logprobs, choices, batches, tools,
reasoning, documents) and the bad requests of tests/integration/test_bad_requests.py. The binary targets'
seeds are generated: `extproc-fuzz --write-seeds N`. Run from this directory: python3 seed_requests.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
OK = [{"role": "user", "content": "hi"}]
BRIEF = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]

REQUESTS: dict[str, object] = {
    "chat-minimal": {"model": "m", "messages": OK},
    "chat-brief-stream": {"model": "m", "messages": BRIEF, "stream": True, "max_tokens": 5},
    "chat-usage": {
        "model": "m",
        "messages": BRIEF,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    "chat-logprobs": {
        "model": "m",
        "messages": OK,
        "seed": 7,
        "logprobs": True,
        "top_logprobs": 3,
        "max_tokens": 10,
    },
    "chat-choices": {"model": "m", "messages": OK, "n": 3, "temperature": 0.8, "max_completion_tokens": 8},
    "chat-sampling": {
        "model": "m",
        "messages": OK,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "seed": 11,
        "stop": [" the"],
        "stop_token_ids": [128009],
        "ignore_eos": False,
        "skip_special_tokens": True,
        "logit_bias": {"1234": -100, "42": 5.5},
        "include_stop_str_in_output": True,
        "user": "user-1",
    },
    "chat-parts": {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}
        ],
    },
    "chat-tools": {"model": "m", "messages": TOOL_TURNS, "tools": TOOLS},
    "chat-reasoning": {
        "model": "m",
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "add them"},
            {"role": "user", "content": "and 3+3?"},
        ],
        "chat_template_kwargs": {"enable_thinking": True},
    },
    "chat-continue": {
        "model": "m",
        "messages": [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
    },
    "chat-documents": {
        "model": "m",
        "messages": OK,
        "documents": [{"title": "Sea", "text": "The sea is blue."}],
    },
    "chat-unicode": {
        "model": "m",
        "messages": [{"role": "user", "content": "é✓🙂 \u0000 <|eot_id|> {{ x }}"}],
    },
    "completion-text": {"model": "m", "prompt": "Hello there", "max_tokens": 4},
    "completion-tokens": {"model": "m", "prompt": [9906, 1070], "max_tokens": 4},
    "completion-batch": {"model": "m", "prompt": ["one", "two", "three"], "max_tokens": 2},
    "completion-token-batch": {"model": "m", "prompt": [[1, 2], [3, 4]], "max_tokens": 2},
    "completion-echo": {"model": "m", "prompt": "Say", "echo": True, "max_tokens": 3, "stream": True},
    "completion-logprobs": {
        "model": "m",
        "prompt": "Describe the sea.",
        "logprobs": 5,
        "min_tokens": 2,
        "max_tokens": 10,
    },
    "tokenize-chat": {"model": "m", "messages": BRIEF, "return_token_strs": True},
    "tokenize-prompt": {"model": "m", "prompt": "Hello", "add_special_tokens": False},
    "detokenize": {"model": "m", "tokens": [9906, 1070]},
}
# tests/integration/test_bad_requests.py's cases (as bytes where they are not JSON objects).
BAD: dict[str, bytes | object] = {
    "bad-malformed": b'{"model": ',
    "bad-not-object": b"[1, 2]",
    "bad-empty": b"",
    "bad-no-messages": {"model": "m"},
    "bad-no-model": {"messages": OK},
    "bad-empty-messages": {"model": "m", "messages": []},
    "bad-temperature-type": {"model": "m", "messages": OK, "temperature": "hot"},
    "bad-top-p": {"model": "m", "messages": OK, "top_p": 1.5},
    "bad-max-tokens": {"model": "m", "messages": OK, "max_tokens": -1},
    "bad-role": {"model": "m", "messages": [{"role": "wizard", "content": "x"}]},
    "bad-min-over-max": {"model": "m", "messages": OK, "max_tokens": 2, "min_tokens": 5},
    "bad-logit-bias": {"model": "m", "messages": OK, "logit_bias": {"x": 1}},
    "bad-stop": {"model": "m", "messages": OK, "stop": [1]},
}


def write(directory: Path, cases: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, body in cases.items():
        data = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
        (directory / f"{name}.json").write_bytes(data)


write(HERE / "corpus" / "request", {**REQUESTS, **BAD})
write(HERE / "corpus" / "template", {k: v for k, v in REQUESTS.items() if k.startswith("chat-")})
