"""The wire: small msgspec structs over zmq between the API process and the stage workers.

Client -> worker (ROUTER socket of the worker): a job (`ThinkerJob`, `TalkerJob`,
`VoiceBoxJob` from stage.py: sending one submits it), `Abort`, `Inspect`.
Worker -> client: the job's outputs (stage.py), `RequestError`, `Aborted`, `InspectReply`.
Worker -> supervisor (PUSH to the supervisor's PULL socket): `Ready`, `Heartbeat`,
`StartFailed`. Tensors never travel here: outputs and jobs carry `BlockRef`s into the pool.
"""

from __future__ import annotations

import msgspec

from pipeline.stage import (
    TalkerJob,
    TalkerOutput,
    ThinkerJob,
    ThinkerOutput,
    VoiceBoxJob,
    VoiceBoxOutput,
)


class Abort(msgspec.Struct, frozen=True, tag="abort"):
    """Abort these requests in the engine and drop their jobs; `ack` > 0 asks for `Aborted`."""

    request_ids: list[str]
    ack: int = 0


class Aborted(msgspec.Struct, frozen=True, tag="aborted"):
    """The abort `ack` is done: none of its requests is left in the engine or the worker."""

    ack: int


class Inspect(msgspec.Struct, frozen=True, tag="inspect"):
    """Ask which requests the worker and its engine still hold."""

    ack: int


class InspectReply(msgspec.Struct, frozen=True, tag="inspect_reply"):
    """Requests the engine itself still holds, and jobs the worker is still serving."""

    ack: int
    engine_ids: list[str]
    serving_ids: list[str]


class RequestError(msgspec.Struct, frozen=True, tag="request_error"):
    """The stage raised while serving `request_id`; the request is over."""

    request_id: str
    error: str  # the exception's type name
    message: str


class Ready(msgspec.Struct, frozen=True, tag="ready"):
    """The worker's stage started and its socket is bound: it takes jobs."""

    stage: str
    pid: int


class Heartbeat(msgspec.Struct, frozen=True, tag="heartbeat"):
    """The worker's event loop is alive; `active` jobs are being served."""

    stage: str
    pid: int
    active: int


class StartFailed(msgspec.Struct, frozen=True, tag="start_failed"):
    """The stage could not start; the worker exits after sending this."""

    stage: str
    pid: int
    reason: str


ClientMessage = ThinkerJob | TalkerJob | VoiceBoxJob | Abort | Inspect
WorkerMessage = (
    ThinkerOutput | TalkerOutput | VoiceBoxOutput | RequestError | Aborted | InspectReply
)
ControlMessage = Ready | Heartbeat | StartFailed

encode = msgspec.msgpack.Encoder().encode
client_decoder = msgspec.msgpack.Decoder(ClientMessage)
worker_decoder = msgspec.msgpack.Decoder(WorkerMessage)
control_decoder = msgspec.msgpack.Decoder(ControlMessage)
