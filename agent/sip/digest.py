"""Digest authentication of INVITEs (RFC 3261 22.4, RFC 7616's `qop=auth`), the server's side.

aiosipua answers challenges as a client (`build_credentials`); the server computes the response
a phone with the right password would send by the same function and compares. Nonces are
stateless, like the rest of the bridge: a time and an HMAC of it under a key made at start, so
any nonce this process issued within `nonce_ttl_s` is accepted (a restart makes phones ask
again). Replays within that window are not tracked (no nonce-count bookkeeping).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping

from aiosipua import SipDigestAuth, SipRequest
from aiosipua.auth import build_credentials
from aiosipua.headers import AuthChallenge, parse_auth, stringify_auth

NONCE_TTL_S = 300.0
ALGORITHM = "MD5"  # what desk phones and SIPp answer; aiosipua computes SHA-256 too


class DigestGuard:
    """Who may call: usernames and their passwords, within one realm."""

    def __init__(self, users: Mapping[str, str], realm: str = "omnivox",
                 nonce_ttl_s: float = NONCE_TTL_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.users = dict(users)
        self.realm = realm
        self.nonce_ttl_s = nonce_ttl_s
        self._clock = clock
        self._key = os.urandom(32)

    def challenge(self) -> str:
        """A WWW-Authenticate value with a fresh nonce."""
        params = {"realm": self.realm, "nonce": self._nonce(int(self._clock())),
                  "algorithm": ALGORITHM, "qop": "auth"}
        return stringify_auth(AuthChallenge(scheme="Digest", params=params))

    def admits(self, request: SipRequest) -> bool:
        """Whether `request` carries credentials of a known user answering a live nonce."""
        header = request.get_header("Authorization")
        if not header:
            return False
        given = parse_auth(header, credentials=True).params
        password = self.users.get(given.get("username", ""))
        nonce = given.get("nonce", "")
        if (password is None or given.get("realm") != self.realm or not self._live(nonce)
                or given.get("algorithm", ALGORITHM).upper() != ALGORITHM):
            return False
        challenge = {"realm": self.realm, "nonce": nonce, "algorithm": ALGORITHM}
        if "qop" in given:
            challenge["qop"] = given["qop"]
        try:
            nonce_count = int(given.get("nc", "1"), 16)
        except ValueError:
            return False
        expected = build_credentials(
            SipDigestAuth(given["username"], password), AuthChallenge("Digest", challenge),
            request.method, given.get("uri", ""), nonce_count=nonce_count,
            cnonce=given.get("cnonce"))
        return expected is not None and hmac.compare_digest(
            expected.params["response"], given.get("response", ""))

    def _nonce(self, issued: int) -> str:
        mac = hmac.new(self._key, str(issued).encode(), hashlib.sha256).hexdigest()[:32]
        return f"{issued:x}.{mac}"

    def _live(self, nonce: str) -> bool:
        issued_hex, _, _ = nonce.partition(".")
        try:
            issued = int(issued_hex, 16)
        except ValueError:
            return False
        return (hmac.compare_digest(nonce, self._nonce(issued))
                and 0 <= self._clock() - issued <= self.nonce_ttl_s)
