"""Training a small Llama-architecture target from scratch (the demo pair's target).

Plain next-token training on random windows of a token stream; the result is written as an ordinary
Hugging Face folder (config.json, sharded safetensors, tokenizer) that transformers loads too.
The step count is fitted to a time budget after timing the first steps, so the cosine schedule
always completes.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..io import atomic_write_json, save_tensors
from ..models.config import parse_target_config
from ..models.llama import LlamaModel
from .loop import StepBudget, load_state, lr_at, save_state


@dataclass(frozen=True)
class LlamaShape:
    """A Llama's sizes, the six numbers that fix its weights' shapes: vocabulary, hidden width, layers, query heads,
    key/value heads, MLP width (head_dim is hidden // heads)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    inter: int


def llama_config(
    shape: LlamaShape,
    max_pos: int = 2048,
    rope_theta: float = 10000.0,
    eos_id: int = 1,
    bos_id: int | None = None,
    tie: bool = True,
) -> dict:
    """A Hugging Face LlamaForCausalLM config.json of `shape` (read by transformers and by our decoder)."""
    s = shape
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.inter,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.hidden // s.heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-5,
        "rope_theta": rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tie,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": 0,
        "torch_dtype": "bfloat16",
    }


def new_target_net(raw_cfg: dict, seed: int = 0) -> LlamaModel:
    torch.manual_seed(seed)
    net = LlamaModel(parse_target_config(raw_cfg))
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                p.normal_(0, 0.02 / math.sqrt(2 * raw_cfg["num_hidden_layers"]))
            else:
                p.normal_(0, 0.02)
    return net


def save_target_folder(net: LlamaModel, raw_cfg: dict, folder, dtype=torch.bfloat16, max_shard_bytes=15 * 2**20):
    """Weights in shards under max_shard_bytes (a sharded index when more than one), then config.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().to(dtype).cpu()
        for k, v in net.state_dict().items()
        if not (raw_cfg.get("tie_word_embeddings") and k == "lm_head.weight")
    }
    shards: list[dict[str, torch.Tensor]] = []
    cur: dict[str, torch.Tensor] = {}
    size = 0
    for k in sorted(state):
        nbytes = state[k].numel() * state[k].element_size()
        if cur and size + nbytes > max_shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = state[k]
        size += nbytes
    shards.append(cur)
    for old in folder.glob("model*.safetensors*"):
        old.unlink()
    if len(shards) == 1:
        save_tensors(folder / "model.safetensors", shards[0], metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, sh in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_tensors(folder / name, sh, metadata={"format": "pt"})
            weight_map.update({k: name for k in sh})
        atomic_write_json(
            folder / "model.safetensors.index.json",
            {
                "metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
                "weight_map": weight_map,
            },
        )
    atomic_write_json(folder / "config.json", {**raw_cfg, "torch_dtype": str(dtype).replace("torch.", "")})


@dataclass
class PretrainConfig:
    seq_len: int = 512
    batch_size: int = 64
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup: int = 100
    weight_decay: float = 0.1
    max_steps: int = 2000
    time_budget_s: float | None = None
    eval_every: int = 250
    seed: int = 0


def _windows(stream: torch.Tensor, n: int, T: int, g: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, stream.numel() - T - 1, (n,), generator=g)
    return torch.stack([stream[s : s + T + 1] for s in starts.tolist()])


def pretrain(
    net: LlamaModel,
    train_stream: torch.Tensor,
    heldout_stream: torch.Tensor,
    cfg: PretrainConfig,
    device: str,
    ckpt: Path | None = None,
    log=print,
) -> dict:
    net.to(device).train()
    amp = str(device).startswith("cuda")
    opt = _optimizer(net, cfg, amp)
    g = torch.Generator().manual_seed(cfg.seed)
    eval_batch = _windows(heldout_stream, 64, cfg.seq_len, torch.Generator().manual_seed(123)).to(device)
    start, total = _resume(ckpt, device, net, opt, g, log) or (0, cfg.max_steps)
    pos = torch.arange(cfg.seq_len, device=device)
    from tqdm import tqdm

    bar = tqdm(total=total, initial=start, desc="pretrain", dynamic_ncols=True)
    t0, history = time.time(), []
    # held-out loss, weights, step: the model kept is the best one seen
    best: tuple[float, dict[str, torch.Tensor] | None, int] = (float("inf"), None, 0)
    step = start
    budget = StepBudget(cfg.time_budget_s, start, amp, 10, 40)
    while step < total:
        fitted = budget.check(step, total, cfg.max_steps)
        if fitted is not None:
            total, per = fitted, budget.per_step
            assert per is not None  # check() sets it when it fits the total
            bar.total = total
            log(
                f"\npretrain: {per * 1e3:.1f} ms/step, {cfg.batch_size * cfg.seq_len / per / 1e6:.2f}M tok/s: "
                f"{total} steps fit the {cfg.time_budget_s:.0f}s budget"
            )
        batch = _windows(train_stream, cfg.batch_size, cfg.seq_len, g).to(device, non_blocking=True)
        loss = _train_step(net, opt, batch, pos, lr_at(step, total, cfg.lr, cfg.warmup, cfg.min_lr_ratio), amp)
        step += 1
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % cfg.eval_every == 0 or step == total:
            ev = _heldout_loss(net, eval_batch, pos, amp)
            history.append({"step": step, "train_loss": round(loss.item(), 4), "heldout_loss": round(ev, 4)})
            bar.write(f"step {step}: train loss {loss.item():.3f}, held-out loss {ev:.3f}")
            if ev < best[0]:
                best = (ev, {k: v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()}, step)
            if ckpt is not None:
                save_state(
                    ckpt,
                    {
                        "net": net.state_dict(),
                        "opt": opt.state_dict(),
                        "gen": g.get_state(),
                        "step": step,
                        "total": total,
                    },
                )
    bar.close()
    if best[1] is not None and best[2] != step:
        net.load_state_dict(best[1])
        log(f"pretrain: keeping the weights of step {best[2]} (held-out loss {best[0]:.3f}), the best seen")
    net.eval()
    return {
        "steps": total,
        "kept_step": best[2],
        "kept_heldout_loss": round(best[0], 4),
        "tokens": total * cfg.batch_size * cfg.seq_len,
        "history": history,
        "seconds": round(time.time() - t0, 1),
        "config": asdict(cfg),
    }


def _optimizer(net: LlamaModel, cfg: PretrainConfig, fused: bool) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only (not on norms' gains)."""
    decay = [p for n, p in net.named_parameters() if p.dim() >= 2]
    other = [p for n, p in net.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        fused=fused,
    )


