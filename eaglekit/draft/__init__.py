"""The draft side: the interface the engine uses (base.Draft), the EAGLE-3 module, its checkpoint format,
and the checks that pair it with a target (docs/faults.md: what each code guards against)."""

from __future__ import annotations

import torch

from ..capture import CaptureSpec
from ..errors import ContractError
from ..models.base import Target, TargetInfo
from ..models.config import RopeConfig
from .base import Draft
from .checkpoint import load_draft, save_draft, t2d_from_d2t, vocab_map_sha
from .model import DraftConfig, Eagle3Draft


def pair_problems(
    draft: Eagle3Draft, target: Target, capture: CaptureSpec | None = None, allow_other_target: bool = False
) -> tuple[CaptureSpec, list[ContractError]]:
    """Every way `draft` does not fit `target`, each a ContractError with its code (none: they fit): the
    fault classes of docs/faults.md that show in the configs and tensors (the rest only in acceptance: the
    doctor). `capture` overrides what the draft declares (the doctor's probe, or a user who knows better)."""
    c, t = draft.config, target.info
    spec = capture or c.capture or CaptureSpec.default(t.num_layers)
    out = [
        *_width_problems(draft, t, spec),
        *_vocab_problems(c, t),
        *_d2t_problems(draft, t),
        *_provenance_problems(c, target, allow_other_target),
    ]
    return spec, out


def _width_problems(draft: Eagle3Draft, t: TargetInfo, spec: CaptureSpec) -> list[ContractError]:
    """E204 (the hidden sizes differ), else what the capture checks find: its layers against the target's, and
    fc's input width against the captures."""
    c = draft.config
    if c.t_hidden != t.hidden_size:
        return [
            ContractError(
                f"the draft was built for a target hidden size of {c.t_hidden} "
                f"({'target_hidden_size' if c.target_hidden_size else 'hidden_size'} in its config) but this target's "
                f"hidden size is {t.hidden_size}",
                fix="use a draft trained for this target; if the draft's hidden size differs from the target's, its "
                "config must declare target_hidden_size",
                code="E204",
            )
        ]
    out: list[ContractError] = []
    for check in (lambda: spec.validate(t.num_layers), lambda: spec.check_fc(draft.fc.in_features, t.hidden_size)):
        try:
            check()
        except ContractError as e:
            out.append(e)
    return out


def _vocab_problems(c: DraftConfig, t: TargetInfo) -> list[ContractError]:
    """E205, E206: the vocabulary the draft embeds and the one it proposes from, against the target's."""
    out: list[ContractError] = []
    if c.vocab_size != t.vocab_size:
        out.append(
            ContractError(
                f"the draft embeds a vocabulary of {c.vocab_size} tokens, the target has {t.vocab_size}",
                fix="use a draft trained for this target (same tokenizer)",
                code="E205",
            )
        )
    if c.draft_vocab_size > t.vocab_size:
        out.append(
            ContractError(
                f"the draft vocabulary ({c.draft_vocab_size}) is larger than the target's ({t.vocab_size})",
                fix="draft_vocab_size must be at most the target vocab size",
                code="E206",
            )
        )
    return out


def _d2t_problems(draft: Eagle3Draft, t: TargetInfo) -> list[ContractError]:
    """E214, E207, E212, E213, E217: d2t holds one offset per draft id, in range, one-to-one, t2d marks what it
    maps to, and it is the mapping the lm_head was trained with."""
    c = draft.config
    if draft.d2t.numel() != c.draft_vocab_size:  # (the checks below index d2t by draft id)
        return [
            ContractError(
                f"d2t holds {draft.d2t.numel()} entries but the config's draft_vocab_size is {c.draft_vocab_size}: "
                f"one offset per draft id is needed",
                fix="save the draft with the d2t its lm_head was trained with (eaglekit.draft.save_draft writes both)",
                code="E214",
            )
        ]
    out: list[ContractError] = []
    ids = torch.arange(c.draft_vocab_size, device=draft.d2t.device) + draft.d2t
    bad = int(((ids < 0) | (ids >= t.vocab_size)).sum())
    if bad:
        out.append(
            ContractError(
                f"{bad} of {c.draft_vocab_size} d2t entries map outside the target vocabulary (0..{t.vocab_size - 1}); "
                f"d2t must hold offsets (target_id = i + d2t[i]), not absolute ids",
                fix="rewrite d2t as target_ids - arange(draft_vocab_size)",
                code="E207",
            )
        )
    else:
        dup = c.draft_vocab_size - int(torch.unique(ids).numel())
        if dup:
            out.append(
                ContractError(
                    f"d2t maps {dup} draft ids onto target ids another draft id already has: "
                    f"the mapping must be one-to-one",
                    fix="rebuild d2t from a list of distinct target ids",
                    code="E212",
                )
            )
        t2d = torch.zeros(draft.t2d.numel(), dtype=torch.bool, device=draft.t2d.device)
        t2d[ids[ids < t2d.numel()]] = True
        if draft.t2d.numel() != t.vocab_size or not torch.equal(t2d, draft.t2d.bool()):
            out.append(
                ContractError(
                    f"t2d does not mark the target ids d2t maps to ({int(draft.t2d.sum())} marked, "
                    f"{int(t2d.sum())} expected)",
                    fix="derive t2d from d2t (eaglekit writes it so)",
                    code="E213",
                )
            )
    if c.vocab_map_sha and c.vocab_map_sha != vocab_map_sha(draft.d2t):
        out.append(
            ContractError(
                "the draft's d2t is not the mapping its lm_head was trained with (the recorded hash differs): "
                "each lm_head row would propose the wrong token",
                fix="restore the d2t saved with the draft; never regenerate the vocabulary mapping of a trained draft",
                code="E217",
            )
        )
    return out


