"""`omnivox sip`: a SIP bridge, a separate process that answers SIP calls (G.711 over RTP) and
bridges each to an omnivox server as a WebRTC call with a G.711-only offer.

One concept per module: settings (what the bridge runs with), phone_track (the phone's audio
as a paced WebRTC track), phone_leg (the call's RTP with the phone), server_leg (the call's
WebRTC leg to the server), bridged_call (the two legs of one call, ended together), listener
(SIP transports and dialogs), command (the command line).
"""
