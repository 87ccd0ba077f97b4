"""The EAGLE-3 draft split over tensor-parallel ranks like its target (eaglekit.models.tp): the alternative to
running the draft replicated on every rank, kept for measuring which of the two is faster. It builds on the
target's row-parallel linear, so it lives on the draft side (models/ is a layer below draft/)."""

from __future__ import annotations

import dataclasses

import torch

from ..distributed import TPGroup
from ..errors import InputError
from ..models.tp import RowParallelLinear
from .model import Eagle3Draft


def tp_draft(draft_cfg, group: TPGroup):
    """An EAGLE-3 draft whose one layer is split like the target's (fc, embedding and lm_head replicated):
    the alternative to running the draft replicated, for measuring which is faster. Random weights."""
    c = draft_cfg
    W = group.world
    for name, n in (
        ("draft heads", c.num_heads),
        ("draft kv heads", c.num_kv_heads),
        ("draft MLP width", c.intermediate_size),
    ):
        if n % W:
            raise InputError(f"{name} {n} is not divisible by {W}", fix="run the draft replicated", code="E144")
    local = dataclasses.replace(
        c,
        num_heads=c.num_heads // W,
        num_kv_heads=c.num_kv_heads // W,
        intermediate_size=c.intermediate_size // W,
        head_dim=c.head_dim,
    )
    with torch.device("meta"):
        d = Eagle3Draft(local)
        a, m = d.midlayer.self_attn, d.midlayer.mlp
        a.o_proj = RowParallelLinear(a.o_proj.in_features, c.hidden_size, a.o_proj.bias is not None, group)
        m.down_proj = RowParallelLinear(m.down_proj.in_features, c.hidden_size, False, group)
    return d
