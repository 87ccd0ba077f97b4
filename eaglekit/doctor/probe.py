"""The probe: teacher-forced acceptance of the draft under the configured wiring and its alternatives, over the
same positions, compared pairwise; enlarged round by round until it can tell the wirings apart or its time
budget ends.

Each round the target continues its prompts (batched, greedy), one forward captures EVERY layer's output for
those sequences, and each wiring is a slice of that: so a wiring costs one draft pass, not a target pass.
Per position and wiring the draft's teacher-forced chain gives an accepted run r in 0..steps (the leading
correct steps). The configured wiring is compared with each alternative on the same positions: the mean of
r_conf - r_alt with a standard error clustered by sequence (positions of one sequence are correlated), and
McNemar's discordant counts at position 1. |z| >= Z decides; below it the probe cannot tell the two apart.
The same all-layer features give the target side of the feature fingerprint (eaglekit.train.fingerprint).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..capture import CaptureSpec
from .report import WiringRow

# The probe's text for a target that ships no prompts (most do not): many short, varied prompts, not a few long ones.
# The comparison's standard error is clustered by sequence, so it shrinks with the number of prompts; the first 8 alone,
# extended to longer sequences, left the Qwen2 zoo pair undecided after 45 s (z 1.6-2.8 over 4151 positions), all 40
# decide it in ~5 s (z 3.0 and -4.6 over 1846; docs/performance.md#d42). Code, prose,
# question-and-answer and chat, as targets are served.
GENERIC_PROMPTS = [
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The three primary colours are",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "Once upon a time, in a small village by the sea,",
    "class Stack:\n    def __init__(self):\n",
    "To convert degrees Celsius to Fahrenheit, multiply by",
    "for i in range(10):\n",
    "The quick brown fox",
    "def parse_args():\n    parser = argparse.ArgumentParser(description=",
    "SELECT name, COUNT(*) AS orders\nFROM customers\nJOIN orders ON",
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n",
    "function debounce(fn, wait) {\n  let timer;\n",
    'if [ -f "$CONFIG" ]; then\n    source "$CONFIG"\nfi\n',
    '    def __repr__(self):\n        return f"',
    "try:\n    with open(path) as f:\n        data = json.load(f)\nexcept",
    "# Installation\n\nTo install the package, run",
    "The French Revolution began in 1789 when",
    "Photosynthesis is the process by which plants",
    "Dear Sir or Madam,\n\nI am writing to",
    "Q: What is the capital of Australia?\nA:",
    "Step 1: Preheat the oven to 180 degrees.\nStep 2:",
    "The main difference between a list and a tuple in Python is",
    "In 1969, the Apollo 11 mission",
    "A prime number is a natural number greater than 1 that",
    "User: Can you explain how a hash table works?\nAssistant:",
    "Here is a short poem about the autumn rain:\n\n",
    "The results of the experiment show that",
    "1. Eggs\n2. Flour\n3. Sugar\n4.",
    "To solve the equation 3x + 5 = 20, we first",
    "The mitochondria is often called",
    "Chapter 1\n\nIt was a cold morning in January, and",
    "Water boils at 100 degrees Celsius at sea level because",
    "The meeting has been moved to Thursday at",
    "Machine learning models are trained by",
    "    for key, value in sorted(counts.items()):\n",
    "x = np.linspace(0, 2 * np.pi, 100)\ny =",
    "The best way to learn a new language is",
    "According to the report, the company's revenue",
    "<html>\n  <head>\n    <title>",
    "The sun rose slowly over the hills, and",
]
Z = 3.0  # |z| that decides a comparison: five alternatives at 3 sigma keep the family-wise error under 1%
MIN_SEQUENCES = 4  # a clustered standard error from fewer sequences is itself too uncertain to decide on
MAX_SEQ = 1024  # the probe extends sequences up to this many tokens once its prompts are used up


def probe_prompts(target_dir, prompt_file, vocab: int) -> tuple[list[list[int]], str]:
    """Every prompt the probe may use, in order (it takes them a round at a time)."""
    from ..tokenizer import encode, load_tokenizer, read_prompts

    tok = load_tokenizer(target_dir, required=False)
    if tok is None:  # no tokenizer: random token prompts still compare wirings fairly
        g = torch.Generator().manual_seed(0)
        return [torch.randint(0, vocab, (24,), generator=g).tolist() for _ in range(256)], "random token ids"
    if prompt_file:
        return [encode(tok, t) for t in read_prompts(prompt_file)], str(prompt_file)
    beside = Path(target_dir).parent / "prompts.jsonl"  # a pair shipped with its prompts (the demo pair)
    if beside.is_file():
        return [encode(tok, t) for t in read_prompts(beside)], str(beside)
    return [encode(tok, t) for t in GENERIC_PROMPTS], "built-in prompts"


def wirings(configured: CaptureSpec, num_layers: int) -> list[tuple[str, CaptureSpec]]:
    _, *rest = configured.after_layers
    cands = [
        ("configured", configured),
        ("shifted -1", configured.shifted(-1)),
        ("shifted +1", configured.shifted(+1)),
        ("default [1, n//2-1, n-4]", CaptureSpec.default(num_layers)),
        ("embedding instead of the low layer", CaptureSpec((-1, *rest))),
        ("last layer only", CaptureSpec(tuple([num_layers - 1] * configured.num_captures))),
    ]
    if list(configured.after_layers) != sorted(configured.after_layers):  # vLLM sorts the ids it is given
        cands.insert(1, ("ascending order", CaptureSpec(tuple(sorted(configured.after_layers)))))
    out, seen = [], set()
    for name, spec in cands:
        if spec.after_layers in seen or any(i < -1 or i >= num_layers for i in spec.after_layers):
            continue
        seen.add(spec.after_layers)
        out.append((name, spec))
    return out


@dataclass(eq=False)
class _Seq:
    ids: list[int]
    outcome: dict = field(default_factory=dict)  # wiring name -> (correct [steps, n], counted [steps, n]) bool


class Probe:
    """Sequences, their all-layer features and each wiring's per-position outcome, grown a round at a time."""

    def __init__(self, target, draft, configured: CaptureSpec, steps: int):
        from ..train.fingerprint import FeatureSketch

        self.target, self.draft, self.steps = target, draft, steps
        self.L, self.H = target.info.num_layers, target.info.hidden_size
        self.all_layers = CaptureSpec(tuple(range(-1, self.L)))
        self.cands = [(n, s) for n, s in wirings(configured, self.L)]
        self.fits = {n: s.width(self.H) == draft.fc.in_features for n, s in self.cands}
        self.hot = draft.to_target_ids(torch.arange(draft.config.draft_vocab_size, device=draft.d2t.device))
        self.seqs: list[_Seq] = []
        self.eos = tuple(target.info.eos_token_ids)
        self.sketch = FeatureSketch(self.L + 1, self.H)  # every layer (-1 .. L-1), over the probe's text
        # the vocabulary mapping's own evidence: per position of the configured wiring, the draft id the draft
        # proposes first and the token the target chose there (eaglekit.doctor.vocab reads them)
        self.vocab_pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    # --- growing -----------------------------------------------------------------------------------------
    def _continue(self, prompts: list[list[int]], max_new: int) -> list[list[int]]:
        from ..train.regen import greedy_texts

        return greedy_texts(self.target, prompts, max_new, self.eos)

    def add(self, prompts: list[list[int]], max_new: int) -> None:
        """New sequences: the prompts continued by the target; every wiring's outcome on them."""
        self._run([_Seq(s) for s in self._continue(prompts, max_new)])

    def extend(self, max_new: int) -> bool:
        """Longer sequences: each not ended by EOS continued by `max_new` more tokens and probed again (once the
        prompts are used up). The fingerprint's sums keep the shorter versions too: more text, same statistics."""
        cap = min(MAX_SEQ, self.target.info.max_position_embeddings)
        redo = [s for s in self.seqs if len(s.ids) + 8 <= cap and not (s.ids and s.ids[-1] in self.eos)]
        if not redo:
            return False
        self.seqs = [s for s in self.seqs if s not in redo]
        room = cap - max(len(s.ids) for s in redo)
        self._run([_Seq(x) for x in self._continue([s.ids for s in redo], min(max_new, room))])
        return True

    @torch.no_grad()
    def _run(self, new: list[_Seq], chunk: int = 8) -> None:
        from ..train.data import Example, pad_batch
        from ..train.ttt import TargetBatch, teacher_forced_hits

        dev, lm = self.target.device, self.target.lm_head_weight()
        for i in range(0, len(new), chunk):
            part = new[i : i + chunk]
            ids, _, valid = pad_batch([Example(s.ids, [1] * len(s.ids)) for s in part])
            ids, valid = ids.to(dev), valid.to(dev)
            hidden, feats = self.target.features(ids, valid.long(), self.all_layers)
            self.sketch.add(feats, valid)
            B, T = ids.shape
            per_layer = feats.view(B, T, self.L + 1, self.H)
            for name, spec in self.cands:
                if not self.fits[name]:
                    continue
                f = per_layer[:, :, [j + 1 for j in spec.after_layers]].reshape(B, T, -1)
                b = TargetBatch(f, ids, valid.long(), valid, hidden)
                if name == "configured":
                    correct, counted = self._hits_and_pairs(b, lm, valid)
                else:
                    correct, counted, _ = teacher_forced_hits(self.draft, b, lm, self.hot, self.steps)
                    correct, counted = correct.cpu(), counted.cpu()
                for j, s in enumerate(part):
                    n = len(s.ids)
                    s.outcome[name] = (correct[j, :, :n], counted[j, :, :n])
        self.seqs += new

    def _hits_and_pairs(self, b, lm, valid):
        """teacher_forced_hits, keeping the first step's proposals with the target's own choices."""
        from ..train.ttt import target_distribution, ttt_forward

        p, in_dv = target_distribution(b, lm, self.hot)
        logits, keep = [], []
        ttt_forward(self.draft, b, p, in_dv, length=self.steps, keep_logits=logits, keep_correct=keep)
        proposed = logits[0].argmax(-1)  # [B, T]: at t, the draft id proposed for token t + 2
        chosen = torch.stack([(row.to(lm.dtype) @ lm.T).argmax(-1) for row in b.target_hidden])  # [B, T]: token t + 1
        ok = valid[:, 1:] & valid[:, :-1]
        self.vocab_pairs.append((proposed[:, :-1][ok].cpu(), chosen[:, 1:][ok].cpu()))
        return torch.stack([c for c, _ in keep], 1).cpu(), torch.stack([w for _, w in keep], 1).cpu()

    # --- reading -----------------------------------------------------------------------------------------
    @property
    def positions(self) -> int:
        name = next(n for n, _ in self.cands if self.fits[n])
        return int(sum(int(s.outcome[name][1][0].sum()) for s in self.seqs))

    def _runs(self, name: str) -> list[torch.Tensor]:
        """Per sequence: the accepted run (leading correct steps) at each counted position."""
        out = []
        for s in self.seqs:
            c, w = s.outcome[name]
            out.append(torch.cumprod(c.long(), 0).sum(0)[w[0]].double())
        return out

    def rows(self, decide_z: float = Z) -> list[WiringRow]:
        from ..train.ttt import simulated_accept_length

        rows = []
        ran = [n for n, _ in self.cands if self.fits[n]]
        conf_runs = self._runs("configured") if "configured" in ran else None
        conf_hit = (
            [s.outcome["configured"][0][0][s.outcome["configured"][1][0]] for s in self.seqs]
            if "configured" in ran
            else None
        )
        for name, spec in self.cands:
            if not self.fits[name]:
                rows.append(WiringRow(name, list(spec.after_layers), refused="E202"))
                continue
            corr = sum(s.outcome[name][0].sum(1).double() for s in self.seqs)
            cnt = sum(s.outcome[name][1].sum(1).double() for s in self.seqs)
            acc = (corr / cnt.clamp(min=1)).tolist()
            runs = self._runs(name)
            n = sum(r.numel() for r in runs)
            row = WiringRow(
                name,
                list(spec.after_layers),
                accept_length=round(simulated_accept_length(acc), 4),
                per_position=[round(a, 4) for a in acc],
                positions=n,
                mean_run=round(float(sum(r.sum() for r in runs)) / max(n, 1), 4),
            )
            if conf_runs is not None and name != "configured":
                assert conf_hit is not None  # computed with conf_runs
                diff, se = paired_difference(conf_runs, runs)
                hit = [s.outcome[name][0][0][s.outcome[name][1][0]] for s in self.seqs]
                row.diff, row.se = round(diff, 4), round(se, 4)
                row.z = round(diff / se, 2) if se > 0 else (0.0 if diff == 0 else math.copysign(99.0, diff))
                row.only_configured = int(sum(int((a & ~b).sum()) for a, b in zip(conf_hit, hit)))
                row.only_this = int(sum(int((~a & b).sum()) for a, b in zip(conf_hit, hit)))
                row.decided = abs(row.z) >= decide_z and len(self.seqs) >= MIN_SEQUENCES
            rows.append(row)
        return rows


