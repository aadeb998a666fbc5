"""omnivox's vLLM general plugin (pipeline/engines/vllm_plugin.py): installed where vLLM looks
for it, loaded by vLLM's engine core, and freezing the heap at exit only in the engine
processes omnivox starts."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

from pipeline.engines import vllm_plugin

# In a fresh interpreter: a handler registered before the plugin runs after the plugin's (atexit
# runs last-in first-out) and says whether the heap was frozen by then.
AT_EXIT = ("import atexit, gc, importlib.metadata as m\n"
           "atexit.register(lambda: print('frozen' if gc.get_freeze_count() else 'unfrozen'))\n"
           "(plugin,) = [p for p in m.entry_points(group='vllm.general_plugins')"
           " if p.name == 'omnivox']\n"
           "plugin.load()()\n")


def test_vllm_finds_the_plugin_and_its_engine_core_loads_general_plugins() -> None:
    from importlib.metadata import entry_points

    from vllm import plugins
    from vllm.v1.engine.core import EngineCore

    assert plugins.DEFAULT_PLUGINS_GROUP == "vllm.general_plugins"
    found = {p.name: p for p in entry_points(group=plugins.DEFAULT_PLUGINS_GROUP)}
    assert found["omnivox"].load() is vllm_plugin.register
    assert "load_general_plugins()" in inspect.getsource(EngineCore.__init__), (
        "vLLM's EngineCore no longer loads general plugins: omnivox's engine cores would "
        "collect their heap at exit again (pipeline/engines/vllm_plugin.py)")


def at_exit(freeze: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != vllm_plugin.FREEZE_AT_EXIT}
    if freeze is not None:
        env[vllm_plugin.FREEZE_AT_EXIT] = freeze
    done = subprocess.run([sys.executable, "-c", AT_EXIT], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_heap_is_frozen_at_exit_only_where_omnivox_started_the_engine() -> None:
    assert at_exit("1") == "frozen"
    assert at_exit(None) == "unfrozen"
    assert at_exit("0") == "unfrozen"
