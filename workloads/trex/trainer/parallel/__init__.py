"""The parallel trainer: mesh, tensor/expert parallelism, FSDP2, distributed Muon (see parallelize.py)."""
