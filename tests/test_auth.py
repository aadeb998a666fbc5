"""Authentication: API keys on every /v1 route, single-use client secrets that place real calls,
CORS, and no key or secret in any log. A media-only server (no engines) with keys configured;
the default, open mode is what every other test runs on."""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from agent.api.auth import is_loopback
from agent.app import create_app
from agent.config import Settings
from tests.keyed_server import (
    ALLOWED_ORIGIN,
    CALL_TIMEOUT_S,
    KEY,
    OTHER_KEY,
    assert_refused,
    bearer,
    mint,
    offer_call,
    request,
)
from tests.product_calls import spoken
from tests.served import Served
from tests.test_signalling import make_offer

# Every /v1 route, plus a path under /v1 that no route of this module serves: the check is on the
# prefix, so routes other modules add (GET /v1/calls/{id}) are covered without opting in.
V1_REQUESTS = [
    ("POST", "/v1/realtime/calls"),
    ("DELETE", "/v1/realtime/calls/rtc_unknown"),
    ("POST", "/v1/realtime/client_secrets"),
    ("GET", "/v1/calls/rtc_unknown"),
    ("GET", "/v1"),
]


@pytest.mark.parametrize(("method", "path"), V1_REQUESTS)
async def test_every_v1_request_needs_a_valid_key(
    keyed_server: Served, method: str, path: str
) -> None:
    sdp = await make_offer()
    body = {"content": sdp, "headers": {"Content-Type": "application/sdp"}}
    missing = await request(keyed_server, method, path, **body)
    assert_refused(missing, "missing_api_key")
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong_tokens = [KEY + "x", KEY[:-1], "ek_" + secrets.token_urlsafe(32)]
    for token in wrong_tokens:
        reply = await request(keyed_server, method, path, content=sdp,
                              headers={"Content-Type": "application/sdp", **bearer(token)})
        assert_refused(reply, "invalid_api_key")
    for header in (f"Basic {KEY}", KEY, "Bearer", f"Bearer {KEY} extra"):
        reply = await request(keyed_server, method, path, content=sdp,
                              headers={"Content-Type": "application/sdp", "Authorization": header})
        assert reply.status_code == 401, (header, reply.status_code)
    # A key in the query string is not a key (it would end up in access logs).
    reply = await request(keyed_server, method, f"{path}?api_key={KEY}", **body)
    assert_refused(reply, "missing_api_key")
    assert len(keyed_server.app.state.calls) == 0  # nothing refused got as far as a call

    for key in (KEY, OTHER_KEY):
        if path == "/v1/realtime/calls":
            reply = await request(keyed_server, method, path, content=sdp,
                                  headers={"Content-Type": "application/sdp", **bearer(key)})
        else:
            reply = await request(keyed_server, method, path, headers=bearer(key))
        assert reply.status_code != 401, reply.text
        if path == "/v1/realtime/calls":
            assert reply.status_code == 201, reply.text
            assert (await request(keyed_server, "DELETE", reply.headers["location"],
                                  headers=bearer(key))).status_code == 204
        elif path == "/v1/realtime/client_secrets":
            assert reply.status_code == 200, reply.text
        elif path.startswith("/v1/realtime/calls/"):
            assert reply.status_code == 404 and reply.json()["error"]["code"] == "call_not_found"


async def test_health_readiness_and_page_stay_open(keyed_server: Served) -> None:
    for path in ("/healthz", "/readyz", "/", "/app.js", "/secret.js"):
        reply = await request(keyed_server, "GET", path)
        assert reply.status_code == 200, (path, reply.status_code)
    # /metrics is served without a key, as Prometheus text with the server's own metrics.
    metrics = await request(keyed_server, "GET", "/metrics")
    assert metrics.status_code == 200, metrics.text
    assert metrics.headers["content-type"].startswith("text/plain"), metrics.headers
    families = {f.name for f in text_string_to_metric_families(metrics.text)}
    assert {"omnivox_active_calls", "omnivox_calls_started"} <= families, sorted(families)


async def test_api_key_places_a_real_call(keyed_server: Served) -> None:
    caller, reply = await offer_call(keyed_server, OTHER_KEY)
    try:
        assert reply.status_code == 201, reply.text
        await caller.wait_for("session.created", timeout=CALL_TIMEOUT_S)
        hang_up = await request(keyed_server, "DELETE", caller.location, headers=bearer(KEY))
        assert hang_up.status_code == 204
    finally:
        await caller.close()


