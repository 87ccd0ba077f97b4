"""Kernels and the products policies that choose them.

One room for everything that decides *how* a matrix product, an attention or a norm is computed:

- `products`: the policies (aten, onednn, invariant, hopper), `choose` (the one chooser, with its reason)
  and `check_kind` (why a requested kind cannot run here, and the fix);
- `invariant_gemm`, `invariant_attention`, `invariant_norm`: batch-invariant kernels (Triton on CUDA, a
  fixed-order torch path elsewhere) so that a row's output does not depend on the rows beside it;
- `hopper`: a bf16 decode layer for sm_90 (bulk-copy products and attention as programmatic dependent launches),
  built with nvcc at first use from `hopper.cu`;
- `int8`: the weight-only int8 draft products;
- `topk`: the draft's top-k, with a Triton kernel;
- `compiling`, `graphs`: torch.compile wrappers and CUDA-graph recording.

`eaglekit kernels check` (`check.main`) says which kinds run on this machine and why the others do not, builds
the ones that run and checks their bits (batch invariance, values against torch).
This package imports nothing from eaglekit above `errors` and `capture`.
"""
