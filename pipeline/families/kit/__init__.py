"""The family kit: what the model families share (stage bases, work threads, the queued and
batched VoiceBoxes, build steps, the recogniser, prompt and sampling helpers, the adapters to
libraries' internals). Every family imports it; it imports no family (`lint-imports`)."""
