"""Headless Chromium end to end: the voice-chat page at / calls the server with a fake
microphone playing espeak-ng speech, the server detects the speech, the test responder's tone
reaches the page, the page shows the turn's latency, and hanging up ends the call on the server.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from openai.types.realtime import RealtimeServerEvent
from playwright.async_api import BrowserContext, expect
from pydantic import TypeAdapter

from tests.audio_fixtures import speech_wav
from tests.chromium import TIMEOUT_MS, chromium, omnivox, page_errors
from tests.product_calls import wait_until
from tests.served import Served

pytestmark = [pytest.mark.browser, pytest.mark.asyncio(loop_scope="session")]

SCREENSHOT = Path("/tmp/omnivox-page.png")
# The responder's tone has amplitude 0.3 (RMS about 0.21, less 3 dB for Opus's stereo upmix);
# the page reads linear RMS, and Opus silence is far below this.
REMOTE_LEVEL_THRESHOLD = 0.05


@pytest.fixture(scope="module")
def fake_mic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake microphone's audio: the fake device plays from getUserMedia on, so the speech
    waits long enough for the call to connect first."""
    return speech_wav(
        "Hello there what is the weather like today?",
        tmp_path_factory.mktemp("browser") / "mic.wav",
        pad_before_s=2.5,
        pad_after_s=3.0,
    )


@pytest.fixture(scope="module")
async def browser(
    tmp_path_factory: pytest.TempPathFactory, fake_mic: Path
) -> AsyncIterator[BrowserContext]:
    """One headless Chromium for the module (each test opens its own page)."""
    async with chromium(tmp_path_factory.mktemp("chromium") / "profile", fake_mic) as context:
        yield context


async def test_page_calls_hears_the_agent_and_hangs_up(
    media_server: Served, browser: BrowserContext
) -> None:
    calls = media_server.app.state.calls
    page = await browser.new_page()
    errors = page_errors(page)
    await page.goto(f"{media_server.url}/?raw=1")
    await expect(page.locator("h1")).to_have_text("omnivox")
    constraints = await omnivox(page, "o.constraints")
    assert constraints["echoCancellation"] is False and constraints["autoGainControl"] is False

    button = page.locator("#call-button")
    await expect(button).to_have_text("Connect")
    await button.click()
    await page.wait_for_function(
        "window.omnivox.state.connection === 'connected'", timeout=TIMEOUT_MS
    )
    await expect(page.locator("#state-connection")).to_have_text("connected")
    await expect(button).to_have_text("Hang up")
    call_url = await omnivox(page, "o.callUrl")
    call_id = call_url.rsplit("/", 1)[-1]
    assert calls.get(call_id) is not None, (call_url, len(calls))

    # The server's VAD hears the fake microphone's sentence and says so on the data channel.
    for event_type in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"):
        await page.wait_for_function(
            f"window.omnivox.events.some(e => e.type === '{event_type}')", timeout=TIMEOUT_MS
        )
        logged = page.locator("#log li .type").filter(has_text=re.compile(f"^{event_type}$"))
        await expect(logged).to_have_count(1)
    types = await omnivox(page, "o.events.map(e => e.type)")
    assert types[0] == "session.created", types
    assert "error" not in types, types

    # The responder answers with a tone: the page's analyser of the remote track hears it,
    # and the latency from speech_stopped to the agent's first audio is shown.
    await page.wait_for_function(
        f"window.omnivox.levels.maxRemote > {REMOTE_LEVEL_THRESHOLD}", timeout=TIMEOUT_MS
    )
    await expect(page.locator("#latency-last")).to_have_text(re.compile(r"^\d+ ms$"))
    latencies = await omnivox(page, "o.latencies")
    assert len(latencies) == 1 and latencies[0]["ms"] > 0, latencies
    levels = await omnivox(page, "o.levels")
    print(
        f"\nbrowser turn latency {latencies[0]['ms']} ms ({latencies[0]['source']}); "
        f"max mic RMS {levels['maxMic']:.3f}, agent RMS so far {levels['maxRemote']:.3f}"
    )
    assert levels["maxMic"] > 0.01, levels  # the page's own meter saw the fake microphone
    responder = next(r for r in media_server.app.state.test_responders if r.call.id == call_id)
    assert len(responder.utterances) == 1
    await page.screenshot(path=str(SCREENSHOT), full_page=True)

    # Hang-up ends the call on the server, and the page says so.
    await button.click()
    await wait_until(lambda: len(calls) == 0, 10.0, "the server to drop the call")
    await expect(button).to_have_text("Connect")
    await expect(page.locator("#status")).to_have_text(re.compile("^Call ended"))
    assert await omnivox(page, "o.state.connection") == "closed"
    assert errors == [], errors


def event(event_type: str, **fields) -> dict:
    """A server event in OpenAI Realtime GA shape."""
    return {"type": event_type, "event_id": f"event_{event_type}", **fields}


def speech(edge: str, item_id: str, ms: int) -> dict:
    at = {"started": "audio_start_ms", "stopped": "audio_end_ms"}[edge]
    return event(f"input_audio_buffer.speech_{edge}", item_id=item_id, **{at: ms})


def transcribed(item_id: str, text: str) -> dict:
    return event(
        "conversation.item.input_audio_transcription.completed",
        item_id=item_id,
        content_index=0,
        transcript=text,
        usage={"type": "duration", "seconds": 1.0},
    )


