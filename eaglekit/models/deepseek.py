"""Our DeepSeek-family decoder (DeepSeek-V2 / V2-Lite, DeepSeek-V3 / R1, Kimi-K2): MLA attention over a static
latent cache (eaglekit.models.mla) and DeepSeek's mixture of experts (eaglekit.models.moe), the first
`first_k_dense_replace` layers dense.

Parameter names match transformers' DeepseekV3ForCausalLM / DeepseekV2ForCausalLM (the checkpoints' names); a
checkpoint's per-expert tensors (mlp.experts.<e>.gate_proj.weight, ...) are stacked at load, and layers past
num_hidden_layers (DeepSeek-V3's multi-token-prediction layer, model.layers.61) are not read. The residual stream
after any layer can be captured (CaptureSpec.after_layers; -1 is the embedding), as in eaglekit.models.llama.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import InputError
from ..kernels.compiling import in_prompt
from .base import StaticCacheTarget, TargetInfo, take_last
from .deepseek_config import DeepSeekConfig, load_deepseek_config
from .layers import COMPILE_MAX_TOKENS, MLP, RMSNorm, own_row, span_mask_rows
from .mla import MLA, LatentCache, MLARotary, RowLatent
from .moe import MoE
from .weights import load_state_dict_into, read_folder_tensors


class DeepSeekLayer(nn.Module):
    def __init__(self, c: DeepSeekConfig, index: int):
        super().__init__()
        self.self_attn = MLA(c)
        self.mlp = MoE(c) if c.is_moe(index) else MLP(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, kv=None, slots=None, mask=None, prompt: bool = False):
        """`prompt`: a call of the prompt graph (the experts' way for a token count that changes: moe.Experts)."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, slots, mask)
        h = self.post_attention_layernorm(x)
        return x + (self.mlp(h, prompt) if isinstance(self.mlp, MoE) else self.mlp(h))


class _Body(nn.Module):
    def __init__(self, c: DeepSeekConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DeepSeekLayer(c, i) for i in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


def _span_dynamic(mask, kv):
    """Before a compiled call: the cache rows passed narrowed to the span S (mask [.., T, S]), S a symbolic size, so
    a new span does not compile again (as eaglekit.kernels.compiling.span_dynamic for [B, H, S, hd] caches)."""
    from torch._dynamo import maybe_mark_dynamic

    S = mask.shape[-1]
    kv = kv[:, :S]
    maybe_mark_dynamic(mask, mask.dim() - 1)
    maybe_mark_dynamic(kv, 1)
    return kv


class DeepSeekModel(nn.Module):
    """The network itself: ids -> (final normed hidden, captured residual streams)."""

    def __init__(self, c: DeepSeekConfig):
        super().__init__()
        self.config = c
        self.model = _Body(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = MLARotary(c)
        self.compiled_layer = None  # set by DeepSeekTarget.compile()
        self.prompt_layer = None  # set by DeepSeekTarget.compile_prompts()

    def forward(self, ids, positions, cache=None, slots=None, mask=None, capture: tuple[int, ...] = ()):
        """ids [B, T]; positions [T] or [B, T]; cache a LatentCache / RowLatent (or None: attention over the T
        tokens, causal); mask [B|1, T, S]. -> (normed hidden [B, T, H], features [B, T, C*H] | None)."""
        x = self.model.embed_tokens(ids)
        caught = {}
        if -1 in capture:
            caught[-1] = x
        cos, sin = self.rotary(positions, x.dtype)
        # the compiled layer serves the small fixed shapes of decoding; prompts run plain, or through the one graph
        # compiled for every length (prompt_layer)
        prompt = in_prompt()
        fast = (
            self.compiled_layer
            if (
                self.compiled_layer is not None
                and cache is not None
                and not prompt
                and ids.shape[1] <= COMPILE_MAX_TOKENS
            )
            else None
        )
        any_length = (
            self.prompt_layer if prompt and cache is not None and ids.shape[0] == 1 and ids.shape[1] > 1 else None
        )
        for i, layer in enumerate(self.model.layers):
            kv = cache.layer(i) if cache is not None else None
            if fast is not None:
                x = fast(layer, x, cos, sin, _span_dynamic(mask, kv), slots, mask)
            elif any_length is not None:
                x = any_length(layer, x, cos, sin, kv, slots, mask, True)
            else:
                x = layer(x, cos, sin, kv, slots, mask)
            if i in capture:
                caught[i] = x
        feats = torch.cat([caught[i] for i in capture], dim=-1) if capture else None
        return self.model.norm(x), feats


# a checkpoint's per-expert tensors: model.layers.<l>.mlp.experts.<e>.<gate|up|down>_proj.weight
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def convert_checkpoint(tensors: dict[str, torch.Tensor], c: DeepSeekConfig, folder) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors -> this module's state dict: per-expert weights stacked (gate_up_proj = [gate; up]
    per expert), layers past num_hidden_layers (multi-token prediction) dropped. Tensors already stacked (as
    transformers 5 holds them) pass as they are."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}  # layer prefix -> expert -> its weights by name
    for k, v in tensors.items():
        m = _LAYER.match(k)
        if m and int(m.group(1)) >= c.num_layers:
            continue
        e = _EXPERT.match(k)
        if e:
            experts.setdefault(e.group(1), {}).setdefault(int(e.group(2)), {})[e.group(3)] = v
        else:
            out[k] = v
    E = c.n_routed_experts
    for prefix, per in experts.items():
        missing = [i for i in range(E) if i not in per or len(per[i]) != 3]
        if missing:
            raise InputError(
                f"checkpoint in {folder} lacks weights of {len(missing)} experts of {prefix} (e.g. expert "
                f"{missing[0]}); config.json says n_routed_experts {E}",
                fix="check that config.json belongs to these weights",
                code="E107",
            )
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([per[i]["gate_proj"], per[i]["up_proj"]]) for i in range(E)]
        )
        out[f"{prefix}.down_proj"] = torch.stack([per[i]["down_proj"] for i in range(E)])
        per.clear()
    return out


