"""Instances of a JSON Schema, for the simulator's `json_schema` and `json_object` constraints.

`SchemaSampler(schema).sample(rng)` builds a value valid under the schema, the same value for the same
`random.Random` state. Supported: `type` (object, array, string, number, integer, boolean, null, or a list:
the first non-null), `enum`, `const`, `properties` with `required` (optional properties come with even odds,
more while `minProperties` is short), `additionalProperties` (only for required names the properties do not
list), `items`, `prefixItems`, `minItems` / `maxItems`, `uniqueItems`, `anyOf` / `oneOf` (the first branch),
`allOf` (merged), `$ref` to any local JSON pointer (`#/$defs/...`, `#/definitions/...`, `#`; past depth 6
only required properties and minimum item counts, so recursive schemas end), string
`minLength` / `maxLength` / `pattern` (through `regex_sample`) / common `format`s, and number bounds
(`minimum`, `maximum`, exclusive ones, `multipleOf`). Annotations (`title`, `description`, `default`, ...)
are ignored. Keywords that constrain in ways the sampler does not model (`not`, `if` / `then` / `else`,
`patternProperties`, `contains`, ...) raise `UnsupportedSchema` naming the keyword, at construction.

`is_valid(instance, schema)` checks an instance against the same subset, so a scripted output can be kept
under a constraint it satisfies.
"""

from __future__ import annotations

import math
import random
import re
import uuid
from collections.abc import Iterator
from typing import Any

from extproc.simulator import regex_sample

UNSUPPORTED = (
    "not",
    "if",
    "then",
    "else",
    "patternProperties",
    "dependentSchemas",
    "dependentRequired",
    "dependencies",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
)
# Where a schema holds subschemas: one schema, a list of them, or a name -> schema map.
_ONE = ("items", "additionalProperties", "additionalItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions")
MAX_DEPTH = 32
# Past this depth only what the schema requires is generated, so recursive schemas end.
SHALLOW_DEPTH = 6
# The plain words strings are made of.
WORDS = (
    "alpha", "bravo", "city", "delta", "echo", "field", "green", "harbor", "island", "jade", "kilo",
    "lemon", "metro", "north", "ocean", "paris", "quartz", "river", "stone", "tango", "umber", "valley",
    "water", "xenon", "yellow", "zephyr",
)  # fmt: skip
_FORMATS = {
    "date-time": "2024-05-17T09:30:00Z",
    "date": "2024-05-17",
    "time": "09:30:00",
    "email": "user@example.com",
    "uri": "https://example.com/item",
    "url": "https://example.com/item",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
}
_OPEN_EXTRA = 2  # how far past minItems an array may grow


class UnsupportedSchema(ValueError):
    """A schema the simulator cannot sample from (the message names the keyword and where it is)."""


def _subschemas(schema: dict[str, Any], path: str) -> Iterator[tuple[Any, str]]:
    for key in _ONE:
        if isinstance(schema.get(key), dict):
            yield schema[key], f"{path}/{key}"
    for key in _LIST:
        value = schema.get(key)
        if key == "items" or not isinstance(value, list):
            continue
        for i, item in enumerate(value):
            yield item, f"{path}/{key}/{i}"
    if isinstance(schema.get("items"), list):  # draft 4-7 tuple form
        for i, item in enumerate(schema["items"]):
            yield item, f"{path}/items/{i}"
    for key in _MAP:
        value = schema.get(key)
        if isinstance(value, dict):
            for name, item in value.items():
                yield item, f"{path}/{key}/{name}"


