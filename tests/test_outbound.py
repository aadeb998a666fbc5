"""OutboundAudioTrack: absolute-clock pacing, queueing, flush and back-pressure, real resampling."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import av
import numpy as np
import pytest
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError

from media.opus_voice import VoiceOpusEncoder
from media.outbound import (
    FADE_MS,
    FRAME_SAMPLES,
    MAX_LAG_FRAMES,
    SAMPLE_RATE,
    OutboundAudioTrack,
)
from tests.audio_fixtures import frames_of, tone
from tests.cpu_wait import waited_s

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE


def samples_of(frames: list[av.AudioFrame]) -> np.ndarray:
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames])


async def take(track: OutboundAudioTrack, n: int) -> list[av.AudioFrame]:
    return [await track.recv() for _ in range(n)]


def peak_hz(pcm: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64) * np.hanning(len(pcm))))
    return float(np.argmax(spectrum)) * rate / len(pcm)


async def test_frames_are_paced_on_an_absolute_clock(caplog: pytest.LogCaptureFixture) -> None:
    """What the pacer promises: frame n leaves at its anchor + n * 20 ms, never earlier, with
    consecutive timestamps; the anchor moves (a warning says so) only for a frame more than
    MAX_LAG_FRAMES behind it, a stalled loop; and nothing drifts: the last frame is no later
    than its anchor says by more than this thread waited for a CPU since that anchor. A busy
    machine may stall the loop (and re-anchor it) at any point of the 10 s, so each frame is
    judged against its own anchor, not against frame 0."""
    caplog.set_level(logging.WARNING, logger="media.outbound")
    track = OutboundAudioTrack()
    await track.write(tone(440, 2.0, 24_000), 24_000)
    loop = asyncio.get_running_loop()
    asked, released, waited, pts, reanchored = [], [], [], [], []
    for _ in range(500):  # 10 s
        warnings = len(caplog.records)
        waited.append(waited_s(os.getpid()) or 0.0)
        asked.append(loop.time())
        frame = await track.recv()
        released.append(loop.time())
        pts.append(frame.pts)
        reanchored.append(len(caplog.records) > warnings)
    waited.append(waited_s(os.getpid()) or 0.0)
    assert pts == [n * FRAME_SAMPLES for n in range(500)]
    # The anchor is taken when a frame is asked for (at or after `asked`): anchor + n * 20 ms
    # below is never after frame n's true due time.
    anchor, since = asked[0], 0
    lateness = []
    for n in range(500):
        if reanchored[n]:
            behind = released[n] - (anchor + n * FRAME_S)
            assert n > 0 and behind > MAX_LAG_FRAMES * FRAME_S, (n, behind)
            anchor, since = asked[n] - n * FRAME_S, n
        lateness.append(released[n] - (anchor + n * FRAME_S))
    cpu_waited = waited[-1] - waited[since]
    print(f"pacing: {sum(reanchored)} re-anchors, max late {max(lateness) * 1000:.1f} ms, last "
          f"frame {lateness[-1] * 1000:.1f} ms late against its anchor (frame {since}), this "
          f"thread waiting for a CPU {cpu_waited * 1000:.0f} ms since")
    assert min(lateness) > -0.002  # never early
    assert lateness[-1] - cpu_waited < 0.040  # no drift
    track.stop()


async def test_a_stalled_loop_reanchors_instead_of_bursting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="media.outbound")
    track = OutboundAudioTrack()
    await take(track, 3)
    time.sleep(0.3)  # the event loop stalls for 15 frame periods
    loop = asyncio.get_running_loop()
    began = loop.time()
    frames = await take(track, 10)
    # Without re-anchoring, the 15 overdue frames would come back at once.
    assert loop.time() - began >= 0.15
    assert [f.pts for f in frames] == [n * FRAME_SAMPLES for n in range(3, 13)]
    assert [r.message for r in caplog.records if "re-anchoring" in r.message], caplog.records
    track.stop()


async def test_frames_have_the_wire_format_and_encode_with_opus() -> None:
    track = OutboundAudioTrack()
    await track.write(tone(440, 0.1, SAMPLE_RATE), SAMPLE_RATE)
    encoder = OpusEncoder()
    for frame in await take(track, 3):
        assert frame.samples == FRAME_SAMPLES
        assert frame.sample_rate == SAMPLE_RATE
        assert frame.format.name == "s16" and frame.layout.name == "mono"
        assert frame.time_base.numerator == 1 and frame.time_base.denominator == SAMPLE_RATE
        payloads, _ = encoder.encode(frame)
        assert payloads and len(payloads[0]) > 10
    track.stop()


async def test_flush_fades_out_in_the_next_frame_then_silence_and_keeps_pts_running() -> None:
    changes: list[bool] = []
    track = OutboundAudioTrack(on_playing_changed=changes.append)
    sent = tone(440, 1.0, SAMPLE_RATE)
    await track.write(sent, SAMPLE_RATE)
    before = await take(track, 5)
    assert all(np.abs(f.to_ndarray()).max() > 1000 for f in before)
    assert track.playing and changes == [True]

    assert track.flush() == 1000 - 5 * 20
    assert track.queued_ms == 0
    assert not track.playing and changes == [True, False]
    after = await take(track, 5)
    # The frame after the cut: the tone's next FADE_MS, going to silence, then nothing more.
    fade = SAMPLE_RATE * FADE_MS // 1000
    faded = after[0].to_ndarray().reshape(-1)
    following = sent[5 * FRAME_SAMPLES:5 * FRAME_SAMPLES + fade].astype(np.int32)
    assert faded[0] == following[0] and not faded[fade:].any()
    assert np.all(np.abs(faded[:fade].astype(np.int32)) <= np.abs(following))
    assert np.abs(faded[fade - 10:fade]).max() < 0.01 * np.abs(following).max()
    assert all(not f.to_ndarray().any() for f in after[1:])
    assert [f.pts for f in before + after] == [n * FRAME_SAMPLES for n in range(10)]
    assert track.played_ms == 100 and changes == [True, False]  # the fade is no agent audio
    track.stop()


def heard_after(frames: list[av.AudioFrame], cut_frame: int) -> float:
    """Through the voice's Opus encoder and aiortc's decoder (a caller's): how long after the
    start of frame `cut_frame` a sample is still above -50 dBFS, in ms."""
    encoder, decoder, heard = VoiceOpusEncoder(), OpusDecoder(), []
    for frame in frames:
        payloads, timestamp = encoder.encode(frame)
        for payload in payloads:
            for decoded in decoder.decode(JitterFrame(data=payload, timestamp=timestamp)):
                heard.append(decoded.to_ndarray().reshape(-1, 2)[:, 0])  # stereo s16
    loud = np.nonzero(np.abs(np.concatenate(heard)[cut_frame * FRAME_SAMPLES:]) > 100)[0]
    return float(loud[-1]) * 1000 / SAMPLE_RATE if len(loud) else 0.0


async def test_a_cut_low_voice_falls_silent_at_the_caller_within_the_fade() -> None:
    """A 100 Hz tone cut by flush() is below -50 dBFS at the caller's decoder once the fade's
    frame is over (20 ms and the codec's 2.5 ms: after the 5 ms fade, only the frame's coding
    noise, near -45 dBFS, is left); the same tone stepped to silence rings on through Opus
    three times as long."""
    sent = tone(100, 1.0, SAMPLE_RATE)
    track = OutboundAudioTrack()
    await track.write(sent, SAMPLE_RATE)
    frames = await take(track, 15)
    track.flush()
    frames += await take(track, 10)
    track.stop()
    stepped = frames[:15] + frames_of(np.zeros(10 * FRAME_SAMPLES, np.int16), first=15)
    faded_ms, stepped_ms = heard_after(frames, 15), heard_after(stepped, 15)
    print(f"\n[outbound] 100 Hz cut: heard {faded_ms:.1f} ms after it faded, "
          f"{stepped_ms:.1f} ms stepped")
    assert faded_ms < 23.0 and stepped_ms > 3 * faded_ms


async def test_played_ms_counts_only_agent_audio() -> None:
    changes: list[bool] = []
    track = OutboundAudioTrack(on_playing_changed=changes.append)
    assert not samples_of(await take(track, 3)).any()
    assert track.played_ms == 0 and not track.playing

    audio = tone(300, 0.110, SAMPLE_RATE)  # five and a half frames
    await track.write(audio, SAMPLE_RATE)
    assert track.queued_ms == 110
    out = samples_of(await take(track, 8))
    np.testing.assert_array_equal(out[: len(audio)], audio)
    assert not out[len(audio):].any()  # the rest of the sixth frame is silence
    assert track.played_ms == 110 and track.queued_ms == 0
    assert changes == [True, False] and not track.playing

    await take(track, 3)
    assert track.played_ms == 110
    track.stop()


async def test_write_blocks_while_the_queue_is_full_and_resumes_with_playback() -> None:
    track = OutboundAudioTrack(max_queue_ms=200)
    audio = tone(440, 1.0, SAMPLE_RATE)
    writer = asyncio.create_task(track.write(audio, SAMPLE_RATE))
    await asyncio.sleep(0.05)
    assert not writer.done()
    assert track.queued_ms == 200

    frames = []
    while not writer.done():
        frames.append(await track.recv())
        assert track.queued_ms <= 200
        await asyncio.sleep(0.005)  # let a woken writer run before checking it again
    await writer
    # The writer finished once the last 200 ms fitted; playback then drains the rest.
    assert len(frames) == (1000 - 200) // 20
    frames += await take(track, 10)
    np.testing.assert_array_equal(samples_of(frames), audio)
    assert track.played_ms == 1000
    track.stop()


async def test_flush_wakes_a_blocked_writer_and_drops_its_rest() -> None:
    track = OutboundAudioTrack(max_queue_ms=200)
    writer = asyncio.create_task(track.write(tone(440, 1.0, 16_000), 16_000))
    await asyncio.sleep(0.05)
    assert not writer.done()
    assert 180 <= track.flush() <= 200
    await asyncio.wait_for(writer, 1.0)
    assert track.queued_ms == 0
    assert not samples_of(await take(track, 2)).any()
    track.stop()


@pytest.mark.parametrize("rate, dtype", [
    (8_000, np.int16), (16_000, np.int16), (22_050, np.int16), (24_000, np.int16),
    (48_000, np.int16), (24_000, np.float32), (22_050, np.float32),
])
async def test_any_rate_input_plays_for_the_right_duration(rate: int, dtype: type) -> None:
    source = tone(440, 0.3, rate)
    pcm = source if dtype is np.int16 else source.astype(np.float32) / 32767
    track = OutboundAudioTrack()
    await track.write(pcm, rate)
    # The resampler keeps a filter tail of a few samples until the next write.
    assert 297 <= track.queued_ms <= 300
    out = samples_of(await take(track, 15))
    assert 297 <= track.played_ms <= 300
    assert abs(peak_hz(out[:14400], SAMPLE_RATE) - 440) < 10
    assert abs(np.abs(out).max() - np.abs(source).max()) < 0.05 * 32767
    track.stop()


async def test_stop_ends_recv_and_writes() -> None:
    track = OutboundAudioTrack(max_queue_ms=100)
    blocked = asyncio.create_task(track.write(tone(440, 1.0, SAMPLE_RATE), SAMPLE_RATE))
    await asyncio.sleep(0.02)
    track.stop()
    assert track.readyState == "ended"
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(blocked, 1.0)
    with pytest.raises(MediaStreamError):
        await track.recv()
    with pytest.raises(MediaStreamError):
        await track.write(tone(440, 0.1, SAMPLE_RATE), SAMPLE_RATE)


async def test_bad_input_is_rejected() -> None:
    track = OutboundAudioTrack()
    with pytest.raises(ValueError):
        await track.write(np.zeros((2, 100), dtype=np.int16), 16_000)
    with pytest.raises(ValueError):
        await track.write(np.zeros(100, dtype=np.int32), 16_000)
    with pytest.raises(ValueError):
        await track.write(np.zeros(100, dtype=np.int16), 0)
    assert track.queued_ms == 0
    track.stop()

