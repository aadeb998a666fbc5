"""An uploaded audio file (any container and codec FFmpeg reads) as the caller's audio format.

Decoded and resampled by PyAV to 16 kHz mono int16, the format the VAD and the Thinkers take,
at most `max_seconds` of it: a longer file is refused rather than cut.
"""

from __future__ import annotations

import io
import itertools

import av
import numpy as np

from media.audio_format import SAMPLE_RATE


class AudioFileError(ValueError):
    """The file is not audio FFmpeg can decode, or is too long; the message says which."""


def decode_audio_file(data: bytes, max_seconds: float) -> np.ndarray:
    """The file's first audio stream as 16 kHz mono int16."""
    limit = int(max_seconds * SAMPLE_RATE)
    pieces: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(data), "r") as container:
            if not container.streams.audio:
                raise AudioFileError("the file has no audio stream")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            for frame in itertools.chain(container.decode(audio=0), [None]):  # None: the tail
                pieces += [out.to_ndarray().reshape(-1) for out in resampler.resample(frame)]
                if sum(map(len, pieces)) > limit:  # stop decoding a file too long at once
                    raise AudioFileError(f"the audio is longer than {max_seconds:g} s")
    except av.FFmpegError as exc:
        raise AudioFileError(f"the file could not be decoded as audio: {exc}") from None
    if not pieces or not sum(map(len, pieces)):
        raise AudioFileError("the file holds no audio samples")
    return np.concatenate(pieces)
