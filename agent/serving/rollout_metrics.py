"""/metrics for model serving: each served version's state, calls and default flag, and the
rollout in progress (or the last one): its phase and the share of new callers it has moved."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.serving.registry import ModelRegistry
from agent.serving.rollout import Rollouts
from agent.serving.rollout_state import Phase


class RolloutCollector(Collector):
    """Read at scrape time from the registry and the rollouts."""

    def __init__(self, models: ModelRegistry, rollouts: Rollouts) -> None:
        self.models = models
        self.rollouts = rollouts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        versions = GaugeMetricFamily(
            "omnivox_model_version", "A served model version (1), by state and whether it is "
            "its name's default", labels=["model", "state", "default"])
        calls = GaugeMetricFamily("omnivox_model_version_calls",
                                  "Live calls on each served model version", labels=["model"])
        for served in self.models.versions():
            default = str(self.models.is_default(served)).lower()
            versions.add_metric([served.id, str(served.state), default], 1)
            calls.add_metric([served.id], served.calls)
        yield versions
        yield calls
        state = self.rollouts.state
        if state is None:
            return
        phase = GaugeMetricFamily(
            "omnivox_rollout_phase", "The last rollout's phase (1 for the one it is in)",
            labels=["target", "previous", "strategy", "phase"])
        for each in Phase:
            phase.add_metric([state.target_id, state.previous_id, str(state.strategy),
                              str(each)], int(each == state.phase))
        yield phase
        yield GaugeMetricFamily("omnivox_rollout_percent", "Share of new unpinned callers "
                                "the rollout sends to its target now (%)", value=state.percent)
