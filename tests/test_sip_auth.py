"""`omnivox sip --auth USER:PASSWORD`: digest auth on INVITEs, checked with SIPp as the phone
(tests/sipp/digest_auth.xml, digest_refused.xml) against the shared media-only server (the
signalling is what is checked: no engines needed). A phone without credentials is answered 401
with a challenge; with the right password its retry is bridged; with a wrong one the retry is
challenged again and the server is never called."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.product_calls import wait_until
from tests.served import Served
from tests.sip_phone import recording_rtp, running_bridge, sipp_call, sipp_result


@pytest.fixture(scope="module")
async def guarded_bridge(media_server: Served) -> AsyncIterator[str]:
    async with running_bridge(media_server.url, "--auth", "alice:s3cret") as bridge:
        yield bridge


@pytest.mark.parametrize("password", ["s3cret", "wrong"])
async def test_a_phone_must_answer_the_digest_challenge(
    media_server: Served, guarded_bridge: str, tmp_path: Path, password: str
) -> None:
    calls = media_server.app.state.calls
    bridged: list[str] = []
    async with (recording_rtp() as (sink, _),
                sipp_call("digest_auth.xml" if password == "s3cret" else "digest_refused.xml",
                          guarded_bridge, tmp_path, sink, "-d", "500",
                          "-au", "alice", "-ap", password) as sipp):
        if password == "s3cret":
            await wait_until(lambda: bool(list(calls)), 30, "the bridged call")
            bridged = [call.id for call in calls]
        rc, out = await sipp_result(sipp, 60)
    # Each scenario fails on any answer but the expected one: the first INVITE 401 with a
    # challenge; the retry 200 then the BYE answered, or with the wrong password 401 again.
    assert rc == 0, out
    if password == "s3cret":
        assert bridged
        await wait_until(lambda: not list(calls), 15, "the server's call to end")
    else:
        assert not list(calls)  # the server was never called
