"""The draft training loop: TTT loss, AdamW + warmup/cosine, grad clip, atomic checkpoints, resume,
data parallel under torchrun (gloo on CPU, NCCL on GPU) with the same entry point.

Determinism: the sample order of epoch e is a permutation seeded by (seed, e), so a run killed at any
point and resumed from its last checkpoint consumes exactly the samples an uninterrupted run would,
in the same order (no sample lost or counted twice; the log is truncated back to the checkpoint).
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..draft import save_draft
from ..io import atomic_write_bytes
from .ttt import simulated_accept_length, target_distribution, ttt_forward


@dataclass
class TrainConfig:
    out: str
    batch_size: int = 8  # per rank
    epochs: float = 1.0
    max_steps: int | None = None
    lr: float = 1e-4
    min_lr_ratio: float = 0.1
    warmup: float = 0.03  # fraction of steps (< 1) or a step count
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 0.5
    ttt_length: int = 7
    decay: float = 0.8
    save_every: int = 200
    eval_every: int = 0
    seed: int = 0
    bf16: bool | None = None  # None: on when training on CUDA
    time_budget_s: float | None = None  # fit the step count to this budget after timing the first steps
    extra: dict = field(default_factory=dict)


# the feature fingerprint is taken over the first this many training tokens (per-slot sums: cheap)
FINGERPRINT_TOKENS = 200_000


def dist_info() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def init_distributed(device: str) -> str:
    """Under torchrun: join the group (NCCL on GPU, gloo on CPU) and return this rank's device."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return device
    cuda = device.startswith("cuda")
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return f"cuda:{local}"
    return device


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    warm = int(cfg.warmup * total) if cfg.warmup < 1 else int(cfg.warmup)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(total - warm, 1)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


class _Crash:
    """Test hook: EAGLEKIT_KILL_AT=<where>:<n> sends this process SIGKILL at that point (a real kill)."""

    def __init__(self):
        spec = os.environ.get("EAGLEKIT_KILL_AT", "")
        self.where, _, n = spec.partition(":")
        self.n = int(n) if n else -1

    def __call__(self, where: str, n: int):
        if where == self.where and n == self.n:
            os.kill(os.getpid(), signal.SIGKILL)


crash_hook = _Crash()


