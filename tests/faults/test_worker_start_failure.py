"""A stage that cannot start again (on the package's fault server, tests/faults/conftest.py)
is marked failed, which /readyz, new callers (503) and live calls (an `error` event) are all
told. The stage stays failed for good, so this module runs last of the package: its name sorts
last (pytest runs a package's modules in name order)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import httpx
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from pipeline.settings import STAGE_ORDER
from tests.faults.fault_server import RESTART, FaultServer, connected
from tests.product_calls import assert_valid_events, connect, say, wait_until

pytestmark = [pytest.mark.engines, pytest.mark.asyncio(loop_scope="session")]


async def offer_sdp() -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        return pc.localDescription.sdp
    finally:
        await pc.close()


async def test_stage_that_cannot_start_is_marked_failed_and_everyone_is_told(
    fault_server: FaultServer,
) -> None:
    """The voicebox's model goes missing, then its worker dies: each restart fails at start,
    and after max_attempts the stage is failed. Runs last: the stage stays failed."""
    served, pipeline, stage = fault_server.served, fault_server.pipeline, "voicebox"
    caller = await connect(served.url)
    part = fault_server.models_dir / "tiny" / stage
    moved = part.with_name(f"{stage}.moved")
    try:
        before = pipeline.health().stages[stage]
        part.rename(moved)  # a bad model path from the next start on
        killed = time.monotonic()
        os.kill(before.pid, signal.SIGKILL)
        await wait_until(lambda: pipeline.health().stages[stage].state == "failed", 120,
                         f"the {stage} to be marked failed")
        failed_after = time.monotonic() - killed

        # /readyz names the stage and why; it was retried (max_attempts=2) before giving up.
        async with httpx.AsyncClient(base_url=served.url) as http:
            readyz = await http.get("/readyz")
        body = readyz.json()
        assert readyz.status_code == 503 and body["status"] == "not_ready", body
        failed = body["stages"][stage]
        assert failed["state"] == "failed", body
        assert "FileNotFoundError" in failed["reason"], failed
        assert str(fault_server.models_dir) in failed["reason"], failed
        assert "2 failed starts in a row" in failed["reason"], failed
        assert failed["restarts"] == before.restarts + 2, failed
        assert all(body["stages"][s]["state"] == "ready" for s in STAGE_ORDER if s != stage)
        assert stage in body["detail"] and "failed" in body["detail"], body

        # The live call is told at once, and stays up.
        error = await caller.wait_for("error", timeout=10)
        assert error["error"]["code"] == "stage_failed", error
        assert stage in error["error"]["message"], error
        assert connected(served, caller)

        # A new caller is refused: 503 with a JSON error naming the stage (no Retry-After:
        # it will not come back by itself).
        async with httpx.AsyncClient(base_url=served.url) as http:
            refused = await http.post("/v1/realtime/calls", content=await offer_sdp(),
                                      headers={"Content-Type": "application/sdp"})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "stage_failed", refused.text
        assert stage in refused.json()["error"]["message"], refused.text
        assert "retry-after" not in refused.headers

        # The live call's next turn fails, saying why.
        say(caller, "Hello?")
        done = await caller.wait_for("response.done", timeout=30)
        assert done["response"]["status"] == "failed", done
        assert f"stage {stage}" in caller.of_type("error")[-1]["error"]["message"]
        assert connected(served, caller)
        assert_valid_events(caller)
        print(f"\n{stage} failing at start: marked failed {failed_after:.1f} s after the kill "
              f"({RESTART['max_attempts']} attempts, back-off {RESTART['backoff_s']} s)")
    finally:
        with contextlib.suppress(FileNotFoundError):
            moved.rename(part)
        await caller.hang_up()
