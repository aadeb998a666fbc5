"""Benchmarks: `omnivox bench turn|calls|pipeline` and their callers, servers and reports."""
