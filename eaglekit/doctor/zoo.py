"""The fault zoo: wiring faults seeded into copies of a trained pair, each with the verdict the doctor must give,
and the confusion table of what it gave.

    python -m eaglekit.doctor.zoo [--out DIR] [--json FILE] [--only NAME,...] [--quick]

Two target families: the shipped demo Llama pair, and a Qwen2 target built from the demo target's weights (q, k,
v biases added: k's random, which softmax ignores, so it computes the same function; its draft is the demo draft
rewired to it: its record names the Qwen2 target). Each fault is one of docs/faults.md's classes, or a
row of issue 43's table; most are seeded into the pair as vLLM would be given it (`eaglekit export --to vllm`),
some with the draft's `eaglekit` block (and training record) removed, as a draft from another tool comes. The cases
of issue 64 are faults outside the layer wiring that only the draft's training record shows (eaglekit.doctor.recorded),
and right pairs that must stay clean with it (another dtype, the built-in prompts, a draft recorded by doctor --record).

Outcomes, per case: `right` the verdict the case expects (a fault with one of its codes; clean; or cannot tell
where nothing can tell), `wrong cause` a fault with none of the expected codes, `cannot tell` where a fault or a
clean bill was expected, `false clean` clean where a fault was, `false alarm` a fault where none was.
The engine doctor (`eaglekit doctor --engine vllm`) runs the same cases through
eaglekit.integrations.vllm.doctor.zoo_main (the integrations layer sits above this one, so it passes its runner in).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..options import DOCTOR_DEVICE, DoctorOptions, ModelOptions

OUTCOMES = ("right", "wrong cause", "cannot tell", "false clean", "false alarm")


@dataclass
class Case:
    name: str
    family: str  # llama (the demo pair) | qwen2
    fault: str  # what is seeded, in words
    expect: str  # fault | clean | cannot_tell
    codes: tuple[str, ...] = ()  # a fault's acceptable codes (any one of them is the right cause)
    build: Callable | None = None  # (Pairs, out: Path) -> (target_dir, draft_dir, other ModelOptions fields)
    engine: bool = True  # also run through the engine doctor
    quick: bool = False  # refused before the probe: cheap enough for the default test tier
    issue_row: str | None = None  # the row of issue 43's table it re-runs
    warn: tuple[str, ...] = ()  # codes that must be among the findings whatever the verdict
    engine_expect: str | None = None  # the engine doctor's verdict where it differs (vLLM sorts the ids)
    engine_warn: tuple[str, ...] = ()


# --- the pairs ------------------------------------------------------------------------------------------------
def _assets() -> Path:
    return Path(__file__).resolve().parents[1] / "assets" / "demo"


def _edit_config(d: Path, fn) -> Path:
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


def _edit_weights(d: Path, fn) -> Path:
    from safetensors.torch import load_file, save_file

    w = load_file(d / "model.safetensors")
    fn(w)
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    return d


def _copy(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def third_party(d: Path) -> Path:
    """As a draft from another tool comes: no eaglekit block (no target record, no d2t hash, no features), no
    training record."""
    no_record(d)
    return _edit_config(d, lambda c: c.pop("eaglekit", None))


def no_record(d: Path) -> Path:
    from ..train.record import RECORD_FILE

    (d / RECORD_FILE).unlink(missing_ok=True)
    return d


def set_ids(d: Path, ids) -> Path:
    """Capture ids written into a vLLM folder (both places vLLM may read)."""

    def f(c):
        c["eagle_aux_hidden_state_layer_ids"] = list(ids)
        c.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = list(ids)
        blk = c.get("eaglekit") or {}
        blk.pop("capture", None)  # a record of the old ids would conflict (E219): the folder's ids are the fault

    return _edit_config(d, f)


def roll_d2t(w: dict) -> None:
    """The mapping rolled by one (row i gets row i-1's target token): shapes, range and one-to-one stay valid, every
    lm_head row points at another token. (Rolling the offsets themselves changes little where they are mostly
    equal: the demo's draft vocabulary is nearly the first 4096 ids.)"""
    ar = torch.arange(w["d2t"].numel())
    w["d2t"] = (torch.roll(ar + w["d2t"].long(), 1) - ar).to(w["d2t"].dtype)
    if "t2d" in w:
        from ..draft.checkpoint import t2d_from_d2t

        w["t2d"] = t2d_from_d2t(w["d2t"], w["t2d"].numel())


def perturb_target(src: Path, dst: Path, scale: float = 0.05, seed: int = 1) -> Path:
    """A same-shape target with other weights: every matrix multiplied by 1 + scale * N(0, 1) elementwise."""
    from safetensors.torch import load_file, save_file

    _copy(src, dst)
    g = torch.Generator().manual_seed(seed)
    for f in sorted(dst.glob("*.safetensors")):
        w = load_file(f)
        for k, v in w.items():
            if v.is_floating_point() and v.dim() >= 2:
                w[k] = (v.float() * (1 + scale * torch.randn(v.shape, generator=g))).to(v.dtype)
        save_file(w, f, metadata={"format": "pt"})
    return dst


def qwen2_target(src: Path, dst: Path) -> Path:
    """The demo target as a Qwen2 model: the same weights, q/k/v biases added (q and v zero, k random: a key bias
    adds q.b_k to every score of a query, which softmax ignores), so the same function in another family."""
    from safetensors.torch import load_file, save_file

    _copy(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=cfg["num_hidden_layers"],
    )
    cfg.pop("attention_bias", None)
    cfg.pop("mlp_bias", None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    g = torch.Generator().manual_seed(7)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    for f in sorted(dst.glob("*.safetensors")):
        w = load_file(f)
        for k in [k for k in w if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))]:
            b = k[: -len("weight")] + "bias"
            rows = w[k].shape[0]
            w[b] = (0.5 * torch.randn(rows, generator=g) if "k_proj" in k else torch.zeros(rows)).to(w[k].dtype)
            index["weight_map"][b] = f.name
        save_file(w, f, metadata={"format": "pt"})
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return dst


def shuffle_d2t(w: dict, share: float = 0.1, seed: int = 3) -> None:
    """`share` of the draft ids exchange their target tokens among themselves (t2d unchanged: the same set)."""
    n = w["d2t"].numel()
    g = torch.Generator().manual_seed(seed)
    pick = torch.randperm(n, generator=g)[: int(n * share)]
    ids = torch.arange(n) + w["d2t"].long()
    ids[pick] = ids[pick[torch.randperm(pick.numel(), generator=g)]]
    w["d2t"] = (ids - torch.arange(n)).to(w["d2t"].dtype)


def other_chat_template(src: Path, dst: Path) -> Path:
    """The target with another chat template than the one its draft was trained and recorded with."""
    _copy(src, dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}<|assistant|>\n"
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return dst


class Pairs:
    """The base pairs every case starts from, built once under `root`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        a = _assets()
        self.targets = {"llama": a / "target"}
        self.drafts = {"llama": a / "draft"}  # eaglekit's own folder (features and d2t hash recorded)
        self._vllm: dict[str, Path] = {}

    def target(self, family: str) -> Path:
        if family not in self.targets:
            self.targets[family] = qwen2_target(self.targets["llama"], self.root / "qwen2_target")
        return self.targets[family]

    def draft(self, family: str) -> Path:
        """The eaglekit folder of the family's draft (the demo draft; for qwen2 re-recorded for that target)."""
        if family not in self.drafts:
            from ..draft import load_draft, save_draft
            from ..models import load_target
            from ..train.fingerprint import weights_fingerprint

            t = load_target(self.target(family))
            d = load_draft(self.drafts["llama"], embed_weight=t.embed_weight())
            c = d.config
            c.target_fingerprint, c.target_tokenizer = t.info.fingerprint, t.tokenizer_fingerprint
            c.target_weights = weights_fingerprint(self.target(family))
            self.drafts[family] = save_draft(d, self.root / f"{family}_draft")
        return self.drafts[family]

    def recorded_third_party(self, family: str) -> Path:
        """The family's vLLM export as another tool writes it (no eaglekit block, no record), then recorded by
        `eaglekit doctor --record` on its own target: a pair the user trusts."""
        out = self.root / f"{family}_third_party_recorded"
        if not out.exists():
            from .recorded import write_pair_record

            third_party(_copy(self.vllm(family), out))
            write_pair_record(self.target(family), out, log=lambda s: None)
        return out

    def vllm(self, family: str) -> Path:
        """The family's draft exported for vLLM against its target (records the target's weights fingerprint)."""
        if family not in self._vllm:
            from ..draft import load_draft
            from ..interop.export import export
            from ..models import load_target

            t = load_target(self.target(family))
            d = load_draft(self.draft(family), embed_weight=t.embed_weight())
            out = self.root / f"{family}_vllm"
            export(d, out, "vllm", target=t)
            self._vllm[family] = out
        return self._vllm[family]


# --- the cases ------------------------------------------------------------------------------------------------
def _v(family, *edits, third=False, kwargs=None):
    """A case built on the family's vLLM export: a copy with `edits` applied (each fn(draft_dir))."""

    def build(p: Pairs, out: Path):
        d = _copy(p.vllm(family), out / "draft")
        if third:
            third_party(d)
        for e in edits:
            e(d)
        return p.target(family), d, dict(kwargs or {})

    return build


def _e(family, *edits, target=None, kwargs=None):
    """A case built on the family's eaglekit folder; `target(p, out)` gives another target folder."""

    def build(p: Pairs, out: Path):
        d = _copy(p.draft(family), out / "draft")
        for e in edits:
            e(d)
        return (target(p, out) if target else p.target(family)), d, dict(kwargs or {})

    return build


def _perturbed(family):
    return lambda p, out: perturb_target(p.target(family), out / "target")


def _w(fn):
    return lambda d: _edit_weights(d, fn)


def _c(fn):
    return lambda d: _edit_config(d, fn)


def _no_weights(d: Path) -> Path:
    """The draft recording only its features: no weights fingerprint, no training record."""
    no_record(d)
    return _edit_config(d, lambda c: c["eaglekit"]["target"].pop("weights", None))


def _recorded(family, target=None, kwargs=None):
    """A case built on the family's third-party draft recorded by `doctor --record` (Pairs.recorded_third_party)."""

    def build(p: Pairs, out: Path):
        d = _copy(p.recorded_third_party(family), out / "draft")
        return (target(p, out) if target else p.target(family)), d, dict(kwargs or {})

    return build


def _no_prompts(p: Pairs, out: Path):
    """The draft's own target in a folder without its prompts: the probe takes the built-in ones."""
    return _copy(p.target("llama"), out / "target")


def _abs_d2t(w):
    w["d2t"] = w["d2t"] + torch.arange(w["d2t"].numel())


def _regenerated(w):  # another valid mapping, as a vocabulary regenerated at fine-tuning gives
    hot = torch.arange(w["d2t"].numel()) * 2
    w["d2t"] = hot - torch.arange(hot.numel())
    from ..draft.checkpoint import t2d_from_d2t

    w["t2d"] = t2d_from_d2t(w["d2t"], w["t2d"].numel())


def _untrained(p: Pairs, out: Path):
    from ..capture import CaptureSpec
    from ..draft import new_draft, save_draft
    from ..models import load_target

    t = load_target(p.target("llama"))
    return (
        p.target("llama"),
        save_draft(new_draft(t, capture=CaptureSpec((1, 5, 8)), draft_vocab_size=4096, seed=1), out / "draft"),
        {},
    )


def _other_hidden(p: Pairs, out: Path):
    """A draft of another hidden size with no target_hidden_size (reference section 7, fault 8)."""
    d = _copy(p.vllm("llama"), out / "draft")
    _edit_config(d, lambda c: c["transformer_layer_config"].update(hidden_size=128) or c.pop("eaglekit", None))
    return p.target("llama"), d, {}


CASES = [
    Case("clean", "llama", "nothing: the demo pair exported for vLLM", "clean", build=_v("llama")),
    Case(
        "clean-eaglekit-folder", "llama", "nothing: the demo pair as shipped", "clean", build=_e("llama"), engine=False
    ),
    Case(
        "clean-third-party",
        "llama",
        "nothing, but the draft records nothing of its target (eaglekit block removed)",
        "cannot_tell",
        build=_v("llama", third=True),
    ),
    Case(
        "ids+1-vllm",
        "llama",
        "aux ids one layer high in vLLM's convention ([3, 7, 10]), no eaglekit block",
        "fault",
        ("E290", "E291"),
        _v("llama", lambda d: set_ids(d, [3, 7, 10]), third=True),
        issue_row="1",
    ),
    Case(
        "ids-1-vllm",
        "llama",
        "SpecForge's 'output of' ids ([1, 5, 8]) written into a vLLM folder",
        "fault",
        ("E290", "E291"),
        _v("llama", lambda d: set_ids(d, [1, 5, 8])),
    ),
    Case(
        "ids+2-vllm",
        "llama",
        "aux ids two layers high ([4, 8, 11]), no eaglekit block",
        "fault",
        ("E290", "E291"),
        _v("llama", lambda d: set_ids(d, [4, 8, 11]), third=True),
        issue_row="7",
    ),
    Case(
        "ids-reversed",
        "llama",
        "the right ids in reverse order ([9, 6, 2])",
        "fault",
        ("E290",),
        _v("llama", lambda d: set_ids(d, [9, 6, 2])),
        issue_row="5",
        engine_expect="clean",
        engine_warn=("W282",),
    ),
    Case(
        "extra-embedding",
        "llama",
        "the embedding captured too: ids [0, 2, 6, 9] (reference 7.1)",
        "fault",
        ("E202", "E293"),
        _v("llama", lambda d: set_ids(d, [0, 2, 6, 9])),
        quick=True,
    ),
    Case(
        "last-layer-only",
        "llama",
        "one capture, the last layer ([12]) (reference 7.11)",
        "fault",
        ("E202", "E293"),
        _v("llama", lambda d: set_ids(d, [12])),
        quick=True,
    ),
    Case(
        "no-ids",
        "llama",
        "no ids in the config; the draft was trained on the default (reference 10.2)",
        "clean",
        build=_v(
            "llama",
            lambda d: _edit_config(
                d,
                lambda c: (
                    c.pop("eagle_aux_hidden_state_layer_ids"),
                    c["eagle_config"].pop("eagle_aux_hidden_state_layer_ids"),
                    c["eaglekit"].pop("capture"),
                ),
            ),
        ),
        warn=("W301",),
    ),
    Case(
        "d2t-missing",
        "llama",
        "d2t and t2d absent (reference 7.4)",
        "fault",
        ("E210", "E293"),
        _v("llama", _w(lambda w: (w.pop("d2t"), w.pop("t2d")))),
        quick=True,
    ),
    Case(
        "d2t-absolute",
        "llama",
        "d2t written as absolute ids (reference 7.5)",
        "fault",
        ("E207", "E293"),
        _v("llama", _w(_abs_d2t)),
        quick=True,
    ),
    Case(
        "d2t-rolled",
        "llama",
        "d2t rolled by one, no eaglekit block (no hash)",
        "fault",
        ("E222",),
        _v("llama", _w(roll_d2t), third=True),
        issue_row="3",
    ),
    Case(
        "d2t-rolled-hash",
        "llama",
        "d2t rolled by one, the draft's recorded d2t hash kept",
        "fault",
        ("E217",),
        _v("llama", _w(roll_d2t)),
        quick=True,
        issue_row="4",
    ),
    Case(
        "d2t-regenerated",
        "llama",
        "another valid vocabulary mapping (reference 7.6)",
        "fault",
        ("E217",),
        _e("llama", _w(_regenerated)),
        quick=True,
        engine=False,
    ),
    Case(
        "other-weights",
        "llama",
        "a same-shape target with other weights (5% perturbed), weights recorded",
        "fault",
        ("E220",),
        lambda p, out: (perturb_target(p.target("llama"), out / "target"), _copy(p.vllm("llama"), out / "draft"), {}),
    ),
    # a draft that records its features and not its target's weights (as drafts trained before weights fingerprints):
    # the features' statistics move with the probe text as much as with the weights (identity.py), so nothing decides
    Case(
        "other-weights-features",
        "llama",
        "the same, the draft recording only its features",
        "cannot_tell",
        build=_e("llama", _no_weights, target=_perturbed("llama")),
        engine=False,
    ),
    Case(
        "own-target-features",
        "llama",
        "nothing: the draft's own target in a folder without its prompts, the draft "
        "recording only its features (its statistics far from the built-in prompts')",
        "cannot_tell",
        build=_e("llama", _no_weights, target=lambda p, out: _copy(p.target("llama"), out / "target")),
        engine=False,
    ),
    Case(
        "other-weights-third-party",
        "llama",
        "the same, no eaglekit block",
        "cannot_tell",
        build=lambda p, out: (
            perturb_target(p.target("llama"), out / "target"),
            third_party(_copy(p.vllm("llama"), out / "draft")),
            {},
        ),
        issue_row="2",
    ),
    Case(
        "other-config",
        "llama",
        "a draft recorded for a target of another shape (reference 7.7)",
        "fault",
        ("E208",),
        _v("llama", _c(lambda c: c["eaglekit"]["target"].update(fingerprint="0123456789abcdef"))),
        quick=False,
    ),
    Case(
        "other-tokenizer",
        "llama",
        "trained with another tokenizer / chat template (reference 7.9, 10)",
        "fault",
        ("E215",),
        _v("llama", _c(lambda c: c["eaglekit"]["target"].update(tokenizer="fedcba9876543210"))),
        quick=False,
    ),
    Case(
        "other-vocab",
        "llama",
        "the draft config declares another vocabulary",
        "fault",
        ("E203", "E205", "E214", "E107", "E293"),
        _v("llama", _c(lambda c: c["transformer_layer_config"].update(vocab_size=8000))),
        quick=True,
        issue_row="6",
    ),
    Case(
        "other-hidden",
        "llama",
        "a draft of hidden size 128 with no target_hidden_size (reference 7.8)",
        "fault",
        ("E203", "E204", "E107", "E202", "E293"),
        _other_hidden,
        quick=True,
        issue_row="8",
    ),
    Case(
        "norm-undeclared",
        "llama",
        "a norm_before_fc weight the config does not declare (reference 7.10, 7.12)",
        "fault",
        ("E218", "E293"),
        _v("llama", _w(lambda w: w.__setitem__("fc_norm.weight", torch.ones(768, dtype=torch.bfloat16)))),
        quick=True,
    ),
    Case(
        "conflicting-ids",
        "llama",
        "two places of the folder declare different layers",
        "fault",
        ("E219",),
        _e("llama", _c(lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 5, 8]))),
        engine=False,
    ),
    Case(
        "short-context",
        "llama",
        "the draft's max_position_embeddings far below the target's (reference 7.14)",
        "clean",
        build=_v("llama", _c(lambda c: c["transformer_layer_config"].update(max_position_embeddings=512))),
        warn=("W283",),
    ),
    Case("untrained", "llama", "an untrained draft", "fault", ("E282",), _untrained, engine=False),
    # faults outside the layer wiring, found by the training record (issue 64; eaglekit.doctor.recorded)
    Case(
        "rope-theta",
        "llama",
        "the draft's rope_theta changed in its config (10000 -> 500000)",
        "fault",
        ("E224", "E223"),
        _v("llama", _c(lambda c: c["transformer_layer_config"].update(rope_theta=500000.0))),
        engine=False,
    ),
    Case(
        "norm-before-residual",
        "llama",
        "norm_before_residual flipped in the draft's config",
        "fault",
        ("E224", "E223"),
        _v("llama", _c(lambda c: c.update(norm_before_residual=True))),
        engine=False,
    ),
    Case(
        "d2t-shuffled-10pct",
        "llama",
        "10% of the d2t entries shuffled among themselves, the config's d2t hash removed",
        "fault",
        ("E217", "E223", "E222"),
        _v("llama", _w(shuffle_d2t), _c(lambda c: c["eaglekit"].pop("vocab_map_sha256"))),
        engine=False,
    ),
    Case(
        "tie-word-embeddings",
        "llama",
        "tie_word_embeddings set on a draft with its own lm_head (eaglekit ignores "
        "it; an engine that honours it ties lm_head to the embedding)",
        "fault",
        ("E224",),
        _v("llama", _c(lambda c: c["transformer_layer_config"].update(tie_word_embeddings=True))),
        engine=False,
    ),
    Case(
        "other-chat-template",
        "llama",
        "a draft from another tool recorded with doctor --record, served with another chat template",
        "fault",
        ("E215",),
        _recorded("llama", target=lambda p, out: other_chat_template(p.target("llama"), out / "target")),
        engine=False,
    ),
    Case(
        "clean-recorded",
        "llama",
        "nothing: a draft from another tool (no eaglekit block), recorded with doctor --record on its own target",
        "clean",
        build=_recorded("llama"),
        engine=False,
    ),
    Case(
        "clean-bfloat16",
        "llama",
        "nothing: the demo pair exported for vLLM, run in bfloat16 (recorded in float32)",
        "clean",
        build=_v("llama", kwargs={"dtype": "bfloat16"}),
        warn=("I312",),
        engine=False,
    ),
    Case(
        "clean-builtin-prompts",
        "llama",
        "nothing: the demo pair as shipped, its target in a folder without its "
        "prompts (the probe takes the built-in ones; the record its own sample)",
        "clean",
        build=_e("llama", target=_no_prompts),
        engine=False,
    ),
    Case("qwen2-clean", "qwen2", "nothing: the Qwen2 pair exported for vLLM", "clean", build=_v("qwen2")),
    Case(
        "qwen2-ids+1",
        "qwen2",
        "aux ids one layer high in vLLM's convention",
        "fault",
        ("E290", "E291"),
        _v("qwen2", lambda d: set_ids(d, [3, 7, 10])),
    ),
    Case(
        "qwen2-d2t-rolled",
        "qwen2",
        "d2t rolled by one, no eaglekit block",
        "fault",
        ("E222",),
        _v("qwen2", _w(roll_d2t), third=True),
    ),
    Case(
        "qwen2-other-weights",
        "qwen2",
        "a same-shape Qwen2 target with other weights",
        "fault",
        ("E220",),
        lambda p, out: (perturb_target(p.target("qwen2"), out / "target"), _copy(p.vllm("qwen2"), out / "draft"), {}),
    ),
    Case(
        "qwen2-extra-embedding",
        "qwen2",
        "the embedding captured too",
        "fault",
        ("E202", "E293"),
        _v("qwen2", lambda d: set_ids(d, [0, 2, 6, 9])),
        quick=True,
    ),
]


