"""Engines behind a DNS name: every address an engine, re-resolved, the last set kept on failure."""

from __future__ import annotations

import asyncio

from extproc.discovery.dns import DnsWatch, resolve_addresses


async def test_localhost_resolves_with_the_system_resolver() -> None:
    addresses = await resolve_addresses("localhost", 8001)
    assert "127.0.0.1" in addresses or "::1" in addresses
    assert len(addresses) == len(set(addresses))


async def test_every_address_is_an_engine_and_changes_are_seen_at_the_next_resolution() -> None:
    answers: list[list[str] | OSError] = [
        ["10.0.0.1", "fd00::2"],
        ["10.0.0.1", "fd00::2"],  # unchanged: no call
        OSError("SERVFAIL"),  # kept: no call
        ["10.0.0.3"],
    ]
    asked: list[tuple[str, int]] = []
    seen: list[dict[str, bool]] = []

    async def resolve(name: str, port: int) -> list[str]:
        asked.append((name, port))
        answer = answers[min(len(asked), len(answers)) - 1]
        if isinstance(answer, OSError):
            raise answer
        return answer

    watch = DnsWatch("vllm.ns.svc", 8001, 0.01, seen.append, resolve)
    task = asyncio.create_task(watch.run())
    try:
        for _ in range(200):
            if len(asked) >= len(answers):
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert asked[0] == ("vllm.ns.svc", 8001)
    assert seen == [{"10.0.0.1:8001": True, "[fd00::2]:8001": True}, {"10.0.0.3:8001": True}]
