"""What `omnivox sip` runs with: where it listens, the server it bridges to, the sessions."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WILDCARDS = ("0.0.0.0", "::")


class BridgeSettingsError(ValueError):
    """A setting the bridge cannot run with; the message names it."""


@dataclass(frozen=True)
class BridgeSettings:
    listen_host: str
    listen_port: int
    server_url: str
    api_key: str | None = None
    media_ip: str | None = None  # the address RTP is announced at (default: listen_host)
    rtp_ports: tuple[int, int] = (20_000, 30_000)
    transports: tuple[str, ...] = ("udp", "tcp")
    max_calls: int = 16
    connect_timeout_s: float = 10.0
    session: dict[str, Any] | None = None  # every call's session (None: the server's defaults)
    number_sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    auth_users: dict[str, str] = field(default_factory=dict, repr=False)  # none: no digest auth
    auth_realm: str = "omnivox"

    def __post_init__(self) -> None:
        if self.listen_host in WILDCARDS and not self.media_ip:
            raise BridgeSettingsError(
                f"--listen {self.listen_host} needs --media-ip: the address phones send RTP to")
        low, high = self.rtp_ports
        if not 1024 <= low < high <= 65_535:
            raise BridgeSettingsError(f"--rtp-ports must be LOW-HIGH within 1024-65535, "
                                      f"got {low}-{high}")
        if self.max_calls < 1:
            raise BridgeSettingsError("--max-calls must be at least 1")
        if not self.server_url.startswith(("http://", "https://")):
            raise BridgeSettingsError(f"--server must be an http(s) URL, got {self.server_url!r}")

    @property
    def announced_ip(self) -> str:
        return self.media_ip or self.listen_host

    def session_for(self, number: str | None) -> dict[str, Any] | None:
        """The session of a call to `number` (the INVITE's request-URI user)."""
        if number is not None and number in self.number_sessions:
            return self.number_sessions[number]
        return self.session


def listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [HOST]:PORT) as a host and a port."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65_536:
        raise BridgeSettingsError(f"--listen must be HOST:PORT, got {text!r}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise BridgeSettingsError(f"--listen needs an IP address, got {host!r}") from None
    return host, int(port)


def port_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    if not sep or not low.isdigit() or not high.isdigit():
        raise BridgeSettingsError(f"--rtp-ports must be LOW-HIGH, got {text!r}")
    return int(low), int(high)


def read_session(path: Path) -> dict[str, Any]:
    """A session object (OpenAI's `session` of a call) from a JSON file."""
    try:
        session = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BridgeSettingsError(f"session file {path}: {exc}") from None
    if not isinstance(session, dict):
        raise BridgeSettingsError(f"session file {path}: a JSON object is needed")
    session.setdefault("type", "realtime")
    return session


def number_session(text: str) -> tuple[str, dict[str, Any]]:
    """NUMBER=FILE: the session of calls to NUMBER."""
    number, sep, path = text.partition("=")
    if not sep or not number or not path:
        raise BridgeSettingsError(f"--number must be NUMBER=SESSION.json, got {text!r}")
    return number, read_session(Path(path))


def auth_user(text: str) -> tuple[str, str]:
    """USER:PASSWORD, a phone that may call when digest auth is on."""
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise BridgeSettingsError("--auth must be USER:PASSWORD")  # never echo a password
    return user, password


def read_auth_file(path: Path) -> dict[str, str]:
    """USER:PASSWORD lines (blank lines and # comments skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise BridgeSettingsError(f"auth file {path}: {exc}") from None
    users: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                user, password = auth_user(line.strip())
            except BridgeSettingsError:
                raise BridgeSettingsError(f"auth file {path}, line {number}: USER:PASSWORD "
                                          "expected") from None
            users[user] = password
    return users
