"""A small reader of the Prometheus text exposition format for the metrics tests (prometheus_client is
not a dependency): samples by metric name and label set, and the `# TYPE` of each metric."""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')

Labels = frozenset[tuple[str, str]]


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


@dataclass
class Scrape:
    samples: dict[tuple[str, Labels], float] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    def value(self, name: str, **labels: str) -> float:
        """The sample with exactly these labels (0 when absent: a series not created yet)."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum over every sample of `name` whose labels include these."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)


def parse(text: str) -> Scrape:
    scrape = Scrape()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert name not in scrape.types, f"{name} has two TYPE lines"
            scrape.types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, raw_labels, value = match.groups()
        labels: Labels = frozenset()
        if raw_labels:
            pairs = _LABEL.findall(raw_labels)
            assert ",".join(f'{k}="{v}"' for k, v in pairs) == raw_labels, f"bad labels: {line!r}"
            labels = frozenset((k, _unescape(v)) for k, v in pairs)
        key = (name, labels)
        assert key not in scrape.samples, f"duplicate sample: {line!r}"
        scrape.samples[key] = float(value)
    return scrape


def scrape(url: str) -> Scrape:
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(reply.read().decode())


def delta(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)
