"""Single-use client secrets: minted with an API key, each places one real call (from an aiortc
caller or the page, given it in its URL fragment) and hangs up only that call; expiry, caps
and checks on the mint request."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from openai.types.realtime import ClientSecretCreateResponse

from agent.api.auth import ClientSecrets, SecretStoreFullError
from agent.app import create_app
from agent.config import Settings
from tests.keyed_server import (
    CALL_TIMEOUT_S,
    KEY,
    assert_refused,
    bearer,
    mint,
    offer_call,
    request,
)
from tests.product_calls import LOUD, spoken, wait_until
from tests.served import Served, serve


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
