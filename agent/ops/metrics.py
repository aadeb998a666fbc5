"""The server's Prometheus metrics and the `/metrics` route that exposes them.

Each app owns its registry (never prometheus_client's global one), so several apps in one
process (tests, benchmarks) keep separate counts. Counts the agent produces are updated where
they happen (signalling, calls, the conversation session); what other objects already know
(live calls, the supervisor's restart counts, the shared-memory pool) is read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from agent.ops.loop_lag import LoopLagMonitor
from media.pacing import PacingLateness, pacing_lateness

router = APIRouter()

LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Stage label -> the pipeline's mark for it in TurnDone.usage (seconds after the turn began).
STAGE_MARKS = {
    "asr": "transcript_s",
    "thinker_first_token": "first_text_s",
    "talker_first_tokens": "first_speech_tokens_s",
    "voicebox_first_chunk": "first_audio_s",
}
OUTCOMES = ("completed", "cancelled", "failed")
REFUSALS = ("not_ready", "too_many_calls", "negotiation_timeout")
DROPS = ("connect_timeout", "connection_failed")
CANCELS = ("turn_detected", "client_cancelled")  # barge-in; response.cancel or a client cut
MODEL_ENDPOINTS = ("chat_completions", "speech", "transcriptions")
PREEMPTIVE = ("started", "used", "discarded")
SEMANTIC_DECISIONS = ("ended", "waited")


class Metrics:
    """Every metric of one app, in the app's own registry."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.calls_started = Counter("omnivox_calls_started", "Calls answered (201)", registry=r)
        self.calls_refused = Counter(
            "omnivox_calls_refused", "Call offers refused: 503 not ready or full, 504 negotiation "
            "timeout", ["reason"], registry=r)
        self.calls_dropped = Counter(
            "omnivox_calls_dropped", "Answered calls lost: never connected within the connect "
            "timeout, or the connection failed", ["reason"], registry=r)
        self.turns = Counter("omnivox_turns", "Agent replies ended, by outcome", ["outcome"],
                             registry=r)
        self.time_to_first_audio = Histogram(
            "omnivox_time_to_first_audio_seconds", "From the start of a turn (the end of the "
            "caller's speech) to its first audio handed to the outbound track",
            buckets=LATENCY_BUCKETS, registry=r)
        self.stage_latency = Histogram(
            "omnivox_stage_latency_seconds", "From the start of a turn to each stage's first "
            "output (completed turns)", ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.barge_ins = Counter("omnivox_barge_ins", "Caller speech that interrupted the agent",
                                 registry=r)
        self.cancels = Counter("omnivox_cancels", "Replies cancelled while generating",
                               ["reason"], registry=r)
        self.model_requests = Counter(
            "omnivox_model_requests", "OpenAI-style model requests answered (chat completions, "
            "speech, transcriptions), by endpoint and HTTP status", ["endpoint", "status"],
            registry=r)
        self.model_answer_latency = Histogram(
            "omnivox_model_answer_latency_seconds", "From a model request's arrival to its "
            "answer's start (for a streamed answer: its first output)", ["endpoint"],
            buckets=LATENCY_BUCKETS, registry=r)
        self.loop_lag = Histogram(
            "omnivox_event_loop_lag_seconds", "How late the API process's event loop woke a "
            "periodic sleep", buckets=LAG_BUCKETS, registry=r)
        self.loop_lag_monitor = LoopLagMonitor(self.loop_lag.observe)
        Gauge("omnivox_event_loop_lag_p99_seconds", "99th percentile of the event loop lag over "
              "the last minute", registry=r).set_function(self.loop_lag_monitor.p99)
        r.register(PacingCollector(pacing_lateness))
        ProcessCollector(registry=r)
        for outcome in OUTCOMES:  # every series exists from the start, at 0
            self.turns.labels(outcome)
        for reason in REFUSALS:
            self.calls_refused.labels(reason)
        for reason in DROPS:
            self.calls_dropped.labels(reason)
        for reason in CANCELS:
            self.cancels.labels(reason)
        for stage in STAGE_MARKS:
            self.stage_latency.labels(stage)
        for endpoint in MODEL_ENDPOINTS:
            self.model_answer_latency.labels(endpoint)
        self.preemptive_replies = Counter(
            "omnivox_preemptive_replies", "Replies started at a pause of the caller's, before "
            "the turn ended: then used (the pause ended the turn) or discarded (the caller went "
            "on)", ["outcome"], registry=r)
        for outcome in PREEMPTIVE:
            self.preemptive_replies.labels(outcome)
        self.semantic_turn_ends = Counter(
            "omnivox_semantic_turn_ends", "Pauses judged by semantic_vad: the caller's words "
            "scored as a whole turn, so the turn ended at the pause (ended), or not (waited)",
            ["decision"], registry=r)
        for decision in SEMANTIC_DECISIONS:
            self.semantic_turn_ends.labels(decision)

    def track(self, active_calls: Callable[[], int], pipeline: Any | None) -> None:
        """Read the live call count and (when there is one) the pipeline's state at scrape
        time."""
        Gauge("omnivox_active_calls", "Calls held now", registry=self.registry).set_function(
            active_calls)
        if pipeline is not None:
            self.registry.register(PipelineCollector(pipeline))

    def call_ended(self, reason: str) -> None:
        """Count the call as dropped when it ended for want of a working connection."""
        if reason in DROPS:
            self.calls_dropped.labels(reason).inc()

    def first_audio(self, seconds: float) -> None:
        self.time_to_first_audio.observe(seconds)

    def turn_ended(self, outcome: str, usage: Mapping[str, Any] | None) -> None:
        """Count the turn; a completed one also reports when each stage first answered."""
        self.turns.labels(outcome).inc()
        for stage, mark in STAGE_MARKS.items():
            if usage and usage.get(mark) is not None:
                self.stage_latency.labels(stage).observe(usage[mark])

    def model_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.model_requests.labels(endpoint, str(status)).inc()
        self.model_answer_latency.labels(endpoint).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class PipelineCollector(Collector):
    """Worker restarts (the supervisor's counts) and shared-memory blocks, read when scraped."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        restarts = CounterMetricFamily("omnivox_worker_restarts",
                                       "Stage worker restarts by the supervisor", labels=["stage"])
        for stage, status in self.pipeline.health().stages.items():
            restarts.add_metric([stage], getattr(status, "restarts", 0))
        yield restarts
        pool = getattr(self.pipeline, "pool", None)  # None until started, and after stop
        if pool is not None:
            yield GaugeMetricFamily("omnivox_shm_blocks_in_use",
                                    "Shared-memory blocks held by any process", value=pool.in_use)
            yield GaugeMetricFamily("omnivox_shm_blocks", "Shared-memory blocks in the pool",
                                    value=pool.block_count)


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition (unauthenticated, like /healthz)."""
    return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


class PacingCollector(Collector):
    """The outbound pacers' frame lateness (media/pacing.py), read at scrape time: one record
    per process, whichever app scrapes it."""

    def __init__(self, lateness: PacingLateness) -> None:
        self.lateness = lateness

    def collect(self) -> Iterator[HistogramMetricFamily]:
        lateness = self.lateness
        cumulative, buckets = 0, []
        for bound, count in zip((*lateness.bounds, float("inf")), lateness.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        yield HistogramMetricFamily(
            "omnivox_pacing_lateness_seconds", "How late the outbound pacers handed each call's "
            "20 ms frames to the sender, against their clock", buckets=buckets,
            sum_value=lateness.total_s)