def _resume(
    ckpt: Path | None, device: str, net: LlamaModel, opt: torch.optim.Optimizer, g: torch.Generator, log
) -> tuple[int, int] | None:
    """Restores net, optimizer and the window sampler's generator from `ckpt` where it holds a state: (step, total),
    the total as fitted to the time budget by the run that saved it. None where there is nothing to resume."""
    st = load_state(ckpt, device) if ckpt is not None else None
    if st is None:
        return None
    net.load_state_dict(st["net"])
    opt.load_state_dict(st["opt"])
    g.set_state(st["gen"])
    log(f"pretrain: resuming at step {st['step']} of {st['total']}")
    return st["step"], st["total"]


def _next_token_loss(net: LlamaModel, batch: torch.Tensor, pos: torch.Tensor, amp: bool) -> torch.Tensor:
    """Cross-entropy of each window's next tokens (batch [n, T + 1]), in float32 whatever the autocast."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        h, _ = net(batch[:, :-1], pos)
        logits = net.lm_head(h)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def _train_step(
    net: LlamaModel, opt: torch.optim.Optimizer, batch: torch.Tensor, pos: torch.Tensor, lr: float, amp: bool
) -> torch.Tensor:
    """One optimizer step at learning rate `lr` (gradients clipped to norm 1); returns the step's loss."""
    for gr in opt.param_groups:
        gr["lr"] = lr
    loss = _next_token_loss(net, batch, pos, amp)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _heldout_loss(net: LlamaModel, eval_batch: torch.Tensor, pos: torch.Tensor, amp: bool) -> float:
    """The loss on the held-out windows, in eval mode and without gradients; leaves the net training."""
    net.eval()
    with torch.no_grad():
        ev = _next_token_loss(net, eval_batch, pos, amp).item()
    net.train()
    return ev
