"""DeepSeek's mixture of experts: the router (V2 softmax, V3 / Kimi-K2 sigmoid with correction bias and
group-limited top-k), the routed experts as stacked weights, the shared experts.

The routed experts' weights are stacked as transformers 5 holds them (gate_up_proj [E, 2I, D], down_proj
[E, D, I]); a checkpoint's per-expert tensors are stacked at load. How a call runs its experts:

- gather (decode calls): each token indexes the stacked weights by its own top-k ids, so it reads the bytes of
  its k experts and nothing else, with fixed shapes and no host sync (CUDA graphs record it). A token's result
  depends on its row alone, so a token stepped alone and the same token in a verified tree get the same bits
  from the same kernels. Compiled (torch.compile), the product is written as a multiply and a sum, which inductor
  makes one reduction kernel that loads the indexed weights in place; eager, the indexed weights are copied and
  multiplied (memory k x expert size a token).
- loop (prompts, feature extraction): the experts any token chose, one after the other (a host read of which
  experts were hit; not recordable). Prompts through the prompt graph (compiling.compile_prompt: one graph for every
  length, no host read) run grouped where it runs, else dense.
- dense (larger calls while a CUDA graph records, eager): every expert on every token, weights zero where not
  chosen: fixed shapes, reads every expert once.
- triton (opt-in: `mode = "triton"`, DeepSeekTarget.set_experts): a decode call's pairs through
  eaglekit.kernels.moe_gemv's two kernels (gate/up with the activation, then down with the weighted sum), eager or
  compiled, where that module runs (bf16/fp16 on CUDA); other calls choose per call as above.
- grouped (opt-in: `mode = "grouped"`): the (token, expert) pairs sorted by expert and run as two grouped GEMMs
  (torch._grouped_mm: one CUTLASS kernel over the experts any pair chose, an expert's weights streamed once per call
  whatever number of the call's tokens chose it; no host sync, so CUDA graphs record it). Where gather reads an expert
  once per pair, a verified tree whose tokens share experts reads each shared expert once. A pair's row is computed
  alone in its tile (no split over K; the tile shape is fixed for decode-sized calls, see grouped_usable), so a
  token's bits do not depend on the other rows. Runs where torch's kernel runs without a host sync (bf16 on sm_90 /
  sm_100) and, through torch's reference loop, on a CPU (tests); elsewhere the per-call choice above.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .deepseek_config import DeepSeekConfig
from .layers import MLP

# eager calls with at most this many (token, expert) pairs gather; more copy too many weights
GATHER_MAX_PAIRS = 16


def grouped_usable(h: torch.Tensor, widths: tuple[int, ...]) -> bool:
    """Whether torch._grouped_mm runs h's call without a host sync: bf16 on a GPU of compute capability 9 or 10 with
    every width (`widths`: hidden and expert intermediate) a multiple of 8 (CUTLASS reads rows in 16-byte pieces;
    elsewhere on CUDA torch loops over the groups after reading the offsets to the host, which a CUDA graph cannot
    record), or a CPU in float32 / bf16 / fp16 (that loop: tests; bf16 alone under torch.compile, whose shape rule
    for the op takes bf16 only). The CUDA kernel picks its tile from the call's rows per expert (64 x 128 x 128 at
    <= 128, so for every decode call)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    if h.device.type == "cpu":
        return h.dtype == torch.bfloat16 or (
            h.dtype in (torch.float32, torch.float16) and not torch.compiler.is_compiling()
        )
    # (get_device_properties, not get_device_capability: torch.compile folds the former to a constant at trace time,
    # so the compiled layer keeps no call for it)
    return (
        h.is_cuda
        and h.dtype == torch.bfloat16
        and all(n % 8 == 0 for n in widths)
        and torch.cuda.get_device_properties(h.device).major in (9, 10)
    )


def _acc(x: torch.Tensor) -> torch.dtype:
    """The dtype the weighted sum of experts accumulates in: float32, or x's own where wider (float64 tests)."""
    return torch.promote_types(x.dtype, torch.float32)


