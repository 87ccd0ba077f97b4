"""The draft training loop: TTT loss, AdamW + warmup/cosine, grad clip, atomic checkpoints, resume,
data parallel under torchrun (gloo on CPU, NCCL on GPU) with the same entry point.

Determinism: the sample order of epoch e is a permutation seeded by (seed, e), so a run killed at any
point and resumed from its last checkpoint consumes exactly the samples an uninterrupted run would,
in the same order (no sample lost or counted twice; the log is truncated back to the checkpoint).
"""

from __future__ import annotations

import json
import math
import os
import signal
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..draft import save_draft
from ..errors import InputError
from ..io import append_line, atomic_write_bytes, strict_json
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


# A resumed run (the same --out) continues with the values given now for the settings that only shape the schedule
# and the optimiser's step, and says which changed; it refuses (E120) a change of those that choose its samples or its
# model, which the checkpoint's steps were taken with (the fix: the checkpoint's value, or a new --out).
RESUME_CONTINUES = (
    "epochs",
    "max_steps",
    "lr",
    "min_lr_ratio",
    "warmup",
    "grad_clip",
    "save_every",
    "eval_every",
    "time_budget_s",
)
RESUME_FIXED = ("batch_size", "seed", "ttt_length", "decay", "weight_decay", "betas", "bf16")


class TrainingDiverged(InputError):
    """A non-finite loss, gradient or weight: the run stops, its last good checkpoint and draft stay (E127)."""

    code = "E127"


# the feature fingerprint is taken over the first this many training tokens (per-slot sums: cheap)
FINGERPRINT_TOKENS = 200_000


def dist_info() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