def said(response_id: str, item_id: str, delta: str | None = None, done: str | None = None):
    """A transcript delta of the agent's audio, or (with `done`) the whole transcript."""
    where = {"response_id": response_id, "item_id": item_id, "output_index": 0, "content_index": 0}
    if done is not None:
        return event("response.output_audio_transcript.done", transcript=done, **where)
    return event("response.output_audio_transcript.delta", delta=delta, **where)


def audio(edge: str, response_id: str) -> dict:
    return event(f"output_audio_buffer.{edge}", response_id=response_id)


def response(name: str, response_id: str, status: str, **details) -> dict:
    body = {"id": response_id, "object": "realtime.response", "status": status}
    return event(f"response.{name}", response={**body, **details})


# Two turns, the second cut off by the caller, then a failed response:
# (page time in ms, server event) or (page time in ms, agent audio level as linear RMS).
CONVERSATION = [
    (0, speech("started", "item_1", 500)),
    (1000, speech("stopped", "item_1", 1500)),
    (1100, transcribed("item_1", "What is the capital of France?")),
    (1150, response("created", "resp_1", "in_progress")),
    (1200, said("resp_1", "item_2", "The capital ")),
    (1350, audio("started", "resp_1")),
    (1400, 0.2),  # the agent's audio reaches the page after the event: the event counts
    (1500, said("resp_1", "item_2", "of France is Paris.")),
    (1600, said("resp_1", "item_2", done="The capital of France is Paris.")),
    (3000, audio("stopped", "resp_1")),
    (3000, 0.0),
    (3000, response("done", "resp_1", "completed")),
    (5000, speech("started", "item_3", 5500)),
    (6000, speech("stopped", "item_3", 6500)),
    (6100, transcribed("item_3", "Tell me a long story.")),
    (6150, response("created", "resp_2", "in_progress")),
    (6200, said("resp_2", "item_4", "Once upon a time")),
    (6250, 0.001),
    (6280, 0.15),  # this time the audio level comes first
    (6300, audio("started", "resp_2")),
    (7800, speech("started", "item_5", 8300)),  # the caller talks over the agent
    (7850, audio("cleared", "resp_2")),
    (7850, 0.0),
    (
        7860,
        event("conversation.item.truncated", item_id="item_4", content_index=0, audio_end_ms=1500),
    ),
    (
        7870,
        response(
            "done",
            "resp_2",
            "cancelled",
            status_details={"type": "cancelled", "reason": "turn_detected"},
        ),
    ),
    (8500, speech("stopped", "item_5", 9000)),
    (8600, transcribed("item_5", "Stop.")),
    (8650, response("created", "resp_3", "in_progress")),
    (
        8900,
        response(
            "done",
            "resp_3",
            "failed",
            status_details={
                "type": "failed",
                "error": {"type": "server_error", "message": "engine restarted"},
            },
        ),
    ),
]

# Runs the page's own modules: conversation.js folds the events, ui.js draws them.
FEED_CONVERSATION = """async (steps) => {
  const { Conversation } = await import(new URL("conversation.js", location.href));
  const { View } = await import(new URL("ui.js", location.href));
  const c = new Conversation();
  for (const [t, step] of steps) {
    if (typeof step === "number") c.remoteLevel(step, t);
    else c.handle(step, t);
  }
  const view = new View(document);
  view.renderTranscript(c.lines);
  view.setLatencies(c.latencies);
  view.setSpeaking(c.callerSpeaking, c.agentSpeaking);
  return { lines: c.lines, latencies: c.latencies, speaking: [c.callerSpeaking, c.agentSpeaking] };
}"""


async def test_page_draws_transcript_barge_in_and_latency_from_events(
    media_server: Served, browser: BrowserContext
) -> None:
    server_events = TypeAdapter(RealtimeServerEvent)
    for _, step in CONVERSATION:  # the script is made of real OpenAI Realtime events
        if isinstance(step, dict):
            server_events.validate_python(step)
    page = await browser.new_page()
    errors = page_errors(page)
    await page.goto(f"{media_server.url}/")
    state = await page.evaluate(FEED_CONVERSATION, CONVERSATION)

    lines = [(line["role"], line["text"], line["interrupted"]) for line in state["lines"]]
    assert lines == [
        ("caller", "What is the capital of France?", False),
        ("agent", "The capital of France is Paris.", False),
        ("caller", "Tell me a long story.", False),
        ("agent", "Once upon a time", True),
        ("bargein", "caller interrupted the agent after 1.5 s of audio", False),
        ("caller", "Stop.", False),
        ("note", "response failed: engine restarted", False),
    ]
    assert all(line["final"] for line in state["lines"])
    assert state["latencies"] == [
        {"itemId": "item_1", "ms": 350, "source": "event"},
        {"itemId": "item_3", "ms": 280, "source": "level"},
    ]
    assert state["speaking"] == [False, False]

    transcript = page.locator("#transcript li")
    await expect(transcript).to_have_count(7)
    await expect(transcript.nth(1)).to_have_text("AgentThe capital of France is Paris.")
    await expect(page.locator("#transcript li.bargein")).to_have_count(1)
    await expect(page.locator('#transcript li.agent[data-interrupted="true"]')).to_have_count(1)
    await expect(page.locator("#latency-last")).to_have_text("280 ms")
    assert errors == [], errors
