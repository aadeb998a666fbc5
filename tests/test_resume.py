"""Resuming a dropped call (agent/calls/resume.py) with real aiortc callers: a caller whose
connection goes away comes back with the token from its `session.created` and keeps its
conversation (history and session settings); a caller who comes back while the server still
holds the dropped call takes it over; past the grace, with a used or a wrong token, the new call
is refused (410) and the parked conversation is gone.

No engines: the calls run the product's conversation session with no pipeline behind it (the
history is made with `conversation.item.create`, which needs no reply)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest

from agent.app import create_app
from agent.calls.registry import CallRegistry
from agent.calls.resume import ResumeError, ResumeStore
from agent.config import ConversationSettings, Settings
from agent.realtime.history import Conversation
from agent.realtime.session import Session
from agent.realtime.session_config import SavedConversation, SessionConfig
from media.vad import VadConfig
from tests.product_calls import (
    session_of,
    turn_detection,
    type_text,
    update_session,
    wait_until,
)
from tests.rtc_client import ArrayAudioTrack, RtcCaller, dead_peer_offer
from tests.served import Served, serve

GRACE_S = 3.0
HEADER = "Omnivox-Resume-Token"
INSTRUCTIONS = "Answer as a kiosk at the museum's door."


@pytest.fixture(scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"), max_calls=4,
                        resume_grace_s=GRACE_S)
    app = create_app(settings, handler_factory=lambda call: Session(call, None, call.conversation))
    async with serve(app) as served:
        yield served


async def call(served: Served, token: str | None = None) -> RtcCaller:
    """A connected caller with its session.created (resuming `token` when given)."""
    caller = RtcCaller(served.url, ArrayAudioTrack(np.zeros(0, np.int16)))
    await caller.connect({HEADER: token} if token else None)
    await caller.wait_for("session.created")
    return caller


async def talked(served: Served) -> tuple[RtcCaller, str, list[str]]:
    """A caller who changed its instructions and said two things: the caller, its resume
    token and the ids of its history's items."""
    caller = await call(served)
    token = caller.of_type("session.created")[0]["resume"]["token"]
    # No replies (no pipeline here): the user's items are only added.
    update_session(caller, instructions=INSTRUCTIONS, audio=turn_detection(create_response=False))
    await caller.wait_for("session.updated")
    type_text(caller, "Where is the cloakroom?")
    type_text(caller, "And the cafe?")
    await caller.wait_for("conversation.item.added", count=2)
    items = [i.item_id for i in session_of(served, caller).conversation.items]
    assert len(items) == 2
    return caller, token, items


def registry(served: Served) -> CallRegistry:
    return served.app.state.calls


async def offer_with(served: Served, token: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.url) as http:
        return await http.post("/v1/realtime/calls", content=await dead_peer_offer(),
                               headers={"Content-Type": "application/sdp", HEADER: token})


async def test_a_dropped_caller_resumes_its_conversation(server: Served) -> None:
    caller, token, items = await talked(server)
    await caller.close()  # the connection goes away; no hang-up
    await wait_until(lambda: len(registry(server)) == 0 and len(registry(server).resumes) == 1,
                     10, "the dropped call parked")

    back = await call(server, token)
    try:
        created = back.of_type("session.created")[0]
        assert created["session"]["instructions"] == INSTRUCTIONS
        assert created["session"]["audio"]["input"]["turn_detection"]["create_response"] is False
        assert created["resume"]["token"] != token  # a new token for the new call
        session = session_of(server, back)
        assert [i.item_id for i in session.conversation.items] == items
        assert session.conversation.messages()[0] == {"role": "system",
                                                      "content": INSTRUCTIONS}
        type_text(back, "Thanks!")
        await back.wait_for("conversation.item.added")
        assert len(session.conversation.items) == 3
        assert len(registry(server).resumes) == 0
        # The token was used: it resumes nothing again.
        refused = await offer_with(server, token)
        assert refused.status_code == 410, refused.text
        assert refused.json()["error"]["code"] == "resume_expired"
    finally:
        await back.hang_up()


async def test_a_caller_back_before_the_drop_is_noticed_takes_the_call_over(
        server: Served) -> None:
    old, token, items = await talked(server)
    back = await call(server, token)
    try:
        await wait_until(lambda: registry(server).get(old.location.rsplit("/", 1)[1]) is None,
                         10, "the old call closed")
        assert len(registry(server)) == 1
        assert [i.item_id for i in session_of(server, back).conversation.items] == items
    finally:
        await back.hang_up()
        await old.close()


async def test_past_the_grace_or_with_a_wrong_token_the_call_is_refused(server: Served) -> None:
    caller, token, _ = await talked(server)
    await caller.close()
    await wait_until(lambda: len(registry(server).resumes) == 1, 10, "the dropped call parked")
    # The parked conversation is freed at the end of the grace, without any request.
    await wait_until(lambda: len(registry(server).resumes) == 0, GRACE_S + 10, "it freed")
    for wrong in (token, "rt_not-a-token"):
        refused = await offer_with(server, wrong)
        assert refused.status_code == 410, refused.text
        assert "grace" in refused.json()["error"]["message"]
    assert len(registry(server)) == 0


async def test_a_hung_up_call_is_not_kept(server: Served) -> None:
    caller, token, _ = await talked(server)
    await caller.hang_up()
    await wait_until(lambda: len(registry(server)) == 0, 10, "the call ended")
    assert len(registry(server).resumes) == 0
    assert (await offer_with(server, token)).status_code == 410


async def test_at_most_the_limit_is_parked_the_oldest_freed_first() -> None:
    store = ResumeStore(grace_s=60, limit=2)
    tokens = [store.issue(f"rtc_{n}") or "" for n in range(3)]
    assert all(tokens)
    for token in tokens:
        store.ended(token, "connection_failed", SavedConversation(
            Conversation("", 4), SessionConfig(ConversationSettings(), VadConfig())))
    assert len(store) == 2
    with pytest.raises(ResumeError):
        store.take(tokens[0])
    assert store.take(tokens[2]) is not None
    assert ResumeStore(grace_s=0, limit=2).issue("rtc_x") is None  # off: no token at all
