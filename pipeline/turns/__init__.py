"""The requests run through the stages: the `Pipeline` handle, a turn's cascade, text replies."""
