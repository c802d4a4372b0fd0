"""The API keys file (extproc.api_keys), `extproc keys hash`, which writes its lines, and its reloader
(extproc.keys_reload)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from pathlib import Path

import pytest

from extproc import cli
from extproc.api_keys import KeyEntry, KeysFileError, key_digest, load_keys, parse_keys
from extproc.config import ConfigError, load_settings
from extproc.keys_reload import KeysReloader

DIGEST = hashlib.sha256(b"sk-test").hexdigest()


def test_the_hash_line_holds_the_digest_never_the_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("sk-test\n"))
    assert cli.main(["keys", "hash", "--name", "alice", "--models", "a, b", "--rpm", "60"]) == 0
    out = capsys.readouterr().out
    assert "sk-test" not in out
    assert json.loads(out) == {
        "sha256": DIGEST,
        "name": "alice",
        "models": ["a", "b"],
        "requests_per_minute": 60,
    }
    assert parse_keys(out) == (KeyEntry(DIGEST, "alice", ("a", "b"), 60),)


def test_a_generated_key_is_shown_once_on_stderr_and_matches_its_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["keys", "hash", "--name", "ci", "--generate"]) == 0
    captured = capsys.readouterr()
    key = captured.err.strip().rsplit(" ", 1)[1]
    assert key.startswith("sk-") and len(key) > 40
    (entry,) = parse_keys(captured.out)
    assert entry.sha256 == key_digest(key) and entry.models == ("*",) and entry.requests_per_minute == 0


def test_no_key_on_stdin_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert cli.main(["keys", "hash", "--name", "x"]) == 2


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("not json", "line 2"),
        ('{"sha256": "abc", "name": "x", "models": ["*"]}', "64 lower-case hex"),
        (f'{{"sha256": "{DIGEST.upper()}", "name": "x", "models": ["*"]}}', "64 lower-case hex"),
        (f'{{"sha256": "{DIGEST}", "name": "", "models": ["*"]}}', "name"),
        (f'{{"sha256": "{DIGEST}", "name": "x", "models": []}}', "models"),
        (
            f'{{"sha256": "{DIGEST}", "name": "x", "models": ["*"], "requests_per_minute": -1}}',
            "requests_per",
        ),
        (f'{{"sha256": "{DIGEST}", "name": "x", "models": ["*"], "key": "sk-test"}}', "unknown field"),
        (f'{{"sha256": "{DIGEST}", "name": "again", "models": ["*"]}}', "same key as line 1"),
    ],
)
def test_bad_lines_are_refused_with_their_line_number(line: str, problem: str) -> None:
    text = f'{{"sha256": "{DIGEST}", "name": "first", "models": ["*"]}}\n{line}\n'
    with pytest.raises(KeysFileError, match=problem):
        parse_keys(text)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys.jsonl"
    path.write_text("# nothing yet\n\n")
    with pytest.raises(KeysFileError, match="no keys"):
        load_keys(path)


def test_the_setting_checks_the_file_at_startup(tmp_path: Path) -> None:
    path = tmp_path / "keys.jsonl"
    path.write_text("{}\n")
    with pytest.raises(ConfigError, match=r"--api-keys-file .*: keys file line 1: sha256"):
        load_settings({"api_keys_file": str(path)})
    with pytest.raises(ConfigError, match=r"--api-keys-file .*: cannot read it"):
        load_settings({"api_keys_file": str(tmp_path / "missing")})


class RecordingGateway:
    """Stands in for _native.Gateway: the key sets handed over."""

    def __init__(self) -> None:
        self.key_sets: list[list[tuple[str, str, list[str], int]]] = []

    def set_api_keys(self, keys: list[tuple[str, str, list[str], int]]) -> None:
        self.key_sets.append(keys)


async def test_sighup_reloads_at_once_and_a_broken_file_keeps_the_keys(tmp_path: Path) -> None:
    path = tmp_path / "keys.jsonl"
    path.write_text(KeyEntry(key_digest("sk-one"), "one", ("*",), 0).line() + "\n")
    gateway = RecordingGateway()
    # A poll interval far beyond the test: only the SIGHUP path can reload in time.
    reloader = KeysReloader(gateway, path, poll_interval_s=3600)  # type: ignore[arg-type]
    reloader.start()
    try:
        path.write_text(path.read_text() + KeyEntry(key_digest("sk-two"), "two", ("*",), 0).line() + "\n")
        reloader.reload_now()
        for _ in range(100):
            if gateway.key_sets:
                break
            await asyncio.sleep(0.01)
        assert [[name for _, name, _, _ in keys] for keys in gateway.key_sets] == [["one", "two"]]

        path.write_text('{"sha256": "half-writ')
        reloader.reload_now()
        await asyncio.sleep(0.3)
        assert len(gateway.key_sets) == 1, "a broken file replaced the keys"
        assert not reloader.check(), "a file already seen is not read again"
    finally:
        await reloader.stop()