# --- running and scoring --------------------------------------------------------------------------------------
def outcome(case: Case, res: dict, engine: bool = False) -> str:
    status = res.get("status") or ("fault" if res.get("fault") else "clean")
    codes = {f["code"] for f in res.get("findings") or []}
    expect, warn = case.expect, case.warn
    if engine and case.engine_expect:
        expect, warn = case.engine_expect, case.engine_warn
    if warn and not set(warn) <= codes:
        return "wrong cause"
    if expect == "fault":
        if status == "fault":
            errors = {f["code"] for f in res["findings"] if f["severity"] == "error"}
            return "right" if errors & set(case.codes) else "wrong cause"
        return "cannot tell" if status == "cannot_tell" else "false clean"
    if expect == "clean":
        return {"clean": "right", "cannot_tell": "cannot tell"}.get(status, "false alarm")
    return {"cannot_tell": "right", "clean": "false clean"}.get(status, "false alarm")  # expect cannot_tell


def run_case(case: Case, pairs: Pairs, out: Path, runner) -> dict:
    """One case: seed it, run `runner(model)` on its ModelOptions (device cpu, the doctor's), score the JSON it
    returns."""
    from ..errors import EaglekitError

    work = out / case.name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    t0 = time.time()
    assert case.build is not None  # every case seeds its fault with one
    target, draft, kw = case.build(pairs, work)
    try:
        res = runner(ModelOptions(target=target, draft=draft, device=DOCTOR_DEVICE, **kw))
    except EaglekitError as e:  # the doctor could not run: exit 2, never a verdict
        res = {
            "status": "could_not_run",
            "exit_code": 2,
            "fault": False,
            "verdict": f"could not run: {e}",
            "findings": [{"code": e.code, "severity": "error", "message": e.message}],
        }
    got = outcome(case, res, engine="engine" in res)
    errors = [f for f in res.get("findings") or [] if f["severity"] == "error"]
    alone = res.get("eaglekit_alone")  # the engine doctor carries the doctor's own verdict: both tables, one run
    extra = (
        {
            "alone": {
                "status": alone["status"],
                "outcome": outcome(case, alone),
                "codes": [f["code"] for f in alone["findings"] if f["severity"] == "error"],
                "verdict": (alone.get("verdict") or "")[:1500],
                "decide": alone.get("decide") or [],
            }
        }
        if alone
        else {}
    )
    return {
        **extra,
        "case": case.name,
        "family": case.family,
        "fault": case.fault,
        "expect": case.expect,
        "expect_codes": list(case.codes),
        "issue_row": case.issue_row,
        "status": res.get("status"),
        "exit_code": res.get("exit_code"),
        "codes": [f["code"] for f in errors]
        or [f["code"] for f in res.get("findings") or [] if f["code"] in case.warn],
        "outcome": got,
        "verdict": res.get("verdict", "")[:1500],
        "decide": res.get("decide") or [],
        "fixes": [f.get("fix") for f in errors if f.get("fix")][:2],
        "seconds": round(time.time() - t0, 1),
    }


