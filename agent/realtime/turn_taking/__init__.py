"""Turn-taking: who has the floor on a call, and when it changes hands.

Each policy is a small object the session owns and tells of the caller's speech: the server
VAD's end of turn (server_vad.py), the reply started at a pause (pauses.py, preemptive.py), the
Thinker's judgement of the words at that pause (semantic_turns.py), the caller cutting the agent
off (barge_in.py) and the caller's silence after the agent (idle_timeout.py). Each takes a
narrow interface of its own (a Protocol of the few things it reads or does, or plain values and
callables), never the session: the session satisfies them, and no policy imports it (a contract
in pyproject.toml says so).
"""
