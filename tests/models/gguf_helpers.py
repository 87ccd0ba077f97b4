"""Tiny GGUF files written from tiny Hugging Face folders with the `gguf` package, the way llama.cpp's
convert_hf_to_gguf.py writes them: llama.cpp's tensor names (from gguf's own name map, not eaglekit's), q/k rows of
llama permuted for llama.cpp's interleaved rotary layout, 1-D tensors kept F32, the tokenizer as a BPE token list
with merges, and the chat template in the metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.torch import load_file

ARCH = {"llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3"}


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py), what eaglekit.gguf.unpermute undoes."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(folder: Path, path: Path, qtype: str = "F32", tokenizer: bool = True, arch: str | None = None,
               extra_tensor: tuple[str, np.ndarray] | None = None, drop: tuple[str, ...] = (),
               bos: int | None = None) -> Path:
    """The GGUF of the Hugging Face folder `folder`, every 2-D weight stored as `qtype` (F32, F16, BF16, Q8_0,
    Q4_0, Q4_1, ...). `arch` overrides general.architecture; `extra_tensor` adds one tensor as given; `bos` sets a
    BOS id the folder's config lacks."""
    import gguf

    cfg = json.loads((Path(folder) / "config.json").read_text())
    if bos is not None:
        cfg["bos_token_id"] = bos
    fam = cfg["model_type"]
    n_layers, heads = cfg["num_hidden_layers"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, ARCH[fam]), n_layers)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch or fam)
    w.add_name(f"tiny-{fam}")
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    rope = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id)):
        if cfg.get(key) is not None:
            add(cfg[key])
    if tokenizer and (Path(folder) / "tokenizer.json").is_file():
        _add_tokenizer(w, Path(folder), cfg["vocab_size"])
    q = getattr(gguf.GGMLQuantizationType, qtype)
    tensors = {}
    for f in sorted(Path(folder).glob("*.safetensors")):  # one file or the shards of an index
        tensors.update(load_file(str(f)))
    for hf, arr in sorted(tensors.items()):
        stem, _, suffix = hf.rpartition(".")
        name = names.get_name(stem)
        assert name is not None, hf
        name = f"{name}.{suffix}"
        if name in drop:
            continue
        arr = arr.float().numpy()
        if fam == "llama" and ".attn_q." in name:
            arr = permute(arr, heads)
        elif fam == "llama" and ".attn_k." in name:
            arr = permute(arr, kv)
        if arr.ndim == 2 and qtype != "F32":
            w.add_tensor(name, gguf.quants.quantize(arr, q), raw_dtype=q)
        else:
            w.add_tensor(name, arr)
    if rope.get("rope_type") == "llama3":  # convert_hf_to_gguf's LlamaModel.generate_extra_tensors
        w.add_tensor("rope_freqs.weight", llama3_factors(theta, head_dim, rope))
    if extra_tensor is not None:
        w.add_tensor(*extra_tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def llama3_factors(theta: float, dim: int, rope: dict) -> np.ndarray:
    """The rope_freqs.weight llama.cpp's converter writes for a llama3 rope (its loop, vectorized)."""
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
    factor, low, high = rope["factor"], rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _add_tokenizer(w, folder: Path, vocab: int) -> None:
    tj = json.loads((folder / "tokenizer.json").read_text())
    ids = {**tj["model"]["vocab"], **{t["content"]: t["id"] for t in tj.get("added_tokens", [])}}
    tokens = [None] * vocab
    for tok, i in ids.items():
        if i < vocab:
            tokens[i] = tok
    tokens = [t if t is not None else f"<unused{i}>" for i, t in enumerate(tokens)]
    special = {t["id"] for t in tj.get("added_tokens", []) if t.get("special")}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(vocab)])  # 3: control, 1: normal
    w.add_token_merges(merges)
    w.add_add_bos_token(False)
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    template = tc.get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if template:
        w.add_chat_template(template)
