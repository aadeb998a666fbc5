"""Model stages: the stage contract, the tensor transport, the stage runtime, the turn logic,
engines and families."""
