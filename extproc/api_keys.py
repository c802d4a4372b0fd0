"""API keys: the keys file (`api_keys_file`) and `extproc keys hash`, which writes its lines.

The file holds one JSON object per line, one per key, and never the key itself:

    {"sha256": "<hex SHA-256 of the key>", "name": "alice", "models": ["*"], "requests_per_minute": 60}

`models` lists the served model names the key may use (`"*"`: every one); `requests_per_minute` is its rate
(a burst of up to that many, then one every 60/N s; 0 for none). Blank lines and lines starting with `#`
are skipped. The native gateway checks each request's `Authorization: Bearer <key>` against these entries
before reading its body (native/core/src/auth.rs); this module only reads and writes the file
(extproc.keys_reload follows it while extproc runs).
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import json
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ANY_MODEL = "*"
_FIELDS = ("sha256", "name", "models", "requests_per_minute")
_HEX = frozenset("0123456789abcdef")


class KeysFileError(ValueError):
    """The keys file cannot be used; the message names the line."""


@dataclass(frozen=True)
class KeyEntry:
    sha256: str
    name: str
    models: tuple[str, ...]
    requests_per_minute: int

    def line(self) -> str:
        """The entry as one line of the keys file."""
        value = {
            "sha256": self.sha256,
            "name": self.name,
            "models": list(self.models),
            "requests_per_minute": self.requests_per_minute,
        }
        return json.dumps(value)

    def as_native(self) -> tuple[str, str, list[str], int]:
        """The entry as `_native.Gateway.set_api_keys` takes it."""
        return self.sha256, self.name, list(self.models), self.requests_per_minute


def key_digest(key: str) -> str:
    """The lower-case hex SHA-256 of `key`, as the keys file holds it."""
    return hashlib.sha256(key.encode()).hexdigest()


def _entry(value: Any) -> KeyEntry:
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    unknown = sorted(set(value) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; expected {', '.join(_FIELDS)}")
    sha = value.get("sha256")
    if not isinstance(sha, str) or len(sha) != 64 or not set(sha) <= _HEX:
        raise ValueError("sha256 must be 64 lower-case hex digits (`extproc keys hash` writes it)")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    models = value.get("models")
    if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
        raise ValueError('models must be a non-empty list of model names (["*"] for all)')
    rpm = value.get("requests_per_minute", 0)
    if isinstance(rpm, bool) or not isinstance(rpm, int) or not 0 <= rpm <= 1_000_000:
        raise ValueError("requests_per_minute must be an integer from 0 (no limit) to 1000000")
    return KeyEntry(sha, name, tuple(models), rpm)


def parse_keys(text: str, source: str = "keys file") -> tuple[KeyEntry, ...]:
    """Every entry of a keys file's text; a bad line, or a key listed twice, raises KeysFileError."""
    entries: list[KeyEntry] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = _entry(json.loads(line))
        except ValueError as e:  # JSONDecodeError included
            raise KeysFileError(f"{source} line {number}: {e}") from None
        if entry.sha256 in seen:
            raise KeysFileError(f"{source} line {number}: the same key as line {seen[entry.sha256]}")
        seen[entry.sha256] = number
        entries.append(entry)
    if not entries:
        raise KeysFileError(f"{source}: no keys (every request would be refused)")
    return tuple(entries)


def load_keys(path: Path) -> tuple[KeyEntry, ...]:
    try:
        text = path.read_text()
    except OSError as e:
        raise KeysFileError(f"{path}: {e.strerror or e}") from None
    return parse_keys(text, str(path))


# --- `extproc keys hash` ------------------------------------------------------------------------------------


def build_parser(parser: argparse.ArgumentParser) -> None:
    """The `keys` command's subcommands, added to `parser`."""
    sub = parser.add_subparsers(dest="keys_command", metavar="SUBCOMMAND", required=True)
    hashing = sub.add_parser(
        "hash",
        help="print the keys-file line for a key (read from stdin, or --generate a new one)",
        description="Print the api_keys_file line for a key: its SHA-256, never the key. The key is read "
        "from stdin (one line), or made with --generate and printed on stderr, once.",
    )
    hashing.add_argument("--name", required=True, help="who holds the key (logs and summaries)")
    hashing.add_argument(
        "--models", default=ANY_MODEL, help="comma-separated model names the key may use; * for all"
    )
    hashing.add_argument("--rpm", type=int, default=0, metavar="N", help="requests per minute (0: no limit)")
    hashing.add_argument("--generate", action="store_true", help="make a new random key")


def run(args: argparse.Namespace) -> int:
    """`extproc keys hash`: prints the line on stdout; 2 on a bad argument."""
    if args.generate:
        key = "sk-" + secrets.token_urlsafe(32)
        print(f"key (shown once): {key}", file=sys.stderr)
    elif sys.stdin.isatty():
        key = getpass.getpass("API key: ")
    else:
        key = sys.stdin.readline().rstrip("\r\n")
    if not key:
        print("extproc: no key given on stdin", file=sys.stderr)
        return 2
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        entry = _entry(
            {"sha256": key_digest(key), "name": args.name, "models": models, "requests_per_minute": args.rpm}
        )
    except ValueError as e:
        print(f"extproc: {e}", file=sys.stderr)
        return 2
    print(entry.line())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="extproc keys")
    build_parser(parser)
    return run(parser.parse_args(argv))
