"""Settings, declared once: the environment, the command line, the documented tables and the
one-line errors all follow the declarations in agent/config.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import parse_args, settings_of
from agent.config import REPO_ROOT, Settings, env_name

KEY, OTHER_KEY = "key-one-at-least-16-chars", "key-two-at-least-16-chars"


def test_every_setting_reads_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {
        "OMNIVOX_MAX_CALL_S": "60", "OMNIVOX_MAX_EVENTS_PER_S": "2.5",
        "OMNIVOX_IDLE_TIMEOUT_S": "",  # empty: the default
        "OMNIVOX_VAD__MAX_UTTERANCE_MS": "5000", "OMNIVOX_CONVERSATION__VOICE": "alloy",
        "OMNIVOX_API_KEYS": f" {KEY} ,{OTHER_KEY},", "OMNIVOX_CORS_ORIGINS": "https://a.example",
        "OMNIVOX_CLIENT_SECRET_TTL_S": "30", "OMNIVOX_LOG_FORMAT": "JSON",
        "OMNIVOX_ICE_SERVERS": "stun:127.0.0.1:3478", "OMNIVOX_UNRELATED": "x",
    }
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.max_call_s == 60 and settings.max_events_per_s == 2.5
    assert settings.idle_timeout_s == Settings.model_fields["idle_timeout_s"].default
    assert settings.vad.max_utterance_ms == 5000 and settings.conversation.voice == "alloy"
    assert [k.get_secret_value() for k in settings.api_keys] == [KEY, OTHER_KEY]
    assert settings.cors_origins == ["https://a.example"]
    assert settings.client_secret_ttl_s == 30 and settings.log_format == "json"
    assert settings.ice_servers == ["stun:127.0.0.1:3478"]


def test_a_flag_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIVOX_MAX_CALLS", "5")
    assert settings_of(parse_args(["serve"])).max_calls == 5
    assert settings_of(parse_args(["serve", "--max-calls", "3"])).max_calls == 3
    monkeypatch.setenv("OMNIVOX_MODELS_DIR", "/tmp/elsewhere")
    assert settings_of(parse_args(["models", "build", "tiny"])).models_dir == Path("/tmp/elsewhere")


def test_the_limits_table_matches_the_declarations() -> None:
    """Each row of the Limits table (docs/operations.md) names a setting, its default and its
    variable."""
    operations = (REPO_ROOT / "docs" / "operations.md").read_text()
    table = operations[operations.index("## Limits"):operations.index("## Faults")]
    rows = re.findall(r"^\| (`[^|]+) \| ([^|]+) \| (`[^|]+) \|", table, re.M)
    assert len(rows) >= 8, "the Limits table went missing"
    for names, shown_defaults, variables in rows:
        for name, shown, variable in zip(re.findall(r"`([\w.]+)`", names),
                                         shown_defaults.split(","),
                                         re.findall(r"`(\w+)`", variables), strict=True):
            path = name.split(".")
            assert variable == env_name(*path), f"the docs name {variable} for {name}"
            # The declared default (not the environment's: tests set some variables).
            value = Settings.model_fields[path[0]].get_default(call_default_factory=True)
            for part in path[1:]:
                value = getattr(value, part)
            assert float(shown) == float(value), f"the docs say {name} defaults to {shown}"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(("args", "named"), [
    (("serve", "--port", "99999"), "OMNIVOX_PORT"),
    (("serve", "--max-calls", "-3"), "--max-calls"),
    (("serve", "--profile", "nope"), "unknown profile 'nope'"),
    (("models", "build", "nope"), "no model family 'nope'"),
    (("bench", "turn", "--turns", "0"), "--turns"),
])
def test_bad_input_gets_one_line_and_status_2(args: tuple[str, ...], named: str) -> None:
    done = run_cli(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("omnivox: ") and done.stderr.count("\n") == 1, done.stderr
    assert named in done.stderr


def test_help_shows_each_flag_with_its_default_and_variable() -> None:
    done = run_cli("serve", "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    for name in ("port", "max_calls", "data_dir", "log_format"):
        field = Settings.model_fields[name]
        assert f"--{name.replace('_', '-')}" in text and env_name(name) in text
        assert str(field.description) in text
