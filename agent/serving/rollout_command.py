"""`omnivox models rollout NAME@VERSION --url URL` and `omnivox models retire NAME@VERSION`:
the admin routes (agent/api/rollout_route.py) called on a running server, the rollout followed
phase by phase until it is done (exit 0) or rolled back (exit 1, saying why)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import httpx

from agent.config import add_api_key_option

POLL_S = 1.0
REQUEST_TIMEOUT_S = 30.0


def add_parsers(models_cmd: Any) -> None:
    rollout = models_cmd.add_parser(
        "rollout", help="roll a model version onto a running server (red-black or versioned)")
    rollout.add_argument("model", help="NAME@VERSION, built beside the served one")
    rollout.add_argument("--strategy", choices=("red-black", "versioned"), default="red-black",
                         help="red-black: new calls move to it and the old version drains and "
                         "stops; versioned: it becomes the default, the old keeps serving those "
                         "pinned to it (default: red-black)")
    rollout.add_argument("--steps", type=steps_of, default=None,
                         help="red-black: shares of new calls moved, e.g. 10,50,100 (default: "
                         "100 at once)")
    rollout.add_argument("--canary-turns", type=int, default=1,
                         help="spoken turns the new version must answer first (default: 1)")
    rollout.add_argument("--timeout", type=float, default=1800.0,
                         help="seconds to follow it (the rollout goes on on the server)")
    retire = models_cmd.add_parser("retire", help="stop serving a model version")
    retire.add_argument("model", help="NAME@VERSION, not its name's default")
    retire.add_argument("--force", action="store_true",
                        help="even with calls pinned to it (they move to the default)")
    for parser in (rollout, retire):
        parser.add_argument("--url", required=True, help="the server, e.g. http://host:8000")
        add_api_key_option(parser)


def steps_of(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"steps are percentages, e.g. 10,50,100: {text!r}") \
            from None


def rollout(args: argparse.Namespace) -> int:
    return _reaching(args, _rollout)


def retire(args: argparse.Namespace) -> int:
    return _reaching(args, _retire)


def _reaching(args: argparse.Namespace, command: Any) -> int:
    """Run `command`, a server that cannot be reached said in one line."""
    try:
        return int(command(args))
    except httpx.HTTPError as exc:
        print(f"omnivox: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1


def _rollout(args: argparse.Namespace) -> int:
    body = {"model": args.model, "strategy": args.strategy, "steps": args.steps,
            "canary_turns": args.canary_turns}
    with _client(args) as http:
        reply = http.post("/v1/models/rollout", json=body)
        if reply.status_code != 202:
            return _refused(reply)
        state, seen = reply.json(), ""
        deadline = time.monotonic() + args.timeout
        while True:
            seen = _progress(state, seen)
            if state["phase"] in ("done", "rolled_back"):
                break
            if time.monotonic() > deadline:
                print(f"omnivox: still {state['phase']} after {args.timeout:g} s (it goes on; "
                      f"GET {args.url}/v1/models/rollout)", file=sys.stderr)
                return 1
            time.sleep(POLL_S)
            state = http.get("/v1/models/rollout").json()
    if state["phase"] == "rolled_back":
        print(f"omnivox: rollout to {state['target']} rolled back: {state['reason']}",
              file=sys.stderr)
        return 1
    print(f"omnivox: {state['target']} is the default of {state['name']} ({state['strategy']})")
    return 0


def _retire(args: argparse.Namespace) -> int:
    with _client(args) as http:
        reply = http.post(f"/v1/models/{args.model}/retire", json={"force": args.force})
    if reply.status_code != 200:
        return _refused(reply)
    done = reply.json()
    stopped = "its workers stopped" if done["workers_stopped"] else "its workers left running"
    print(f"omnivox: {done['id']} retired ({stopped}; {done['calls_moved']} call(s) moved)")
    return 0


def _client(args: argparse.Namespace) -> httpx.Client:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    return httpx.Client(base_url=args.url, headers=headers, timeout=REQUEST_TIMEOUT_S)


def _progress(state: dict[str, Any], seen: str) -> str:
    """Print what changed in the rollout's state (its phase, the share moved, each canary
    turn, the canary completion); what has been printed, as a key."""
    phase = state["phase"]
    if phase == "shifting":
        phase += f": {state['percent']}% of new calls to {state['target']}"
    canary = [f"canary turn {turn['turn']} spoke {turn['audio_ms']} ms (first audio after "
              f"{turn['first_audio_s']} s)" for turn in state["canary"]]
    if state.get("canary_json"):
        canary.append(f"canary completion valid for its output schema "
                      f"({state['canary_json']['tokens']} tokens)")
    # In the order they happened, whichever poll saw them first.
    lines = [phase, *canary] if state["phase"] in ("starting", "checking") else [*canary, phase]
    for line in lines:
        if line not in seen.split("\n"):
            print(f"omnivox: rollout {state['previous']} -> {state['target']}: {line}",
                  flush=True)
    return "\n".join([*seen.split("\n"), *lines])


def _refused(reply: httpx.Response) -> int:
    try:
        message = reply.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = reply.text
    print(f"omnivox: refused ({reply.status_code}): {message}", file=sys.stderr)
    return 2 if reply.status_code in (400, 404) else 1
