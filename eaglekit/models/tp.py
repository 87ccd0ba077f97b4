"""A tensor-parallel Llama-family target: our decoder with its weights split over the ranks of a TPGroup.

    q/k/v, gate/up   column-parallel: each rank holds heads [r*H/N, (r+1)*H/N) and MLP columns likewise,
                     still fused into one matmul per rank (Attention.fuse / MLP.fuse on the local shards)
    o, down          row-parallel: the partial products are summed by one all-reduce each (2 per layer)
    KV cache         this rank's kv heads only
    embedding        replicated: a lookup reads T rows, so a split saves memory but never bandwidth, and
                     would cost an all-reduce per forward; the replicated draft reads the same table
    lm_head          split by vocabulary rows (one all-gather of the logits) or replicated: pick_lm_head

The network is the ordinary LlamaModel built from a *local* config (heads / N, kv heads / N, MLP width / N),
whose o_proj / down_proj (and lm_head) are swapped for the parallel linears below. After each all-reduce the
residual stream is whole and bitwise identical on every rank, so the captured features (CaptureSpec) are the
residual streams themselves: capture adds no communication, and every rank runs the same replicated draft,
the same acceptance and the same cache update, staying in step without exchanging tokens.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..distributed import TPGroup, check_divisible, pick_lm_head, shard
from ..errors import InputError
from .config import TargetConfig, load_target_config
from .layers import Rotary
from .llama import LlamaModel, LlamaTarget


class RowParallelLinear(nn.Linear):
    """y = all_reduce(x_local @ W_local^T) + b: the input features are this rank's share."""

    def __init__(self, in_features, out_features, bias, group: TPGroup, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.group = group

    def forward(self, x):
        y = self.group.all_reduce(F.linear(x, self.weight))
        return y + self.bias if self.bias is not None else y


class VocabParallelLinear(nn.Linear):
    """Logits over this rank's vocabulary rows, gathered into the whole vocabulary on every rank."""

    def __init__(self, in_features, out_features, group: TPGroup, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=False, device=device, dtype=dtype)
        self.group = group

    def forward(self, x):
        return self.group.all_gather_last(F.linear(x, self.weight))


def local_config(cfg: TargetConfig, world: int) -> TargetConfig:
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // world,
        num_kv_heads=cfg.num_kv_heads // world,
        intermediate_size=cfg.intermediate_size // world,
        tie_word_embeddings=False,
    )


def build_local(cfg: TargetConfig, group: TPGroup, vocab_parallel: bool, dtype=torch.float32) -> LlamaModel:
    """This rank's network on the meta device (no memory; `dtype` for a later to_empty), parallel linears
    in place."""
    check_divisible(cfg, group.world, vocab_parallel)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return _build_local(cfg, group, vocab_parallel)
    finally:
        torch.set_default_dtype(old)


