"""Authentication: API keys on every /v1 route, single-use client secrets that place real calls,
CORS, and no key or secret in any log. A media-only server (no engines) with keys configured;
the default, open mode is what every other test runs on."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from aiortc import RTCSessionDescription
from openai.types.realtime import ClientSecretCreateResponse
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from agent.api.auth import ClientSecrets, SecretStoreFullError, is_loopback
from agent.app import create_app
from agent.config import Settings
from tests.media_servers import tone_server
from tests.product_calls import LOUD, spoken, wait_until
from tests.rtc_client import ArrayAudioTrack, RtcCaller
from tests.served import Served, serve
from tests.test_signalling import make_offer

# Fresh per run, so finding one in a log can only mean it was logged.
KEY = "sk-test-" + secrets.token_hex(16)
OTHER_KEY = "sk-other-" + secrets.token_hex(16)
ALLOWED_ORIGIN = "https://app.example"
CALL_TIMEOUT_S = 20.0


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
async def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """A media-only server (tone replies) that requires API keys and allows one CORS origin."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("auth-data"),
        max_calls=6,
        api_keys=f"{KEY}, {OTHER_KEY}",
        cors_origins=[ALLOWED_ORIGIN],
        max_client_secrets=64,
    )
    async with tone_server(settings) as served:
        yield served


async def request(served: Served, method: str, path: str, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.url, timeout=CALL_TIMEOUT_S) as http:
        return await http.request(method, path, **kwargs)


async def mint(served: Served, token: str = KEY, **body) -> httpx.Response:
    return await request(served, "POST", "/v1/realtime/client_secrets", json=body or None,
                         headers=bearer(token))


async def offer_call(
    served: Served, token: str | None, pcm: np.ndarray | None = None
) -> tuple[RtcCaller, httpx.Response]:
    """A real aiortc caller whose offer is posted with `token` as Bearer (none when None); on
    201 the answer is applied, so the call connects. Close the caller when done."""
    caller = RtcCaller(served.url, ArrayAudioTrack(pcm if pcm is not None else np.zeros(0)))
    caller.pc.addTransceiver(caller.audio, direction="sendrecv")
    await caller.pc.setLocalDescription(await caller.pc.createOffer())
    reply = await request(
        served, "POST", "/v1/realtime/calls", content=caller.pc.localDescription.sdp,
        headers={"Content-Type": "application/sdp", **(bearer(token) if token else {})},
    )
    if reply.status_code == 201:
        caller.location = reply.headers["location"]
        await caller.pc.setRemoteDescription(RTCSessionDescription(reply.text, "answer"))
    return caller, reply


def assert_refused(reply: httpx.Response, code: str) -> None:
    assert reply.status_code == 401, (reply.status_code, reply.text)
    assert reply.headers["www-authenticate"].startswith("Bearer"), reply.headers
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == code, error
    assert error["message"]


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