def check_supported(schema: Any, path: str = "#") -> None:
    """Raise UnsupportedSchema for the first keyword outside the sampler's subset, anywhere in the schema."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise UnsupportedSchema(f"json_schema at {path} must be an object or a boolean")
    for keyword in UNSUPPORTED:
        if keyword in schema:
            raise UnsupportedSchema(
                f"json_schema keyword {keyword!r} (at {path}) is not supported by the simulator"
            )
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        raise UnsupportedSchema(f"json_schema $ref {ref!r} (at {path}): only local references are supported")
    for sub, sub_path in _subschemas(schema, path):
        check_supported(sub, sub_path)


def resolve_ref(root: Any, ref: str) -> Any:
    """A local JSON pointer (`#/$defs/Name`) into the root schema."""
    node = root
    for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise UnsupportedSchema(f"json_schema $ref {ref!r} points nowhere")
    return node


def _merge_all_of(schema: dict[str, Any], root: Any) -> dict[str, Any]:
    merged = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        part = _expand(part, root)
        for key, value in part.items():
            if key == "properties":
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required":
                merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
            else:
                merged.setdefault(key, value)
    return merged


def _expand(schema: Any, root: Any, depth: int = 0) -> dict[str, Any]:
    """The schema with `$ref` and `allOf` resolved at its top (siblings of `$ref` kept)."""
    if schema is True:
        return {}
    if schema is False:
        raise UnsupportedSchema("json_schema false has no instance")
    if depth > MAX_DEPTH:
        raise UnsupportedSchema("json_schema $ref chain too deep")
    if "$ref" in schema:
        target = _expand(resolve_ref(root, schema["$ref"]), root, depth + 1)
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    if "allOf" in schema:
        schema = _merge_all_of(schema, root)
    return schema


def schema_type(schema: dict[str, Any]) -> str:
    declared = schema.get("type")
    if isinstance(declared, list):
        return next((t for t in declared if t != "null"), "null")
    if isinstance(declared, str):
        return declared
    if any(k in schema for k in ("properties", "required", "additionalProperties", "minProperties")):
        return "object"
    if any(k in schema for k in ("items", "prefixItems", "minItems", "maxItems")):
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
        return "number"
    return "string"


def _bounds(schema: dict[str, Any]) -> tuple[float | None, bool, float | None, bool]:
    """(low, low exclusive, high, high exclusive), draft 4's boolean exclusives included."""
    low, high = schema.get("minimum"), schema.get("maximum")
    low_open = high_open = False
    exclusive_low, exclusive_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(exclusive_low, bool):
        low_open = exclusive_low
    elif exclusive_low is not None and (low is None or exclusive_low >= low):
        low, low_open = exclusive_low, True
    if isinstance(exclusive_high, bool):
        high_open = exclusive_high
    elif exclusive_high is not None and (high is None or exclusive_high <= high):
        high, high_open = exclusive_high, True
    return low, low_open, high, high_open


