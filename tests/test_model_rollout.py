"""Model versions served side by side and rolled out on a live server (issue 14), on the tiny
family: a versioned rollout keeps a pinned caller on its version while unpinned callers get the
new default; a red-black rollout while four WebRTC calls talk drops no call and fails no turn,
new calls land on the new version and the old one's workers are gone at the end; a version
that fails its checks rolls back with the old one still serving.

One app serves the whole module on the shared tiny pipeline (tiny@1, not this app's: it is
never stopped here) and starts tiny@2 once, in the first test. The red-black rollout goes from
tiny@2 back to tiny@1, the direction whose old version the app owns, so its workers can be
seen to stop without starting a third pipeline on two cores; `make soak` runs the same checks
from tiny@1 to tiny@2 on an app that starts its own tiny@1 (two more engine starts).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from agent.app import create_app
from agent.cli import build_models, parse_args, settings_of
from agent.config import ConversationSettings, Settings
from agent.profiles import build_pipeline
from agent.serving import rollout_command
from agent.serving.rollout import RolloutTimes
from tests.openai_clients import clients
from tests.product_calls import connect, say, session_of, update_session
from tests.rtc_client import RtcCaller
from tests.served import Served, serve

pytestmark = pytest.mark.engines
TIMEOUT_S = 240.0  # guards hangs only: a turn takes seconds, an engine start most of a minute
THINKER_WEIGHTS = "thinker/model.safetensors"


# tiny@2's declared output schema: its canary completion must be JSON valid for it.
MOOD = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                         "mood": {"enum": ["happy", "calm", "sad"]}},
        "required": ["ok", "mood"], "additionalProperties": False}


def _build(models: Path, version: str, seed: int, *flags: str) -> None:
    args = parse_args(["models", "build", "tiny", "--models-dir", str(models),
                       "--version", version, "--seed", str(seed), *flags])
    assert build_models(args, settings_of(args)) == 0


@pytest.fixture(scope="module")
async def server(shared_tiny_server: Served, tiny_models_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    """This module's app on the shared tiny@1 pipeline, with tiny@2 built beside it (declaring
    an output schema) and a tiny@3 whose weights were changed after its build."""
    schema = tmp_path_factory.mktemp("schema") / "mood.json"
    schema.write_text(json.dumps(MOOD))
    await asyncio.to_thread(_build, tiny_models_dir, "2", 8, "--output-schema", str(schema))
    await asyncio.to_thread(_build, tiny_models_dir, "3", 9)
    weights = tiny_models_dir / "versions/3/tiny" / THINKER_WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    settings = Settings(profile="tiny", models_dir=tiny_models_dir, max_calls=8,
                        data_dir=tmp_path_factory.mktemp("rollout-data"),
                        conversation=ConversationSettings(max_reply_tokens=16))
    app = create_app(settings, pipeline=shared_tiny_server.app.state.pipeline,
                     owns_pipeline=False)
    async with serve(app) as served:
        yield served


async def command(run: Any, *argv: str) -> int:
    """`omnivox models ARGV` (its command, without main's process-wide logging), in a thread:
    the server runs on this loop."""
    return int(await asyncio.to_thread(run, parse_args(["models", *argv])))


async def models_of(served: Served) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=served.url) as http:
        listing = (await http.get("/v1/models")).json()
    return {m["id"]: m for m in listing["data"]} | {"rollout": listing["rollout"]}


async def admin(served: Served, path: str, **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=served.url, timeout=TIMEOUT_S) as http:
        return await http.post(path, json=body)


async def completion_model(served: Served, model: str) -> str:
    """The version that answered a chat completion for `model`."""
    _, client = clients(served)
    reply = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_completion_tokens=4)
    return reply.model


async def talk(caller: RtcCaller, turn: int) -> dict[str, Any]:
    """One typed turn; the response.done it ended with."""
    say(caller, f"Tell me something, please ({turn}).")
    done = await caller.wait_for("response.done", TIMEOUT_S, count=turn)
    return done["response"]


async def test_versioned_rollout_keeps_a_pinned_caller_on_its_version(server: Served) -> None:
    pinned = await connect(server.url)
    update_session(pinned, model="tiny@1")
    assert (await pinned.wait_for("session.updated"))["session"]["model"] == "tiny@1"

    # Through the command line, as an operator would (in a thread: the server is on this loop).
    assert await command(rollout_command.rollout, "rollout", "tiny@2", "--url", server.url,
                         "--strategy", "versioned") == 0
    models = await models_of(server)
    assert models["tiny@2"]["default"] and not models["tiny@1"]["default"]
    assert models["tiny@2"]["state"] == "serving" and models["tiny@2"]["ready"]
    assert models["tiny@1"]["calls"] == 1
    rollout = models["rollout"]
    assert (rollout["phase"], rollout["previous"], rollout["target"]) == ("done", "tiny@1",
                                                                           "tiny@2")
    assert rollout["canary"][0]["audio_ms"] > 0
    assert rollout["canary_json"]["tokens"] > 0  # a guided completion valid for its schema

    # Unpinned traffic goes to the new default, pinned traffic stays.
    assert await completion_model(server, "tiny") == "tiny@2"
    assert await completion_model(server, "tiny@1") == "tiny@1"
    fresh = await connect(server.url)
    assert (await fresh.wait_for("session.created"))["session"]["model"] == "tiny@2"
    assert (await talk(fresh, 1))["status"] == "completed"
    assert (await talk(pinned, 1))["status"] == "completed"
    assert session_of(server, pinned).pipeline.served.id == "tiny@1"

    # tiny@1 cannot be retired under its pinned caller, nor tiny@2, the default.
    refused = await admin(server, "/v1/models/tiny@1/retire")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_in_use"
    refused = await admin(server, "/v1/models/tiny@2/retire")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_is_default"
    await asyncio.gather(pinned.hang_up(), fresh.hang_up())

    assert await command(rollout_command.retire, "retire", "tiny@1", "--url", server.url) == 0
    assert set(await models_of(server)) == {"tiny@2", "rollout"}
    with pytest.raises(openai.NotFoundError, match="served are: tiny@2"):
        await completion_model(server, "tiny@1")


async def test_red_black_rollout_under_four_calls_drops_nothing(server: Served) -> None:
    await red_black_under_four_calls(server, "tiny@2", "tiny@1")


async def red_black_under_four_calls(server: Served, old_id: str, new_id: str) -> None:
    """A red-black rollout from `old_id`, the default (its workers the app's), to `new_id` in
    steps 50,100 while four calls talk: every turn completed, no call dropped, a new call on
    `new_id`, a completion pinned to `old_id` finished there, `old_id`'s workers gone."""
    old = server.app.state.models.get(old_id)
    assert old is not None and server.app.state.models.default("tiny") is old and old.owned
    old_pids = [s.pid for s in old.pipeline.health().stages.values()]
    callers = [await connect(server.url) for _ in range(4)]
    await asyncio.gather(*(talk(c, 1) for c in callers))

    started = await admin(server, "/v1/models/rollout", model=new_id, strategy="red-black",
                          steps=[50, 100])
    assert started.status_code == 202, started.text
    # The calls go on talking through the checks, the shift and into the drain (the new
    # version's start too, when it is not served yet: engines load slowly on a busy host).
    done = await asyncio.gather(*(talk(c, 2) for c in callers))
    await wait_phase(server, "draining", RolloutTimes().start_timeout_s + TIMEOUT_S)
    done += await asyncio.gather(*(talk(c, 3) for c in callers))
    assert [r["status"] for r in done] == ["completed"] * 8
    assert all(session_of(server, c).pipeline.served is old for c in callers)

    newcomer = await connect(server.url)
    assert (await newcomer.wait_for("session.created"))["session"]["model"] == new_id
    assert (await talk(newcomer, 1))["status"] == "completed"
    assert {c.location for c in callers} <= {f"/v1/realtime/calls/{call.id}"
                                             for call in server.app.state.calls}  # none dropped

    # A completion pinned to the draining version, in flight as its last calls end, finishes
    # there before its workers stop.
    _, client = clients(server)
    pinned = asyncio.ensure_future(client.chat.completions.create(
        model=old_id, messages=[{"role": "user", "content": "Hi"}],
        max_completion_tokens=400))
    await asyncio.gather(*(c.hang_up() for c in callers))
    await wait_phase(server, "done")
    answer = await pinned
    assert (answer.model, answer.choices[0].finish_reason) == (old_id, "length")
    assert set(await models_of(server)) == {new_id, "rollout"}
    assert all(not _alive(pid) for pid in old_pids)  # the old version's workers are gone
    await newcomer.hang_up()
    async with httpx.AsyncClient(base_url=server.url) as http:
        metrics = (await http.get("/metrics")).text
    assert f'omnivox_rollout_phase{{phase="done",previous="{old_id}",strategy="red-black",' \
           f'target="{new_id}"}} 1.0' in metrics
    assert f'omnivox_model_version{{default="true",model="{new_id}",state="serving"}} 1.0' \
        in metrics


async def test_a_version_that_fails_its_checks_rolls_back(server: Served) -> None:
    assert await command(rollout_command.rollout, "rollout", "tiny@3", "--url", server.url) == 1
    models = await models_of(server)
    assert set(models) == {"tiny@1", "rollout"} and models["tiny@1"]["default"]
    rollout = models["rollout"]
    assert rollout["phase"] == "rolled_back" and rollout["percent"] == 0
    assert "tiny@3 did not start" in rollout["reason"] and THINKER_WEIGHTS in rollout["reason"]
    assert await completion_model(server, "tiny") == "tiny@1"  # the old version serves on
    missing = await admin(server, "/v1/models/rollout", model="tiny@9", strategy="versioned",
                          wait=True)
    assert missing.json()["phase"] == "rolled_back" and "not built" in missing.json()["reason"]


async def wait_phase(served: Served, phase: str, timeout_s: float = TIMEOUT_S) -> None:
    for _ in range(int(timeout_s * 10)):
        state = served.app.state.rollouts.state
        if state is not None and state.phase == phase:
            return
        assert state is None or state.phase != "rolled_back", state.reason
        await asyncio.sleep(0.1)
    raise AssertionError(f"the rollout never reached {phase}")


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(not os.environ.get("OMNIVOX_ROLLOUT_SOAK_S"),
                    reason="a soak: set OMNIVOX_ROLLOUT_SOAK_S (make soak)")
async def test_red_black_rollouts_back_and_forth_under_churning_calls(server: Served) -> None:
    """For OMNIVOX_ROLLOUT_SOAK_S seconds, six callers at a time talk three turns each and
    hang up, new ones taking their place, while red-black rollouts go tiny@1 -> tiny@2 ->
    tiny@1 ... in steps 10,50,100: every rollout done, every turn completed, no call dropped."""
    until = asyncio.get_running_loop().time() + float(os.environ["OMNIVOX_ROLLOUT_SOAK_S"])
    outcomes: list[str] = []
    dropped = 0

    async def churn() -> None:
        nonlocal dropped
        while asyncio.get_running_loop().time() < until:
            caller = await connect(server.url)
            for turn in (1, 2, 3):
                outcomes.append((await talk(caller, turn))["status"])
            dropped += bool(caller.of_type("error"))
            await caller.hang_up()

    async def roll() -> list[str]:
        phases = []
        target = "tiny@2"
        while asyncio.get_running_loop().time() < until:
            reply = await admin(server, "/v1/models/rollout", model=target, steps=[10, 50, 100],
                                wait=True)
            phases.append(f"{target}: {reply.json()['phase']} {reply.json()['reason'] or ''}")
            target = "tiny@1" if target == "tiny@2" else "tiny@2"
        return phases

    *_, phases = await asyncio.gather(*(churn() for _ in range(6)), roll())
    print(f"rollouts: {phases}; turns: {len(outcomes)}")
    assert phases and all(p.startswith(("tiny@1: done", "tiny@2: done")) for p in phases)
    assert outcomes.count("completed") == len(outcomes) and dropped == 0


@pytest.mark.skipif(not os.environ.get("OMNIVOX_ROLLOUT_SOAK_S"),
                    reason="two more engine starts: set OMNIVOX_ROLLOUT_SOAK_S (make soak)")
async def test_red_black_rollout_from_tiny_1_to_tiny_2_stops_tiny_1s_workers(
    server: Served, tiny_models_dir: Path, tmp_path: Path
) -> None:
    """The red-black test in the issue's direction, tiny@1 -> tiny@2, on an app whose tiny@1
    is its own (so its workers stop): `server` built tiny@2."""
    settings = Settings(profile="tiny", models_dir=tiny_models_dir, max_calls=8,
                        data_dir=tmp_path, conversation=ConversationSettings(max_reply_tokens=16))
    app = create_app(settings, pipeline=build_pipeline(settings))
    async with serve(app) as served:
        for _ in range(int(TIMEOUT_S * 10)):
            if app.state.readiness.stages_ready():
                break
            await asyncio.sleep(0.1)
        assert app.state.readiness.stages_ready(), app.state.readiness.summary()
        await red_black_under_four_calls(served, "tiny@1", "tiny@2")
        print(f"rollout tiny@1 -> tiny@2: {app.state.rollouts.state.describe()}")
