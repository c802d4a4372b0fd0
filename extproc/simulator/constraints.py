"""Structured-output constraints of an engine request, honoured by generating text that satisfies them.

vLLM's `SamplingParams.constraint` oneof (SGLang's is mapped onto it by `sglang._as_vllm`):

- `json_schema` (16): a JSON instance of the schema (`json_schema.SchemaSampler`), compact with spaces;
- `json_object` (20): a JSON object (a small free-form one);
- `choice` (21): one of the choices;
- `regex` (17): a string the whole regex matches (`regex_sample`);
- `grammar` (18) and `structural_tag` (19): refused with INVALID_ARGUMENT (not supported by the simulator).

The text depends on the choice's seed only (`n` choices differ as their seeds do). A constraint the
simulator cannot honour raises ValueError, which the servicer turns into INVALID_ARGUMENT, never silently
ignored. A scripted text (`script`) that already satisfies the constraint is kept (`accepts`).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, Protocol

from smg_grpc_proto.generated import vllm_engine_pb2

from extproc.simulator import json_schema, regex_sample

UNSUPPORTED_KINDS = {"grammar": "grammar (EBNF)", "structural_tag": "structural_tag"}


class Constraint(Protocol):
    kind: str

    def generate(self, rng: random.Random) -> str: ...

    def accepts(self, text: str) -> bool: ...


class JsonConstraint:
    def __init__(self, schema: Any, kind: str = "json_schema") -> None:
        self.kind = kind
        self.schema = schema
        self.sampler = json_schema.SchemaSampler(schema)

    def generate(self, rng: random.Random) -> str:
        return json.dumps(self.sampler.sample(rng), ensure_ascii=False)

    def accepts(self, text: str) -> bool:
        try:
            value = json.loads(text)
        except ValueError:
            return False
        return json_schema.is_valid(value, self.schema)


class ChoiceConstraint:
    kind = "choice"

    def __init__(self, choices: list[str]) -> None:
        if not choices:
            raise ValueError("a choice constraint needs at least one choice")
        self.choices = choices

    def generate(self, rng: random.Random) -> str:
        return rng.choice(self.choices)

    def accepts(self, text: str) -> bool:
        return text in self.choices


class RegexConstraint:
    kind = "regex"

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.node = regex_sample.parse_regex(pattern)

    def generate(self, rng: random.Random) -> str:
        return regex_sample.sample(self.node, rng)

    def accepts(self, text: str) -> bool:
        return re.fullmatch(self.pattern, text) is not None


def from_sampling(params: vllm_engine_pb2.SamplingParams) -> Constraint | None:
    """The request's constraint, or None; ValueError when the simulator cannot honour it."""
    kind = params.WhichOneof("constraint")
    if kind is None:
        return None
    if kind in UNSUPPORTED_KINDS:
        raise ValueError(f"{UNSUPPORTED_KINDS[kind]} constraints are not supported by the simulator")
    if kind == "json_object":
        return JsonConstraint({"type": "object"}, "json_object") if params.json_object else None
    if kind == "choice":
        return ChoiceConstraint(list(params.choice.choices))
    if kind == "regex":
        return RegexConstraint(params.regex)
    if kind == "json_schema":
        try:
            schema = json.loads(params.json_schema)
        except ValueError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
        return JsonConstraint(schema)
    raise ValueError(f"{kind} constraints are not supported by the simulator")
