"""The named parts of a `multipart/form-data` body, read with the standard library's MIME parser
(the body is read whole first, bounded by its route's limit)."""

from __future__ import annotations

import email.parser
import email.policy

MULTIPART = "multipart/form-data"


def form_parts(content_type: str, body: bytes) -> dict[str, bytes] | None:
    """Each part's bytes by its name; None when the body is not a readable form."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return None
    parts: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            parts[name] = payload
    return parts
