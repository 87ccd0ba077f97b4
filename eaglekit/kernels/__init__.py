"""Kernels and the products policies that choose them.

One room for everything that decides *how* a matrix product, an attention or a norm is computed:

- `products`: the policies (aten, onednn, invariant, hopper), `choose` (the one chooser, with its reason)
  and `check_kind` (why a requested kind cannot run here, and the fix);
- `invariant_gemm`, `invariant_attention`, `invariant_norm`: batch-invariant kernels (Triton on CUDA, a
  fixed-order torch path elsewhere) so that a row's output does not depend on the rows beside it;
- `hopper`: the bulk-copy (TMA) GEMV for small-M products on sm_90, JIT-built from `hopper.cu`;
- `int8`: the weight-only int8 draft products;
- `topk`: the draft's top-k, with a Triton kernel;
- `compiling`, `graphs`: torch.compile wrappers and CUDA-graph recording.

`python -m eaglekit kernels check` (or `eaglekit kernels check`) builds and checks each kernel on this machine.
This package imports nothing from eaglekit above `errors` and `capture`.
"""
