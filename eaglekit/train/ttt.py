"""Training-time test (TTT): the EAGLE-3 draft unrolled on its own outputs, as at decode time.

Step 0 sees target features: at index t the input is (g_t, token t+1) and the draft predicts token t+2.
Step k >= 1 feeds the draft's previous output h_{k-1}[t] instead of a target feature, with token
t+1+k, and predicts token t+2+k. Attention at step k: causal over the step-0 keys, plus the keys of the
same index from steps 1..k (a diagonal block per step) - exactly what a depth-k tree node sees when
decoding: the committed prefix and its own ancestors. Positions are t + k, the logical position of the
step's entry (as SGLang places its draft steps at decode time).

loss = sum_k decay**k * soft-CE(target distribution on the draft vocab, draft logits), over positions
whose predicted token is in the loss mask and whose target argmax lies in the draft vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class TargetBatch:
    """What the loss needs from the target for a batch (right-padded, [B, T, ...])."""

    feats: torch.Tensor  # aux features [B, T, C*H_t]
    ids: torch.Tensor  # token ids [B, T]
    loss_mask: torch.Tensor  # [B, T] 1 where the token is one the draft should learn to predict
    valid: torch.Tensor  # [B, T] bool, False on padding
    target_hidden: torch.Tensor  # final normed hidden [B, T, H_t] -> target logits via lm_head


def _shift(x: torch.Tensor, s: int, fill=0) -> torch.Tensor:
    """x[:, s:] padded at the end back to length T."""
    if s == 0:
        return x
    pad = torch.full_like(x[:, :s], fill)
    return torch.cat([x[:, s:], pad], dim=1)


def target_distribution(batch: TargetBatch, lm_head_w: torch.Tensor, hot_ids: torch.Tensor):
    """-> (p over the draft vocab [B, T, Vd] float32, argmax-in-draft-vocab [B, T] bool), at each position p:
    the target's distribution of the token at p + 1."""
    with torch.no_grad():
        logits = (batch.target_hidden.to(lm_head_w.dtype) @ lm_head_w.T).float()
        top = logits.argmax(-1)
        in_dv = torch.zeros(lm_head_w.shape[0], dtype=torch.bool, device=logits.device)
        in_dv[hot_ids] = True
        p = torch.softmax(logits[..., hot_ids], dim=-1)
        return p, in_dv[top]


def ttt_forward(
    draft,
    batch: TargetBatch,
    p_dv: torch.Tensor,
    in_dv: torch.Tensor,
    length: int = 7,
    decay: float = 0.8,
    keep_logits: list | None = None,
    keep_correct: list | None = None,
    keep_loss: list | None = None,
):
    """-> (weighted loss, per-step losses [length], per-step correct counts [length], per-step counts).
    `keep_logits`, if a list, receives each step's draft logits [B, T, Vd] (for tests and analysis);
    `keep_correct` each step's (correct [B, T], counted [B, T]) booleans (the doctor's paired test);
    `keep_loss` each step's soft cross-entropy [B, T] at every position (counted or not: `keep_correct` says)."""
    B, T = batch.ids.shape
    dev = batch.ids.device
    h = draft.project(batch.feats.to(draft.fc.weight.dtype))
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril_()
    eye = torch.eye(T, dtype=torch.bool, device=dev)
    extra: list = []
    total = h.new_zeros((), dtype=torch.float32)
    losses, correct, counts = [], [], []
    keep = (batch.loss_mask > 0) & batch.valid
    for k in range(length):
        ids_in = _shift(batch.ids, 1 + k)
        # the token predicted at (t, k) is t + 2 + k; its distribution is the target's at position t + 1 + k
        w = _shift(keep, 2 + k, False) & _shift(in_dv, 1 + k, False) & _shift(batch.valid, 1 + k, False)
        p = _shift(p_dv, 1 + k)
        mask = torch.cat([causal] + [eye] * k, dim=1)[None]
        pos = torch.arange(T, device=dev) + k
        cos, sin = draft.rotary(pos, h.dtype)
        emb = draft.embed_tokens(ids_in).to(h.dtype)
        out, kv = draft.midlayer(emb, h, cos, sin, mask=mask, extra_kv=extra)
        extra.append(kv)
        logits = draft.lm_head(draft.norm(out)).float()
        if keep_logits is not None:
            keep_logits.append(logits.detach())
        ce = -(p * F.log_softmax(logits, dim=-1)).sum(-1)
        if keep_loss is not None:
            keep_loss.append(ce.detach())
        n = w.sum()
        loss_k = (ce * w).sum() / n.clamp(min=1)
        total = total + (decay**k) * loss_k
        with torch.no_grad():
            losses.append(loss_k.detach())
            hit = (logits.argmax(-1) == p.argmax(-1)) & w
            correct.append(hit.sum())
            if keep_correct is not None:
                keep_correct.append((hit, w))
            counts.append(n)
        h = out
    return total, torch.stack(losses), torch.stack(correct), torch.stack(counts)


