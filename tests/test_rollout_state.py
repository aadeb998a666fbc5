"""Rollout bookkeeping without engines: the persisted state and what a restarted server makes
of it (the default it left, and the versions it left serving beside it started again), the
refusals of a rollout asked wrongly, and a call's binding to its model version (a pin takes
over only between turns; each turn's cancel reaches the version running it), a canary turn
that must be heard, a canary completion that must follow the version's declared output schema,
/readyz after a rollout past a first version that failed to start, and a call pinned to a
model not served refused (404) before it exists, over WebRTC and WebSocket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import websockets
import websockets.asyncio.client

from agent.app import create_app
from agent.config import Settings
from agent.serving.binding import UnknownModelError, VersionBinding
from agent.serving.registry import ModelRegistry, ServedVersion, VersionState
from agent.serving.rollout import RolloutRefused, Rollouts, RolloutTimes
from agent.serving.rollout_state import (
    Phase,
    RolloutState,
    Strategy,
    load,
    save,
    served_after_restart,
)
from pipeline.families.kit.build_support import write_json
from pipeline.model_version import ModelVersion
from pipeline.runtime.supervisor import StageState, StageStatus
from pipeline.settings import PipelineSettings
from pipeline.stage import ThinkerJob, ThinkerOutput
from pipeline.turns.events import AudioChunk, Turn, TurnDone
from pipeline.version_checks import ModelVersionError, declare_output_schema
from tests.rtc_client import dead_peer_offer
from tests.served import Served, serve


class Stage:
    """A stand-in pipeline of the tiny family, always ready once started (a start may fail:
    `refused`): each turn waits for `go`, then says `pcm` (none by default) and is done;
    cancels are noted; a text completion answers `answer`, its job noted."""

    def __init__(self, pcm: np.ndarray | None = None, refused: str | None = None,
                 model_version: str = "1") -> None:
        self.settings = PipelineSettings(family="tiny", models_dir=Path("/m"),
                                         model_version=model_version)
        self.go = asyncio.Event()
        self.pcm = pcm
        self.refused = refused
        self.running = False
        self.turns: list[str] = []
        self.cancelled: list[str] = []
        self.answer = "{}"
        self.jobs: list[ThinkerJob] = []

    async def start(self) -> None:
        if self.refused is not None:
            raise ModelVersionError(self.refused)
        self.running = True

    async def stop(self) -> None:
        self.running = False

    def on_stage_failed(self, listener: Any) -> None:
        pass

    async def generate_text(self, job: ThinkerJob) -> AsyncIterator[ThinkerOutput]:
        self.jobs.append(job)
        half = len(self.answer) // 2
        yield ThinkerOutput(job.request_id, self.answer[:half], [1] * half)
        yield ThinkerOutput(job.request_id, self.answer[half:], [1], finished=True,
                            finish_reason="stop")

    def health(self) -> Any:
        return SimpleNamespace(ready=True, stages={"voicebox": StageStatus("voicebox",
                                                                          StageState.READY)})

    async def respond(self, turn: Turn) -> AsyncIterator[Any]:
        self.turns.append(turn.turn_id)
        await self.go.wait()
        if self.pcm is not None:
            yield AudioChunk(turn.turn_id, self.pcm, 24_000, "Hi", 0, 2)
        yield TurnDone(turn.turn_id, "", {})

    async def cancel(self, turn_id: str) -> bool:
        self.cancelled.append(turn_id)
        return True


def registry(root: Path = Path("/m")) -> tuple[ModelRegistry, ServedVersion, ServedVersion]:
    models = ModelRegistry("tiny")
    one = ServedVersion("tiny", ModelVersion(root), "tiny", Stage(), owned=False)
    two = ServedVersion("tiny", ModelVersion(root, "2"), "tiny", Stage(), owned=True)
    models.add(one, default=True)
    models.add(two)
    return models, one, two


def test_a_restarted_server_serves_what_the_last_rollout_left(tmp_path: Path) -> None:
    settings = Settings(profile="tiny", data_dir=tmp_path)
    assert served_after_restart(settings).model_version == "1"  # no rollout yet
    state = RolloutState("tiny", "2", "1", Strategy.RED_BLACK, phase=Phase.SHIFTING)
    save(tmp_path, state)
    assert load(tmp_path) == state
    assert served_after_restart(settings).model_version == "1"  # cut short: the old one
    state.phase = Phase.DONE
    save(tmp_path, state)
    assert served_after_restart(settings).model_version == "2"
    assert served_after_restart(Settings(profile="tiny", data_dir=tmp_path,
                                         model_version="3")).model_version == "3"  # set wins
    assert served_after_restart(Settings(profile="local", data_dir=tmp_path)
                                ).model_version == "1"


def test_a_rollout_cut_short_by_a_restart_is_recorded_rolled_back(tmp_path: Path) -> None:
    save(tmp_path, RolloutState("tiny", "2", "1", Strategy.RED_BLACK, phase=Phase.DRAINING,
                                percent=100))
    rollouts = Rollouts(registry()[0], Settings(profile="tiny", data_dir=tmp_path))
    rollouts.recover()
    for state in (rollouts.state, load(tmp_path)):
        assert state is not None and state.phase == Phase.ROLLED_BACK and state.percent == 0
        assert "restarted during the rollout (draining)" in (state.reason or "")


@pytest.mark.parametrize(("model", "steps", "code"), [
    ("local@2", None, "model_not_found"), ("tiny@1", None, "already_default"),
    ("tiny", None, "invalid_model"), ("tiny@2", [50, 20], "invalid_steps"),
    ("tiny@2", [0, 100], "invalid_steps"),
])
def test_a_rollout_asked_wrongly_is_refused_before_anything_changes(
    tmp_path: Path, model: str, steps: list[int] | None, code: str
) -> None:
    models, one, _ = registry()
    rollouts = Rollouts(models, Settings(profile="tiny", data_dir=tmp_path))
    with pytest.raises(RolloutRefused) as refused:
        rollouts.begin(model, Strategy.RED_BLACK, steps)
    assert refused.value.code == code
    assert rollouts.state is None and models.default("tiny") is one


async def test_a_pin_takes_over_between_turns_and_cancels_reach_the_turns_version() -> None:
    models, one, two = registry()
    binding = VersionBinding(models, one)
    assert (one.calls, binding.model_id) == (1, "tiny@1")
    with pytest.raises(UnknownModelError, match="served are: tiny@1, tiny@2"):
        binding.pin("tiny@9")
    first = asyncio.ensure_future(_events(binding, "t1"))
    await asyncio.sleep(0)
    binding.pin("tiny@2")  # mid-turn: the turn in flight stays where it runs
    assert binding.model_id == "tiny@2" and binding.served is one
    await binding.cancel("t1")
    one.pipeline.go.set()
    await first
    two.pipeline.go.set()
    await _events(binding, "t2")
    assert (one.pipeline.turns, two.pipeline.turns) == (["t1"], ["t2"])
    assert one.pipeline.cancelled == ["t1"] and (one.calls, two.calls) == (0, 1)
    binding.release()
    assert two.calls == 0


def test_a_shift_sends_unpinned_callers_to_a_serving_version_only() -> None:
    models, one, two = registry()
    models.split("tiny", "2", 100)
    assert models.resolve("tiny") is two and models.resolve("tiny@1") is one
    two.state = VersionState.CHECKING  # not ready for callers yet: neither shifted nor pinned
    assert models.resolve("tiny") is one and models.resolve("tiny@2") is None
    models.split("tiny", None)
    one.state = VersionState.DRAINING  # still reached by callers pinned to it
    assert models.resolve("tiny@1") is one


@pytest.mark.parametrize(("pcm", "phase"), [
    (np.zeros(2400, np.float32), "rolled_back"),  # spoke, but digital silence
    (np.full(2400, 0.1, np.float32), "done"),
])
async def test_a_canary_turn_must_be_heard_or_the_rollout_rolls_back(
    tmp_path: Path, pcm: np.ndarray, phase: str
) -> None:
    models, one, two = registry()
    two.pipeline.pcm = pcm
    two.pipeline.go.set()
    rollouts = Rollouts(models, Settings(profile="tiny", data_dir=tmp_path),
                        RolloutTimes(canary_timeout_s=10, step_s=0))
    rollouts.begin("tiny@2", Strategy.VERSIONED)
    state = await rollouts.wait()
    assert state is not None and state.phase == phase
    if phase == "rolled_back":
        assert models.default("tiny") is one and state.reason is not None
        assert "tiny@2: canary turn canary-tiny@2-1 produced no audible audio" in state.reason
        assert models.get("tiny@2") is two and two.state == VersionState.SERVING  # as before
    else:
        assert models.default("tiny") is two and state.canary[0]["audio_ms"] == 100


async def _events(binding: VersionBinding, turn_id: str) -> list[Any]:
    return [event async for event in binding.respond(Turn(turn_id, []))]


async def test_a_call_pinned_to_a_model_not_served_is_refused_before_it_exists(
    media_server: Served,
) -> None:
    offer = await dead_peer_offer()
    session = json.dumps({"type": "realtime", "model": "tiny@9"})
    async with httpx.AsyncClient(base_url=media_server.url) as http:
        reply = await http.post("/v1/realtime/calls", files={
            "sdp": (None, offer, "application/sdp"),
            "session": (None, session, "application/json")})
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"
    assert "'tiny@9' is not served here" in reply.json()["error"]["message"]
    url = media_server.url.replace("http://", "ws://") + "/v1/realtime?model=tiny@9"
    with pytest.raises(websockets.InvalidStatus) as denied:
        async with websockets.asyncio.client.connect(url):
            pass
    assert denied.value.response.status_code == 404
    assert len(media_server.app.state.calls) == 0


async def test_the_admin_routes_take_an_api_key(tmp_path: Path) -> None:
    app = create_app(Settings(api_keys=["sk-admin-0123456789"], data_dir=tmp_path))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://omnivox") as http:
        for path in ("/v1/models/rollout", "/v1/models/tiny@1/retire"):
            body = {"model": "tiny@2"} if path.endswith("rollout") else {}
            assert (await http.post(path, json=body)).status_code == 401
            keyed = await http.post(path, json=body,
                                    headers={"Authorization": "Bearer sk-admin-0123456789"})
            assert keyed.status_code == 404  # past the key: a media server serves no model


MOOD = {"type": "object", "properties": {"mood": {"enum": ["calm", "sad"]}},
        "required": ["mood"], "additionalProperties": False}


@pytest.mark.parametrize(("answer", "reason"), [
    ('{"mood": "calm"}', None),
    ('{"mood": "angry"}', "does not follow it: at mood, 'angry' is not one of ['calm', 'sad']"),
    ('{"mood": "ca', "is not valid JSON"),
])
async def test_a_version_declaring_an_output_schema_must_answer_json_valid_for_it(
    tmp_path: Path, answer: str, reason: str | None
) -> None:
    models, one, two = registry(tmp_path)
    (two.root / "tiny").mkdir(parents=True)
    write_json(two.root / "tiny/manifest.json", {"family": "tiny"})
    declare_output_schema(two.model, "tiny", MOOD)
    two.pipeline.pcm, two.pipeline.answer = np.full(2400, 0.1, np.float32), answer
    two.pipeline.go.set()
    rollouts = Rollouts(models, Settings(profile="tiny", data_dir=tmp_path),
                        RolloutTimes(canary_timeout_s=10, step_s=0))
    rollouts.begin("tiny@2", Strategy.VERSIONED)
    state = await rollouts.wait()
    assert state is not None and state.canary[0]["audio_ms"] == 100  # it spoke first
    [job] = two.pipeline.jobs  # guided by the schema, text only
    assert job.response_format == {"type": "json_schema", "json_schema": {
        "name": "output_schema", "schema": MOOD}} and not job.embeds
    if reason is None:
        assert state.phase == Phase.DONE and models.default("tiny") is two
        assert state.canary_json is not None and state.canary_json["tokens"] == 9
    else:
        assert state.phase == Phase.ROLLED_BACK and models.default("tiny") is one
        assert state.reason is not None and state.reason.startswith(
            "tiny@2: canary completion canary-tiny@2-json under its output schema " + reason)


async def test_a_restart_serves_again_the_versions_the_last_rollout_left_serving(
    tmp_path: Path,
) -> None:
    # tiny@1 and tiny@2 serve (a versioned rollout 1 -> 2); a red-black 2 -> 3 is cut short.
    save(tmp_path, RolloutState("tiny", "3", "2", Strategy.RED_BLACK, phase=Phase.SHIFTING,
                                percent=50, serving=["1", "2"]))
    settings = served_after_restart(Settings(profile="tiny", data_dir=tmp_path))
    models, built = ModelRegistry("tiny"), []
    two = ServedVersion("tiny", ModelVersion(tmp_path, "2"), "tiny", Stage(), owned=False)
    models.add(two, default=True)

    def build(version: Settings) -> Stage:
        built.append(version.model_version)
        return Stage(refused=None if version.model_version == "1" else "not built",
                     model_version=version.model_version)

    rollouts = Rollouts(models, settings, build=build)
    rollouts.recover()
    await asyncio.gather(*rollouts.restore())
    one = models.get("tiny@1")
    assert settings.model_version == "2" and built == ["1"]  # not tiny@3, cut short
    assert one is not None and one.pipeline.running and one.owned
    assert models.resolve("tiny@1") is one and models.default("tiny") is two
    await rollouts.retire("tiny@1")  # no longer served: a next restart leaves it
    assert _serving(tmp_path) == ["2"] and not one.pipeline.running

    # A version that cannot start again is served no more, and no longer restored.
    save(tmp_path, RolloutState("tiny", "2", "4", Strategy.VERSIONED, phase=Phase.DONE,
                                serving=["2", "4"]))
    rollouts = Rollouts(models, settings, build=build)
    rollouts.recover()
    await asyncio.gather(*rollouts.restore())
    assert built == ["1", "4"] and models.get("tiny@4") is None
    assert _serving(tmp_path) == ["2"]
    # A server started on another version than the one the state left (a flag): it alone.
    assert Rollouts(ModelRegistry("tiny"), settings, build=build).restore() == []


def _serving(data_dir: Path) -> list[str]:
    state = load(data_dir)
    assert state is not None
    return state.serving


async def test_readyz_forgets_a_failed_start_once_a_rollout_replaced_its_version(
    tmp_path: Path,
) -> None:
    first = Stage(refused="refusing tiny version 1: file thinker/x does not match its sha256")
    app = create_app(Settings(profile="tiny", data_dir=tmp_path), pipeline=first)
    async with serve(app) as served, httpx.AsyncClient(base_url=served.url) as http:
        for _ in range(200):  # the start gives up in the background
            ready = await http.get("/readyz")
            if "pipeline" in ready.json()["stages"]:
                break
            await asyncio.sleep(0.05)
        assert ready.status_code == 503 and "does not match" in ready.json()["detail"]
        two = ServedVersion("tiny", ModelVersion(tmp_path, "2"), "tiny",
                            Stage(np.full(2400, 0.1, np.float32)), owned=False)
        two.pipeline.go.set()
        app.state.models.add(two)
        app.state.rollouts.times = RolloutTimes(canary_timeout_s=10, step_s=0)
        app.state.rollouts.begin("tiny@2", Strategy.VERSIONED)
        assert (await app.state.rollouts.wait()).phase == Phase.DONE
        assert (await http.get("/readyz")).json()["stages"]["voicebox"]["state"] == "ready"
        listing = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
        assert listing["tiny@1"]["stages"]["pipeline"]["state"] == "failed"  # still its own
        assert listing["tiny@2"]["ready"] and listing["tiny@2"]["default"]
