"""Tiny random DeepSeek-family models (transformers' own classes) saved as ordinary Hugging Face folders."""

from __future__ import annotations

from pathlib import Path

import torch

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0}

# the parity grid: (name, family, options); every one has >= 7 layers, dense first layers and MoE layers
CONFIGS = {
    "v3-qlora": ("deepseek_v3", dict(q_lora=True)),
    "v3-noqlora-yarn": ("deepseek_v3", dict(q_lora=False, yarn=True)),
    "v3-halfrope": ("deepseek_v3", dict(q_lora=True, rope_interleave=False, n_group=1, topk_group=1)),
    "v2-greedy": ("deepseek_v2", dict(q_lora=False, topk_method="greedy")),
    "v2-group-yarn": ("deepseek_v2", dict(q_lora=True, topk_method="group_limited_greedy", yarn=True)),
}


def ds_config(family: str = "deepseek_v3", layers: int = 7, vocab: int = 96, hidden: int = 64, q_lora: bool = True,
              yarn: bool = False, **over):
    from transformers import DeepseekV2Config, DeepseekV3Config

    base = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=96, moe_intermediate_size=32,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                n_routed_experts=8, kv_lora_rank=32, q_lora_rank=48 if q_lora else None, qk_rope_head_dim=8,
                v_head_dim=16, qk_nope_head_dim=16, num_experts_per_tok=2, first_k_dense_replace=2,
                max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                tie_word_embeddings=False)
    if family == "deepseek_v2":
        base.update(topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=1.5,
                    n_shared_experts=2)
    else:
        base.update(n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True)
    if yarn:
        base["rope_parameters"] = dict(YARN)
    base.update(over)
    return (DeepseekV2Config if family == "deepseek_v2" else DeepseekV3Config)(**base)


def make_ds_model(folder: Path | None, family: str = "deepseek_v3", seed: int = 0, std: float = 0.5, **over):
    """Build and randomise (large init: logits far from ties; a random correction bias) a tiny model; save it to
    `folder` when given. -> the transformers model (float32, eval)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(ds_config(family, **over), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * std / max(p.shape[-1], 1) ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    model.eval()
    if folder is not None:
        model.save_pretrained(Path(folder))
    return model


def ds_oracle(target, first_token: int, noise: float = 0.0, seed: int = 0):
    """helpers.OracleDraft / NoisyOracleDraft over a DeepSeek target: the draft runs the target's own network (its
    forward takes the same arguments as the Llama network's) on a latent cache of its own."""
    from helpers import NoisyOracleDraft

    from eaglekit.models.mla import LatentCache

    class DSOracle(NoisyOracleDraft):
        def __init__(self):
            self.net, self.first, self.device, self._dtype = target.net, first_token, target.device, target.dtype
            self.noise, self.gen = noise, torch.Generator().manual_seed(seed)
            self._committed = torch.zeros((), dtype=torch.long)

        @property
        def draft_vocab_size(self):
            return target.info.vocab_size

        def reset(self, span):
            c = target.config
            self.kv = LatentCache(c.num_layers, c.latent_width, span + 2, 1, self.device, self.dtype)
            self._committed = torch.zeros((), dtype=torch.long)
            self.span = span

        def _run(self, ids, positions, slots, mask):
            logits = super(NoisyOracleDraft, self)._run(ids, positions, slots, mask)
            if self.noise:
                logits = logits + self.noise * torch.randn(logits.shape, generator=self.gen, dtype=logits.dtype)
            return logits

    return DSOracle()