@torch.no_grad()
def teacher_forced_hits(
    draft, batch: TargetBatch, lm_head_w: torch.Tensor, hot_ids: torch.Tensor, steps: int, decay: float = 0.8
):
    """-> (correct, counted), bool [B, steps, T], and loss, float [B, T]: at position t, whether the draft's step k,
    unrolled on its own outputs from t, predicts the target's greedy token (t + 2 + k), and whether that position
    counts. Along the target's own greedy text the leading run of correct steps is what a chain drafted from t gets
    accepted. loss[t] is the training loss of the chain drafted from t (sum over k of decay**k times step k's soft
    cross-entropy against the target's distribution; NaN where a step does not count): the quantity training
    minimized, so a draft run under another wiring than its trained one shows it here with far less noise than in
    the 0/1 hits (the doctor's record check decides wirings on it)."""
    p, in_dv = target_distribution(batch, lm_head_w, hot_ids)
    keep: list = []
    ce: list = []
    ttt_forward(draft, batch, p, in_dv, length=steps, decay=decay, keep_correct=keep, keep_loss=ce)
    correct, counted = torch.stack([c for c, _ in keep], 1), torch.stack([w for _, w in keep], 1)
    loss = sum((decay**k) * c for k, c in enumerate(ce)).masked_fill(~counted.all(1), float("nan"))
    return correct, counted, loss


def simulated_accept_length(acc: list[float]) -> float:
    """1 + sum_k prod_{i<=k} acc_i: tokens per verify for a chain whose position k accepts with
    probability acc_k given the previous ones (SGLang scale: the +1 is the bonus token; SpecForge's
    number has no +1)."""
    out, run = 1.0, 1.0
    for a in acc:
        run *= a
        out += run
    return out


@torch.inference_mode()
def accepted_runs(target, draft, seqs: list[list[int]], capture, steps: int, chunk: int = 8):
    """Teacher-forced along each sequence, `chunk` sequences a forward: per sequence (runs, counted), both [len]:
    runs[p] = the leading correct steps of a chain of `steps` drafted from position p (0 where not counted),
    counted[p] = whether position p has `steps` tokens after it to check. The training record, the doctor's record
    check and the CPU chain pick read acceptance from this one function."""
    return [(runs, counted) for runs, counted, _ in accepted_runs_each(target, draft, seqs, [capture], steps, chunk)[0]]


def accepted_runs_each(target, draft, seqs: list[list[int]], captures: list, steps: int, chunk: int = 8, stop=None):
    """accepted_runs under each of `captures` (CaptureSpecs), one target forward a chunk for all of them: the target
    captures the union of their layers once and each wiring's features are sliced from it (the target's forward,
    not the draft's, is most of the cost). -> one list per capture of (runs, counted, loss) per sequence: as
    accepted_runs returns, with teacher_forced_hits' per-position loss. `stop(so_far)`, called after each chunk with
    those lists so far, ends the measurement early where it returns True (the lists then cover the first sequences
    only)."""
    from ..capture import CaptureSpec
    from .data import Example, pad_batch

    dev, lm = target.device, target.lm_head_weight()
    hot = draft.to_target_ids(torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device)).to(dev)
    union = sorted({i for c in captures for i in c.after_layers})
    H = target.info.hidden_size
    slot = {layer: n for n, layer in enumerate(union)}
    # each wiring's columns of the union's features, in the wiring's own order
    cols = [
        torch.cat([torch.arange(slot[layer] * H, (slot[layer] + 1) * H) for layer in c.after_layers]).to(dev)
        for c in captures
    ]
    out: list[list] = [[] for _ in captures]
    for i in range(0, len(seqs), chunk):
        part = seqs[i : i + chunk]
        ids, _, valid = pad_batch([Example(s, [1] * len(s)) for s in part])
        ids, valid = ids.to(dev), valid.to(dev)
        hidden, feats = target.features(ids, valid.long(), CaptureSpec(tuple(union)))
        for idx, runs_c in zip(cols, out):
            b = TargetBatch(feats.index_select(-1, idx), ids, valid.long(), valid, hidden)
            correct, counted, loss = (x.cpu() for x in teacher_forced_hits(draft, b, lm, hot, steps))
            runs = torch.cumprod(correct.long(), 1).sum(1)  # [B, T] (a correct step is a counted one)
            runs_c += [(runs[j, : len(s)], counted[j, 0, : len(s)], loss[j, : len(s)]) for j, s in enumerate(part)]
        if stop is not None and i + chunk < len(seqs) and stop(out):
            break
    return out
