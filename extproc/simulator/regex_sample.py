"""Strings that fully match a simple regular expression, for the simulator's `regex` constraint.

The supported language: literal text and escapes (`\\.`, `\\n`, `\\t`, `\\xhh`, `\\uhhhh`), the classes
`.`, `\\d`, `\\w`, `\\s` (and their negations), bracket classes with ranges and `^` negation, the
quantifiers `?`, `*`, `+`, `{m}`, `{m,}`, `{,n}`, `{m,n}` (lazy `?` accepted), alternation, capturing,
non-capturing and named groups, and `^` / `$` at the very ends. Anything else (backreferences,
lookaround, `\\b`, inline flags, possessive quantifiers, POSIX and Unicode property classes) raises
`UnsupportedRegex` naming the construct: a real engine would honour it, so the simulator refuses rather
than emit text that may not match.

Samples are short (an open repeat adds at most 3 beyond its minimum) and draw from printable ASCII, so they
read back as ordinary text; the same `random.Random` state gives the same sample.
"""

from __future__ import annotations

import random
import re
import string
from dataclasses import dataclass

# What classes draw from: printable ASCII without the whitespace beyond space.
ALPHABET = string.ascii_letters + string.digits + " " + string.punctuation
# How far past its minimum an open repeat (`*`, `+`, `{m,}`) or a wide bound may go.
EXTRA_REPEATS = 3
# The bodies Python's `re` reads as a repeat bound (`{,}` is `{0,}`).
_BOUND = re.compile(r"\d+|\d*,\d*")


class UnsupportedRegex(ValueError):
    """A construct the simulator cannot sample (the message names it), or an invalid pattern."""


@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class CharClass:
    ranges: tuple[tuple[str, str], ...]
    negated: bool = False

    def contains(self, char: str) -> bool:
        inside = any(lo <= char <= hi for lo, hi in self.ranges)
        return inside != self.negated


@dataclass(frozen=True)
class Sequence:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alternation:
    branches: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    item: Node
    low: int
    high: int | None  # None: unbounded


Node = Literal | CharClass | Sequence | Alternation | Repeat