def _provenance_problems(c: DraftConfig, target: Target, allow_other_target: bool) -> list[ContractError]:
    """E208, E215: the target and the tokenizer the draft records it was trained with, unless the user vouches
    for this one (--allow-other-target)."""
    t = target.info
    out: list[ContractError] = []
    if c.target_fingerprint and c.target_fingerprint != t.fingerprint and not allow_other_target:
        out.append(
            ContractError(
                f"the draft was trained for a target with fingerprint {c.target_fingerprint}, this target's is "
                f"{t.fingerprint} (a different architecture, size or vocabulary)",
                fix="use the draft's own target, or pass --allow-other-target if you know they are compatible",
                code="E208",
            )
        )
    tok = target.tokenizer_fingerprint
    if c.target_tokenizer and tok and c.target_tokenizer != tok and not allow_other_target:
        out.append(
            ContractError(
                f"the draft was trained with a tokenizer / chat template of fingerprint {c.target_tokenizer}, the "
                f"target folder's is {tok}: prompts would be rendered differently than in training",
                fix="use the tokenizer and chat template the draft was trained with",
                code="E215",
            )
        )
    return out


def check_pair(
    draft: Eagle3Draft, target: Target, capture: CaptureSpec | None = None, allow_other_target: bool = False
) -> CaptureSpec:
    """Refuse a draft that does not fit `target` (the first problem found); return the CaptureSpec to run with."""
    spec, problems = pair_problems(draft, target, capture, allow_other_target)
    if problems:
        raise problems[0]
    return spec


def new_draft(
    target: Target,
    capture: CaptureSpec | None = None,
    draft_vocab_size: int | None = None,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    seed: int = 0,
    dtype=torch.float32,
    rope=None,
) -> Eagle3Draft:
    """A randomly initialised draft shaped for `target` (the starting point of training, and of tests)."""
    t = target.info
    tc = target.cfg
    H = hidden_size or t.hidden_size
    heads = num_heads or (tc.num_heads if tc else max(1, H // 64))
    cfg = DraftConfig(
        hidden_size=H,
        intermediate_size=intermediate_size or (tc.intermediate_size if tc else 4 * H),
        num_heads=heads,
        num_kv_heads=num_kv_heads or (tc.num_kv_heads if tc else heads),
        head_dim=(tc.head_dim if tc and H == t.hidden_size and heads == tc.num_heads else None),
        vocab_size=t.vocab_size,
        draft_vocab_size=draft_vocab_size or t.vocab_size,
        target_hidden_size=t.hidden_size if H != t.hidden_size else None,
        rms_norm_eps=tc.rms_norm_eps if tc else 1e-6,
        rope=rope or (tc.rope if tc else None) or RopeConfig(),  # (DraftConfig's default)
        max_position_embeddings=t.max_position_embeddings,
        capture=capture or CaptureSpec.default(t.num_layers),
        target_fingerprint=t.fingerprint,
        target_vocab_size=t.vocab_size,
        target_num_layers=t.num_layers,
        target_tokenizer=target.tokenizer_fingerprint,
    )
    g = torch.Generator().manual_seed(seed)
    draft = Eagle3Draft(cfg)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name == "embed_tokens.weight":
                continue
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
        if H == t.hidden_size:
            draft.embed_tokens.weight.copy_(target.embed_weight().float())
        draft.t2d.copy_(t2d_from_d2t(draft.d2t, t.vocab_size))
    return draft.to(device=target.device, dtype=dtype)


__all__ = [
    "Draft",
    "DraftConfig",
    "Eagle3Draft",
    "check_pair",
    "load_draft",
    "new_draft",
    "pair_problems",
    "save_draft",
    "vocab_map_sha",
]
