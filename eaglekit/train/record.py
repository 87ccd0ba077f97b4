"""The training record: what a draft accepted on held-out text of its own target, and what it was run with.

One JSON file beside the draft's config (RECORD_FILE), written by `eaglekit train` (on its held-out split),
`eaglekit eval --data` (on that data) and `eaglekit doctor --record` (on the probe's prompts continued by the
target: for a pair the user trusts, made elsewhere); `eaglekit export` carries it. It holds:

  sample      at most MAX_SEQUENCES sequences of token ids (each cut to MAX_TOKENS), and their digest
  runs        per sequence, per position, the accepted run of a chain of `steps` drafted there, teacher-forced
              along the sequence (one character a position: '0'..'9', '.' where the position does not count);
              the doctor measures the same positions again and compares them pairwise (paired_difference)
  acceptance  per-position acceptance, the simulated accept length of that chain, the positions and sequences
  config      every config field that changes the draft's function (FUNCTION_FIELDS, read through the folder's
              own layout), the capture it ran with, and their digest
  d2t         the vocabulary mapping's digest (eaglekit.draft.checkpoint.vocab_map_sha)
  target      the target's config fingerprint, weights fingerprint, tokenizer and chat template digests
  run         the target's dtype, backend and device, and the products kind: what the numbers were measured with

The measurement is the doctor's: the draft loaded from its folder in the target's dtype, fused, with the pair's
products (eaglekit.pair.set_pair_products), so the right pair measured again in the same setup gives the same runs.
The record is a few hundred kB at most (64 x 128 ids and runs); a folder without one reads as before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

RECORD_FILE = "eaglekit_record.json"
VERSION = 1
MAX_SEQUENCES = 64
MAX_TOKENS = 128  # per sequence: the doctor measures the whole sample again, within its time budget
STEPS = 3  # the default chain (TreeShape(3, 1, 4)): the doctor's probe length
# the config fields that change what the draft computes (max_position_embeddings does not: the doctor's W283)
FUNCTION_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "tie_word_embeddings",
    "sliding_window",
    "attention_bias",
    "bias",
)


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def function_fields(folder) -> dict:
    """The FUNCTION_FIELDS of a draft folder in any layout, normalised (absent flags False, rope in one spelling),
    so an eaglekit folder and its vLLM export read the same."""
    from ..draft.checkpoint import _from_speculators, sliding_window_of
    from ..models.config import rope_from, rope_json

    raw = json.loads((Path(folder) / "config.json").read_text())
    if "Eagle3Speculator" in (raw.get("architectures") or []) or "transformer_layer_config" in raw:
        raw = _from_speculators(raw)
    eagle = raw.get("eagle_config") or {}
    out = {k: raw.get(k) for k in FUNCTION_FIELDS}
    rope = rope_json(rope_from(raw))
    out.update(
        rope_theta=rope["rope_theta"],
        rope_scaling=rope.get("rope_scaling"),
        sliding_window=sliding_window_of(raw),
        norm_before_fc=bool(eagle.get("norm_before_fc", raw.get("norm_before_fc", False))),
    )
    for k in ("norm_before_residual", "fc_norm", "norm_output", "tie_word_embeddings", "attention_bias", "bias"):
        out[k] = bool(out[k])
    out["num_key_value_heads"] = out["num_key_value_heads"] or out["num_attention_heads"]
    out["draft_vocab_size"] = out["draft_vocab_size"] or out["vocab_size"]
    out["intermediate_size"] = out["intermediate_size"] or 4 * int(out["hidden_size"])
    out["hidden_act"] = out["hidden_act"] or "silu"
    if out["target_hidden_size"] == out["hidden_size"]:
        out["target_hidden_size"] = None
    return out


def tokenizer_digests(target_dir) -> dict:
    """The target folder's tokenizer files and chat template, digested apart (eaglekit.tokenizer's fingerprint
    hashes both together): the doctor says which of the two changed. A folder materialized from a GGUF gives the
    GGUF's tokenizer metadata hash for the tokenizer (eaglekit.tokenizer.gguf_tokenizer_of: its files' bytes depend
    on the transformers release that wrote them)."""
    from ..tokenizer import CHAT_TEMPLATE_FILES, config_chat_template, gguf_tokenizer_of, hash_tokenizer_files

    folder = Path(target_dir)
    tokenizer = gguf_tokenizer_of(folder)
    if tokenizer is None:  # (a GGUF's folder: its tokenizer files are not read, megabytes the digest would ignore)
        h = hashlib.sha256()
        tokenizer = h.hexdigest()[:16] if hash_tokenizer_files(folder, h) else None
    tmpl = config_chat_template(folder)
    for name in CHAT_TEMPLATE_FILES:
        if (folder / name).is_file():
            tmpl = (tmpl or "") + (folder / name).read_text(errors="replace")
    return {"tokenizer": tokenizer, "chat_template": digest(tmpl) if tmpl else None}


def sample_of(seqs: list[list[int]]) -> list[list[int]]:
    """At most MAX_SEQUENCES sequences, each cut to MAX_TOKENS (the shortest dropped: a sequence of fewer than 8
    tokens has too few positions to count)."""
    return [list(map(int, s[:MAX_TOKENS])) for s in seqs if len(s) >= 8][:MAX_SEQUENCES]


@torch.no_grad()
def measure(target, draft, seqs: list[list[int]], capture, steps: int = STEPS, chunk: int = 8) -> list[str]:
    """Per sequence, the accepted run (leading correct steps of a chain of `steps`) at each position, teacher-forced
    along the sequence, as a string ('.' where the position does not count). The doctor's probe (Probe._runs)
    reads the same runs from the same function, teacher_forced_hits."""
    return measure_each(target, draft, seqs, [capture], steps, chunk)[0]


def measure_each(
    target,
    draft,
    seqs: list[list[int]],
    captures: list,
    steps: int = STEPS,
    chunk: int = 8,
    stop=None,
    losses: list | None = None,
) -> list[list[str]]:
    """measure under each of `captures`, the target run once for all (train.ttt.accepted_runs_each). `losses`, if a
    list, receives one list per capture of each sequence's training loss (teacher_forced_hits) at the positions
    where every step counts: the same positions under every capture, so the lists pair. `stop(runs, losses)`: called
    after each chunk with the runs and losses so far (one list per capture), True ends the measurement there."""
    from .ttt import accepted_runs_each

    done: list[list[str]] = [[] for _ in captures]
    lost: list[list[torch.Tensor]] = [[] for _ in captures]

    def strings(out):  # the runs as strings, each sequence converted once (stop sees them after every chunk)
        for per, got, loss in zip(out, done, lost):
            new = per[len(got) :]
            got += ["".join(str(int(r)) if c else "." for r, c in zip(runs, counted)) for runs, counted, _ in new]
            loss += [x[~x.isnan()].double() for _, _, x in new]
        return done

    runs = strings(
        accepted_runs_each(
            target,
            draft,
            seqs,
            captures,
            steps,
            chunk,
            None if stop is None else (lambda out: stop(strings(out), lost)),
        )
    )
    if losses is not None:
        losses += lost
    return runs


def summary(runs: list[str], steps: int) -> dict:
    """Per-position acceptance (P(run > k | run >= k)), the simulated accept length and the positions."""
    from .ttt import simulated_accept_length

    vals = [int(c) for r in runs for c in r if c != "."]
    n = len(vals)
    reach = [sum(v >= k for v in vals) for k in range(steps + 1)]
    acc = [reach[k + 1] / reach[k] if reach[k] else 0.0 for k in range(steps)]
    return {
        "per_position": [round(a, 4) for a in acc],
        "accept_length": round(simulated_accept_length(acc), 4),
        "mean_run": round(sum(vals) / max(n, 1), 4),
        "positions": n,
        "sequences": len(runs),
    }


def loaded_as_doctor(target, draft_dir):
    """The draft as the doctor runs it: loaded from its folder in the target's dtype, fused, the pair's products."""
    from ..draft import load_draft
    from ..pair import set_pair_products

    draft = load_draft(draft_dir, device=target.device, dtype=target.dtype, embed_weight=target.embed_weight())
    draft.fuse()
    set_pair_products(target, draft, "auto", target.device)
    return draft


def build_record(
    target,
    target_dir,
    draft_dir,
    seqs: list[list[int]],
    capture,
    written_by: str,
    source: str,
    steps: int = STEPS,
    training: dict | None = None,
    draft=None,
) -> dict:
    """The record of the draft in `draft_dir` on `seqs` (cut by sample_of). `draft`: already loaded as the doctor
    runs it (loaded_as_doctor), else loaded here."""
    from .. import __version__
    from ..draft.checkpoint import vocab_map_sha
    from .fingerprint import weights_fingerprint

    draft = draft if draft is not None else loaded_as_doctor(target, draft_dir)
    sample = sample_of(seqs)
    runs = measure(target, draft, sample, capture, steps)
    fields = function_fields(draft_dir)
    choice = target.products_choice
    rec = {
        "version": VERSION,
        "written_by": written_by,
        "eaglekit": __version__,
        "steps": steps,
        "acceptance": summary(runs, steps),
        "sample": {"source": source, "sha256": digest(sample), "sequences": sample},
        "runs": runs,
        "config": {
            "fields": fields,
            "capture": list(capture.after_layers),
            "sha256": digest({**fields, "capture": list(capture.after_layers)}),
        },
        "d2t_sha256": vocab_map_sha(draft.d2t),
        "target": {
            "fingerprint": target.info.fingerprint,
            "weights": weights_fingerprint(target_dir) if target_dir else None,
            **tokenizer_digests(target_dir),
        }
        if target_dir
        else {"fingerprint": target.info.fingerprint},
        "run": {
            "dtype": str(target.dtype).removeprefix("torch."),
            "backend": target.backend,
            "device": str(target.device),
            "products": choice.kind if choice is not None else None,
        },
    }
    if training:
        rec["training_eval"] = training
    return rec


def write_record(draft_dir, rec: dict) -> Path:
    from ..io import atomic_write_json

    path = Path(draft_dir) / RECORD_FILE
    atomic_write_json(path, rec)
    return path


def read_record(draft_dir) -> dict | None:
    """The folder's record, or None (no record, or one this version cannot read: the doctor then goes without)."""
    path = Path(draft_dir) / RECORD_FILE
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(rec, dict) or rec.get("version") != VERSION or not rec.get("runs"):
        return None
    return rec