_DIGIT = (("0", "9"),)
_WORD = (("a", "z"), ("A", "Z"), ("0", "9"), ("_", "_"))
_SPACE = ((" ", " "), ("\t", "\r"))
_CLASS_ESCAPES = {
    "d": CharClass(_DIGIT),
    "D": CharClass(_DIGIT, negated=True),
    "w": CharClass(_WORD),
    "W": CharClass(_WORD, negated=True),
    "s": CharClass(_SPACE),
    "S": CharClass(_SPACE, negated=True),
}
_CONTROL_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0", "a": "\a"}
_UNSUPPORTED_ESCAPES = {
    "b": "word boundary \\b",
    "B": "non-boundary \\B",
    "A": "anchor \\A",
    "Z": "anchor \\Z",
    "z": "anchor \\z",
    "G": "anchor \\G",
    "p": "Unicode property \\p",
    "P": "Unicode property \\P",
    "N": "named character \\N",
    "k": "named backreference \\k",
}
_ANY = CharClass((("\n", "\n"),), negated=True)


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.pos = 0

    def fail(self, construct: str) -> UnsupportedRegex:
        return UnsupportedRegex(
            f"regex construct {construct} (at offset {self.pos} of {self.pattern!r}) "
            "is not supported by the simulator"
        )

    def invalid(self, why: str) -> UnsupportedRegex:
        return UnsupportedRegex(f"invalid regex {self.pattern!r}: {why} at offset {self.pos}")

    def peek(self, ahead: int = 0) -> str | None:
        at = self.pos + ahead
        return self.pattern[at] if at < len(self.pattern) else None

    def take(self) -> str:
        char = self.peek()
        if char is None:
            raise self.invalid("unexpected end")
        self.pos += 1
        return char

    def parse(self) -> Node:
        if self.peek() == "^":
            self.pos += 1
        node = self.alternation()
        if self.peek() is not None:
            raise self.invalid("unbalanced parenthesis")
        return node

    def alternation(self) -> Node:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else Alternation(tuple(branches))

    def sequence(self) -> Node:
        items: list[Node] = []
        while (char := self.peek()) is not None and char not in "|)":
            if char == "$":
                if self.pos == len(self.pattern) - 1:
                    self.pos += 1
                    break
                raise self.fail("anchor $ inside the pattern")
            if char == "^":
                raise self.fail("anchor ^ inside the pattern")
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else Sequence(tuple(items))

    def atom(self) -> Node:
        char = self.take()
        if char == "(":
            return self.group()
        if char == "[":
            return self.bracket()
        if char == ".":
            return _ANY
        if char == "\\":
            return self.escape(in_class=False)
        if char in "*+?":
            raise self.invalid("nothing to repeat")
        if char == "{" and self.bound() is not None:
            raise self.invalid("nothing to repeat")
        return Literal(char)

    def group(self) -> Node:
        if self.peek() == "?":
            self.pos += 1
            kind = self.take()
            if kind == ":":
                pass
            elif kind == "P" and self.peek() == "<":
                end = self.pattern.find(">", self.pos)
                if end < 0:
                    raise self.invalid("unterminated group name")
                self.pos = end + 1
            elif kind == "P":
                raise self.fail("named backreference (?P=")
            elif kind in "=!":
                raise self.fail(f"lookahead (?{kind}")
            elif kind == "<" and self.peek() in ("=", "!"):
                raise self.fail(f"lookbehind (?<{self.peek()}")
            elif kind == "<":
                end = self.pattern.find(">", self.pos)
                if end < 0:
                    raise self.invalid("unterminated group name")
                self.pos = end + 1
            elif kind == "#":
                raise self.fail("comment group (?#")
            elif kind == "(":
                raise self.fail("conditional group (?(")
            elif kind == ">":
                raise self.fail("atomic group (?>")
            else:
                raise self.fail(f"inline flags (?{kind}")
        node = self.alternation()
        if self.peek() != ")":
            raise self.invalid("missing )")
        self.pos += 1
        return node

    def escape(self, *, in_class: bool) -> Node:
        char = self.take()
        if char in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[char]
        if char in _CONTROL_ESCAPES:
            return Literal(_CONTROL_ESCAPES[char])
        if char in "xu":
            width = 2 if char == "x" else 4
            digits = self.pattern[self.pos : self.pos + width]
            if len(digits) != width or any(d not in string.hexdigits for d in digits):
                raise self.invalid(f"bad \\{char} escape")
            self.pos += width
            return Literal(chr(int(digits, 16)))
        if char.isdigit():
            raise self.fail(f"backreference \\{char}")
        if char == "b" and in_class:
            return Literal("\b")
        if char in _UNSUPPORTED_ESCAPES:
            raise self.fail(_UNSUPPORTED_ESCAPES[char])
        if char.isalnum():
            raise self.invalid(f"bad escape \\{char}")
        return Literal(char)

    def bracket(self) -> CharClass:
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[str, str]] = []
        classes: list[CharClass] = []
        first = True
        while True:
            char = self.take()
            if char == "]" and not first:
                break
            first = False
            if char == "[" and self.peek() in (":", "=", "."):
                raise self.fail(f"POSIX class [{self.peek()}")
            if char == "\\":
                item = self.escape(in_class=True)
                if isinstance(item, CharClass):
                    if item.negated:
                        raise self.fail("negated class escape inside brackets")
                    classes.append(item)
                    continue
                assert isinstance(item, Literal)
                char = item.text
            if self.peek() == "-" and self.peek(1) not in ("]", None):
                self.pos += 1
                high = self.take()
                if high == "\\":
                    item = self.escape(in_class=True)
                    if not isinstance(item, Literal):
                        raise self.invalid("bad character range")
                    high = item.text
                if high < char:
                    raise self.invalid(f"bad character range {char}-{high}")
                ranges.append((char, high))
            else:
                ranges.append((char, char))
        for cls in classes:
            ranges.extend(cls.ranges)
        return CharClass(tuple(ranges), negated)

    def bound(self) -> tuple[int, int | None] | None:
        """A `{m}`, `{m,}`, `{,n}` or `{m,n}` right after a consumed `{`, or None (a literal brace)."""
        end = self.pattern.find("}", self.pos)
        if end < 0:
            return None
        body = self.pattern[self.pos : end]
        if not _BOUND.fullmatch(body):
            return None  # Python reads it as literal text
        low, comma, high = body.partition(",")
        self.pos = end + 1
        low_value = int(low) if low else 0
        if not comma:
            return low_value, low_value
        return low_value, int(high) if high else None

    def quantified(self, node: Node) -> Node:
        while (char := self.peek()) is not None and char in "*+?{":
            if char == "{":
                start = self.pos
                self.pos += 1
                bound = self.bound()
                if bound is None:
                    self.pos = start
                    break
                low, high = bound
                if high is not None and high < low:
                    raise self.invalid("min repeat greater than max repeat")
            else:
                self.pos += 1
                low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
            if isinstance(node, Repeat):
                raise self.invalid("multiple repeat")
            node = Repeat(node, low, high)
            if self.peek() == "?":
                self.pos += 1  # lazy: the same strings match
            elif self.peek() == "+":
                raise self.fail("possessive quantifier")
        return node


def parse_regex(pattern: str) -> Node:
    """The pattern's tree; raises UnsupportedRegex for constructs outside the supported language."""
    return _Parser(pattern).parse()


def sample(node: Node, rng: random.Random) -> str:
    """One string the whole pattern matches."""
    parts: list[str] = []
    _emit(node, rng, parts)
    return "".join(parts)


def _emit(node: Node, rng: random.Random, out: list[str]) -> None:
    if isinstance(node, Literal):
        out.append(node.text)
    elif isinstance(node, CharClass):
        out.append(_pick(node, rng))
    elif isinstance(node, Sequence):
        for item in node.items:
            _emit(item, rng, out)
    elif isinstance(node, Alternation):
        _emit(rng.choice(node.branches), rng, out)
    else:
        top = node.low + EXTRA_REPEATS if node.high is None else min(node.high, node.low + EXTRA_REPEATS)
        for _ in range(rng.randint(node.low, top)):
            _emit(node.item, rng, out)


def _pick(cls: CharClass, rng: random.Random) -> str:
    candidates = [char for char in ALPHABET if cls.contains(char)]
    if candidates:
        return rng.choice(candidates)
    if not cls.negated:
        return rng.choice(cls.ranges)[0]  # a class outside printable ASCII: its ranges' own characters
    raise UnsupportedRegex(
        "regex class that excludes every printable character is not supported by the simulator"
    )
