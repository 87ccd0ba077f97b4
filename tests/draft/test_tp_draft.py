"""draft/tp.py: the draft split over tensor-parallel ranks like its target (built on the meta device: no process
group is needed to build it, only to run it)."""

import pytest
import torch

from eaglekit.distributed import TPGroup
from eaglekit.draft.model import DraftConfig
from eaglekit.draft.tp import tp_draft
from eaglekit.errors import InputError
from eaglekit.models.tp import RowParallelLinear


def _group(world: int) -> TPGroup:
    return TPGroup(world=world, rank=0, device=torch.device("cpu"), backend="gloo", timeout_s=1.0)


def test_the_draft_layer_is_split_like_the_target():
    cfg = DraftConfig(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, vocab_size=96,
                      draft_vocab_size=32, head_dim=16)
    d = tp_draft(cfg, _group(2))
    a, m = d.midlayer.self_attn, d.midlayer.mlp
    assert (d.config.num_heads, d.config.num_kv_heads, d.config.intermediate_size) == (2, 1, 64)
    assert isinstance(a.o_proj, RowParallelLinear) and isinstance(m.down_proj, RowParallelLinear)
    assert a.o_proj.out_features == 64 and m.down_proj.in_features == 64


def test_a_draft_that_does_not_divide_is_refused():
    cfg = DraftConfig(hidden_size=64, intermediate_size=128, num_heads=3, num_kv_heads=3, vocab_size=96,
                      draft_vocab_size=32, head_dim=16)
    with pytest.raises(InputError, match="not divisible by 2"):
        tp_draft(cfg, _group(2))
