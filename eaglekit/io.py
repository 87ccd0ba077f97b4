"""Files in and out. Atomic writes: a reader never sees half a file, a killed writer leaves the old file (or none).
Paths, text and a model folder's JSON files given by the user: checked before anything loads, a coded error each."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(path: Path, nbytes: int, e: OSError):
    """The error for a write that ran out of space (ENOSPC) or quota (EDQUOT): what, where, how to go on."""
    from .errors import EaglekitError

    try:
        free = f"{shutil.disk_usage(path.parent).free / 1e6:.1f} MB free"
    except OSError:
        free = "free space unknown"
    what = "disk quota exceeded" if e.errno == errno.EDQUOT else "no space left on the device"
    return EaglekitError(
        f"{what} while writing {path.name} ({nbytes / 1e6:.2f} MB) in {path.parent} ({free}); the file was not "
        f"changed: the previous version (a checkpoint, a shard, a draft) is intact and nothing half-written was left",
        fix=f"free space under {path.parent} (or choose an --out on a larger disk), then run the same command "
        f"again: training resumes from its last checkpoint, extraction from its last complete shard; "
        f"regenerate and export write their file anew",
        code="E160",
    )


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in _FULL:
            raise disk_full(path, len(data), e) from None
        raise


def append_line(path: str | Path, line: str) -> None:
    """Append one line (a log record). A crash or a full disk may leave a partial last line: readers drop it."""
    path = Path(path)
    try:
        with open(path, "a") as f:
            f.write(line + "\n")
    except OSError as e:
        if e.errno in _FULL:
            raise disk_full(path, len(line) + 1, e) from None
        raise


def replace_tree(src: str | Path, dst: str | Path) -> None:
    """Copy the folder `src` over the folder `dst`: copied beside it first, then swapped in by two renames, so that a
    kill or a full disk leaves the old `dst` whole (or, between the renames, the old one at .{name}.old)."""
    src, dst = Path(src), Path(dst)
    tmp, old = dst.with_name(f".{dst.name}.tmp"), dst.with_name(f".{dst.name}.old")
    for p in (tmp, old):
        shutil.rmtree(p, ignore_errors=True)
    shutil.copytree(src, tmp)
    if dst.exists():
        os.replace(dst, old)
    os.replace(tmp, dst)
    shutil.rmtree(old, ignore_errors=True)


def strict_json(obj, **kw) -> str:
    """JSON without the NaN / Infinity literals Python writes by default (no strict reader takes them): a non-finite
    float becomes null."""
    import math

    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(obj), allow_nan=False, **kw)


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def save_tensors(path: str | Path, tensors: dict, metadata: dict | None = None) -> str:
    """Atomic safetensors write; returns the sha256 of the bytes written."""
    from safetensors.torch import save

    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=metadata)
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# the largest record a data reader takes: one line of a JSONL file, or one text file (read as one record). Readers
# stream, so memory follows this bound, not the file's size (a 1 GB one-line file took 11 GB of RSS read whole); a
# larger record is E126, naming the file, the line and the bound
MAX_RECORD_BYTES = 64 * 2**20


def _too_large(where: str, size: str) -> Exception:
    from .errors import InputError

    return InputError(
        f"{where} is {size}, more than the {MAX_RECORD_BYTES // 2**20} MiB a data record may be "
        f"(one JSONL line, or one text file)",
        code="E126",
        fix="split it: several JSONL lines (records), or several text files",
    )


def iter_lines(path: str | Path, what: str = "file"):
    """(line number, text) for each line of a UTF-8 file, read a line at a time: a line longer than MAX_RECORD_BYTES
    is E126 (file, line, bound) before it is held whole; invalid UTF-8 is E116 (file, line, offset)."""
    from .errors import InputError

    p = need_file(path, what)
    limit = MAX_RECORD_BYTES
    with open(p, "rb") as f:
        for n, raw in enumerate(iter(lambda: f.readline(limit + 1), b""), 1):
            if len(raw) > limit and not raw.endswith(b"\n"):
                raise _too_large(f"{p}:{n}", f"longer than {limit} bytes")
            try:
                yield n, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise InputError(
                    f"{what} {p}:{n} is not valid UTF-8: byte {raw[e.start]:#04x} at offset {e.start} "
                    f"of the line ({e.reason})",
                    fix="save the file as UTF-8 (e.g. iconv -t utf-8)",
                    code="E116",
                ) from None


def read_record_text(path: str | Path) -> str:
    """A text data file, read whole as one record (invalid UTF-8 replaced); one larger than MAX_RECORD_BYTES is E126
    before it is read."""
    p = Path(path)
    size = p.stat().st_size
    if size > MAX_RECORD_BYTES:
        raise _too_large(str(p), f"{size} bytes")
    return p.read_text(errors="replace")


def iter_jsonl(path: str | Path):
    """(line number, object) for each non-empty line, streamed (iter_lines: E126 for a line past the bound); a
    malformed line is an error naming file and line."""
    from .errors import InputError

    for n, line in iter_lines(path, "file"):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{n} is not JSON ({e})", fix="one JSON object per line", code="E102") from None


# --- paths and text given on the command line: checked before anything loads --------------------------------
def broken_link(path: str | Path, what: str) -> None:
    """E128 when `path` is a symbolic link that loops or points at nothing: said as such, not as a missing file or as
    whatever the loader that tripped on it was doing (a tokenizer.json loop read as "install sentencepiece")."""
    from .errors import InputError

    p = Path(path)
    if not p.is_symlink() or p.exists():
        return
    try:
        os.stat(p)
        return
    except OSError as e:
        loop = e.errno == errno.ELOOP
    target = os.readlink(p)
    raise InputError(
        f"{what} {p} is a symbolic link "
        + (f"that loops (it leads back to itself through {target})" if loop else f"to {target}, which does not exist"),
        code="E128",
        fix="point the link at the real file (ls -l shows where it leads), or put the file itself in its place",
    )


def need_dir(path: str | Path, what: str) -> Path:
    """`path` is an existing folder (E101 when absent, E118 when it is a file, E128 a broken link)."""
    from .errors import InputError

    p = Path(path)
    broken_link(p, what)
    if p.is_dir():
        return p
    if p.exists():
        raise InputError(
            f"{what} {p} is a file, expected a folder",
            code="E118",
            fix=f"pass the folder that holds it ({p.parent}) or another folder",
        )
    raise InputError(f"{what} {p} does not exist", fix="pass the path of an existing folder", code="E101")


def need_file(path: str | Path, what: str) -> Path:
    """`path` is an existing file (E101 when absent, E118 when it is a folder, E128 a broken link)."""
    from .errors import InputError

    p = Path(path)
    broken_link(p, what)
    if p.is_file():
        return p
    if p.is_dir():
        raise InputError(
            f"{what} {p} is a directory, expected a file", code="E118", fix="pass a file inside it, or another file"
        )
    raise InputError(f"{what} {p} does not exist", fix="pass an existing file", code="E101")


def no_file_at(path: str | Path, what: str) -> Path:
    """`path` may become a folder: it is one already, or nothing is there yet (E118 when it is a file)."""
    from .errors import InputError

    p = Path(path)
    if p.exists() and not p.is_dir():
        raise InputError(
            f"{what} {p} is a file, expected a folder (new or existing)",
            code="E118",
            fix="pass another --out, or move the file away",
        )
    return p


def _within(p: Path, folder: Path) -> bool:
    return p == folder or folder in p.parents


def no_overlap(out: str | Path, what: str, inputs: dict, writes=()) -> None:
    """A command's output `out` is none of its `inputs` ({option: path or None}) and lies inside none of them, and
    no input lies inside what the command replaces there (`writes`: paths under `out`, e.g. OUT/draft). E131: a
    command that wrote over its input would lose the user's data (regenerate --data d.jsonl --out d.jsonl)."""
    from .errors import InputError

    o = Path(out).resolve()
    replaced = [o / w for w in writes]
    for name, path in inputs.items():
        if path is None:
            continue
        i = Path(path).resolve()
        if o == i:
            clash = f"{what} {out} is {name} {path} itself: writing it would replace the input"
        elif _within(o, i):
            clash = f"{what} {out} lies inside {name} {path}: writing it would change the input"
        elif any(_within(i, r) for r in replaced):
            r = next(r for r in replaced if _within(i, r))
            clash = f"{name} {path} lies in {r}, which this command replaces"
        else:
            continue
        raise InputError(clash, fix=f"write {what} somewhere else (outside {path})", code="E131")