async def test_client_secret_places_one_call_and_hangs_up_only_that_call(
    keyed_server: Served, tmp_path: Path
) -> None:
    minted = await mint(keyed_server)
    assert minted.status_code == 200, minted.text
    assert minted.headers["cache-control"] == "no-store"
    shaped = ClientSecretCreateResponse.model_validate(minted.json())
    secret = shaped.value
    assert secret.startswith("ek_") and len(secret) > 40
    ttl = keyed_server.app.state.settings.client_secret_ttl_s
    assert time.time() + ttl - 5 <= shaped.expires_at <= time.time() + ttl
    assert shaped.session.type == "realtime"

    # The secret is not an API key: it cannot mint.
    assert_refused(await mint(keyed_server, secret), "invalid_api_key")

    calls = keyed_server.app.state.calls
    pcm = spoken("Hello, can you hear me?", tmp_path)
    caller, reply = await offer_call(keyed_server, secret, pcm)
    other, other_reply = await offer_call(keyed_server, KEY)
    try:
        assert reply.status_code == 201, reply.text
        assert other_reply.status_code == 201, other_reply.text
        # A real call: the server hears the speech and its tone reply reaches the caller.
        await caller.wait_for("session.created", timeout=CALL_TIMEOUT_S)
        await caller.wait_for("input_audio_buffer.speech_stopped", timeout=CALL_TIMEOUT_S)
        await wait_until(lambda: any(np.abs(f).max() > LOUD for f in caller.received),
                         CALL_TIMEOUT_S, "the responder's tone")

        # Single use: the same secret places no second call.
        again, again_reply = await offer_call(keyed_server, secret)
        await again.close()
        assert_refused(again_reply, "invalid_api_key")

        # It hangs up the call it placed, and no other.
        assert_refused(await request(keyed_server, "DELETE", other.location,
                                     headers=bearer(secret)), "invalid_api_key")
        assert calls.get(other.location.rsplit("/", 1)[1]) is not None
        own = await request(keyed_server, "DELETE", caller.location, headers=bearer(secret))
        assert own.status_code == 204
        assert calls.get(caller.location.rsplit("/", 1)[1]) is None
    finally:
        await request(keyed_server, "DELETE", other.location, headers=bearer(KEY))
        await caller.close()
        await other.close()


async def test_one_secret_used_twice_at_once_places_one_call(keyed_server: Served) -> None:
    secret = (await mint(keyed_server)).json()["value"]
    placed = await asyncio.gather(*(offer_call(keyed_server, secret) for _ in range(2)))
    try:
        statuses = sorted(reply.status_code for _, reply in placed)
        assert statuses == [201, 401], statuses
    finally:
        for caller, reply in placed:
            if reply.status_code == 201:
                await request(keyed_server, "DELETE", caller.location, headers=bearer(KEY))
            await caller.close()


async def test_refused_offer_leaves_the_secret_for_a_good_one(keyed_server: Served) -> None:
    secret = (await mint(keyed_server)).json()["value"]
    bad = await request(keyed_server, "POST", "/v1/realtime/calls", content="v=0\r\nnonsense",
                        headers={"Content-Type": "application/sdp", **bearer(secret)})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_sdp"
    caller, reply = await offer_call(keyed_server, secret)
    try:
        assert reply.status_code == 201, reply.text
    finally:
        await request(keyed_server, "DELETE", caller.location, headers=bearer(secret))
        await caller.close()


async def test_expired_secret_is_refused(keyed_server: Served) -> None:
    minted_at = time.monotonic()
    minted = await mint(keyed_server, expires_after={"anchor": "created_at", "seconds": 1})
    assert minted.status_code == 200, minted.text
    assert minted.json()["expires_at"] <= time.time() + 1
    # Past its lifetime by any clock: no race, the wait can only be longer than needed.
    await asyncio.sleep(max(0.0, minted_at + 1.2 - time.monotonic()))
    caller, reply = await offer_call(keyed_server, minted.json()["value"])
    await caller.close()
    assert_refused(reply, "invalid_api_key")


def test_secret_store_expiry_cap_and_purge_on_a_controlled_clock() -> None:
    now = [1000.0]
    store = ClientSecrets(limit=3, clock=lambda: now[0], wall_clock=lambda: 1_700_000_000.0)
    value, expires_at = store.mint(10)
    assert expires_at == 1_700_000_010
    now[0] += 9.9
    digest = store.reserve(value)
    assert digest is not None
    assert store.reserve(value) is None  # reserved: a second use at the same time is refused
    store.release(digest)  # that request placed no call
    now[0] += 0.1  # exactly at expiry: expired
    assert store.reserve(value) is None

    fresh = [store.mint(5)[0] for _ in range(3)]
    with pytest.raises(SecretStoreFullError) as full:
        store.mint(5)
    assert full.value.retry_after_s == 5
    now[0] += 5.0
    store.mint(5)  # the expired three were purged to make room
    assert len(store) == 1
    assert all(store.reserve(v) is None for v in fresh)

    # Used secrets are remembered (to hang their call up) up to the same cap, oldest forgotten.
    used = []
    for n in range(4):
        secret = store.mint(5)[0]
        store.bind(store.reserve(secret), f"rtc_{n}")
        used.append(secret)
    assert not store.placed(used[0], "rtc_0")
    assert store.placed(used[3], "rtc_3") and not store.placed(used[3], "rtc_2")


