"""Make the repository root importable (`load` and `extproc` are used from the source tree), and the one tiny
benchmark run that the smoke test and the plot tests both read."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def quick_bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`python -m load.bench` on a tiny plan, the simulator, our stack and the floor as real processes, with
    the default concurrency sweep (half a second a level at this scale); SMG is left out, a PyPI install of
    its own. Its results directory and what it printed: one run for the smoke test and the plot tests,
    which used to start nearly the same benchmark each."""
    out = tmp_path_factory.mktemp("bench")
    argv = [sys.executable, "-m", "load.bench", "--quick", "--scale", "0.05", "--targets", "floor,ours"]
    argv += ["--workloads", "chat,chat-stream", "--out", str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout
