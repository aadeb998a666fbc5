"""Model serving: the versions this server runs side by side, which one each caller gets, and
the rollouts that move callers from one version to another."""