async def test_mint_request_is_checked(keyed_server: Served) -> None:
    longest = keyed_server.app.state.settings.client_secret_ttl_s
    for expires_after in ({"seconds": 0}, {"seconds": longest + 1}, {"seconds": "10"},
                          {"seconds": True}, {"anchor": "now", "seconds": 10}, 10):
        reply = await mint(keyed_server, expires_after=expires_after)
        assert reply.status_code == 400, (expires_after, reply.text)
        assert reply.json()["error"]["code"] == "invalid_request"
    for content in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        reply = await request(keyed_server, "POST", "/v1/realtime/client_secrets",
                              content=content, headers=bearer(KEY))
        assert reply.status_code == 400, (content, reply.text)
    huge = await request(keyed_server, "POST", "/v1/realtime/client_secrets",
                         content=b" " * 100_000, headers=bearer(KEY))
    assert huge.status_code == 413
    # A session in the request (as OpenAI's clients send) is accepted.
    reply = await mint(keyed_server, session={"type": "realtime"},
                       expires_after={"anchor": "created_at", "seconds": 5})
    assert reply.status_code == 200, reply.text
    assert time.time() <= reply.json()["expires_at"] + 1 <= time.time() + 6


async def test_outstanding_secrets_are_capped(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, api_keys=[KEY], max_client_secrets=2,
                              client_secret_ttl_s=30))
    async with serve(app) as served:
        for _ in range(2):
            assert (await mint(served)).status_code == 200
        full = await mint(served)
    assert full.status_code == 429 and full.json()["error"]["code"] == "too_many_client_secrets"
    assert 1 <= int(full.headers["retry-after"]) <= 30


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


@pytest.mark.browser
async def test_page_calls_with_a_client_secret_from_the_fragment(
    keyed_server: Served, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The deployer's backend mints, the page gets the secret in its URL fragment, calls with
    it, hangs up with it, and a second call without a new secret is refused with a hint."""
    from playwright.async_api import expect

    from tests.audio_fixtures import speech_wav
    from tests.chromium import TIMEOUT_MS, chromium, omnivox, page_errors

    folder = tmp_path_factory.mktemp("auth-browser")
    mic = speech_wav("Hello there.", folder / "mic.wav", pad_before_s=1.0, pad_after_s=1.0)
    secret = (await mint(keyed_server)).json()["value"]
    calls = keyed_server.app.state.calls
    async with chromium(folder / "profile", mic) as browser:
        page = await browser.new_page()
        errors = page_errors(page)
        await page.goto(f"{keyed_server.url}/?raw=1#client_secret={secret}")
        assert await omnivox(page, "o.hasClientSecret") is True
        assert secret not in page.url  # taken out of the address bar
        button = page.locator("#call-button")
        await button.click()
        await page.wait_for_function(
            "window.omnivox.state.connection === 'connected'", timeout=TIMEOUT_MS
        )
        assert await omnivox(page, "o.hasClientSecret") is False
        call_id = (await omnivox(page, "o.callUrl")).rsplit("/", 1)[-1]
        assert calls.get(call_id) is not None
        async with page.expect_response(lambda r: r.request.method == "DELETE") as hung_up:
            await button.click()
        assert (await hung_up.value).status == 204  # the DELETE carried the secret
        await wait_until(lambda: calls.get(call_id) is None, 10.0, "the call to end")

        await expect(button).to_have_text("Connect")
        await button.click()
        await expect(page.locator("#status")).to_contain_text("client secret",
                                                              timeout=TIMEOUT_MS)
        assert (await omnivox(page, "o.lastError"))["code"] == "missing_api_key"
        # The refused POST logs a console error in Chromium; nothing else may.
        assert [e for e in errors if "401" not in e] == [], errors