async def test_cors_allows_only_the_configured_origin(
    keyed_server: Served, media_server: Served
) -> None:
    preflight = {"Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    allowed = await request(keyed_server, "OPTIONS", "/v1/realtime/calls",
                            headers={"Origin": ALLOWED_ORIGIN, **preflight})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    other = await request(keyed_server, "OPTIONS", "/v1/realtime/calls",
                          headers={"Origin": "https://evil.example", **preflight})
    assert "access-control-allow-origin" not in other.headers
    # Refusals carry the header too, so the allowed page can read why it was refused.
    refused = await request(keyed_server, "POST", "/v1/realtime/client_secrets",
                            headers={"Origin": ALLOWED_ORIGIN})
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
    # The page reads the call's Location cross-origin, so it is exposed.
    minted = await request(keyed_server, "POST", "/v1/realtime/client_secrets",
                           headers={"Origin": ALLOWED_ORIGIN, **bearer(KEY)})
    assert "location" in minted.headers["access-control-expose-headers"].lower()
    # Default settings: no allow-list, same origin only.
    default = await request(media_server, "OPTIONS", "/v1/realtime/calls",
                            headers={"Origin": ALLOWED_ORIGIN, **preflight})
    assert "access-control-allow-origin" not in default.headers


async def test_no_key_or_secret_in_any_log(
    keyed_server: Served, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A whole authenticated call, refusals included, logged at DEBUG with uvicorn's access
    log on: neither key nor secret appears anywhere."""
    uvicorn_loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.access")]
    levels = [lg.level for lg in uvicorn_loggers]
    for lg in uvicorn_loggers:  # they do not propagate to caplog's root handler
        lg.addHandler(caplog.handler)
        lg.setLevel(logging.INFO)
    secret = ""
    try:
        with caplog.at_level(logging.DEBUG):
            assert_refused(await mint(keyed_server, KEY[:-1]), "invalid_api_key")
            secret = (await mint(keyed_server)).json()["value"]
            caller, reply = await offer_call(keyed_server, secret, spoken("Hello.", tmp_path))
            try:
                assert reply.status_code == 201, reply.text
                await caller.wait_for("input_audio_buffer.speech_stopped",
                                      timeout=CALL_TIMEOUT_S)
                again, again_reply = await offer_call(keyed_server, secret)
                await again.close()
                assert again_reply.status_code == 401
                hang_up = await request(keyed_server, "DELETE", caller.location,
                                        headers=bearer(secret))
                assert hang_up.status_code == 204
            finally:
                await caller.close()
    finally:
        for lg, level in zip(uvicorn_loggers, levels, strict=True):
            lg.removeHandler(caplog.handler)
            lg.setLevel(level)
    logged = caplog.text + "".join(repr(r.args) for r in caplog.records)
    assert "POST /v1/realtime/client_secrets" in logged  # the access log was captured
    assert "refused POST /v1/realtime/client_secrets" in logged  # and ours
    for value in (KEY, KEY[:-1], OTHER_KEY, secret, secret[3:]):
        assert value not in logged
    settings = keyed_server.app.state.settings
    shown = repr(settings) + str(settings) + settings.model_dump_json()
    shown += repr(keyed_server.app.user_middleware)
    assert KEY not in shown and OTHER_KEY not in shown


def test_keys_and_origins_are_checked() -> None:
    short = "short-key"
    with pytest.raises(ValidationError) as refused:
        Settings(api_keys=f"{KEY},{short}")
    assert short not in str(refused.value) and KEY not in str(refused.value)
    for origin in ("app.example", "https://app.example/path", "ftp://app.example"):
        with pytest.raises(ValidationError):
            Settings(cors_origins=origin)


def test_open_server_off_loopback_warns(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
    assert not is_loopback("example.org")

    def warnings(**settings) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="agent.api.auth"):
            create_app(Settings(data_dir=tmp_path, **settings))
        return [r.getMessage() for r in caplog.records if r.name == "agent.api.auth"]

    warned = warnings(host="0.0.0.0")
    assert len(warned) == 1 and "OMNIVOX_API_KEYS" in warned[0] and "0.0.0.0" in warned[0]
    assert warnings(host="127.0.0.1") == []
    assert warnings(host="0.0.0.0", api_keys=[KEY]) == []
