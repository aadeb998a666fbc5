"""Where a turn's time to first audio went, from the server's own stamps of it.

At the end of each call the caller reads the call's record (`GET /v1/calls/{id}`,
agent/ops/records.py): for each reply, when the server started it (wall clock), when its first
audio was queued and its first frame handed to the sender, and the pipeline's marks (the
caller's words recognised, the Thinker's first token, the Talker's first speech tokens, the
VoiceBox's first chunk). Against the caller's end of speech (its media timeline turned into
wall-clock time: caller and server share the machine's clock on a loopback bench) these split
the caller's time to first audio into

- the end of the turn: speech end -> the server starts the reply (the end-of-turn silence, or
  the semantic judgement at a pause, plus the VAD's frame and the inbound path);
- the pipeline: its marks, counted from the pipeline turn's start. Without preemptive replies
  that is the reply's start; a preemptive turn (semantic_vad, or vad.pause_ms) began earlier,
  at the caller's pause, so its marks may fall before the reply's start;
- the session: the first audio queued for the caller, its first frame handed to the sender;
- the way out: that frame to the first loud sample the caller received (pacing, the network,
  any quiet lead-in of the voice).

Beside the times, where a reply ran dry: its underruns (the server's outbound queue empty
mid-reply), each stage's longest wait between two outputs, and the lowest the rendered audio's
lead over playback fell.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import httpx

from agent.ops.metrics import STAGE_MARKS

log = logging.getLogger(__name__)

# Breakdown figure (asr_ms, thinker_first_token_ms, talker_first_tokens_ms,
# voicebox_first_chunk_ms) -> the pipeline's mark for it in the turn's usage (s after it began)
PIPELINE_MARKS = {f"{stage}_ms": mark for stage, mark in STAGE_MARKS.items()}
FIGURES = ("turn_began_ms", *PIPELINE_MARKS, "first_audio_queued_ms", "first_frame_sent_ms")
Said = tuple[int, str | None, float | None]  # (turn, response id, caller's speech end, unix s)


class RecordedCall(Protocol):
    async def call_record(self, timeout_s: float = 10.0) -> dict[str, Any]: ...


def breakdown(server_turn: dict[str, Any], speech_end_unix: float) -> dict[str, Any]:
    """One turn's figures in ms (module doc) from its row in the call's record."""
    began = (server_turn["started_at"] - speech_end_unix) * 1e3
    usage = server_turn.get("usage") or {}

    def after_began(ms: float | None) -> float | None:
        return None if ms is None else began + ms

    figures: dict[str, Any] = {"turn_began_ms": began}
    for figure, mark in PIPELINE_MARKS.items():
        seconds = usage.get(mark)
        figures[figure] = None if seconds is None else seconds * 1e3
    figures["first_audio_queued_ms"] = after_began(server_turn.get("first_audio_ms"))
    figures["first_frame_sent_ms"] = after_began(server_turn.get("first_frame_ms"))
    # Not a time: how often the server's outbound queue ran dry while the reply was generating.
    # A gap the caller heard with none here came after the queue (pacing, network, caller).
    figures["underruns"] = server_turn.get("underruns")
    # Which stage held it: each stage's longest wait between two of its outputs (a stall shows
    # in its stage and every stage after it), and how far ahead of playback the audio stayed.
    waits = usage.get("longest_wait_s") or {}
    figures["longest_wait_ms"] = {stage: round(s * 1e3, 1) for stage, s in waits.items()}
    ahead = usage.get("lowest_ahead_s")
    figures["lowest_ahead_ms"] = None if ahead is None else round(ahead * 1e3, 1)
    return figures


async def turn_stamps(caller: RecordedCall, said: list[Said]) -> list[dict[str, Any]]:
    """The breakdown of each turn said whose reply the server recorded ({"turn": n, figures});
    none when the record cannot be read (the figures are extra, never a failed call)."""
    try:
        record = await caller.call_record()
    except (httpx.HTTPError, ValueError) as exc:
        log.warning("bench calls: no turn stamps: %s", exc)
        return []
    by_response = {t["response_id"]: t for t in record.get("turns", [])}
    out = []
    for turn, response_id, speech_end in said:
        server_turn = by_response.get(response_id)
        if server_turn is not None and speech_end is not None:
            out.append({"turn": turn, **breakdown(server_turn, speech_end)})
    return out
