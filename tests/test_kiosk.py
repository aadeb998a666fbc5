"""The kiosk page (web/kiosk/) in headless Chromium against the real product (tiny family):
it connects by itself on load with no click, answers a spoken question with live captions and
a visible state, and when the server is restarted under it, it shows that it is reconnecting,
comes back by itself (a fresh conversation: the new server holds none to resume) and answers
the next question. Before that, the call's connection is cut under the page: it resumes the
conversation with the token from its session.created.

The server is an API app on the shared tiny server's pipeline (no engine start), stopped and
started again on the same port. `make soak` runs it for ten minutes of conversation
(OMNIVOX_KIOSK_SOAK_S=600): questions one after another, the restart halfway."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from playwright.async_api import BrowserContext, Page

from agent.app import create_app
from agent.config import ConversationSettings, Settings
from tests.audio_fixtures import read_wav, speech_wav
from tests.chromium import TIMEOUT_MS, omnivox, page_errors, scripted_chromium
from tests.conftest import wait_idle, wait_ready
from tests.served import Served, serve
from tests.test_browser_agent import MICROPHONE

pytestmark = [pytest.mark.browser, pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

SOAK_S = float(os.environ.get("OMNIVOX_KIOSK_SOAK_S", "0"))  # 0: one question each side
# Minutes of silence before the page starts over (9 s; the test waits for it at the end): the
# questions leave none, one following the other's reply at once.
RESET_MIN = 0.15
REPLY_TIMEOUT_MS = 90_000
RECONNECT_TIMEOUT_MS = 60_000
DOWN_S = 2.0  # how long the server stays down: the page meets refused connections
SCREENSHOT = Path("/tmp/omnivox-kiosk.png")


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A spoken question as base64 int16 PCM at 48 kHz, for the page's microphone."""
    wav = speech_wav("What time does the museum open?",
                     tmp_path_factory.mktemp("kiosk") / "question.wav",
                     pad_before_s=0.3, pad_after_s=0.2)
    return base64.b64encode(read_wav(wav)[0].astype("<i2").tobytes()).decode()


@pytest.fixture(scope="module")
async def browser(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BrowserContext]:
    async with scripted_chromium(tmp_path_factory.mktemp("chromium")) as context:
        yield context


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def kiosk_app(shared: Served, data_dir: Path) -> FastAPI:
    """A fresh API process's app (no call, nothing to resume) on the shared engines."""
    settings = Settings(
        profile="tiny",
        models_dir=shared.app.state.settings.models_dir,
        data_dir=data_dir,
        max_calls=4,
        conversation=ConversationSettings(max_reply_tokens=24),
    )
    return create_app(settings, pipeline=shared.app.state.pipeline, owns_pipeline=False)


async def responses_done(page: Page) -> int:
    return int(await omnivox(page, "o.replies"))


async def ask(page: Page) -> float:
    """Say the question once the page listens; the seconds until its reply is done."""
    await page.wait_for_function("window.omnivox.phase === 'listening'",
                                 timeout=RECONNECT_TIMEOUT_MS)
    before = await responses_done(page)
    started = time.monotonic()
    await page.evaluate("window.__mic.say('question')")
    await page.wait_for_function(
        f"window.omnivox.replies > {before}",
        timeout=REPLY_TIMEOUT_MS)
    return time.monotonic() - started


async def converse(page: Page, until: float) -> list[float]:
    """Questions one after another until `until` (monotonic), at least one."""
    seconds = [await ask(page)]
    while time.monotonic() < until:
        await page.wait_for_function("window.omnivox.phase === 'listening'",
                                     timeout=REPLY_TIMEOUT_MS)
        seconds.append(await ask(page))
    return seconds


async def test_kiosk_comes_back_by_itself_after_a_server_restart(
    shared_tiny_server: Served, browser: BrowserContext, question: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    await wait_idle(shared_tiny_server)
    port = free_port()
    began = time.monotonic()
    page = await browser.new_page()
    errors = page_errors(page)
    await page.add_init_script(MICROPHONE)

    async with serve(kiosk_app(shared_tiny_server, tmp_path_factory.mktemp("data")), port) as a:
        await wait_ready(a)
        await page.goto(f"{a.url}/kiosk?raw=1&reset_min={RESET_MIN}")  # nothing is clicked, ever
        await page.evaluate("(b64) => window.__mic.load('question', b64)", question)
        before = await converse(page, began + SOAK_S / 2)
        await page.screenshot(path=str(SCREENSHOT))
        assert await page.locator("#transcript li.agent").count() >= 1
        assert await page.locator("#transcript li.caller").count() >= 1
        assert await omnivox(page, "o.calls") == 1  # the page placed its first call alone

        # The connection is cut under the page (the server's end of it closes): the page
        # comes back with its resume token and goes on with the same conversation.
        dropped = next(iter(a.app.state.calls))
        history = [item.item_id for item in dropped.handler.conversation.items]
        cut_at = time.monotonic()
        await dropped.pc.close()
        await page.wait_for_function("window.omnivox.resumed === 1", timeout=RECONNECT_TIMEOUT_MS)
        resume_s = time.monotonic() - cut_at
        resumed = next(iter(a.app.state.calls))
        assert resumed.id != dropped.id
        assert [i.item_id for i in resumed.handler.conversation.items][:len(history)] == history
        before.append(await ask(page))
        now = [i.item_id for i in resumed.handler.conversation.items]  # at most 32 are kept
        assert history[-1] in now and now[-1] not in history, (history, now)

    # The server is gone: the page says so, and tries again while it is down.
    await page.wait_for_function("window.omnivox.phase === 'reconnecting'", timeout=TIMEOUT_MS)
    assert await page.locator("#phase").get_attribute("data-phase") == "reconnecting"
    down_at = time.monotonic()
    await asyncio.sleep(DOWN_S)

    async with serve(kiosk_app(shared_tiny_server, tmp_path_factory.mktemp("data")), port) as b:
        await wait_ready(b)
        await page.wait_for_function("window.omnivox.connected", timeout=RECONNECT_TIMEOUT_MS)
        back_s = time.monotonic() - down_at
        after = await converse(page, began + SOAK_S)
        stats = await omnivox(page, "({calls: o.calls, conversations: o.conversations, "
                                    "resumed: o.resumed, lastError: o.lastError})")
        # Silence: the page starts over (empty captions, a new call), and the server keeps
        # nothing of the conversation it hung up.
        await page.wait_for_function("window.omnivox.conversations === 3 && "
                                     "window.omnivox.connected", timeout=RECONNECT_TIMEOUT_MS)
        assert await page.locator("#transcript li").count() == 0
        assert len(b.app.state.calls.resumes) == 0
        await page.close()  # hangs the call up (pagehide)

    print(f"\nkiosk: {len(before)} + {len(after)} questions answered in "
          f"{time.monotonic() - began:.0f} s; reply done after (s) median "
          f"{float(np.median(before + after)):.1f}, max {max(before + after):.1f}; resumed "
          f"{resume_s:.1f} s after the cut; back "
          f"{back_s:.1f} s after the server went down ({DOWN_S:.0f} s down); {stats}")
    # A fresh conversation on the new server: the old one's resume was refused there.
    assert stats["calls"] >= 3 and stats["conversations"] == 2 and stats["resumed"] == 1
    assert stats["lastError"]["code"] == "resume_expired", stats
    # Refused connections and the 410 while the server was down are the browser's own logs.
    assert [e for e in errors if "Failed to load resource" not in e] == [], errors
