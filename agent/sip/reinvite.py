"""re-INVITEs on a bridged call: session refreshes, hold and resume, a moved RTP address.

The codec stays the one the call was set up with (the server's leg was negotiated for it): a
re-INVITE that no longer offers it is refused with 488 and the call goes on as it was. Hold
(the phone offering `sendonly` or `inactive`, or the old-style `c=0.0.0.0`) stops the audio
sent to the phone; the server's call goes on, hearing silence, until the phone resumes.
"""

from __future__ import annotations

import logging

from aiosipua import IncomingCall, SdpMessage, SdpNegotiationError, negotiate_sdp

from agent.sip.phone_leg import DTMF_PAYLOAD_TYPE, PhoneLeg

log = logging.getLogger(__name__)

_TAKES_AUDIO = ("sendrecv", "recvonly")  # offer directions in which the phone receives


def answer_reinvite(sip: IncomingCall, phone: PhoneLeg, announced_ip: str) -> None:
    """Answer the re-INVITE `sip.invite` now (200 with our SDP, or 488)."""
    if not sip.invite.body:  # no offer: ours goes in the 200, the phone answers in the ACK
        sip.accept(phone.answer)
        return
    offer = sip.sdp_offer
    try:
        answer = renegotiate(offer, phone, announced_ip)
    except SdpNegotiationError as exc:
        log.info("call %s: re-INVITE refused (%s)", sip.call_id, exc)
        refusal = sip.dialog.create_response(sip.invite, 488, "Not Acceptable Here")
        if sip.transport is not None:
            sip.transport.send_reply(refusal)
        return
    assert offer is not None and offer.audio is not None and offer.rtp_address is not None
    held = offer.audio.direction not in _TAKES_AUDIO or offer.rtp_address[0] in ("0.0.0.0", "::")
    phone.renegotiated(answer, offer.rtp_address, sending=not held)
    log.info("call %s: re-INVITE answered (%s)", sip.call_id, "on hold" if held else "active")
    sip.accept(answer)


def renegotiate(offer: SdpMessage | None, phone: PhoneLeg, announced_ip: str) -> SdpMessage:
    """Our answer to a new offer on the same RTP port, in the call's codec, its version one
    above our last answer's (RFC 3264 8)."""
    if offer is None or offer.audio is None or offer.rtp_address is None:
        raise SdpNegotiationError("the re-INVITE's SDP has no audio stream with an address")
    previous = phone.answer.origin
    answer, _ = negotiate_sdp(
        offer, local_ip=announced_ip, rtp_port=phone.port,
        supported_codecs=[phone.payload_type], dtmf_payload_type=DTMF_PAYLOAD_TYPE,
        session_id=previous.session_id)
    answer.origin.session_version = str(int(previous.session_version) + 1)
    return answer
