"""A draft folder in the SpecForge / SGLang layout, written by hand (no eaglekit block), shared by the draft,
interop, doctor and error tests."""

import json

import torch
from safetensors.torch import save_file


def write_specforge_folder(folder, H=64, Ht=64, heads=4, kv=2, inter=96, vocab=96, dvocab=48, layer_ids=(1, 3, 4),
                           seed=0, ids_key="eagle_config", with_d2t=True, extra_cfg=None, n_caps=3):
    """A draft folder as SpecForge writes it: no eaglekit block, ids in the 'output of layer' meaning."""
    g = torch.Generator().manual_seed(seed)
    hd = H // heads

    def r(*shape):
        return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(torch.bfloat16)

    hot = torch.randperm(vocab, generator=g)[:dvocab].sort().values  # the target ids the draft may propose
    w = {
        "fc.weight": r(H, n_caps * Ht),
        "midlayer.self_attn.q_proj.weight": r(heads * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": r(kv * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": r(kv * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": r(H, heads * hd),
        "midlayer.mlp.gate_proj.weight": r(inter, H),
        "midlayer.mlp.up_proj.weight": r(inter, H),
        "midlayer.mlp.down_proj.weight": r(H, inter),
        "midlayer.input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
        "midlayer.hidden_norm.weight": torch.ones(H, dtype=torch.bfloat16),
        "midlayer.post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
        "norm.weight": torch.ones(H, dtype=torch.bfloat16),
        "lm_head.weight": r(dvocab, H),
    }
    if with_d2t:
        w["d2t"] = hot - torch.arange(dvocab)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[hot] = True
        w["t2d"] = t2d
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
           "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": dvocab, "rms_norm_eps": 1e-6,
           "max_position_embeddings": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "rope_theta": 10000.0}
    if layer_ids is not None:
        if ids_key == "eagle_config":
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True}
        else:
            cfg[ids_key] = list(layer_ids)
    if Ht != H:
        cfg["target_hidden_size"] = Ht
    cfg.update(extra_cfg or {})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(w, folder / "model.safetensors")
    return hot