class DeepSeekTarget(StaticCacheTarget):
    """A target backed by our DeepSeek-family decoder (the interface and behaviour of models.llama.LlamaTarget)."""

    backend = "deepseek"
    compiles = True

    def __init__(self, net: DeepSeekModel, device, dtype):
        self.net = net.eval()
        self.config = c = net.config
        self.device, self.dtype = torch.device(device), dtype
        self.experts = "auto"  # the routed experts' mode (set_experts)
        self.info = TargetInfo(
            c.family,
            c.vocab_size,
            c.hidden_size,
            c.num_layers,
            c.max_position_embeddings,
            c.eos_token_ids,
            c.fingerprint,
        )
        self.cache: LatentCache | None = None

    @classmethod
    def from_folder(cls, folder, device="cpu", dtype=torch.float32) -> "DeepSeekTarget":
        folder = Path(folder)
        cfg = load_deepseek_config(folder)
        with torch.device("meta"):
            net = DeepSeekModel(cfg)
        tensors = convert_checkpoint(read_folder_tensors(folder, "target"), cfg, folder)
        if cfg.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)
        router = {k: v for k, v in tensors.items() if k.endswith((".mlp.gate.weight", ".e_score_correction_bias"))}
        load_state_dict_into(
            net,
            tensors,
            folder,
            dtype=dtype,
            device=device,
            tied={"lm_head.weight": "model.embed_tokens.weight"} if cfg.tie_word_embeddings else {},
        )
        for k, v in router.items():  # the router stays float32 (its scores decide which experts run)
            mod, _, name = k.rpartition(".")
            t = v.to(device=device, dtype=torch.float32)
            m = net.get_submodule(mod)
            if name == "weight":
                m.weight = nn.Parameter(t, requires_grad=False)
            else:
                m.e_score_correction_bias = t
        net.rotary = MLARotary(cfg).to(device)
        target = cls(net, device, dtype)
        target.fuse()
        return target

    # --- Target interface --------------------------------------------------------------------------
    static = True

    def reset(self, span: int) -> None:
        c = self.config
        if self.cache is None or self.cache.max_len < span:
            self.cache = LatentCache(c.num_layers, c.latent_width, span, 1, self.device, self.dtype)
        self.cache.length.zero_()
        self.span = span

    def _layers(self, capture) -> tuple[int, ...]:
        return capture.validate(self.config.num_layers).after_layers if capture is not None else ()

    # --- batched decoding ----------------------------------------------------------------------------
    def row_cache(self, batch: int, span: int) -> RowLatent:
        if batch == 1:  # a batch of one is the target's own sequence (the one-request Decoder's)
            return own_row(self, span, RowLatent.over)
        c = self.config
        return RowLatent(c.num_layers, c.latent_width, span, batch, self.device, self.dtype)

    @torch.inference_mode()
    def _forward_rows(self, kv, ids, depths, block, span, capture=None, last=False):
        T = ids.shape[1]
        L = kv.length
        slots = L[:, None] + torch.arange(T, device=self.device)
        mask = span_mask_rows(L, block, span, None, depths)
        h, feats = self.net(ids, L[:, None] + depths, kv, slots, mask, self._layers(capture))
        return self.net.lm_head(take_last(h, last)).float(), feats

    def compile(self, options: dict | None = None) -> None:
        """torch.compile the decoder layer for the decode shapes (one compiled graph per token count and layer kind,
        dense or MoE, shared by the layers of that kind; the engine records the compiled kernels in its CUDA
        graphs). Compiled, a token's experts run as fused gathers of the stacked weights (eaglekit.models.moe)."""
        from ..kernels.compiling import compile_decode

        self.net.compiled_layer = compile_decode(DeepSeekLayer.forward, options, self.config.hidden_size)

    def compile_prompts(self, on: bool = True) -> None:
        """Prompts through one graph of the layer compiled for every length (compiling.compile_prompt; the routed
        experts grouped where torch's grouped GEMM runs, else dense), or (off) through the plain layers again."""
        from ..kernels.compiling import compile_prompt

        self.net.prompt_layer = compile_prompt(DeepSeekLayer.forward) if on else None

    @property
    def compiled_prompts(self) -> bool:
        return self.net.prompt_layer is not None

    @property
    def compiled_layers(self) -> bool:
        return self.net.compiled_layer is not None

    def set_experts(self, mode: str | None) -> None:
        """How the routed experts run (eaglekit.models.moe.Experts.mode; `--experts`): None chooses per call;
        "triton" sends decode calls to eaglekit.kernels.moe_gemv (slower than inductor's gathers on an H200 and an
        H100); "grouped" runs a call's pairs as two grouped GEMMs (on an H100 the V2-Lite shape's step 4-7% slower than
        the gathers, its (3,1,4) cycle 1.23x faster: docs/performance.md#d33). Set before compile()."""
        from .moe import Experts

        if mode not in (None, "gather", "fused", "loop", "dense", "triton", "grouped"):
            raise ValueError(f"unknown experts mode {mode!r}")
        for m in self.net.modules():
            if isinstance(m, Experts):
                m.mode = mode
        self.experts = mode or "auto"

    def fuse(self) -> None:
        """Fused gate/up projections of the dense and shared-expert MLPs, and MLA's q (or q_a) with kv_a (same
        memory, fewer kernels)."""
        for m in self.net.modules():
            if isinstance(m, (MLP, MLA)):
                m.fuse()

    @torch.no_grad()
    def features(self, ids, pad_mask=None, capture=None):
        # batches are right-padded, so plain causal attention is exact for every real token
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.net(ids, pos, None, None, None, self._layers(capture))

    def lm_head_weight(self):
        return self.net.lm_head.weight

    def embed_weight(self):
        return self.net.model.embed_tokens.weight
