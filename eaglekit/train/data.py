"""Training data in: text files or folders, JSONL with `text`, chat JSONL (`messages` or `conversations`)
rendered with the tokenizer's chat template (loss on assistant tokens only), or pre-tokenized JSONL
(`input_ids` + `loss_mask`, what `eaglekit regenerate` writes).

Everything becomes a list of Examples: token ids and a 0/1 loss mask of the same length, cut into
windows of at most `max_len` tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..io import iter_jsonl, read_record_text
from ..tokenizer import chat_template_of

TEXT_SUFFIXES = (".txt", ".py", ".md", ".rst", ".json", ".c", ".h", ".js", ".ts", ".rs", ".go", ".java")


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]

    def __len__(self):
        return len(self.input_ids)


def roles(messages: list) -> list[dict]:
    """Normalise ShareGPT-style {'from', 'value'} turns to {'role', 'content'}."""
    out = []
    for m in messages:
        if "role" in m:
            out.append({"role": m["role"], "content": m.get("content", "")})
        else:
            role = {
                "human": "user",
                "user": "user",
                "gpt": "assistant",
                "assistant": "assistant",
                "system": "system",
            }.get(m.get("from"), m.get("from"))
            out.append({"role": role, "content": m.get("value", "")})
    return out


def chat_example(tokenizer, messages: list[dict]) -> Example:
    """Render with the chat template; mark the tokens of assistant contents (found by character spans)."""
    if not chat_template_of(tokenizer):
        raise InputError(
            "chat data needs a tokenizer with a chat template",
            fix="add chat_template to tokenizer_config.json, or give plain text data",
            code="E109",
        )
    messages = roles(messages)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans, pos = [], 0
    for m in messages:
        if not m["content"]:
            continue
        i = text.find(m["content"], pos)
        if i < 0:
            continue
        if m["role"] == "assistant":
            spans.append((i, i + len(m["content"])))
        pos = i + len(m["content"])
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(a < e and b > s for s, e in spans)) for a, b in enc["offset_mapping"]]
    return Example(list(enc["input_ids"]), mask)


def _windows(ex: Example, max_len: int, min_len: int = 8) -> list[Example]:
    out = []
    for i in range(0, len(ex), max_len):
        ids, mask = ex.input_ids[i : i + max_len], ex.loss_mask[i : i + max_len]
        if len(ids) >= min_len and any(mask):
            out.append(Example(ids, mask))
    return out


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES + (".jsonl",))


def _is_ints(v) -> bool:
    return isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)


def _need(f, n, name, value, ok: bool, rule: str) -> None:
    if not ok:
        shown = json.dumps(value)
        raise InputError(
            f"{f}:{n}: '{name}' is {shown if len(shown) <= 60 else shown[:57] + '...'}, not {rule}",
            code="E119",
            fix=f"write '{name}' as {rule} at {f}:{n}",
        )


def read_records(path: str | Path):
    """Yield ('text', str) | ('chat', messages) | ('tokens', Example) from a file or folder."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"data path {path} does not exist", fix="pass a file or folder of training data", code="E101")
    for f in _files(path):
        if f.suffix != ".jsonl":
            yield "text", read_record_text(f)
            continue
        for n, obj in iter_jsonl(f):
            if not isinstance(obj, dict):
                raise InputError(
                    f"{f}:{n} is a JSON {type(obj).__name__}, not an object",
                    code="E119",
                    fix='one object per line, e.g. {"text": "..."}',
                )
            if "input_ids" in obj:
                ids, mask = obj["input_ids"], obj.get("loss_mask")
                _need(f, n, "input_ids", ids, _is_ints(ids), "a list of token ids")
                _need(
                    f,
                    n,
                    "loss_mask",
                    mask,
                    mask is None or (_is_ints(mask) and len(mask) == len(ids)),
                    f"a list of 0/1 as long as input_ids ({len(ids)})",
                )
                yield "tokens", Example(ids, mask if mask is not None else [1] * len(ids))
            elif "messages" in obj or "conversations" in obj:
                key = "messages" if "messages" in obj else "conversations"
                msgs = obj[key]
                _need(
                    f,
                    n,
                    key,
                    msgs,
                    isinstance(msgs, list) and all(isinstance(m, dict) for m in msgs),
                    "a list of {role, content} objects",
                )
                yield "chat", msgs
            elif "text" in obj:
                _need(f, n, "text", obj["text"], isinstance(obj["text"], str), "a string")
                yield "text", obj["text"]
            else:
                raise InputError(
                    f"{f}:{n} has none of input_ids, messages, conversations, text",
                    fix="see `eaglekit train --help` for the accepted formats",
                    code="E102",
                )


def load_examples(path, tokenizer, max_len: int) -> list[Example]:
    out = []
    for kind, rec in read_records(path):
        if kind == "text":
            if tokenizer is None:
                raise InputError(
                    "text data needs the target's tokenizer",
                    code="E109",
                    fix="put the tokenizer files in the target folder",
                )
            ids = tokenizer(rec, add_special_tokens=False)["input_ids"]
            ex = Example(list(ids), [1] * len(ids))
        elif kind == "chat":
            ex = chat_example(tokenizer, rec)
        else:
            ex = rec
        out.extend(_windows(ex, max_len))
    if not out:
        raise InputError(
            f"no usable training example in {path} (each needs >= 8 tokens and a loss-mask token)",
            fix="check the data format and the tokenizer",
            code="E102",
        )
    return out


def write_examples(path, examples: list[Example]) -> None:
    from ..io import atomic_write_bytes

    lines = (json.dumps({"input_ids": e.input_ids, "loss_mask": e.loss_mask}) for e in examples)
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())


def pad_batch(examples: list[Example], pad_id: int = 0, length: int | None = None):
    """Right-padded tensors: ids [B, T], loss_mask [B, T], valid [B, T]."""
    import torch

    T = length or max(len(e) for e in examples)
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(examples), T, dtype=torch.long)
    valid = torch.zeros(len(examples), T, dtype=torch.bool)
    for i, e in enumerate(examples):
        n = min(len(e), T)
        ids[i, :n] = torch.tensor(e.input_ids[:n])
        mask[i, :n] = torch.tensor(e.loss_mask[:n])
        valid[i, :n] = True
    return ids, mask, valid
