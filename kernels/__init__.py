"""Associative-memory primitives, installed as `edgemem.kernels`.

The PyTorch reference implementations live in `edgemem.memory` (one obvious place for the
equations); this package re-exports them as the reference that faster versions (fused Triton
kernels, a TensorRT plugin) are tested against.
"""

from edgemem.memory import dpfp, memory_read, memory_write, write_gamma

__all__ = ["dpfp", "memory_read", "memory_write", "write_gamma"]
