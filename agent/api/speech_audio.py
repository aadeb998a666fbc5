"""Speech as the bytes of an audio file, made while it is rendered: OpenAI's six formats.

`pcm` is raw 16-bit little-endian mono at 24 kHz and `wav` the same behind a header whose sizes
say "unknown" (0xFFFFFFFF), the streaming form readers accept, since the length is not known
when the first bytes go out. mp3, opus (in Ogg), aac (ADTS) and flac are encoded by PyAV's
FFmpeg encoders into a sink that hands on whatever the muxer has written so far.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import av
import numpy as np

from agent.calls.websocket_audio import WIRE_RATE

# Ogg holds pages back up to a second by default: 100 ms pages let audio out as it comes.
OGG_PAGE_US = "100000"


@dataclass(frozen=True)
class AudioFormat:
    """One `response_format`: its media type and, for encoded ones, PyAV's muxer and codec."""

    media_type: str
    container: str | None = None
    codec: str | None = None


FORMATS = {
    "pcm": AudioFormat("audio/pcm"),
    "wav": AudioFormat("audio/wav"),
    "mp3": AudioFormat("audio/mpeg", "mp3", "libmp3lame"),
    "opus": AudioFormat("audio/ogg", "ogg", "libopus"),
    "aac": AudioFormat("audio/aac", "adts", "aac"),
    "flac": AudioFormat("audio/flac", "flac", "flac"),
}


def wav_header(rate: int = WIRE_RATE) -> bytes:
    """A RIFF/WAVE header for mono 16-bit PCM of unknown length."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, 1, rate, rate * 2, 2, 16)
    return struct.pack("<4sI4s", b"RIFF", unknown, b"WAVE") + fmt + struct.pack(
        "<4sI", b"data", unknown)


class _Sink:
    """The file PyAV's muxer writes to: bytes collected until taken (not seekable, so muxers
    write as they go)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self._parts = b"".join(self._parts), []
        return data


class SpeechEncoder:
    """Mono int16 samples at 24 kHz in, the file's next bytes out; `finish` gives the tail."""

    def __init__(self, response_format: str) -> None:
        self.format = FORMATS[response_format]
        self._head = wav_header() if response_format == "wav" else b""  # before the first bytes
        self._sink = _Sink()
        self._container: av.container.OutputContainer | None = None
        self._stream: av.AudioStream | None = None
        if self.format.container is not None and self.format.codec is not None:
            options = {"page_duration": OGG_PAGE_US} if self.format.container == "ogg" else {}
            self._container = av.open(self._sink, "w", format=self.format.container,
                                      options=options)
            stream = self._container.add_stream(self.format.codec, rate=WIRE_RATE,
                                                layout="mono")
            assert isinstance(stream, av.AudioStream)
            self._stream = stream

    def feed(self, pcm: np.ndarray) -> bytes:
        if self._container is None:
            head, self._head = self._head, b""
            return head + pcm.astype("<i2").tobytes()
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = WIRE_RATE
        self._mux(frame)
        return self._sink.take()

    def finish(self) -> bytes:
        """The encoder's and muxer's last bytes (or the wav header of an empty file)."""
        if self._container is None:
            return self.feed(np.zeros(0, np.int16))  # the wav header, if nothing came
        self._mux(None)
        self._container.close()
        return self._sink.take()

    def _mux(self, frame: av.AudioFrame | None) -> None:
        assert self._container is not None and self._stream is not None
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