class Router(nn.Module):
    """transformers' DeepseekV3TopkRouter / DeepseekV2TopkRouter: weight [E, D] (float32), and for sigmoid
    scoring e_score_correction_bias [E] (float32)."""

    e_score_correction_bias: torch.Tensor | None  # a buffer under sigmoid scoring, else None

    def __init__(self, c: DeepSeekConfig):
        super().__init__()
        self.c = c
        E = c.n_routed_experts
        self.weight = nn.Parameter(torch.zeros(E, c.hidden_size, dtype=torch.float32))
        if c.scoring == "sigmoid":
            self.register_buffer("e_score_correction_bias", torch.zeros(E, dtype=torch.float32))
        else:
            self.e_score_correction_bias = None

    def _group_mask(self, choice: torch.Tensor, group_score) -> torch.Tensor:
        c = self.c
        N, E = choice.shape
        groups = group_score(choice.view(N, c.n_group, E // c.n_group))  # [N, G]
        picked = torch.topk(groups, k=c.topk_group, dim=-1, sorted=False)[1]
        keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, picked, True)
        return keep[:, :, None].expand(N, c.n_group, E // c.n_group).reshape(N, E)

    def forward(self, h: torch.Tensor):
        """h [N, D] -> (expert ids [N, k], weights [N, k] float32)."""
        c = self.c
        logits = F.linear(h.float(), self.weight.float())
        if c.scoring == "sigmoid":
            scores = logits.sigmoid()
            assert self.e_score_correction_bias is not None  # (a buffer under sigmoid scoring)
            choice = scores + self.e_score_correction_bias
            if c.n_group > 1:
                keep = self._group_mask(choice, lambda g: g.topk(2, dim=-1)[0].sum(dim=-1))
                choice = choice.masked_fill(~keep, float("-inf"))
            idx = torch.topk(choice, k=c.num_experts_per_tok, dim=-1, sorted=False)[1]
            w = scores.gather(1, idx)
            if c.norm_topk_prob:
                w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        else:
            scores = logits.softmax(dim=-1)
            if c.topk_method == "group_limited_greedy" and c.n_group > 1:
                keep = self._group_mask(scores, lambda g: g.max(dim=-1).values)
                scores = scores.masked_fill(~keep, 0.0)
            w, idx = torch.topk(scores, k=c.num_experts_per_tok, dim=-1, sorted=False)
        return idx, w * c.routed_scaling_factor


class Experts(nn.Module):
    """The routed experts, stacked: gate_up_proj [E, 2I, D] (gate rows first), down_proj [E, D, I]."""

    def __init__(self, c: DeepSeekConfig):
        super().__init__()
        E, I, D = c.n_routed_experts, c.moe_intermediate_size, c.hidden_size
        self.I = I
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, D))
        self.down_proj = nn.Parameter(torch.empty(E, D, I))
        # None: chosen per call (module docstring); or one of gather, fused, loop, dense, triton, grouped
        self.mode: str | None = None

    def _act(self, gu):
        g, u = gu.split(self.I, dim=-1)
        return F.silu(g) * u

    def gather(self, h, idx, w, fused: bool):
        """Each token through its own k experts' weights, indexed from the stack."""
        if fused:  # one reduction kernel each under inductor, loading the indexed rows in place
            a = self._act((self.gate_up_proj[idx] * h[:, None, None, :]).sum(-1))  # [N, k, I]
            y = (self.down_proj[idx] * a[:, :, None, :]).sum(-1)  # [N, k, D]
        else:
            a = self._act(torch.matmul(self.gate_up_proj[idx], h[:, None, :, None]).squeeze(-1))
            y = torch.matmul(self.down_proj[idx], a[..., None]).squeeze(-1)
        return (y.to(_acc(h)) * w[..., None]).sum(1).to(h.dtype)

    def grouped(self, h, idx, w):
        """The pairs sorted by expert (a stable sort: within an expert, pairs keep their tokens' order), two grouped
        GEMMs over the stacked weights (offsets: where each expert's rows end, counted on the device), the results put
        back in pair order and weighted in gather's fixed order."""
        N, k = idx.shape
        flat = idx.reshape(-1)
        order = torch.sort(flat, stable=True)[1]
        counts = torch.zeros(self.gate_up_proj.shape[0], dtype=torch.int32, device=h.device)
        counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offs = counts.cumsum(0, dtype=torch.int32)
        rows = h.index_select(0, order // k)  # [N k, D]: the token of each sorted pair
        a = self._act(torch._grouped_mm(rows, self.gate_up_proj.transpose(1, 2), offs=offs))  # [N k, I]
        y = torch._grouped_mm(a, self.down_proj.transpose(1, 2), offs=offs)  # [N k, D], sorted
        y = torch.empty_like(y).index_copy_(0, order, y).view(N, k, -1)  # back in pair order
        return (y.to(_acc(h)) * w[..., None]).sum(1).to(h.dtype)

    def loop(self, h, idx, w):
        out = torch.zeros(h.shape[0], h.shape[1], dtype=_acc(h), device=h.device)
        for e in torch.unique(idx).tolist():
            tok, slot = (idx == e).nonzero(as_tuple=True)
            a = self._act(F.linear(h[tok], self.gate_up_proj[e]))
            out.index_add_(0, tok, F.linear(a, self.down_proj[e]).to(out.dtype) * w[tok, slot, None])
        return out.to(h.dtype)

    def dense(self, h, idx, w):
        a = self._act(torch.einsum("nd,efd->enf", h, self.gate_up_proj))  # [E, N, I]
        y = torch.einsum("enf,edf->end", a, self.down_proj)  # [E, N, D]
        dense_w = torch.zeros(h.shape[0], y.shape[0], dtype=_acc(h), device=h.device).scatter_(1, idx, w.to(_acc(h)))
        return torch.einsum("end,ne->nd", y.to(_acc(h)), dense_w).to(h.dtype)

    def forward(self, h, idx, w, prompt: bool = False):
        """`prompt`: a call of the prompt graph (compiling.compile_prompt), whose token count is any: compiled, it runs
        grouped where that runs, else dense (each expert read once; gather would read an expert once per pair)."""
        mode = self.mode
        if mode == "triton":
            from ..kernels import moe_gemv

            if moe_gemv.usable(h, idx.numel()):
                return moe_gemv.experts(h, self.gate_up_proj, self.down_proj, idx, w)
            mode = None  # (a prompt, float32, a CPU: the per-call choice)
        elif mode == "grouped":
            if grouped_usable(h, (h.shape[-1], self.I)):
                return self.grouped(h, idx, w)
            mode = None  # (float64, fp16 or float32 on a GPU, a GPU before sm_90: the per-call choice)
        if mode is None:
            if torch.compiler.is_compiling() and prompt:
                if grouped_usable(h, (h.shape[-1], self.I)):
                    return self.grouped(h, idx, w)
                mode = "dense"
            elif torch.compiler.is_compiling():
                mode = "fused"
            elif idx.numel() <= GATHER_MAX_PAIRS:
                mode = "gather"
            elif h.is_cuda and torch.cuda.is_current_stream_capturing():
                mode = "dense"
            else:
                mode = "loop"
        if mode in ("gather", "fused"):
            return self.gather(h, idx, w, fused=mode == "fused")
        return self.loop(h, idx, w) if mode == "loop" else self.dense(h, idx, w)


class MoE(nn.Module):
    """Names as transformers' DeepseekV3MoE: gate (the router), experts, shared_experts."""

    def __init__(self, c: DeepSeekConfig):
        super().__init__()
        self.gate = Router(c)
        self.experts = Experts(c)
        self.shared_experts = (
            MLP(c.hidden_size, c.moe_intermediate_size * c.n_shared_experts, bias=c.mlp_bias)
            if c.n_shared_experts
            else None
        )

    def forward(self, x, prompt: bool = False):
        B, T, D = x.shape
        h = x.reshape(B * T, D)
        idx, w = self.gate(h)
        y = self.experts(h, idx, w, prompt).view(B, T, D)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y