def _epoch_order(source, epoch: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return source.epoch_order(g)


def evaluate_ttt(draft, source, indices, lm_head_w, hot, cfg: TrainConfig, device) -> dict:
    """Per-position top-1 accuracy and simulated accept length on held-out samples."""
    correct = torch.zeros(cfg.ttt_length)
    counts = torch.zeros(cfg.ttt_length)
    draft.eval()
    with torch.no_grad(), _autocast(device, cfg):
        for i in range(0, len(indices), cfg.batch_size):
            b = source.batch(indices[i:i + cfg.batch_size], device)
            p, in_dv = target_distribution(b, lm_head_w, hot)
            _, _, c, n = ttt_forward(draft, b, p, in_dv, cfg.ttt_length, cfg.decay)
            correct += c.float().cpu()
            counts += n.float().cpu()
    draft.train()
    acc = (correct / counts.clamp(min=1)).tolist()
    return {"per_position_acc": acc, "simulated_accept_length": simulated_accept_length(acc),
            "tokens": int(counts[0])}


def _autocast(device, cfg):
    import contextlib

    on = cfg.bf16 if cfg.bf16 is not None else str(device).startswith("cuda")
    if on:
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_draft(draft, source, lm_head_w: torch.Tensor, hot: torch.Tensor, cfg: TrainConfig, device,
                eval_indices=None, progress: bool = True) -> dict:
    """Train `draft` in place on `source` (online or offline batches). Returns the final metrics."""
    world, rank = dist_info()
    out = Path(cfg.out)
    ckpt = out / "checkpoint" / "state.pt"
    log_path = out / "train_log.jsonl"
    global_batch = cfg.batch_size * world
    steps_per_epoch = max(source.n // global_batch, 1)
    total = cfg.max_steps or max(int(cfg.epochs * steps_per_epoch), 1)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    start, samples_seen = 0, 0
    from .fingerprint import FeatureSketch

    C = draft.config.num_captures
    sketch = FeatureSketch(C, draft.fc.in_features // C)  # which layer each slot is trained on (doctor)
    if ckpt.is_file():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        if not torch.equal(state["hot"].cpu(), hot.cpu()):
            from ..errors import InputError

            raise InputError(f"the checkpoint in {ckpt.parent} was trained with another draft vocabulary",
                             fix="resume with the same data and --draft-vocab-size, or use a new --out", code="E120")
        draft.load_state_dict(state["draft"], strict=False)
        opt.load_state_dict(state["opt"])
        start, samples_seen, total = state["step"], state["samples_seen"], state.get("total", total)
        if "sketch" in state:
            sketch.load_state(state["sketch"])
        if rank == 0 and log_path.is_file():  # drop log lines written after the checkpoint
            keep = [ln for ln in log_path.read_text().splitlines() if json.loads(ln)["step"] < start]
            atomic_write_bytes(log_path, ("\n".join(keep) + "\n").encode() if keep else b"")
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        print(f"training: {source.n} samples, {steps_per_epoch} steps/epoch at global batch {global_batch}, "
              f"{total} steps" + (f", resuming at step {start}" if start else ""), flush=True)
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=start, desc="train", dynamic_ncols=True)
    draft.train()
    order_cache: dict[int, list[int]] = {}
    last = {}
    import time

    t0 = time.time()
    step = start
    while step < total:
        if cfg.time_budget_s and start == 0 and step in (10, 30):
            # time steps 10..30: the first steps carry one-off costs (allocator, kernel selection)
            if str(device).startswith("cuda"):
                torch.cuda.synchronize()
            if step == 10:
                t10 = time.time()
        if cfg.time_budget_s and start == 0 and step == 30:
            per = (time.time() - t10) / 20
            total = max(min(total, int((cfg.time_budget_s - (t10 - t0)) / per)), step + 1)
            if bar is not None:
                bar.total = total
            if rank == 0:
                print(f"\ntraining: {per * 1e3:.1f} ms/step: {total} steps fit the {cfg.time_budget_s:.0f}s budget",
                      flush=True)
        epoch, j = divmod(step, steps_per_epoch)
        if epoch not in order_cache:
            order_cache = {epoch: _epoch_order(source, epoch, cfg.seed)}
        order = order_cache[epoch]
        base = j * global_batch + rank * cfg.batch_size
        idx = order[base:base + cfg.batch_size]
        batch = source.batch(idx, device)
        if rank == 0 and sketch.n < FINGERPRINT_TOKENS:
            sketch.add(batch.feats, batch.valid)
        p, in_dv = target_distribution(batch, lm_head_w, hot)
        lr = lr_at(step, total, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        with _autocast(device, cfg):
            loss, losses, correct, counts = ttt_forward(draft, batch, p, in_dv, cfg.ttt_length, cfg.decay)
        loss.backward()
        if world > 1:
            _allreduce_grads(params, world)
        gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats = torch.cat([losses.float() * counts.float(), correct.float(), counts.float()])
        if world > 1:
            import torch.distributed as dist

            dist.all_reduce(stats)
        L = cfg.ttt_length
        stats = stats.cpu()
        n = stats[2 * L:].clamp(min=1)
        acc = (stats[L:2 * L] / n).tolist()
        samples_seen += global_batch
        last = {"step": step, "loss": float((stats[:L] / n * (cfg.decay ** torch.arange(L))).sum()),
                "acc": [round(a, 4) for a in acc], "lr": lr, "grad_norm": float(gnorm), "samples_seen": samples_seen}
        if rank == 0:
            with open(log_path, "a") as f:
                f.write(json.dumps(last) + "\n")
            if bar is not None:
                bar.set_postfix(loss=f"{last['loss']:.3f}", acc=" ".join(f"{a:.2f}" for a in acc[:4]))
                bar.update(1)
        done = step + 1 == total
        if rank == 0 and ((step + 1) % cfg.save_every == 0 or done):
            _save(draft, opt, hot, step + 1, samples_seen, total, cfg, ckpt, out, sketch)
        if cfg.eval_every and eval_indices and ((step + 1) % cfg.eval_every == 0) and rank == 0 and not done:
            ev = evaluate_ttt(draft, source, eval_indices, lm_head_w, hot, cfg, device)
            print(f"\nstep {step + 1}: held-out acc {[round(a, 3) for a in ev['per_position_acc']]} "
                  f"simulated accept length {ev['simulated_accept_length']:.2f}", flush=True)
        crash_hook("train_step", step + 1)
        step += 1
    if bar is not None:
        bar.close()
    result = {"steps": total, "samples_seen": samples_seen, "last": last}
    if eval_indices and rank == 0:
        result["heldout"] = evaluate_ttt(draft, source, eval_indices, lm_head_w, hot, cfg, device)
    return result


def _allreduce_grads(params, world: int) -> None:
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    i = 0
    for g in grads:
        g.copy_(flat[i:i + g.numel()].view_as(g))
        i += g.numel()


def _save(draft, opt, hot, step, samples_seen, total, cfg, ckpt: Path, out: Path, sketch) -> None:
    if sketch.n:
        cap = draft.config.capture
        draft.config.features = sketch.to_json(cap.after_layers if cap is not None else None)
    state = {"step": step, "samples_seen": samples_seen, "total": total, "hot": hot.cpu(),
             "draft": {k: v for k, v in draft.state_dict().items() if k != "embed_tokens.weight"},
             "opt": opt.state_dict(), "config": asdict(cfg), "sketch": sketch.state()}
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(ckpt, buf.getvalue())
    save_draft(draft, out / "draft", dtype=torch.bfloat16)
