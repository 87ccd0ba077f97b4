"""The demo pair recipe: a Llama-architecture target and its EAGLE-3 draft, trained from nothing on
the Python standard library's own source code (it ships with every interpreter, so no download).

Stages, each skipped when its output exists (a killed recipe resumes):
  corpus     list the stdlib .py files; ~5% (by a hash of the path) are held out, never trained on
  tokenizer  byte-level BPE trained with `tokenizers` on the training files
  target     next-token pretraining of the target; written as a Hugging Face folder
  regen      the target continues random windows of the training files (half greedy, half sampled)
  draft      EAGLE-3 TTT training (online features) on the regenerated data
  prompts    held-out prompts (a function's `def` line and the code before it)
  eval       simulated accept length on held-out data, and the real engine's accept length

    eaglekit recipe demo --out runs/demo --preset gpu     # the shipped pair (H200, ~7 minutes)
    eaglekit recipe demo --out runs/demo --preset cpu     # a smaller pair on a CPU
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

from ..io import atomic_write_bytes, atomic_write_json
from ..observe.metrics import fmt

PRESETS: dict[str, dict[str, Any]] = {
    # what the shipped pair was trained with (one H200)
    "gpu": dict(
        vocab=8192,
        hidden=256,
        layers=12,
        heads=4,
        kv_heads=2,
        inter=768,
        seq_len=512,
        batch=128,
        lr=3e-3,
        pre_steps=6000,
        pre_budget=150,
        prompts=16384,
        prompt_len=64,
        gen_len=192,
        regen_batch=1024,
        draft_vocab=4096,
        draft_batch=64,
        draft_lr=6e-4,
        draft_steps=8000,
        draft_budget=150,
        draft_max_len=256,
        max_files=None,
        eval_prompts=12,
        eval_new=128,
    ),
    # a usable smaller pair on a 2-core CPU (about half an hour)
    "cpu": dict(
        vocab=4096,
        hidden=128,
        layers=8,
        heads=4,
        kv_heads=2,
        inter=384,
        seq_len=256,
        batch=16,
        lr=3e-3,
        pre_steps=1500,
        pre_budget=900,
        prompts=1024,
        prompt_len=48,
        gen_len=96,
        regen_batch=128,
        draft_vocab=2048,
        draft_batch=16,
        draft_lr=1e-3,
        draft_steps=1500,
        draft_budget=600,
        draft_max_len=144,
        max_files=600,
        eval_prompts=8,
        eval_new=64,
    ),
    # seconds, for tests of the recipe itself
    "tiny": dict(
        vocab=384,
        hidden=32,
        layers=8,
        heads=2,
        kv_heads=1,
        inter=64,
        seq_len=64,
        batch=8,
        lr=3e-3,
        pre_steps=30,
        pre_budget=None,
        prompts=32,
        prompt_len=16,
        gen_len=16,
        regen_batch=16,
        draft_vocab=128,
        draft_batch=8,
        draft_lr=1e-3,
        draft_steps=12,
        draft_budget=None,
        draft_max_len=32,
        max_files=12,
        eval_prompts=2,
        eval_new=12,
    ),
}
PAD, EOS = "<|pad|>", "<|endoftext|>"


def stdlib_files(max_files: int | None = None, root: str | Path | None = None) -> tuple[Path, list[str]]:
    root = Path(root) if root else Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and "dist-packages" not in p.parts
    )
    if max_files:
        step = max(len(files) // max_files, 1)
        files = files[::step][:max_files]
    return root, files


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 20 == 0


def stage_corpus(out: Path, p: dict, stdlib: str | Path | None = None) -> dict:
    path = out / "corpus.json"
    if path.is_file():
        return json.loads(path.read_text())
    root, files = stdlib_files(p["max_files"], stdlib)
    split = {"train": [f for f in files if not is_heldout(f)], "heldout": [f for f in files if is_heldout(f)]}
    if not split["heldout"]:  # tiny subsets: keep at least one file aside
        split["heldout"] = split["train"][-1:]
        split["train"] = split["train"][:-1]
    if stdlib is None:
        version = sys.version.split()[0]
    else:  # another interpreter's library: its VERSION file if present, else the folder's name
        vf = root / "VERSION"
        version = vf.read_text().strip() if vf.is_file() else root.name
    info: dict[str, object] = {"python": version, "stdlib_root": str(root.resolve())}
    for k, names in split.items():
        h = hashlib.sha256()
        size = 0
        for n in names:
            data = (root / n).read_bytes()
            h.update(n.encode() + b"\0" + data)
            size += len(data)
        info[k] = {"files": names, "count": len(names), "bytes": size, "sha256": h.hexdigest()}
    atomic_write_json(path, info)
    return info


def _texts(corpus: dict, split: str) -> list[str]:
    root = Path(corpus["stdlib_root"])
    return [(root / f).read_text(errors="replace") for f in corpus[split]["files"]]


def stage_tokenizer(out: Path, corpus: dict, p: dict):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder = out / "target"
    if not (folder / "tokenizer.json").is_file():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=p["vocab"],
            special_tokens=[PAD, EOS],
            min_frequency=2,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(_texts(corpus, "train"), trainer)
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
        fast.save_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _stream(tok, texts: list[str]) -> torch.Tensor:
    eos = tok.convert_tokens_to_ids(EOS)
    ids = []
    for enc in tok(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def stage_target(out: Path, corpus, tok, p: dict, device: str, log) -> dict:
    from .pretrain import LlamaShape, PretrainConfig, llama_config, new_target_net, pretrain, save_target_folder

    folder = out / "target"
    report = out / "target_train.json"
    if report.is_file() and (folder / "config.json").is_file():
        return json.loads(report.read_text())
    train, held = _stream(tok, _texts(corpus, "train")), _stream(tok, _texts(corpus, "heldout"))
    log(f"target: {train.numel()} training tokens, {held.numel()} held-out tokens")
    raw = llama_config(
        LlamaShape(len(tok), p["hidden"], p["layers"], p["heads"], p["kv_heads"], p["inter"]),
        max_pos=2048,
        eos_id=tok.convert_tokens_to_ids(EOS),
    )
    net = new_target_net(raw, seed=0)
    cfg = PretrainConfig(
        seq_len=p["seq_len"],
        batch_size=p["batch"],
        lr=p["lr"],
        max_steps=p["pre_steps"],
        time_budget_s=p["pre_budget"],
        eval_every=max(p["pre_steps"] // 40, 10),
        warmup=min(100, p["pre_steps"] // 10),
    )
    res = pretrain(net, train, held, cfg, device, ckpt=out / "target_ckpt.pt", log=log)
    save_target_folder(net, raw, folder)
    res["params"] = sum(x.numel() for x in net.parameters())
    res["train_tokens_per_epoch"] = int(train.numel())
    atomic_write_json(report, res)
    (out / "target_ckpt.pt").unlink(missing_ok=True)
    return res


def stage_regen(out: Path, corpus, tok, target, p: dict, log):
    from .data import Example, load_examples, write_examples
    from .regen import regenerate

    path = out / "regen.jsonl"
    if path.is_file():
        return load_examples(path, None, 10**9)
    g = torch.Generator().manual_seed(1)
    stream = _stream(tok, _texts(corpus, "train"))
    L = p["prompt_len"]
    starts = torch.randint(0, stream.numel() - L, (p["prompts"],), generator=g).tolist()
    prompts = [stream[s : s + L].tolist() for s in starts]
    t0 = time.time()
    ex: list[Example] = regenerate(
        target,
        prompts,
        p["gen_len"],
        batch_size=p["regen_batch"],
        temperature=0.8,
        greedy_share=0.5,
        seed=2,
        eos_ids=target.info.eos_token_ids,
        mask_prompt=False,
    )
    log(f"regen: {len(ex)} sequences, {sum(len(e) for e in ex)} tokens in {time.time() - t0:.0f}s")
    write_examples(path, ex)
    return ex


def stage_draft(out: Path, target, examples, p: dict, device: str, log) -> dict:
    from ..capture import CaptureSpec
    from ..draft import save_draft
    from .data import Example
    from .loop import Indexed, heldout_split
    from .run import prepare_draft
    from .sources import OnlineSource
    from .trainer import TrainConfig, train_draft
    from .vocab import count_tokens

    report = out / "draft_train.json"
    if report.is_file() and (out / "draft" / "config.json").is_file():
        return json.loads(report.read_text())
    spec = CaptureSpec.default(target.info.num_layers)
    examples = [Example(e.input_ids[: p["draft_max_len"]], e.loss_mask[: p["draft_max_len"]]) for e in examples]
    train_idx, held_idx = heldout_split(len(examples), 1 / 32, 0)
    train = [examples[i] for i in train_idx]
    draft, hot, coverage = prepare_draft(target, count_tokens(train, target.info.vocab_size), spec, p["draft_vocab"])
    log(f"draft vocab: {p['draft_vocab']} of {target.info.vocab_size} tokens cover {coverage:.1%} of the data")
    cfg = TrainConfig(
        out=str(out / "draft_run"),
        batch_size=p["draft_batch"],
        max_steps=p["draft_steps"],
        lr=p["draft_lr"],
        warmup=0.05,
        save_every=max(p["draft_steps"] // 4, 5),
        time_budget_s=p["draft_budget"],
    )
    res = train_draft(
        draft,
        Indexed(OnlineSource(target, examples, spec), train_idx),
        target.lm_head_weight(),
        hot,
        cfg,
        device,
        eval_indices=held_idx,
        progress=True,
    )
    save_draft(draft, out / "draft", dtype=torch.bfloat16)
    res["coverage"] = coverage
    atomic_write_json(report, res)
    return res


def stage_prompts(out: Path, corpus, tok, p: dict) -> list[str]:
    path = out / "prompts.jsonl"
    if path.is_file():
        return [json.loads(x)["prompt"] for x in path.read_text().splitlines() if x.strip()]
    prompts = heldout_prompts(corpus, tok, max(p["eval_prompts"], 32))
    # atomic: a recipe killed here and run again reads the file as complete
    atomic_write_bytes(path, "".join(json.dumps({"prompt": x}) + "\n" for x in prompts).encode())
    return prompts


def heldout_prompts(corpus, tok, n: int, max_tokens: int = 120) -> list[str]:
    """Code ending with a `def ...:` line of a held-out file: the model writes the function body."""
    cands = []
    root = Path(corpus["stdlib_root"])
    for f in corpus["heldout"]["files"]:
        lines = (root / f).read_text(errors="replace").split("\n")
        for i, line in enumerate(lines):
            if line.lstrip().startswith("def ") and line.rstrip().endswith(":") and i > 3:
                ctx = lines[max(0, i - 30) : i + 1]
                text = "\n".join(ctx) + "\n"
                while len(tok(text)["input_ids"]) > max_tokens and len(ctx) > 1:
                    ctx = ctx[1:]
                    text = "\n".join(ctx) + "\n"
                cands.append(text)
    step = max(len(cands) // n, 1)
    return cands[::step][:n]


def stage_eval(out: Path, target, draft, tok, prompts, examples, p: dict, device: str, log) -> dict:
    from ..decoding.compare import compare
    from ..decoding.decoder import Decoder
    from ..decoding.tree import TreeShape

    res = {}
    for name, shape in (("chain (3,1,4)", TreeShape(3, 1, 4)), ("tree (6,8,48)", TreeShape(6, 8, 48))):
        ids = [tok(text)["input_ids"] for text in prompts[: p["eval_prompts"]]]
        c = compare(Decoder(target, draft, shape), ids, p["eval_new"], alternate=False)
        m = c.eagle.metrics
        res[name] = {
            "accept_length": c.summary()["accept_length"],
            "per_position": [round(x, 3) for x in m.per_position],
            "identical_to_baseline": c.identical,
            "prompts": len(ids),
        }
        log(
            f"eval {name}: accept length {fmt(m.accept_length)}, per position "
            f"{[round(x, 2) for x in m.per_position]}, identical {c.identical}"
        )
    atomic_write_json(out / "eval.json", res)
    return res


STAGES = ("corpus", "tokenizer", "target", "regen", "draft", "prompts", "eval")


def run_demo_recipe(
    out: str | Path,
    preset: str = "gpu",
    device: str = "auto",
    log=print,
    stop_after: str | None = None,
    stdlib: str | Path | None = None,
) -> dict:
    from ..pair import pick_device

    p = PRESETS[preset]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device(device)
    times = {}
    t = time.time()
    corpus = stage_corpus(out, p, stdlib)
    log(
        f"corpus: {corpus['train']['count']} training files ({corpus['train']['bytes'] / 1e6:.1f} MB), "
        f"{corpus['heldout']['count']} held out; Python {corpus['python']}"
    )
    tok = stage_tokenizer(out, corpus, p)
    times["corpus+tokenizer"] = time.time() - t
    if stop_after in ("corpus", "tokenizer"):
        return {"stopped_after": stop_after}
    t = time.time()
    tres = stage_target(out, corpus, tok, p, device, log)
    times["target"] = time.time() - t
    if stop_after == "target":
        return {"stopped_after": stop_after, "target": tres}
    from ..models import load_target

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    target = load_target(out / "target", device=device, dtype=dtype)
    t = time.time()
    examples = stage_regen(out, corpus, tok, target, p, log)
    times["regen"] = time.time() - t
    if stop_after == "regen":
        return {"stopped_after": stop_after}
    t = time.time()
    dres = stage_draft(out, target, examples, p, device, log)
    times["draft"] = time.time() - t
    prompts = stage_prompts(out, corpus, tok, p)
    from ..draft import load_draft

    draft = load_draft(out / "draft", device=device, dtype=dtype, embed_weight=target.embed_weight())
    t = time.time()
    ev = stage_eval(out, target, draft, tok, prompts, examples, p, device, log)
    times["eval"] = time.time() - t
    summary = {
        "preset": preset,
        "settings": p,
        "device": device,
        "torch": torch.__version__,
        "stage_seconds": {k: round(v, 1) for k, v in times.items()},
        "target": {k: tres.get(k) for k in ("params", "steps", "tokens", "history", "train_tokens_per_epoch")},
        "draft": {"heldout": dres.get("heldout"), "steps": dres.get("steps"), "coverage": dres.get("coverage")},
        "eval": ev,
    }
    atomic_write_json(out / "recipe.json", summary)
    return summary


def demo_fingerprint(target_dir, draft_dir, n_prompts: int = 192, log=print) -> dict:
    """Backfill the feature fingerprint of a demo draft trained before fingerprints were recorded: the recipe's
    regen stage over again (same windows of the training files, same seeds and settings; the first `n_prompts`
    of them, cut to the draft stage's max length), features at the draft's capture, FeatureSketch as the trainer
    records it. Writes only config.json's eaglekit.features; the weights are untouched."""
    from transformers import AutoTokenizer

    from ..models import load_target
    from ..models.config import read_json
    from .data import Example
    from .fingerprint import sketch_of
    from .regen import regenerate

    assets = Path(target_dir).parent
    corpus = json.loads((assets / "corpus.json").read_text())
    if not Path(corpus["stdlib_root"]).is_dir():  # the same Python version's library, found here
        corpus["stdlib_root"] = sysconfig.get_paths()["stdlib"]
    root = Path(corpus["stdlib_root"])
    corpus["train"]["files"] = [f for f in corpus["train"]["files"] if (root / f).is_file()]
    p = PRESETS["gpu"]
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    target = load_target(target_dir)
    raw = read_json(Path(draft_dir) / "config.json", "draft config")
    from ..capture import CaptureSpec

    spec = CaptureSpec.from_dict(raw["eaglekit"]["capture"])
    g = torch.Generator().manual_seed(1)
    stream = _stream(tok, _texts(corpus, "train"))
    L = p["prompt_len"]
    starts = torch.randint(0, stream.numel() - L, (p["prompts"],), generator=g).tolist()[:n_prompts]
    prompts = [stream[s : s + L].tolist() for s in starts]
    ex = regenerate(
        target,
        prompts,
        p["gen_len"],
        batch_size=64,
        temperature=0.8,
        greedy_share=0.5,
        seed=2,
        eos_ids=target.info.eos_token_ids,
        mask_prompt=False,
    )
    ex = [Example(e.input_ids[: p["draft_max_len"]], e.loss_mask[: p["draft_max_len"]]) for e in ex]
    sk = sketch_of(target, ex, spec)
    raw["eaglekit"]["features"] = sk.to_json(spec.after_layers)
    atomic_write_json(Path(draft_dir) / "config.json", raw)
    log(f"fingerprint over {sk.n} tokens of {len(ex)} regenerated sequences written to {draft_dir}/config.json")
    return raw["eaglekit"]["features"]