def confusion(rows: list[dict]) -> dict:
    table: dict[str, Any] = {o: 0 for o in OUTCOMES}  # counts per outcome, then the shares
    for r in rows:
        table[r["outcome"]] += 1
    n = len(rows)
    faults = [r for r in rows if r["expect"] == "fault"]
    table.update(
        cases=n,
        right_share=round(table["right"] / n, 3) if n else None,
        faults=len(faults),
        faults_right=sum(r["outcome"] == "right" for r in faults),
    )
    return table


def print_table(rows: list[dict], title: str) -> None:
    w = max(len(r["case"]) for r in rows)
    print(f"\n{title}")
    print(f"{'case':<{w}}  {'family':<6}  {'expect':<11}  {'status':<12}  {'codes':<18}  outcome")
    for r in rows:
        exp = r["expect"] + (f" {'/'.join(r['expect_codes'])}" if r["expect_codes"] else "")
        print(
            f"{r['case']:<{w}}  {r['family']:<6}  {exp[:11]:<11}  {r['status']!s:<12}  "
            f"{','.join(r['codes'])[:18]:<18}  {r['outcome']}"
        )
    c = confusion(rows)
    print(
        "confusion: " + ", ".join(f"{o} {c[o]}" for o in OUTCOMES) + f" of {c['cases']} cases "
        f"({c['right_share']:.0%} right)"
    )