def check_utf8(text: str, what: str) -> str:
    """`text` holds no lone surrogate: a command-line argument that was not valid UTF-8 reaches Python with its
    bad bytes as surrogates (surrogateescape), and a tokenizer fails on them (E116)."""
    from .errors import InputError

    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start : e.end].encode("utf-8", "surrogateescape")
        raise InputError(
            f"{what} is not valid UTF-8: byte(s) {bad.hex(' ')} at character {e.start}",
            code="E116",
            fix="pass UTF-8 text (check the terminal's or the file's encoding)",
        ) from None
    return text


def read_utf8(path: str | Path, what: str) -> str:
    """A text file that must be UTF-8 (E116 names the first bad byte and its offset)."""
    from .errors import InputError

    p = need_file(path, what)
    data = p.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{what} {p} is not valid UTF-8: byte {data[e.start]:#04x} at offset {e.start} ({e.reason})",
            fix="save the file as UTF-8 (e.g. iconv -t utf-8)",
            code="E116",
        ) from None


# --- a model or draft folder's JSON files: read before any loader, each broken one named by its own code ----------
# (a broken config.json read by the tokenizer loader is not a tokenizer problem). Here, below models/ and the
# tokenizer, because both read them.
FOLDER_JSON = {
    "config.json": "E150",
    "tokenizer.json": "E151",
    "tokenizer_config.json": "E152",
    "generation_config.json": "E153",
    "model.safetensors.index.json": "E154",
    "special_tokens_map.json": "E155",
    "added_tokens.json": "E155",
    "chat_template.json": "E155",
}


