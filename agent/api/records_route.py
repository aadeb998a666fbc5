"""`GET /v1/calls/{call_id}`: a call's record (its row and its turns, in order) as JSON."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from agent.calls.signalling import json_error
from agent.ops.records import CallRecords, RecordsBusyError

router = APIRouter()


@router.get("/v1/calls/{call_id}", response_model=None)
async def call_record(call_id: str, request: Request) -> dict[str, Any] | JSONResponse:
    """The record of a call, live or ended; it includes every turn completed before this
    request arrived (reads queue behind the writes)."""
    records: CallRecords = request.app.state.records
    try:
        record = await records.call_record(call_id)
    except RecordsBusyError as exc:
        return json_error(503, "records_unavailable", str(exc), **{"Retry-After": "1"})
    if record is None:
        return json_error(404, "call_not_found", f"no record of call {call_id!r}")
    return record