class SchemaSampler:
    def __init__(self, schema: Any) -> None:
        check_supported(schema)
        self.root = schema
        self._patterns: dict[str, regex_sample.Node] = {}
        # Every pattern is parsed now, so an unsupported one is refused before generation starts.
        self._collect_patterns(schema)

    def _collect_patterns(self, schema: Any) -> None:
        if not isinstance(schema, dict):
            return
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and pattern not in self._patterns:
            self._patterns[pattern] = regex_sample.parse_regex(pattern)
        for sub, _ in _subschemas(schema, "#"):
            self._collect_patterns(sub)

    def sample(self, rng: random.Random) -> Any:
        return self._value(self.root, rng, 0)

    def _value(self, schema: Any, rng: random.Random, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise UnsupportedSchema("json_schema recursion has no finite instance the simulator can find")
        schema = _expand(schema, self.root)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            if not schema["enum"]:
                raise UnsupportedSchema("json_schema enum is empty")
            return rng.choice(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                if not schema[key]:
                    raise UnsupportedSchema(f"json_schema {key} is empty")
                first = _expand(schema[key][0], self.root)
                rest = {k: v for k, v in schema.items() if k != key}
                return self._value({**rest, **first}, rng, depth + 1)
        kind = schema_type(schema)
        if kind == "object":
            return self._object(schema, rng, depth)
        if kind == "array":
            return self._array(schema, rng, depth)
        if kind == "string":
            return self._string(schema, rng)
        if kind == "integer":
            return self._integer(schema, rng)
        if kind == "number":
            return self._number(schema, rng)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        raise UnsupportedSchema(f"json_schema type {kind!r} is not a JSON Schema type")

    def _object(self, schema: dict[str, Any], rng: random.Random, depth: int) -> dict[str, Any]:
        properties: dict[str, Any] = schema.get("properties") or {}
        required = list(schema.get("required") or [])
        extra = schema.get("additionalProperties", True)
        optional_odds = 0.5 if depth < SHALLOW_DEPTH else 0.0
        chosen = [name for name in properties if name in required or rng.random() < optional_odds]
        for name in properties:
            if len(chosen) >= schema.get("minProperties", 0):
                break
            if name not in chosen:
                chosen.append(name)
        value: dict[str, Any] = {}
        for name in properties:
            if name in chosen:
                value[name] = self._value(properties[name], rng, depth + 1)
        for name in required:
            if name not in value:
                value[name] = self._value(extra if isinstance(extra, dict) else {}, rng, depth + 1)
        if not properties and not required and extra is not False:
            # A free-form object (json_object): one or two plain entries.
            wanted = max(1, schema.get("minProperties", 1))
            for name in rng.sample(WORDS, rng.randint(wanted, max(wanted, 2))):
                value[name] = self._value(extra if isinstance(extra, dict) else {}, rng, depth + 1)
        return value

    def _array(self, schema: dict[str, Any], rng: random.Random, depth: int) -> list[Any]:
        prefix = schema.get("prefixItems")
        items = schema.get("items", True)
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, schema.get("additionalItems", True)
        prefix = prefix or []
        low = schema.get("minItems", 0)
        high = schema.get("maxItems")
        values = [self._value(sub, rng, depth + 1) for sub in prefix[: high if high is not None else None]]
        if items is False:
            return values
        lower = max(low, len(values))
        upper = lower + _OPEN_EXTRA if high is None else min(lower + _OPEN_EXTRA, high)
        # At least one item where the schema allows it: an empty array shows little.
        count = rng.randint(min(max(lower, 1), upper), upper) if depth < SHALLOW_DEPTH else lower
        unique = schema.get("uniqueItems", False)
        tries = 0
        while len(values) < count and tries < 4 * count + 8:
            tries += 1
            value = self._value(items, rng, depth + 1)
            if unique and value in values:
                continue
            values.append(value)
        return values

    def _string(self, schema: dict[str, Any], rng: random.Random) -> str:
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        pattern = schema.get("pattern")
        if isinstance(pattern, str):
            node = self._patterns[pattern]
            text = regex_sample.sample(node, rng)
            for _ in range(16):
                if len(text) >= low and (high is None or len(text) <= high):
                    break
                text = regex_sample.sample(node, rng)
            return text
        fmt = schema.get("format")
        if fmt == "uuid":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if isinstance(fmt, str) and fmt in _FORMATS:
            return _FORMATS[fmt]
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
        while len(text) < low:
            text += " " + rng.choice(WORDS)
        if len(text) < low:
            text += "x" * (low - len(text))
        if high is not None and len(text) > high:
            text = text[:high]
        return text

    def _integer(self, schema: dict[str, Any], rng: random.Random) -> int:
        low, low_open, high, high_open = _bounds(schema)
        lo = None if low is None else (math.floor(low) + 1 if low_open else math.ceil(low))
        hi = None if high is None else (math.ceil(high) - 1 if high_open else math.floor(high))
        if lo is None and hi is None:
            lo, hi = 0, 100
        elif lo is None:
            lo = hi - 100  # type: ignore[operator]
        elif hi is None:
            hi = lo + 100
        assert lo is not None and hi is not None
        step = schema.get("multipleOf")
        if isinstance(step, int) and step > 0:
            first, last = math.ceil(lo / step), math.floor(hi / step)
            if first > last:
                raise UnsupportedSchema("json_schema integer bounds leave no multiple of multipleOf")
            return rng.randint(first, last) * step
        if lo > hi:
            raise UnsupportedSchema("json_schema integer bounds are empty")
        return rng.randint(lo, hi)

    def _number(self, schema: dict[str, Any], rng: random.Random) -> float | int:
        low, low_open, high, high_open = _bounds(schema)
        lo = float(low) if low is not None else (float(high) - 100.0 if high is not None else 0.0)
        hi = float(high) if high is not None else lo + 100.0
        step = schema.get("multipleOf")
        if isinstance(step, (int, float)) and step > 0:
            first, last = math.ceil(lo / step), math.floor(hi / step)
            if low_open and first * step <= lo:
                first += 1
            if high_open and last * step >= hi:
                last -= 1
            if first > last:
                raise UnsupportedSchema("json_schema number bounds leave no multiple of multipleOf")
            k = rng.randint(first, last)
            return k * step if isinstance(step, int) else round(k * step, 9)
        if lo > hi or (lo == hi and (low_open or high_open)):
            raise UnsupportedSchema("json_schema number bounds are empty")
        value = round(rng.uniform(lo, hi), 2)
        if (low_open and value <= lo) or (high_open and value >= hi) or not lo <= value <= hi:
            value = (lo + hi) / 2
        return value


def _type_ok(instance: Any, kind: str) -> bool:
    if kind == "null":
        return instance is None
    if kind == "boolean":
        return isinstance(instance, bool)
    if kind == "integer":
        return (isinstance(instance, int) and not isinstance(instance, bool)) or (
            isinstance(instance, float) and instance.is_integer()
        )
    if kind == "number":
        return isinstance(instance, (int, float)) and not isinstance(instance, bool)
    if kind == "string":
        return isinstance(instance, str)
    if kind == "array":
        return isinstance(instance, list)
    if kind == "object":
        return isinstance(instance, dict)
    return False


def is_valid(instance: Any, schema: Any, root: Any = None) -> bool:
    """Whether the instance satisfies the schema, within the sampler's subset of keywords."""
    root = schema if root is None else root
    try:
        schema = _expand(schema, root)
    except UnsupportedSchema:
        return False
    if "const" in schema and instance != schema["const"]:
        return False
    if "enum" in schema and instance not in schema["enum"]:
        return False
    if "anyOf" in schema and not any(is_valid(instance, s, root) for s in schema["anyOf"]):
        return False
    if "oneOf" in schema and sum(is_valid(instance, s, root) for s in schema["oneOf"]) != 1:
        return False
    declared = schema.get("type")
    if declared is not None:
        kinds = declared if isinstance(declared, list) else [declared]
        if not any(_type_ok(instance, k) for k in kinds):
            return False
    if isinstance(instance, dict):
        properties = schema.get("properties") or {}
        if any(name not in instance for name in schema.get("required") or []):
            return False
        extra = schema.get("additionalProperties", True)
        for name, value in instance.items():
            sub = properties.get(name, extra)
            if sub is False or not is_valid(value, sub, root):
                return False
        if len(instance) < schema.get("minProperties", 0):
            return False
    if isinstance(instance, list):
        prefix = schema.get("prefixItems") or []
        items = schema.get("items", True)
        if isinstance(items, list):
            prefix, items = items, schema.get("additionalItems", True)
        for i, value in enumerate(instance):
            sub = prefix[i] if i < len(prefix) else items
            if sub is False or not is_valid(value, sub, root):
                return False
        if len(instance) < schema.get("minItems", 0) or len(instance) > schema.get("maxItems", len(instance)):
            return False
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0) or len(instance) > schema.get(
            "maxLength", len(instance)
        ):
            return False
        if isinstance(schema.get("pattern"), str) and re.search(schema["pattern"], instance) is None:
            return False
    if _type_ok(instance, "number"):
        low, low_open, high, high_open = _bounds(schema)
        if low is not None and (instance < low or (low_open and instance == low)):
            return False
        if high is not None and (instance > high or (high_open and instance == high)):
            return False
        step = schema.get("multipleOf")
        if (
            isinstance(step, (int, float))
            and step > 0
            and abs(instance / step - round(instance / step)) > 1e-9
        ):
            return False
    return True
