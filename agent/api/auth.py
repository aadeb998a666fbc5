"""Who may use /v1: API keys, short-lived single-use client secrets for browsers, and CORS.

With no API keys configured (local mode) nothing here refuses anything. With keys, every request
whose path starts with /v1 needs `Authorization: Bearer <API key>`, checked by an ASGI middleware
in front of the whole app, so routes added by any module are covered without opting in. A
client secret, minted with an API key at POST /v1/realtime/client_secrets, stands in for the key
on exactly one POST /v1/realtime/calls, and afterwards on the hang-up of the call it created,
or on one Realtime WebSocket (GET /v1/realtime?model=...), given as a bearer token or, as
browsers must, in the `openai-insecure-api-key.<secret>` subprotocol (never an API key there).

Secrets are never logged; the store keeps only their SHA-256 digests, which also makes lookups
independent of how much of a guessed secret is right. API keys are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import math
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.calls.signalling import RESUME_HEADER, json_error, read_body
from agent.config import Settings
from agent.realtime.server_events import session_object

log = logging.getLogger(__name__)
router = APIRouter()

PROTECTED_PREFIX = "/v1"
CALLS_PATH = "/v1/realtime/calls"
REALTIME_PATH = "/v1/realtime"  # the WebSocket
INSECURE_KEY_PROTOCOL = "openai-insecure-api-key."  # a browser's credential, as a subprotocol
# A hang-up of one call: DELETE on its path, or POST on its `hangup` action (the SDK's form).
HANG_UP = re.compile(
    r"^(?:DELETE /v1/realtime/calls/([^/]+)|POST /v1/realtime/calls/([^/]+)/hangup)$"
)
# A placed call's Location: its path, after the server's `location_prefix` when one is set.
CALL_LOCATION = re.compile(r"^(?:/[^/?#]+)*/v1/realtime/calls/([^/?#]+)$")
SECRET_PREFIX = "ek_"  # OpenAI's ephemeral keys look the same
MAX_MINT_BODY_BYTES = 16 * 1024


def is_loopback(host: str) -> bool:
    """Whether a listen address is reachable from this machine only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class SecretStoreFullError(RuntimeError):
    """Too many client secrets outstanding; one frees up in `retry_after_s`."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        super().__init__(f"{limit} client secrets are outstanding; try again later")
        self.retry_after_s = retry_after_s


class ClientSecrets:
    """Outstanding client secrets, by digest, with their expiry on `clock` (monotonic seconds).

    A secret is outstanding until a call is placed with it or it expires; while a call request
    holds it, it is reserved (a second use at the same time is refused); once the call exists,
    the secret is used and only hangs that call up. Outstanding and reserved secrets together
    are capped, expired ones are purged on every mint, and the used ones remembered are capped
    too (the oldest forgotten first).
    """

    def __init__(
        self,
        limit: int,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.limit = limit
        self._clock = clock
        self._wall_clock = wall_clock
        self._outstanding: dict[bytes, float] = {}
        self._reserved: dict[bytes, float] = {}
        self._used: OrderedDict[bytes, str] = OrderedDict()  # digest -> the call it placed

    def __len__(self) -> int:
        """Secrets that still hold a place: outstanding or reserved."""
        return len(self._outstanding) + len(self._reserved)

    def mint(self, ttl_s: int) -> tuple[str, int]:
        """A new secret and its expiry in unix seconds (rounded down: never later than real)."""
        now = self._clock()
        self._purge(now)
        if len(self) >= self.limit:
            soonest = min([*self._outstanding.values(), *self._reserved.values()])
            raise SecretStoreFullError(self.limit, max(1, math.ceil(soonest - now)))
        value = SECRET_PREFIX + secrets.token_urlsafe(32)
        self._outstanding[_digest(value)] = now + ttl_s
        return value, int(self._wall_clock() + ttl_s)

    def reserve(self, value: str) -> bytes | None:
        """Take an outstanding, unexpired secret for one call request; None if it is not one."""
        digest = _digest(value)
        expires = self._outstanding.pop(digest, None)
        if expires is None or expires <= self._clock():
            return None
        self._reserved[digest] = expires
        return digest

    def release(self, digest: bytes) -> None:
        """The request placed no call: the secret is outstanding again until it expires."""
        expires = self._reserved.pop(digest, None)
        if expires is not None and expires > self._clock():
            self._outstanding[digest] = expires

    def bind(self, digest: bytes, call_id: str) -> None:
        """The request placed `call_id`: the secret is used up, except to hang that call up."""
        self._reserved.pop(digest, None)
        self._used[digest] = call_id
        while len(self._used) > self.limit:
            self._used.popitem(last=False)

    def placed(self, value: str, call_id: str) -> bool:
        """Whether this secret placed this call."""
        placed = self._used.get(_digest(value))
        return placed is not None and hmac.compare_digest(placed, call_id)

    def _purge(self, now: float) -> None:
        for digest in [d for d, expires in self._outstanding.items() if expires <= now]:
            del self._outstanding[digest]


def bearer_token(scope: Scope) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, None when there is none."""
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])  # ASGI: (name, value) bytes
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
                return None
            return token
    return None


