"""WebRTC and audio of a call: SDP checks, peer setup, inbound decoding and VAD, paced outbound."""
