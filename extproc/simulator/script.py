"""Scripted outputs: a configured text a simulated engine answers with, per model or per prompt pattern.

A rule is `{match, text, model, count}`: `match` is a regex searched in the prompt's decoded text (special
tokens included, so a chat template's role markers can be matched) or "*" for every prompt; `model` limits
it to engines whose served model name matches that glob; `count` is how many requests it answers (-1:
every one). An engine checks the rules added at run time first (over HTTP `POST /script`, or
`cluster.script.add`), in the order added, then the configured ones (`SimOptions.script`, `--script`);
the first match wins. A request no rule matches gets the usual plausible words. The engines of one
cluster share their rules and counts: a rule for one request answers it whichever engine gets it.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ANY_PROMPT = "*"


@dataclass(frozen=True)
class ScriptRule:
    text: str
    match: str = ANY_PROMPT
    model: str | None = None  # a glob over the served model name; None: every model
    count: int = -1  # requests it answers; -1: every one
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not isinstance(self.match, str):
            raise ValueError("a script rule's text and match must be strings")
        if self.model is not None and not isinstance(self.model, str):
            raise ValueError("a script rule's model must be a string")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < -1:
            raise ValueError("a script rule's count must be -1 (every request) or a number of requests")
        if self.match != ANY_PROMPT:
            try:
                object.__setattr__(self, "_pattern", re.compile(self.match))
            except re.error as e:
                raise ValueError(f"script match {self.match!r} is not a valid regex: {e}") from None

    def serves(self, model_name: str) -> bool:
        return self.model is None or fnmatch.fnmatchcase(model_name, self.model)

    def matches(self, prompt_text: Callable[[], str]) -> bool:
        return self._pattern is None or self._pattern.search(prompt_text()) is not None

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "match": self.match, "model": self.model, "count": self.count}


def parse_rules(data: Any) -> tuple[ScriptRule, ...]:
    """Rules from JSON data: one rule object or a list of them (ValueError on anything else)."""
    items = data if isinstance(data, (list, tuple)) else [data]
    rules = []
    for item in items:
        if isinstance(item, ScriptRule):
            rules.append(item)
            continue
        if not isinstance(item, dict):
            raise ValueError("a script rule is a JSON object with `text` (and `match`, `model`, `count`)")
        unknown = set(item) - {"text", "match", "model", "count"}
        if unknown or "text" not in item:
            raise ValueError(f"a script rule needs `text` and takes match, model, count; got {sorted(item)}")
        rules.append(ScriptRule(**item))
    return tuple(rules)


def script_json(rules: tuple[ScriptRule, ...]) -> str:
    """The command line's `--script` value for these rules."""
    return json.dumps([rule.as_dict() for rule in rules])


def load_script_arg(value: str) -> tuple[ScriptRule, ...]:
    """`--script`: JSON rules, or `@path` to a file holding them."""
    if value.startswith("@"):
        with open(value[1:], encoding="utf-8") as f:
            value = f.read()
    try:
        return parse_rules(json.loads(value))
    except json.JSONDecodeError as e:
        raise ValueError(f"--script takes JSON rules or @file: {e}") from None


class _Entry:
    def __init__(self, rule: ScriptRule) -> None:
        self.rule = rule
        self.left = rule.count

    def as_dict(self) -> dict[str, Any]:
        return {**self.rule.as_dict(), "count": self.left}


class Script:
    """One engine's rules with their remaining counts."""

    def __init__(self, configured: tuple[ScriptRule, ...], model_name: str) -> None:
        self.model_name = model_name
        self._configured = [_Entry(rule) for rule in configured if rule.serves(model_name)]
        self._added: list[_Entry] = []

    def add(self, rules: tuple[ScriptRule, ...] | ScriptRule) -> None:
        """Rules checked before the configured ones, in the order added."""
        for rule in parse_rules(rules):
            if rule.serves(self.model_name):
                self._added.append(_Entry(rule))

    def clear(self) -> None:
        """Forget the rules added at run time (the configured ones stay)."""
        self._added.clear()

    def as_list(self) -> list[dict[str, Any]]:
        return [entry.as_dict() for entry in (*self._added, *self._configured) if entry.left != 0]

    def pick(self, prompt_text: Callable[[], str]) -> str | None:
        """The text of the first rule left that matches the prompt, counting it; None when none does.
        `prompt_text` decodes the prompt, only when a rule needs it (once)."""
        if not self._added and not self._configured:
            return None
        decoded: list[str] = []

        def text() -> str:
            if not decoded:
                decoded.append(prompt_text())
            return decoded[0]

        for entry in (*self._added, *self._configured):
            if entry.left != 0 and entry.rule.matches(text):
                if entry.left > 0:
                    entry.left -= 1
                return entry.rule.text
        return None
