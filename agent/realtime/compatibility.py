"""Which parts of OpenAI's GA Realtime protocol omnivox serves: every client event, server event
and session field, served, refused (and why) or not applicable. The one place the table in
docs/realtime-compatibility.md is generated from (`python -m agent.realtime.compatibility`);
tests check it against the `openai` package's types (an SDK release that adds an event or a
field fails a test until it is placed here) and against the handlers that serve it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Literal

Status = Literal["served", "refused", "not applicable"]


@dataclass(frozen=True)
class Support:
    """How omnivox takes one part of the protocol, and what a client should know of it."""

    status: Status
    note: str = ""


def served(note: str = "") -> Support:
    return Support("served", note)


def refused(why: str) -> Support:
    return Support("refused", why)


def not_applicable(why: str) -> Support:
    return Support("not applicable", why)


CLIENT_EVENTS: dict[str, Support] = {
    "session.update": served("applied whole or not at all; OpenAI's model, voice and "
                             "transcription names taken as aliases"),
    "input_audio_buffer.append": served("WebSocket calls; a WebRTC call's audio is its track"),
    "input_audio_buffer.commit": served("with turn_detection null (the server VAD commits)"),
    "input_audio_buffer.clear": served(),
    "output_audio_buffer.clear": served("stops the agent's audio at once (barge-in)"),
    "conversation.item.create": served("user text messages and function_call_output items; "
                                       "no item starts a response by itself"),
    "conversation.item.retrieve": served(),
    "conversation.item.delete": served("not the item of the response under way"),
    "conversation.item.truncate": served("the item keeps the words heard before audio_end_ms"),
    "response.create": served("output_modalities, tools and tool_choice for that response"),
    "response.cancel": served(),
}

SERVER_EVENTS: dict[str, Support] = {
    "error": served(),
    "session.created": served(),
    "session.updated": served("with the names resolved"),
    "conversation.created": not_applicable("one conversation per call, made with it"),
    "conversation.item.added": served(),
    "conversation.item.done": served("a reply's once it ended, the caller's utterance once "
                                     "committed (its transcript follows on its own)"),
    "conversation.item.created": not_applicable("the beta name of conversation.item.added"),
    "conversation.item.retrieved": served(),
    "conversation.item.deleted": served(),
    "conversation.item.truncated": served(),
    "conversation.item.input_audio_transcription.completed": served(
        "families that recognise speech; the transcript the Thinker answered"),
    "conversation.item.input_audio_transcription.delta": served(
        "the recogniser hears an utterance whole: one delta, then completed"),
    "conversation.item.input_audio_transcription.segment": not_applicable("diarization"),
    "conversation.item.input_audio_transcription.failed": served(
        "transcription sessions; in a conversation a failed recognition fails the response"),
    "input_audio_buffer.committed": served(),
    "input_audio_buffer.cleared": served(),
    "input_audio_buffer.speech_started": served(),
    "input_audio_buffer.speech_stopped": served(),
    "input_audio_buffer.timeout_triggered": served(
        "server_vad's idle_timeout_ms passed in silence; a reply follows"),
    "input_audio_buffer.dtmf_event_received": served("keys pressed on a SIP or WebRTC call"),
    "output_audio_buffer.started": served(),
    "output_audio_buffer.stopped": served(),
    "output_audio_buffer.cleared": served(),
    "response.created": served(),
    "response.done": served("completed, cancelled, failed or incomplete, with usage"),
    "response.output_item.added": served(),
    "response.output_item.done": served(),
    "response.content_part.added": refused("not yet: parts are told by the item events"),
    "response.content_part.done": refused("not yet: parts are told by the item events"),
    "response.output_audio.delta": served("WebSocket calls; a WebRTC call hears its track"),
    "response.output_audio.done": served(),
    "response.output_audio_transcript.delta": served(),
    "response.output_audio_transcript.done": served(),
    "response.output_text.delta": served("text-only replies"),
    "response.output_text.done": served("text-only replies"),
    "response.function_call_arguments.delta": served("one delta: arguments are whole JSON"),
    "response.function_call_arguments.done": served(),
    "rate_limits.updated": not_applicable("no token quotas on a self-hosted server"),
    "mcp_list_tools.in_progress": not_applicable("MCP tools are refused"),
    "mcp_list_tools.completed": not_applicable("MCP tools are refused"),
    "mcp_list_tools.failed": not_applicable("MCP tools are refused"),
    "response.mcp_call.in_progress": not_applicable("MCP tools are refused"),
    "response.mcp_call.completed": not_applicable("MCP tools are refused"),
    "response.mcp_call.failed": not_applicable("MCP tools are refused"),
    "response.mcp_call_arguments.delta": not_applicable("MCP tools are refused"),
    "response.mcp_call_arguments.done": not_applicable("MCP tools are refused"),
}

SESSION_FIELDS: dict[str, Support] = {
    "type": served("realtime, or transcription (families that write speech down: the "
                   "caller's utterances transcribed, nothing answered)"),
    "model": served("a served name or version pins it; OpenAI's names mean the call's own"),
    "instructions": served(),
    "output_modalities": served("audio (with its transcript) or text"),
    "max_output_tokens": served("1..4096 or inf"),
    "tools": served("function tools; MCP tools refused"),
    "tool_choice": served("auto, none, required or one function"),
    "parallel_tool_calls": not_applicable("the Thinker makes one call a response"),
    "truncation": served("auto: the oldest turns give way, in steps of an eighth of the "
                         "Thinker's context window, before a turn would not fit; "
                         "retention_ratio: down to that share of the room; disabled: an "
                         "over-long turn fails; token_limits refused (the window is the "
                         "limit); max_history_items bounds the history in any case"),
    "audio.input.format": served("audio/pcm at 24 kHz; G.711 (audio/pcmu, audio/pcma, 8 kHz) "
                                 "on WebSocket calls; refused on WebRTC (Opus media)"),
    "audio.input.transcription": served("always on: the model's own recogniser; OpenAI's "
                                        "transcription names are aliases"),
    "audio.input.turn_detection": served("server_vad (idle_timeout_ms included), semantic_vad "
                                         "or null"),
    "audio.input.noise_reduction": served("RNNoise, before the VAD and the model; near_field "
                                          "and far_field alike (RNNoise has one model); "
                                          "strength 1 only"),
    "audio.output.format": served("audio/pcm at 24 kHz; G.711 (audio/pcmu, audio/pcma, 8 kHz) "
                                  "on WebSocket calls; refused on WebRTC (Opus media)"),
    "audio.output.voice": served("the family's voices; OpenAI's ten are aliases"),
    "audio.output.speed": refused("the voices speak at 1.0 only"),
    "include": refused("transcription logprobs are not returned"),
    "prompt": refused("stored prompts live on OpenAI's platform; send instructions"),
    "reasoning": refused("the Thinker does not reason apart from its answer"),
    "tracing": not_applicable("accepted and unused: traces stay in the server's logs"),
}

SECTIONS = (("Client events", CLIENT_EVENTS), ("Server events", SERVER_EVENTS),
            ("Session fields", SESSION_FIELDS))


def markdown() -> str:
    """docs/realtime-compatibility.md: one table per section."""
    lines = ["# OpenAI Realtime (GA) compatibility", "",
             "Generated by `python -m agent.realtime.compatibility` from",
             "`agent/realtime/compatibility.py`; a test checks it against the `openai` package.",
             "A refused event or field gets an `error` event saying why; an event the server",
             "does not send is marked so.", ""]
    for title, table in SECTIONS:
        lines += [f"## {title}", "", "| name | status | notes |", "|---|---|---|"]
        lines += [f"| `{name}` | {s.status} | {s.note} |" for name, s in sorted(table.items())]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(markdown())
