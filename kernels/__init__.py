"""Associative-memory primitives, installed as `edgemem.kernels`.

Like flash-linear-attention's `ops/`, each primitive has a reference and faster versions, tested
against each other by one suite (tests/test_kernels.py):

- `reference`: PyTorch, the equations of `edgemem.memory` (DPFP-nu, read, delta-rule write with the
  gamma-corrected normaliser).
- `triton_ops`: fused Triton kernels with the same signatures (`pip install 'edgemem[kernels]'`);
  compiled on a GPU, interpreted on a CPU under TRITON_INTERPRET=1 for correctness.
"""

from edgemem.memory import dpfp, memory_read, memory_write, write_gamma

__all__ = ["dpfp", "memory_read", "memory_write", "write_gamma"]
