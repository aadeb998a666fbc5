"""SDP offers from callers: checked before any peer connection is built for them."""

from __future__ import annotations

import re

from aiortc.sdp import SessionDescription

# Codecs the call accepts for the caller's audio, in the order we prefer them.
AUDIO_CODECS = ("opus", "PCMU", "PCMA")
_MDNS_CANDIDATE = re.compile(r"^a=candidate:\S+ \d+ \S+ \d+ \S+\.local \d+ .*$", re.IGNORECASE)


class SdpError(ValueError):
    """An offer we cannot answer; the message says why in words a caller can act on."""


def check_offer(sdp: str) -> None:
    """Parse an offer and refuse what cannot become an audio call (SdpError says why)."""
    if not sdp.lstrip().startswith("v=0"):
        raise SdpError("not an SDP offer: it must start with 'v=0'")
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc's parser raises whatever the bad line provokes
        raise SdpError(f"malformed SDP: {exc or type(exc).__name__}") from None
    audio = [m for m in parsed.media if m.kind == "audio"]
    if not audio:
        raise SdpError("the offer has no audio m-line")
    if not any(c.name in AUDIO_CODECS for m in audio for c in m.rtp.codecs):
        raise SdpError(f"no supported audio codec offered (want one of {', '.join(AUDIO_CODECS)})")
    for m in parsed.media:
        ice, dtls = m.ice, m.dtls
        if ice is None or not ice.usernameFragment or not ice.password:
            raise SdpError(f"m-line '{m.kind}' has no ICE credentials (a=ice-ufrag/a=ice-pwd)")
        if dtls is None or not dtls.fingerprints:
            raise SdpError(f"m-line '{m.kind}' has no DTLS fingerprint")


def without_mdns_candidates(sdp: str) -> str:
    """Drop `.local` host candidates.

    Resolving them means multicast DNS queries on the LAN and a slower answer; the browser's
    own connectivity checks reach us anyway and become peer-reflexive candidates.
    """
    lines = sdp.splitlines()
    kept = [line for line in lines if not _MDNS_CANDIDATE.match(line)]
    return "\r\n".join(kept) + "\r\n"
