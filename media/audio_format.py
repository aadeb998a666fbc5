"""The caller's audio as media/ hands it on: 16 kHz mono int16 in 20 ms frames, the format of
inbound decoding, the VAD and its utterances; the one place these numbers are declared."""

SAMPLE_RATE = 16_000  # Hz, mono int16
FRAME_MS = 20  # one RTP packet of audio, and one webrtcvad frame
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000  # 320
SAMPLES_PER_MS = SAMPLE_RATE // 1000  # 16
