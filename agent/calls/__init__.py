"""Per-call plumbing: one WebRTC call, the registry of calls, and per-call limits."""
