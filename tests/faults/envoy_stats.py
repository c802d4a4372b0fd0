"""Reading a test Envoy's counters and gauges from its admin interface."""

from __future__ import annotations

import urllib.request


def stats(admin_url: str, pattern: str) -> dict[str, int]:
    """The plain stats whose names match the regular expression `pattern` (histograms left out)."""
    with urllib.request.urlopen(f"{admin_url}/stats?filter={pattern}", timeout=5) as resp:
        text = resp.read().decode()
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(": ")
        if value.strip().lstrip("-").isdigit():
            values[name] = int(value)
    return values


def stat(admin_url: str, name: str) -> int:
    """One counter or gauge by its exact name (0 when Envoy has not created it yet)."""
    return stats(admin_url, f"^{name.replace('.', '[.]')}$").get(name, 0)


def host_health(admin_url: str, cluster: str, address: str) -> str:
    """The health flags Envoy shows for one host of a cluster (e.g. `healthy`, `/failed_outlier_check`)."""
    with urllib.request.urlopen(f"{admin_url}/clusters", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f"{cluster}::{address}::health_flags::"):
                return line.rsplit("::", 1)[1]
    raise AssertionError(f"no host {address} in cluster {cluster}")