def _build_local(cfg, group, vocab_parallel):
    with torch.device("meta"):
        net = LlamaModel(local_config(cfg, group.world))
        for layer in net.model.layers:
            a, m = layer.self_attn, layer.mlp
            a.o_proj = RowParallelLinear(a.o_proj.in_features, cfg.hidden_size, a.o_proj.bias is not None, group)
            m.down_proj = RowParallelLinear(
                m.down_proj.in_features, cfg.hidden_size, m.down_proj.bias is not None, group
            )
        if vocab_parallel:
            net.lm_head = VocabParallelLinear(cfg.hidden_size, cfg.vocab_size // group.world, group)
    return net


def split_of(name: str, cfg: TargetConfig, group: TPGroup, vocab_parallel: bool) -> tuple[int, slice] | None:
    """How parameter `name` is cut for this rank: (dim, slice of the full tensor), or None (replicated)."""
    W, r, hd = group.world, group.rank, cfg.head_dim
    leaf = name.rsplit(".", 2)
    mod, kind = leaf[-2], leaf[-1]
    if mod == "q_proj":
        return 0, shard(cfg.num_heads * hd, W, r)
    if mod in ("k_proj", "v_proj"):
        return 0, shard(cfg.num_kv_heads * hd, W, r)
    if mod in ("gate_proj", "up_proj"):
        return 0, shard(cfg.intermediate_size, W, r)
    if mod == "o_proj" and kind == "weight":
        return 1, shard(cfg.num_heads * hd, W, r)
    if mod == "down_proj" and kind == "weight":
        return 1, shard(cfg.intermediate_size, W, r)
    if name == "lm_head.weight" and vocab_parallel:
        return 0, shard(cfg.vocab_size, W, r)
    return None  # norms, the embedding, o / down biases (added once, after the sum), a replicated lm_head


def _weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> safetensors file, from the index or the single file (nothing is read yet)."""
    from safetensors import safe_open

    if not folder.is_dir():
        raise InputError(f"target folder {folder} does not exist", fix="pass the path of a model folder", code="E101")
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return {k: single for k in f.keys()}
    if index.is_file():
        try:
            wm = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise InputError(
                f"target index {index} is malformed ({e})", fix="re-export the checkpoint", code="E105"
            ) from None
        missing = sorted({folder / s for s in wm.values() if not (folder / s).is_file()})
        if missing:
            raise InputError(
                f"target shard {missing[0]} named by {index.name} is missing",
                fix="copy every shard listed in the index",
                code="E106",
            )
        return {k: folder / s for k, s in wm.items()}
    raise InputError(
        f"target folder {folder} has no model.safetensors or model.safetensors.index.json",
        fix="save the model with safetensors (save_pretrained does by default)",
        code="E106",
    )


def read_shards(
    folder: Path, net: LlamaModel, cfg: TargetConfig, group: TPGroup, vocab_parallel: bool, device, dtype
) -> dict[str, torch.Tensor]:
    """This rank's slices only, read with safe_open + get_slice (the whole model is never in memory)."""
    from safetensors import SafetensorError, safe_open

    files = _weight_files(folder)
    state: dict[str, torch.Tensor] = {}
    handles: dict[Path, Any] = {}  # file -> its safe_open handle
    try:
        for name, p in net.state_dict(keep_vars=True).items():
            src = name
            if name == "lm_head.weight" and cfg.tie_word_embeddings:
                src = "model.embed_tokens.weight"
            if src not in files:
                raise InputError(
                    f"checkpoint in {folder} lacks the tensor {src}",
                    code="E107",
                    fix="check that config.json belongs to these weights",
                )
            f = handles.get(files[src])
            if f is None:
                f = handles[files[src]] = safe_open(str(files[src]), framework="pt")
            sl = f.get_slice(src)
            full = list(sl.get_shape())
            cut = split_of(name, cfg, group, vocab_parallel)
            if cut is None:
                t = sl[:]
            else:
                dim, s = cut
                t = sl[s.start : s.stop] if dim == 0 else sl[:, s.start : s.stop]
            if tuple(t.shape) != tuple(p.shape):
                raise InputError(
                    f"tensor {src} in {folder} has shape {tuple(full)}, which does not fit config.json "
                    f"(this rank's share should be {tuple(p.shape)})",
                    fix="check that config.json belongs to these weights",
                    code="E107",
                )
            state[name] = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
    except (SafetensorError, OSError) as e:
        raise InputError(
            f"target weights in {folder} cannot be read ({e})", code="E105", fix="re-copy or re-export the checkpoint"
        ) from None
    return state


class TPLlamaTarget(LlamaTarget):
    """LlamaTarget over this rank's shards. `cfg` is the whole model's config; `net.config` the local one."""

    backend = "tp"
    tp: TPGroup  # (a rank's group: never None here)

    def __init__(self, net: LlamaModel, cfg: TargetConfig, group: TPGroup, device, dtype):
        super().__init__(net, device, dtype)
        self.cfg, self.tp = cfg, group
        self.vocab_parallel = isinstance(net.lm_head, VocabParallelLinear)
        self._lm_head_full = None
        # the decode-sized all-reduces (up to 128 rows) go through symmetric memory when asked for
        group.setup_symm(128 * cfg.hidden_size, dtype)

    @classmethod
    # a rank loads on its group's device, not on a device of the caller's choosing
    def from_folder(  # type: ignore[override]
        cls, folder, group: TPGroup, dtype=torch.float32, lm_head: str = "auto"
    ) -> "TPLlamaTarget":
        folder = Path(folder)
        cfg = load_target_config(folder)
        vp = pick_lm_head(
            lm_head,
            cfg.vocab_size,
            cfg.hidden_size,
            group.world,
            group.device,
            torch.tensor([], dtype=dtype).element_size(),
        )
        net = build_local(cfg, group, vp)
        state = read_shards(folder, net, cfg, group, vp, group.device, dtype)
        net.load_state_dict(state, strict=True, assign=True)
        net.rotary = Rotary(cfg.head_dim, cfg.rope).to(group.device)
        target = cls(net, cfg, group, group.device, dtype)
        target.fuse()
        return target

    @classmethod
    def random(
        cls,
        cfg: TargetConfig,
        group: TPGroup,
        dtype=torch.bfloat16,
        lm_head: str = "auto",
        seed: int = 0,
        std: float = 0.02,
    ) -> "TPLlamaTarget":
        """Random weights made directly on this rank's device, shard by shard (benchmarks: no checkpoint).
        Replicated tensors get the same values on every rank (their seed ignores the rank)."""
        vp = pick_lm_head(
            lm_head,
            cfg.vocab_size,
            cfg.hidden_size,
            group.world,
            group.device,
            torch.tensor([], dtype=dtype).element_size(),
        )
        net = build_local(cfg, group, vp, dtype).to_empty(device=group.device)
        with torch.no_grad():
            for name, p in net.named_parameters():
                split = split_of(name, cfg, group, vp) is not None
                g = torch.Generator(device=group.device)
                g.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()) + (group.rank * 7919 if split else 0))
                if "norm" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0, std, generator=g)
        net.rotary = Rotary(cfg.head_dim, cfg.rope).to(group.device)
        target = cls(net, cfg, group, group.device, dtype)
        target.fuse()
        return target

    def lm_head_weight(self):
        """The whole [V, H] matrix (gathered once when split: the doctor and training read it, decoding never)."""
        if not self.vocab_parallel:
            return self.net.lm_head.weight
        if self._lm_head_full is None:
            with torch.no_grad():
                w = self.net.lm_head.weight.detach()
                self._lm_head_full = self.tp.all_gather_last(w.t().contiguous()).t().contiguous()
        return self._lm_head_full

    def weight_bytes(self, embedding: bool = False) -> int:
        """Bytes of weights this rank reads per decode step (the embedding is a lookup: left out by default)."""
        emb = self.net.model.embed_tokens.weight
        n = sum(p.numel() * p.element_size() for p in self.net.parameters())
        return n if embedding else n - emb.numel() * emb.element_size()


def load_tp_target(folder, group: TPGroup, dtype, lm_head: str = "auto") -> TPLlamaTarget:
    return TPLlamaTarget.from_folder(folder, group, dtype, lm_head)
