"""One Prometheus exposition from several processes' (a front and its call workers): each
family once, the front's samples as they are, each worker's with a `call_worker` label, so
counters and histograms add up across the label (the calls' pacing, drops, refusals)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

WORKER_LABEL = "call_worker"


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def merged(own: bytes, workers: dict[str, str]) -> bytes:
    """`own` exposition with each worker's (by its label value) merged in."""
    families: dict[str, Metric] = {}
    sources = [(None, own.decode()), *workers.items()]
    for worker, text in sources:
        for family in text_string_to_metric_families(text):
            into = families.setdefault(family.name, Metric(
                family.name, family.documentation, family.type, family.unit))
            for sample in family.samples:
                labels = sample.labels if worker is None else {**sample.labels,
                                                               WORKER_LABEL: worker}
                into.add_sample(sample.name, labels, sample.value, sample.timestamp,
                                sample.exemplar)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)