def run_zoo(runner, out: Path, only=None, quick: bool = False, engine: bool = False, log=print) -> list[dict]:
    pairs = Pairs(out / "_pairs")
    rows = []
    for case in sorted(CASES, key=lambda c: c.issue_row or "9") if engine else CASES:
        if (only and case.name not in only) or (quick and not case.quick) or (engine and not case.engine):
            continue
        r = run_case(case, pairs, out, runner)
        log(f"{r['case']}: {r['status']} {r['codes']} -> {r['outcome']} ({r['seconds']} s)")
        rows.append(r)
    return rows


def doctor_runner(opts: DoctorOptions | None = None):
    from . import run_doctor

    return lambda model: run_doctor(model, opts)


def main(argv=None, runner=None, title="eaglekit doctor") -> int:
    ap = argparse.ArgumentParser(prog="python -m eaglekit.doctor.zoo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/eaglekit-zoo", help="where the seeded copies are written")
    ap.add_argument("--json", default=None, help="write the rows and the confusion table here")
    ap.add_argument("--only", default=None, help="comma-separated case names")
    ap.add_argument("--quick", action="store_true", help="only the cases refused before the probe")
    ap.add_argument("--time-budget", type=float, default=None)
    args = ap.parse_args(argv)
    engine = runner is not None
    if runner is None:
        runner = doctor_runner(DoctorOptions(time_budget=args.time_budget) if args.time_budget is not None else None)
    t0 = time.time()
    rows = run_zoo(runner, Path(args.out), args.only.split(",") if args.only else None, args.quick, engine)
    print_table(rows, f"{title}: fault zoo, {len(rows)} cases, {time.time() - t0:.0f} s")
    if args.json:
        from ..io import atomic_write_json

        atomic_write_json(
            args.json,
            {"doctor": title, "rows": rows, "confusion": confusion(rows), "seconds": round(time.time() - t0, 1)},
        )
    c = confusion(rows)
    return 0 if c["false clean"] == 0 and c["false alarm"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