@contextmanager
def distributed_run(device: str):
    """Under torchrun: join the group (NCCL on GPU, gloo on CPU) for the block, which gets this rank's device, and
    leave it after (distributed.leave_group): after a barrier when the block succeeded (rank 0's files are written
    before any rank leaves), at once when it raised. Outside torchrun, or in a group the caller made, nothing is
    joined or left."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        yield device
        return
    cuda = device.startswith("cuda")
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    from ..distributed import leave_group

    try:
        yield device
    except BaseException:
        leave_group(barrier=False)
        raise
    leave_group(barrier=True)


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
            b = source.batch(indices[i : i + cfg.batch_size], device)
            p, in_dv = target_distribution(b, lm_head_w, hot)
            _, _, c, n = ttt_forward(draft, b, p, in_dv, cfg.ttt_length, cfg.decay)
            correct += c.float().cpu()
            counts += n.float().cpu()
    draft.train()
    acc = (correct / counts.clamp(min=1)).tolist()
    return {"per_position_acc": acc, "simulated_accept_length": simulated_accept_length(acc), "tokens": int(counts[0])}


def _autocast(device, cfg):
    import contextlib

    on = cfg.bf16 if cfg.bf16 is not None else str(device).startswith("cuda")
    if on:
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class RunState:
    """What a checkpoint restores: the step, the samples consumed, the (possibly budget-fitted) step count."""

    step: int = 0
    samples_seen: int = 0
    total: int = 0


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _changed_settings(old: dict, cfg: "TrainConfig", ckpt: Path) -> dict:
    """{setting: (checkpoint's, now)} for the RESUME_CONTINUES settings that differ; E120 for a RESUME_FIXED one."""
    now = asdict(cfg)
    norm = lambda v: list(v) if isinstance(v, tuple) else v  # noqa: E731 -- betas: a tuple, a list once reloaded
    fixed = {k: (old[k], now[k]) for k in RESUME_FIXED if k in old and norm(old[k]) != norm(now[k])}
    if fixed:
        what = ", ".join(f"{_flag(k)} {a} (now {b})" for k, (a, b) in fixed.items())
        raise InputError(
            f"the checkpoint in {ckpt.parent} was trained with {what}: these choose a run's samples or "
            f"its model, so a resumed run keeps them",
            code="E120",
            fix=f"resume with {' '.join(f'{_flag(k)} {a}' for k, (a, _) in fixed.items())}, or use a new "
            f"--out to start over",
        )
    return {k: (old[k], now[k]) for k in RESUME_CONTINUES if k in old and old[k] != now[k]}


def _resume(
    draft,
    opt,
    hot,
    sketch,
    ckpt: Path,
    log_path: Path,
    run: RunState,
    device,
    rank: int,
    cfg: "TrainConfig | None" = None,
) -> RunState:
    """Load the last checkpoint if there is one, refusing one made with another vocabulary or with other RESUME_FIXED
    settings; cut the log back to it. Changed RESUME_CONTINUES settings apply from the checkpoint's step on (said so);
    the step count is recomputed when --max-steps or --epochs changed, else the checkpoint's (maybe budget-fitted)
    one is kept."""
    from .loop import load_state

    state = load_state(ckpt, device)
    if state is None:
        return run
    if not torch.equal(state["hot"].cpu(), hot.cpu()):
        raise InputError(
            f"the checkpoint in {ckpt.parent} was trained with another draft vocabulary",
            fix="resume with the same data and --draft-vocab-size, or use a new --out",
            code="E120",
        )
    draft.load_state_dict(state["draft"], strict=False)
    opt.load_state_dict(state["opt"])
    if "sketch" in state:
        sketch.load_state(state["sketch"])
    changed = _changed_settings(state.get("config") or {}, cfg, ckpt) if cfg is not None else {}
    total = run.total if {"max_steps", "epochs"} & changed.keys() else state.get("total", run.total)
    run = RunState(state["step"], state["samples_seen"], total)
    if rank == 0 and changed:
        print(
            f"training: resuming at step {run.step} with changed settings, which apply from this step on: "
            + ", ".join(f"{_flag(k)} {a} -> {b}" for k, (a, b) in changed.items())
            + f" ({total} steps in all)",
            flush=True,
        )
    if rank == 0 and run.step >= total:
        print(
            f"training: the checkpoint is at step {run.step}, at or past the {total} steps asked: nothing is left "
            f"to train",
            flush=True,
        )
    if rank == 0 and log_path.is_file():
        _truncate_log(log_path, run.step)
    return run


def _step(model, opt, params, batch, lm_head_w, hot, lr: float, cfg: "TrainConfig", device, world: int):
    """One optimiser step on one batch; -> (per-step stats summed over ranks [3L], grad norm)."""
    p, in_dv = target_distribution(batch, lm_head_w, hot)
    for g in opt.param_groups:
        g["lr"] = lr
    with _autocast(device, cfg):
        loss, losses, correct, counts = model(batch, p, in_dv, cfg.ttt_length, cfg.decay)
    loss.backward()  # under DDP the gradients are averaged over the ranks here
    gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    stats = torch.cat([losses.float() * counts.float(), correct.float(), counts.float()])
    if world > 1:
        import torch.distributed as dist

        dist.all_reduce(stats)
    return stats.cpu(), gnorm


def _record(stats, step: int, lr: float, gnorm, samples_seen: int, cfg: "TrainConfig") -> dict:
    L = cfg.ttt_length
    n = stats[2 * L :].clamp(min=1)
    acc = (stats[L : 2 * L] / n).tolist()
    return {
        "step": step,
        "loss": float((stats[:L] / n * (cfg.decay ** torch.arange(L))).sum()),
        "acc": [round(a, 4) for a in acc],
        "lr": lr,
        "grad_norm": float(gnorm),
        "samples_seen": samples_seen,
    }


@contextmanager
def _tf32(device):
    """float32 matmuls on TF32 tensor cores while training on a CUDA device, restored afterwards. An online source
    runs the float32 target's forward each step (features and the full-vocabulary logits): in IEEE float32 that is
    the larger part of a step; the draft itself already runs under bf16 autocast. Training tolerates TF32's 10-bit
    mantissa; decoding never runs under it (its greedy output is held to the target's exactly)."""
    if not str(device).startswith("cuda"):
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def train_draft(
    draft,
    source,
    lm_head_w: torch.Tensor,
    hot: torch.Tensor,
    cfg: TrainConfig,
    device,
    eval_indices=None,
    progress: bool = True,
) -> dict:
    """Train `draft` in place on `source` (online or offline batches). Returns the final metrics.
    The parts: resume (_resume), schedule (loop.lr_at, loop.StepBudget), step (_step, DDP across ranks),
    checkpoint (_save), evaluation (evaluate_ttt); float32 matmuls on TF32 on a GPU (_tf32)."""
    with _tf32(device):
        return _train(draft, source, lm_head_w, hot, cfg, device, eval_indices, progress)


def _train(draft, source, lm_head_w, hot, cfg: TrainConfig, device, eval_indices, progress: bool) -> dict:
    from .loop import StepBudget, data_parallel, lr_at

    world, rank = dist_info()
    out = Path(cfg.out)
    ckpt = out / "checkpoint" / "state.pt"
    log_path = out / "train_log.jsonl"
    global_batch = cfg.batch_size * world
    steps_per_epoch = max(source.n // global_batch, 1)
    params, opt, sketch, run = _start(draft, hot, cfg, steps_per_epoch, device, rank)
    saved = run.step  # the step of the last good checkpoint (0: none yet)
    start, total = run.step, run.total
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        print(
            f"training: {source.n} samples, {steps_per_epoch} steps/epoch at global batch {global_batch}, "
            f"{total} steps" + (f", resuming at step {start}" if start else ""),
            flush=True,
        )
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=start, desc="train", dynamic_ncols=True)
    model = data_parallel(draft, world, device)
    draft.train()
    budget = StepBudget(cfg.time_budget_s, start, str(device).startswith("cuda"), 10, 30)
    order_cache: dict[int, list[int]] = {}
    last = {}
    step, samples_seen = start, run.samples_seen
    while step < total:
        fitted = _fit(budget, step, total, run.total, world, rank, device)
        if fitted is not None:
            total = fitted
            if bar is not None:
                bar.total = total
        epoch, j = divmod(step, steps_per_epoch)
        if epoch not in order_cache:
            order_cache = {epoch: _epoch_order(source, epoch, cfg.seed)}
        base = j * global_batch + rank * cfg.batch_size
        batch = source.batch(order_cache[epoch][base : base + cfg.batch_size], device)
        if rank == 0 and sketch.n < FINGERPRINT_TOKENS:
            sketch.add(batch.feats, batch.valid)
        lr = lr_at(step, total, cfg.lr, cfg.warmup, cfg.min_lr_ratio)
        stats, gnorm = _step(model, opt, params, batch, lm_head_w, hot, lr, cfg, device, world)
        samples_seen += global_batch
        last = _record(stats, step, lr, gnorm, samples_seen, cfg)
        finite = bool(torch.isfinite(stats).all()) and math.isfinite(last["grad_norm"])
        if rank == 0:
            append_line(log_path, strict_json(last if finite else {**last, "diverged": True}))
        if not finite:  # every rank sees the same all-reduced stats: all stop here
            _diverged(step, last, lr, saved, out, "the loss" if not math.isfinite(last["loss"]) else "the gradient")
        if bar is not None:
            bar.set_postfix(loss=f"{last['loss']:.3f}", acc=" ".join(f"{a:.2f}" for a in last["acc"][:4]))
            bar.update(1)
        done = step + 1 == total
        if (step + 1) % cfg.save_every == 0 or done:
            if not all(bool(torch.isfinite(p).all()) for p in draft.parameters()):  # a step that overflowed them
                _diverged(step, last, lr, saved, out, "the weights")
            if rank == 0:
                _save(draft, opt, hot, RunState(step + 1, samples_seen, total), cfg, ckpt, out, sketch)
            saved = step + 1
        if cfg.eval_every and eval_indices and ((step + 1) % cfg.eval_every == 0) and rank == 0 and not done:
            ev = evaluate_ttt(draft, source, eval_indices, lm_head_w, hot, cfg, device)
            print(
                f"\nstep {step + 1}: held-out acc {[round(a, 3) for a in ev['per_position_acc']]} "
                f"simulated accept length {ev['simulated_accept_length']:.2f}",
                flush=True,
            )
        crash_hook("train_step", step + 1)
        step += 1
    if bar is not None:
        bar.close()
    result = {"steps": total, "samples_seen": samples_seen, "last": last}
    if eval_indices and rank == 0:
        result["heldout"] = evaluate_ttt(draft, source, eval_indices, lm_head_w, hot, cfg, device)
    return result


def _start(draft, hot, cfg: TrainConfig, steps_per_epoch: int, device, rank: int):
    """-> (trained parameters, optimizer, feature sketch, RunState): fresh, or restored from the checkpoint."""
    from .fingerprint import FeatureSketch

    out = Path(cfg.out)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    C = draft.config.num_captures
    sketch = FeatureSketch(C, draft.fc.in_features // C)  # which layer each slot is trained on (doctor)
    run = RunState(total=cfg.max_steps or max(int(cfg.epochs * steps_per_epoch), 1))
    run = _resume(
        draft, opt, hot, sketch, out / "checkpoint" / "state.pt", out / "train_log.jsonl", run, device, rank, cfg
    )
    return params, opt, sketch, run


def _fit(budget, step: int, total: int, cap: int, world: int, rank: int, device) -> int | None:
    """The step count the time budget fits at this step (loop.StepBudget), the same on every rank; else None."""
    fitted = budget.check(step, total, cap)
    if fitted is not None and world > 1:  # each rank timed its own steps: all take rank 0's fit, or they hang
        fitted, budget.again = _from_rank0(fitted, budget.again, device)
    if fitted is not None and rank == 0:
        print(
            f"\ntraining: {budget.per_step * 1e3:.1f} ms/step: {fitted} steps fit the {budget.budget_s:.0f}s budget",
            flush=True,
        )
    return fitted


def _from_rank0(total: int, again: int | None, device) -> tuple[int, int | None]:
    import torch.distributed as dist

    t = torch.tensor([total, -1 if again is None else again], dtype=torch.long, device=device)
    dist.broadcast(t, 0)
    return int(t[0]), (None if int(t[1]) < 0 else int(t[1]))


def _diverged(step: int, rec: dict, lr: float, saved: int, out: Path, what: str):
    kept = (
        f"the checkpoint of step {saved} and its draft in {out} are kept (nothing of this step was written)"
        if saved
        else "no checkpoint was written yet, and no draft"
    )
    raise TrainingDiverged(
        f"training diverged at step {step + 1}: {what} is not finite (loss {rec['loss']}, grad norm "
        f"{rec['grad_norm']}, learning rate {lr:g}); {kept}",
        fix="lower --lr (or raise --warmup) and run the same command: it resumes from the last good checkpoint with "
        "the new settings (or use a new --out to start over)",
    )


def _truncate_log(log_path: Path, start: int) -> None:
    """Keep the log lines of the steps before the checkpoint: lines written after it are redone by the resumed
    run, and a line a crash (or a full disk) cut short is dropped, and said so."""
    keep, partial = [], []
    for n, ln in enumerate(log_path.read_text(errors="replace").splitlines(), 1):
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:
            partial.append(n)
            continue
        if rec.get("step", start) < start:
            keep.append(ln)
    if partial:
        print(
            f"training: dropped {len(partial)} partial line{'s' if len(partial) > 1 else ''} of {log_path.name} "
            f"(line {', '.join(map(str, partial))}: cut short by a crash or a full disk); those steps are redone",
            flush=True,
        )
    atomic_write_bytes(log_path, ("\n".join(keep) + "\n").encode() if keep else b"")


def _save(draft, opt, hot, run: RunState, cfg, ckpt: Path, out: Path, sketch) -> None:
    """The checkpoint (atomic: a kill or a full disk leaves the previous one), then the draft folder beside it."""
    from .loop import save_state

    if sketch.n:
        cap = draft.config.capture
        draft.config.features = sketch.to_json(cap.after_layers if cap is not None else None)
    save_state(
        ckpt,
        {
            "step": run.step,
            "samples_seen": run.samples_seen,
            "total": run.total,
            "hot": hot.cpu(),
            "draft": {k: v for k, v in draft.state_dict().items() if k != "embed_tokens.weight"},
            "opt": opt.state_dict(),
            "config": asdict(cfg),
            "sketch": sketch.state(),
        },
    )
    save_draft(draft, out / "draft", dtype=torch.bfloat16)