def carry(src_dir, out_dir) -> bool:
    """Copy a draft folder's record into an exported folder (every export format allows an extra file)."""
    if src_dir is None or not (Path(src_dir) / RECORD_FILE).is_file():
        return False
    if Path(src_dir).resolve() == Path(out_dir).resolve():
        return True
    from ..io import atomic_write_bytes

    atomic_write_bytes(Path(out_dir) / RECORD_FILE, (Path(src_dir) / RECORD_FILE).read_bytes())
    return True


def ids_of(source, indices) -> list[list[int]]:
    """The token ids of a training source's samples (OnlineSource's examples, or FeatureStore's shards)."""
    from .sources import OnlineSource

    if isinstance(source, OnlineSource):  # its examples are in memory
        return [list(source.examples[i].input_ids) for i in indices]
    out = []
    for i in indices:
        b = source.batch([i], "cpu")
        out.append(b.ids[0][b.valid[0]].tolist())
    return out


def record_draft(
    target,
    target_dir,
    draft_dir,
    seqs: list[list[int]],
    capture,
    written_by: str,
    source: str,
    training: dict | None = None,
    log=print,
) -> dict | None:
    """Measure and write the record of the saved draft in `draft_dir`; None when there is no sample to measure."""
    if not sample_of(seqs):
        return None
    rec = build_record(target, target_dir, draft_dir, seqs, capture, written_by, source, training=training)
    path = write_record(draft_dir, rec)
    a = rec["acceptance"]
    log(
        f"training record: accept length {a['accept_length']:.2f} (chain of {rec['steps']}, teacher-forced) over "
        f"{a['positions']} positions of {a['sequences']} held-out sequences -> {path}"
    )
    return rec