# the other files of a model folder its loaders read (a tokenizer's vocabularies, single-file weights)
LOADED_FILES = ("tokenizer.model", "vocab.json", "merges.txt", "model.safetensors")


def read_json(path: str | Path, what: str) -> dict:
    """The JSON object in `path` (E101 when absent; the file's own FOLDER_JSON code, else E102, when it is not a
    JSON object)."""
    from .errors import InputError

    path = Path(path)
    broken_link(path, f"{what}:")
    if not path.is_file():
        raise InputError(f"{what}: no file at {path}", fix="point at a folder that holds config.json", code="E101")
    code = FOLDER_JSON.get(path.name, "E102")
    fix = f"restore {path.name} from the original (re-copy or re-export the folder)"
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{what}: {path} is not valid JSON ({e})", fix=fix, code=code) from None
    if not isinstance(obj, dict):
        raise InputError(
            f"{what}: {path} holds a JSON {type(obj).__name__}, not the object {path.name} must be", fix=fix, code=code
        )
    return obj


def check_folder_json(folder: str | Path) -> None:
    """Read every JSON file the folder holds (FOLDER_JSON) before a loader does: a broken one is reported by
    name, not as whatever the loader that tripped on it was doing."""
    folder = Path(folder)
    for name in (*FOLDER_JSON, *LOADED_FILES):  # a file a loader reads, behind a broken link
        broken_link(folder / name, f"{name} of {folder}:")
    for p in folder.iterdir() if folder.is_dir() else ():  # a loop is never meant, whatever the file
        if p.is_symlink() and not p.exists():
            try:
                os.stat(p)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    broken_link(p, f"{p.name} of {folder}:")
    for name in FOLDER_JSON:
        if (folder / name).is_file():
            read_json(folder / name, f"{name} of {folder}")
