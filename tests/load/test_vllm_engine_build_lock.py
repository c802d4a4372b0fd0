"""The real-engine assets are built by one process at a time: a second pytest session sharing the cache waits
for the first one's build instead of deleting the folder it is writing into."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from load.vllm_engine.paths import build_lock

REPO = Path(__file__).resolve().parents[2]

# Takes the same lock from another process and prints how long it waited.
WAITER = """
import time
from load.vllm_engine.paths import build_lock
print("trying", flush=True)
started = time.monotonic()
with build_lock("vllm-venv"):
    print(f"{time.monotonic() - started:.3f}", flush=True)
"""


def _waiter(cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "EXTPROC_VLLM_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", WAITER], env=env, stdout=subprocess.PIPE, text=True)


def test_a_second_process_waits_while_the_build_holds_the_lock(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("EXTPROC_VLLM_CACHE", str(tmp_path))
    with build_lock("vllm-venv"):
        waiter = _waiter(tmp_path)
        assert waiter.stdout.readline() == "trying\n"
        time.sleep(1.0)
        assert waiter.poll() is None, "the other process got the lock while the build held it"
    out, _ = waiter.communicate(timeout=30)
    assert float(out) >= 0.9, "it took the lock before the build released it"


def test_the_lock_is_free_again_after_the_build(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("EXTPROC_VLLM_CACHE", str(tmp_path))
    with build_lock("vllm-venv"):
        pass
    out, _ = _waiter(tmp_path).communicate(timeout=30)
    assert out.splitlines()[0] == "trying"
    assert float(out.splitlines()[1]) < 5.0
