"""Headless Chromium for the browser tests: launched through Playwright with a fake microphone
playing a WAV file, and small readers of the voice-chat page."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.async_api import BrowserContext, Page, async_playwright

from tests.audio_fixtures import write_wav

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_MS = 20_000


def chromium_args(fake_mic: Path) -> list[str]:
    """Flags for headless Chromium with a fake microphone playing `fake_mic` once."""
    return [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={fake_mic}%noloop",
        "--autoplay-policy=no-user-gesture-required",
        # Host candidates as plain addresses (aioice cannot resolve mDNS names). Only the last
        # --disable-features flag counts, and Playwright passes its own before ours.
        "--disable-features=WebRtcHideLocalIpsWithMdns",
    ]


@contextlib.asynccontextmanager
async def chromium(profile_dir: Path, fake_mic: Path) -> AsyncIterator[BrowserContext]:
    """One headless Chromium whose microphone plays `fake_mic` (from each getUserMedia on);
    skips the test when Chromium is not installed."""
    if not CHROMIUM.exists():
        pytest.skip(f"browser tests need Chromium at {CHROMIUM}")
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            profile_dir,
            executable_path=CHROMIUM,
            headless=False,  # --headless=new is in the args; Playwright's own adds --mute-audio
            args=chromium_args(fake_mic),
            viewport={"width": 1200, "height": 860},
        )
        try:
            yield context
        finally:
            await context.close()


@contextlib.asynccontextmanager
async def scripted_chromium(folder: Path) -> AsyncIterator[BrowserContext]:
    """Chromium for pages whose microphone the test's init script replaces (a fake capture of
    silence that no page hears), its profile and files under `folder`."""
    unused = write_wav(folder / "silence.wav", np.zeros(4_800, np.int16), 48_000)
    async with chromium(folder / "profile", unused) as context:
        yield context


def page_errors(page: Page) -> list[str]:
    """Uncaught exceptions and console errors of the page, collected as they happen."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    return errors


async def omnivox(page: Page, expression: str) -> Any:
    """Read the page's test hook: `expression` is evaluated with `o` = window.omnivox; its value
    comes back as Playwright converts it (JSON-like: any shape the expression has)."""
    return await page.evaluate(f"(() => {{ const o = window.omnivox; return {expression}; }})()")