def subprotocol_token(scope: Scope) -> str | None:
    """The credential a browser gives as the `openai-insecure-api-key.<token>` subprotocol."""
    for protocol in scope.get("subprotocols", []):
        if protocol.startswith(INSECURE_KEY_PROTOCOL):
            return protocol[len(INSECURE_KEY_PROTOCOL):] or None
    return None


class BearerAuth:
    """ASGI middleware: every /v1 request needs an API key or, where allowed, a client secret."""

    def __init__(self, app: ASGIApp, key_digests: list[bytes], store: ClientSecrets) -> None:
        # Only digests: the middleware's arguments show in reprs.
        self.app = app
        self._key_digests = key_digests
        self.secrets = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] not in ("http", "websocket") or not path.startswith(PROTECTED_PREFIX):
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        if token is not None and self._is_key(token):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket" and path == REALTIME_PATH:
            token = token or subprotocol_token(scope)
            if token is not None and self._conversation_secret(scope, token):
                await self.app(scope, receive, send)
                return
        method = scope.get("method", "")
        if token is not None and scope["type"] == "http":
            if method == "POST" and path == CALLS_PATH:
                digest = self.secrets.reserve(token)
                if digest is not None:
                    await self._place_call(digest, scope, receive, send)
                    return
            hang_up = HANG_UP.match(f"{method} {path}")
            if hang_up and self.secrets.placed(token, hang_up[1] or hang_up[2]):
                await self.app(scope, receive, send)
                return
        client = scope.get("client") or ("?", 0)
        reason = "no bearer token" if token is None else "unknown, expired or used token"
        log.info("refused %s %s from %s: %s", method or "websocket", path, client[0], reason)
        await self._refuse(scope, receive, send, missing=token is None)

    def _conversation_secret(self, scope: Scope, token: str) -> bool:
        """Whether `token` is a client secret this Realtime WebSocket may use up: one starts a
        conversation of its own, never joins a call (call_id: API keys only)."""
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if any(name == "call_id" for name, _ in query):  # decoded as the route will read it
            return False
        digest = self.secrets.reserve(token)
        if digest is None:
            return False
        self.secrets.bind(digest, "")  # used up; it hangs up nothing
        return True

    def _is_key(self, token: str) -> bool:
        """Constant time: digests of equal length, every key compared, no early exit."""
        given = _digest(token)
        found = False
        for key in self._key_digests:
            found |= hmac.compare_digest(given, key)
        return found

    async def _place_call(self, digest: bytes, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the call request on a reserved secret; bind it to the call it creates, if any."""
        call_id: str | None = None

        async def watch(message: Message) -> None:
            nonlocal call_id
            if message["type"] == "http.response.start" and message["status"] == 201:
                headers = dict(message.get("headers", []))
                location = headers.get(b"location", b"").decode("latin-1")
                placed = CALL_LOCATION.match(location)
                call_id = placed[1] if placed else None
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if call_id is not None:
                self.secrets.bind(digest, call_id)
            else:
                self.secrets.release(digest)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, *, missing: bool) -> None:
        if scope["type"] == "websocket":
            await receive()  # websocket.connect; closing before accepting answers 403
            await send({"type": "websocket.close", "code": 1008})
            return
        if missing:
            response = json_error(
                401, "missing_api_key",
                "this server needs 'Authorization: Bearer <API key or client secret>'",
                **{"WWW-Authenticate": "Bearer"},
            )
        else:
            response = json_error(
                401, "invalid_api_key",
                "the API key or client secret is not valid, has expired or was already used",
                **{"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        await response(scope, receive, send)


def requested_ttl(body: bytes, longest_s: int) -> int:
    """The lifetime a mint request asks for (`expires_after.seconds`), else the longest."""
    if not body.strip():
        return longest_s
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if not isinstance(request, dict):
        raise ValueError("the body must be a JSON object")
    expires_after = request.get("expires_after")
    if expires_after is None:
        return longest_s
    if not isinstance(expires_after, dict):
        raise ValueError("expires_after must be an object")
    if expires_after.get("anchor", "created_at") != "created_at":
        raise ValueError("expires_after.anchor must be 'created_at'")
    seconds = expires_after.get("seconds", longest_s)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not 1 <= seconds <= longest_s:
        raise ValueError(f"expires_after.seconds must be an integer from 1 to {longest_s}")
    return seconds


@router.post("/v1/realtime/client_secrets")
async def create_client_secret(request: Request) -> JSONResponse:
    """Mint a client secret for one call, in the shape of OpenAI's Realtime client secrets.

    A `session` in the request is accepted and not applied: the call starts with the server's
    session, which the client changes with `session.update`.
    """
    settings: Settings = request.app.state.settings
    body = await read_body(request, MAX_MINT_BODY_BYTES)
    if body is None:
        return json_error(413, "body_too_large", f"body exceeds {MAX_MINT_BODY_BYTES} bytes")
    try:
        ttl_s = requested_ttl(body, settings.client_secret_ttl_s)
    except ValueError as exc:
        return json_error(400, "invalid_request", str(exc))
    store: ClientSecrets = request.app.state.client_secrets
    try:
        value, expires_at = store.mint(ttl_s)
    except SecretStoreFullError as exc:
        return json_error(
            429, "too_many_client_secrets", str(exc), **{"Retry-After": str(exc.retry_after_s)}
        )
    log.info("client secret minted (expires in %d s, %d outstanding)", ttl_s, len(store))
    # OpenAI's shape needs a session id; the call is only placed later and its session.created
    # carries the call's own id (rtc_...), so this one names the minted session only.
    session = session_object(
        "sess_" + secrets.token_hex(12), settings.profile, settings.conversation,
        settings.vad,
    )
    body_out: dict[str, Any] = {"value": value, "expires_at": expires_at, "session": session}
    return JSONResponse(body_out, headers={"Cache-Control": "no-store"})


def install(app: FastAPI, settings: Settings) -> None:
    """Authentication and CORS for `app`; call before any catch-all mount (the web page)."""
    app.state.client_secrets = ClientSecrets(settings.max_client_secrets)
    app.include_router(router)
    keys = [_digest(key.get_secret_value()) for key in settings.api_keys]
    if keys:
        app.add_middleware(BearerAuth, key_digests=keys, store=app.state.client_secrets)
    if settings.cors_origins:
        # Added last, so outermost: preflights are answered before authentication (browsers
        # send them without credentials) and refusals carry the CORS headers too.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", RESUME_HEADER],
            expose_headers=["Location"],
            max_age=600,
        )
    if keys:
        log.info("API keys configured (%d): /v1 needs a bearer token", len(keys))
    elif not is_loopback(settings.host):
        log.warning(
            "no API keys configured and the server listens on %s: anyone who can reach it "
            "can place calls. Set OMNIVOX_API_KEYS (see docs/operations.md, Authentication).",
            settings.host,
        )
