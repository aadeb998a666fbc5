"""The wire: small msgspec structs over zmq between the API process and the stage workers.

Client -> worker (ROUTER socket of the worker): a job (`ThinkerJob`, `TalkerJob`,
`VoiceBoxJob` from pipeline/stage.py: sending one submits it), `Abort`, `Inspect`, `ReleaseTensors`.
Worker -> client: the job's outputs (pipeline/stage.py), `RequestError`, `Aborted`, `InspectReply`.
Worker -> supervisor (PUSH to the supervisor's PULL socket): `Ready`, `Heartbeat`,
`Broken`, `StartFailed`. Tensors never travel here: outputs and jobs carry `BlockRef`s into the
pool, or `CudaIpcRef`s (tensors/cuda_ipc.py) for CUDA tensors one stage sends another on a GPU host.

A CUDA IPC export's route: the producing stage's output carries the `CudaIpcRef`; the API
process passes it on, unread, in the consuming stage's job; when that job ends in any way (or
when the ref was never passed on) the API process sends `ReleaseTensors` to the producing
stage's worker (`CudaIpcRef.stage` names it), fire-and-forget, and the worker drops its clone.
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
    cuda_exports_pending: int = 0  # CUDA IPC exports of this worker not released yet
    cuda_imports_held: int = 0  # CUDA IPC maps this worker holds for jobs still running
    cuda_allocated_bytes: int = 0  # what its live CUDA tensors hold (0 where CUDA is unused)


class ReleaseTensors(msgspec.Struct, frozen=True, tag="release_tensors"):
    """These CUDA IPC exports of the worker are done with: their consuming job has ended, or
    (`delivered=False`) no consumer ever received them. Transfers the worker does not know (it
    was restarted since) are ignored."""

    transfers: list[int]
    delivered: bool = True


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
    """The worker's event loop is alive; `active` jobs are being served, `served` jobs have
    finished with a complete output since it started."""

    stage: str
    pid: int
    active: int
    served: int = 0


class Broken(msgspec.Struct, frozen=True, tag="broken"):
    """The worker lives but its stage can serve no more (`Stage.failure`): replace it. Sent in
    place of every heartbeat from then on."""

    stage: str
    pid: int
    reason: str


class StartFailed(msgspec.Struct, frozen=True, tag="start_failed"):
    """The stage could not start; the worker exits after sending this."""

    stage: str
    pid: int
    reason: str


ClientMessage = ThinkerJob | TalkerJob | VoiceBoxJob | Abort | Inspect | ReleaseTensors
WorkerMessage = (
    ThinkerOutput | TalkerOutput | VoiceBoxOutput | RequestError | Aborted | InspectReply
)
ControlMessage = Ready | Heartbeat | Broken | StartFailed

encode = msgspec.msgpack.Encoder().encode
client_decoder = msgspec.msgpack.Decoder(ClientMessage)
worker_decoder = msgspec.msgpack.Decoder(WorkerMessage)
control_decoder = msgspec.msgpack.Decoder(ControlMessage)
