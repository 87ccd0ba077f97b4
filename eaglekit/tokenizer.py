"""Tokenizers from model folders (transformers' AutoTokenizer, offline), and prompt files."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import InputError

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(folder: str | Path, required: bool = True):
    """The tokenizer of a model folder (or of a .gguf target: eaglekit.gguf.resolve_target)."""
    from .gguf import resolve_target
    from .io import check_folder_json, need_dir

    folder = need_dir(resolve_target(folder), "model folder")
    if not any((folder / f).is_file() for f in _TOKENIZER_FILES):
        if required:
            raise InputError(
                f"no tokenizer in {folder} (looked for {', '.join(_TOKENIZER_FILES)})",
                fix="copy the tokenizer files into the target folder, or pass token ids",
                code="E109",
            )
        return None
    from transformers import AutoTokenizer

    check_folder_json(folder)  # a broken config.json / tokenizer.json is named, not reported as "the tokenizer"
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # noqa: BLE001 (tokenizers raises a bare Exception for a tokenizer.json it cannot use)
        raise InputError(
            f"the tokenizer in {folder} cannot be loaded: {e}", fix="re-save the tokenizer", code="E109"
        ) from None


def tokenizer_fingerprint(folder: str | Path) -> str | None:
    """A hash of a folder's tokenizer files and chat template: a draft records it, because a prompt rendered
    by another tokenizer or template is not what the draft learned (reference fault 9). A folder materialized from
    a GGUF gives the hash of the file's tokenizer metadata (eaglekit.gguf.gguf_tokenizer_fingerprint)."""
    import hashlib

    from .gguf import resolve_target

    folder = Path(resolve_target(folder))
    fp = gguf_tokenizer_of(folder)
    if fp:
        return fp
    h = hashlib.sha256()
    found = hash_tokenizer_files(folder, h)
    tmpl = config_chat_template(folder)
    if tmpl:
        h.update(json.dumps(tmpl).encode())
    for name in CHAT_TEMPLATE_FILES:
        if (folder / name).is_file():
            h.update((folder / name).read_bytes())
    return h.hexdigest()[:16] if found else None


TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def gguf_tokenizer_of(folder: Path) -> str | None:
    """For a folder materialized from a GGUF (eaglekit.gguf), the hash of the file's tokenizer metadata, else None.
    Such a folder's tokenizer files are written by the transformers release that materialized it, and releases write
    the same tokenizer in different bytes: a digest of those files would move between two machines that read one
    GGUF (a draft trained beside transformers 5.17 was called another tokenizer's beside 5.25)."""
    from .gguf import MARKER

    if not (folder / MARKER).is_file():
        return None
    try:
        return json.loads((folder / MARKER).read_text()).get("tokenizer_fingerprint") or None
    except (json.JSONDecodeError, AttributeError):
        return None


def hash_tokenizer_files(folder: Path, h) -> bool:
    """Feed `h` (a hashlib object) each tokenizer file of `folder`, name then bytes, in TOKENIZER_FILES' order: the
    one reading behind tokenizer_fingerprint and the training record's digests. -> whether any file was found."""
    found = False
    for name in TOKENIZER_FILES:
        f = folder / name
        if f.is_file():
            h.update(name.encode() + f.read_bytes())
            found = True
    return found


def config_chat_template(folder: Path):
    """tokenizer_config.json's chat_template (None where the file, the field or valid JSON is missing)."""
    cfg = folder / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    try:
        return json.loads(cfg.read_text()).get("chat_template")
    except json.JSONDecodeError:
        return None


def chat_template_of(tokenizer) -> str | None:
    """The tokenizer's chat template, or None where it has none (a tokenizer object without the field, as a plain
    tokenizers.Tokenizer or a test's stand-in, has none): the one read of it for --chat, chat data and the server."""
    return getattr(tokenizer, "chat_template", None)


def token_ids(out) -> list[int]:
    """The ids of apply_chat_template(tokenize=True): a list, or a BatchEncoding / dict holding them as input_ids
    (transformers' releases differ)."""
    if isinstance(out, dict) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    return list(out)


def encode(tokenizer, text: str, chat: bool = False) -> list[int]:
    if chat:
        if not chat_template_of(tokenizer):
            raise InputError(
                "--chat was given but the tokenizer has no chat template",
                fix="leave out --chat, or add a chat_template to tokenizer_config.json",
                code="E109",
            )
        return token_ids(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
        )
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def read_prompts(path: str | Path) -> list[str]:
    """A prompt file: JSONL (one object per line with "prompt" or "text"), or plain text in which
    prompts are separated by lines holding only `---` (a file without such lines is one prompt)."""
    from .io import read_utf8

    path = Path(path)
    if path.suffix == ".jsonl":  # streamed, a line at a time (io.iter_lines)
        from .io import iter_jsonl

        out: list[str] = []
        for n, obj in iter_jsonl(path):
            p = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else obj
            if not isinstance(p, str):
                raise InputError(
                    f"{path}:{n} has no string field 'prompt' or 'text'",
                    code="E102",
                    fix='write lines like {"prompt": "..."}',
                )
            out.append(p)
    else:
        out = []
        cur: list[str] = []
        for line in read_utf8(path, "prompt file").split("\n"):
            if line.strip() == "---":
                out.append("\n".join(cur))
                cur = []
            else:
                cur.append(line)
        out.append("\n".join(cur))
        out = [p for p in out if p.strip()]
    if not out:
        raise InputError(f"prompt file {path} holds no prompt", fix="add at least one prompt", code="E102")
    return out
