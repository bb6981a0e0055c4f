"""The PyTorch reference of the associative-memory primitives (the equations live in
`edgemem.memory`; this is the name the fused versions are tested against)."""

from edgemem.memory import EPS, dpfp, memory_read, memory_write, write_gamma

__all__ = ["EPS", "dpfp", "memory_read", "memory_write", "write_gamma"]
