"""Model stages: stage contract, shared-memory pool, workers, supervisor, engines, families."""
