"""aiosipua's private parts this bridge needs, reached here alone (tests/test_sip_parts.py
checks each, so an aiosipua upgrade that moves one fails there by name).

- `IncomingCall._send_response`: `reject()` sends no extra headers, and a digest challenge is
  a 401 with WWW-Authenticate.
"""

from __future__ import annotations

import inspect

from aiosipua import IncomingCall


def reject_with_headers(sip: IncomingCall, status: int, reason: str,
                        headers: dict[str, str]) -> None:
    """What `sip.reject(status, reason)` does, with `headers` added to the response."""
    sip._send_response(status, reason, extra_headers=headers)
    sip.dialog.terminate()


def check() -> None:
    """Raise, naming it, if aiosipua no longer has what `reject_with_headers` calls."""
    send = getattr(IncomingCall, "_send_response", None)
    if send is None or "extra_headers" not in inspect.signature(send).parameters:
        raise RuntimeError("aiosipua's IncomingCall._send_response(..., extra_headers=) moved: "
                           "agent/sip/aiosipua_internals.reject_with_headers needs another way")
