"""Model-serving engines the stages drive (vLLM), and the version pins they must match."""
