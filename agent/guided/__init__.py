"""Guided decoding as the API surfaces use it: which JSON schemas it honours exactly, and
function calling built on it."""
