"""The routed experts as grouped GEMMs (eaglekit.models.moe.Experts.grouped, mode "grouped"): the function the
gathers compute, for tokens that share experts and tokens that do not, the module falling back to its per-call choice
where torch's grouped kernel would need a host sync, and the model decoding the same tokens with either. On a CPU
torch._grouped_mm is torch's loop over the groups; the CUDA kernel's bits and graphs are checked in tests/gpu."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import sequence

from eaglekit.models.moe import Experts, grouped_usable


class _C:  # the config fields Experts reads
    n_routed_experts, moe_intermediate_size, hidden_size = 8, 24, 40


def _experts(seed: int) -> tuple[Experts, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    ex = Experts(_C())
    with torch.no_grad():
        ex.gate_up_proj.copy_(torch.randn(ex.gate_up_proj.shape, generator=g) * 40 ** -0.5)
        ex.down_proj.copy_(torch.randn(ex.down_proj.shape, generator=g) * 24 ** -0.5)
    return ex, g


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("N,k,shared", [(1, 2, False), (6, 2, True), (6, 3, False), (17, 2, True)])
def test_grouped_equals_the_gathers(seed, N, k, shared):
    """Tokens routed to overlapping experts (`shared`: every token picks from the first three, so experts repeat
    across tokens and one expert's group has several rows) or to random ones; the pairs' order within a token kept."""
    ex, g = _experts(seed)
    x = torch.randn(N, 40, generator=g)
    pool = 3 if shared else 8
    idx = torch.stack([torch.randperm(pool, generator=g)[:k] for _ in range(N)])
    w = torch.rand(N, k, generator=g)
    with torch.no_grad():
        want = ex.gather(x, idx, w, fused=False)
        got = ex.grouped(x, idx, w)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    ex.mode = "grouped"
    with torch.no_grad():
        assert torch.equal(ex(x, idx, w), got)


def test_grouped_falls_back_where_the_kernel_needs_a_host_sync():
    """float64 (no grouped kernel in any dtype torch has for it): the per-call choice (gather here)."""
    ex, g = _experts(3)
    ex.double()
    x = torch.randn(2, 40, generator=g, dtype=torch.float64)
    idx, w = torch.tensor([[0, 5], [5, 1]]), torch.rand(2, 2, generator=g, dtype=torch.float64)
    assert not grouped_usable(x, (40, 24))
    ex.mode = "grouped"
    with torch.no_grad():
        assert torch.equal(ex(x, idx, w), ex.gather(x, idx, w, fused=False))
    assert grouped_usable(x.float(), (40, 24))


def test_deepseek_target_decodes_the_same_with_grouped_experts(tmp_path):
    """A tiny DeepSeek-V3 target (q_lora, dense and MoE layers, float32): the same greedy tokens with the experts
    grouped as with the per-call choice, prompt and steps, and logits within float32 rounding."""
    from ds_helpers import make_ds_model

    from eaglekit.models import load_target

    make_ds_model(tmp_path, "deepseek_v3", seed=0)
    ours = load_target(tmp_path)
    ids = torch.randint(3, 96, (12,), generator=torch.Generator().manual_seed(5))

    def run(mode):
        ours.set_experts(mode)
        try:
            ours.reset(40)
            logits, _ = sequence.prefill(ours, ids)
            steps = [logits[-1]]
            for _ in range(8):
                steps.append(sequence.step(ours, steps[-1].argmax().view(1)))
            return torch.stack(steps)
        finally:
            ours.set_experts(None)

    base, grouped = run(None), run("grouped")
    assert torch.equal(grouped.argmax(-1), base.argmax(-1))
    torch.testing.assert_close(grouped, base, rtol=1e-4, atol=1e-4)


def test_generate_runs_the_experts_mode_it_is_given(tmp_path, model_dirs, capsys, monkeypatch):
    """`--experts grouped` reaches a DeepSeek target's experts (they run grouped, and `generate --json` names the mode)
    and the draft's output is what the same mode decodes alone; for a dense target the flag is an E108 error before
    any decoding."""
    import json

    from ds_helpers import make_ds_model
    from helpers import make_tokenizer

    from eaglekit.cli import main
    from eaglekit.draft import new_draft, save_draft
    from eaglekit.models import load_target

    tdir = tmp_path / "t"
    make_ds_model(tdir, "deepseek_v3", seed=3)
    make_tokenizer(tdir, 96)
    save_draft(new_draft(load_target(tdir), seed=1), tmp_path / "d", dtype=torch.float32)
    calls = []
    grouped = Experts.grouped
    monkeypatch.setattr(Experts, "grouped", lambda self, *a: calls.append(1) or grouped(self, *a))
    g = ["generate", "--target", str(tdir), "--prompt", "def add", "--max-new-tokens", "12", "--device", "cpu",
         "--json"]
    out = {}
    for mode in ("auto", "grouped"):
        for draft in ((), ("--draft", str(tmp_path / "d"))):
            calls.clear()
            assert main([*g, *draft, "--experts", mode]) == 0
            res = json.loads(capsys.readouterr().out)
            assert res["metrics"]["experts"] == mode and res["metrics"]["backend"] == "deepseek"
            assert bool(calls) == (mode == "grouped")
            out[mode, bool(draft)] = res["token_ids"]
    assert out["grouped", True] == out["grouped", False] and out["auto", True] == out["auto", False]
    assert main(["generate", "--target", str(model_dirs["llama"]), "--prompt", "def", "--experts", "grouped"]) != 0
    err = capsys.readouterr().err
    assert "E108" in err and "--experts grouped" in err and "mixture-of-experts" in err