def paired_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[float, float]:
    """Mean of a - b over all positions, and its standard error: the larger of the one clustered by sequence
    (the list index), sqrt(S / (S - 1) * sum_s (D_s - n_s * mean)^2) / N with D_s the sequence's summed
    difference, and the one that treats positions as independent (a few sequences underestimate the first)."""
    D = torch.tensor([float((x - y).sum()) for x, y in zip(a, b)], dtype=torch.float64)
    n = torch.tensor([x.numel() for x in a], dtype=torch.float64)
    N = float(n.sum())
    if N == 0:
        return 0.0, 0.0
    mean = float(D.sum()) / N
    S = len(a)
    if S < 2:
        return mean, 0.0
    clustered = math.sqrt(S / (S - 1) * float(((D - n * mean) ** 2).sum())) / N
    d = torch.cat([(x - y).double() for x, y in zip(a, b)])
    iid = float(d.std()) / math.sqrt(N) if N > 1 else 0.0
    return mean, max(clustered, iid)


def grow(
    probe: Probe,
    prompts: list[list[int]],
    n_prompts: int,
    max_new: int,
    budget_s: float,
    t_start: float,
    settled,
    bar=None,
) -> list[dict]:
    """Rounds: the first n_prompts prompts; then, while `settled(probe)` is False and the next round (estimated from
    the last) fits the budget, the next n_prompts prompts, then longer continuations of all of them."""
    rounds: list[dict] = []
    used = 0
    last = None
    while True:
        t = time.time()
        if used < len(prompts):
            take = prompts[used : used + n_prompts]
            used += len(take)
            probe.add(take, max_new)
            what = f"+{len(take)} prompts"
        elif probe.extend(max_new):
            what = f"+{max_new} tokens per sequence"
        else:
            break
        last = time.time() - t
        rounds.append(
            {
                "round": len(rounds) + 1,
                "added": what,
                "sequences": len(probe.seqs),
                "positions": probe.positions,
                "seconds": round(last, 1),
            }
        )
        if bar is not None:
            bar.update(1)
            bar.set_postfix(positions=probe.positions)
        if settled(probe):
            break
        est = last * (2.0 if used >= len(prompts) else 1.0)  # an extension redoes every (longer) sequence
        if time.time() - t_start + est > budget_s:
            break
    return rounds
