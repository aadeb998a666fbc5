"""A server's /metrics as the tests read it: every sample by name and labels."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(url: str) -> Samples:
    """Every sample /metrics shows, by (sample name, labels)."""
    async with httpx.AsyncClient(base_url=url, timeout=15) as http:
        reply = await http.get("/metrics")
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(reply.text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def grew(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def refused(samples: Samples, reason: str) -> float:
    """Offers refused for `reason` so far (a reason never counted has no sample yet: 0)."""
    return samples.get(("omnivox_calls_refused_total", frozenset({("reason", reason)})), 0.0)
