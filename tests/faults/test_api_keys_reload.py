"""API keys change without a restart: a key added to the keys file works, and a removed one is refused,
within a second or two (the file is polled), through real Envoy; a key that stays keeps working through
every swap, a half-written or broken file included (the keys in force stay until the file parses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from extproc.api_keys import KeyEntry, key_digest
from tests.conftest import FreePorts
from tests.integration.harness import Stack, local_stack, post_json
from tests.integration.test_lifecycle import child_pid
from tests.integration.test_stack_up import REPO, START_TIMEOUT_S

STAYS = "sk-stays-0123456789"
COMES_AND_GOES = "sk-comes-and-goes-0123456789"
# The file is polled every 0.5 s; a busy machine may add a little.
NOTICED_WITHIN_S = 2.5


def _line(key: str, name: str) -> str:
    return KeyEntry(key_digest(key), name, ("*",), 0).line() + "\n"


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.jsonl"
    path.write_text(_line(STAYS, "stays"))
    return path


@pytest.fixture
def stack(tmp_path: Path, keys_file: Path) -> Iterator[Stack]:
    with local_stack(FreePorts(), tmp_path, api_keys_file=keys_file) as s:
        yield s


def status_for(stack: Stack, key: str) -> int:
    body = {"model": stack.model, "prompt": "hello", "max_tokens": 1}
    conn = post_json(stack.base_url, "/v1/completions", body, headers={"authorization": f"Bearer {key}"})
    try:
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def seconds_until(check: Callable[[], bool], within_s: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < within_s, f"not within {within_s}s"
        time.sleep(0.05)
    return time.monotonic() - started


def replace_atomically(path: Path, text: str) -> None:
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


def test_keys_added_and_removed_take_effect_without_a_restart(stack: Stack, keys_file: Path) -> None:
    assert status_for(stack, STAYS) == 200
    assert status_for(stack, COMES_AND_GOES) == 401

    # A client of the key that stays, all along.
    statuses: list[int] = []
    stop = threading.Event()

    def keep_calling() -> None:
        while not stop.is_set():
            statuses.append(status_for(stack, STAYS))

    caller = threading.Thread(target=keep_calling)
    caller.start()
    try:
        replace_atomically(keys_file, _line(STAYS, "stays") + _line(COMES_AND_GOES, "new"))
        added = seconds_until(lambda: status_for(stack, COMES_AND_GOES) == 200, NOTICED_WITHIN_S)

        # Edited in place (truncated, then written), and briefly broken: neither lets the key back in
        # nor shuts the one that stays out.
        keys_file.write_text(_line(STAYS, "stays"))
        removed = seconds_until(lambda: status_for(stack, COMES_AND_GOES) == 401, NOTICED_WITHIN_S)
        keys_file.write_text(_line(STAYS, "stays") + '{"sha256": "not hex"\n')
        time.sleep(1.0)  # two polls of the broken file
        assert status_for(stack, COMES_AND_GOES) == 401
        keys_file.write_text(_line(STAYS, "stays") + _line(COMES_AND_GOES, "back"))
        seconds_until(lambda: status_for(stack, COMES_AND_GOES) == 200, NOTICED_WITHIN_S)
    finally:
        stop.set()
        caller.join(timeout=30)
    assert statuses and set(statuses) == {200}, sorted(set(statuses))
    print(
        f"added key working after {added:.2f}s, removed key refused after {removed:.2f}s, "
        f"{len(statuses)} calls"
    )


def test_sighup_to_up_reloads_the_keys_without_a_restart(
    tmp_path: Path, free_ports: Any, keys_file: Path
) -> None:
    """SIGHUP to `extproc up` reaches extproc, which re-reads the keys file at once; nothing restarts."""
    argv = [sys.executable, "-m", "extproc", "up", "--port", str(free_ports.one())]
    argv += ["--admin-port", str(free_ports.one()), "--listen", f"127.0.0.1:{free_ports.one()}"]
    argv += ["--sim", "1", "--sim-port", str(free_ports.one()), "--api-keys-file", str(keys_file)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("EXTPROC_")}
    env["EXTPROC_CACHE_DIR"] = str(tmp_path / "cache")
    env["XDG_STATE_HOME"] = str(tmp_path / "state")  # up's SQLite store: not in the user's home
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        up = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        seconds_until(lambda: "extproc: serving" in log.read_text() or up.poll() is not None, START_TIMEOUT_S)
        assert up.poll() is None, log.read_text()
        server = child_pid(up, "extproc serve")
        assert "API keys reloaded" not in log.read_text()
        up.send_signal(signal.SIGHUP)
        seconds_until(lambda: "API keys reloaded" in log.read_text(), NOTICED_WITHIN_S)
        assert up.poll() is None, log.read_text()
        assert child_pid(up, "extproc serve") == server
    finally:
        up.kill()  # its children follow (PR_SET_PDEATHSIG)
        up.wait()
