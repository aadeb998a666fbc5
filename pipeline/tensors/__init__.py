"""How tensors cross between processes: the shared-memory block pool, its leases, CUDA IPC."""
