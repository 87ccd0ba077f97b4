"""TargetConfig: the fields of a Hugging Face config.json our compact decoder needs.

Reads the raw JSON (no transformers import) so that both the v4 spelling (`rope_theta`,
`rope_scaling`) and the v5 one (`rope_parameters`) work. Families: llama, mistral, qwen2, qwen3.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..io import check_folder_json, read_json

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class TargetConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    dtype: str = "float32"
    fingerprint: str = ""


_FINGERPRINT_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "tie_word_embeddings",
    "moe_intermediate_size",
    "n_routed_experts",
    "kv_lora_rank",
    "q_lora_rank",
)


def config_fingerprint(raw: dict) -> str:
    """A short hash of what shapes a target (not its weights' values), the same whichever backend or
    transformers version wrote or reads the config. A draft records it; a draft made for another target
    is refused. (The weights' own hash goes in the feature manifest.)"""
    d: dict[str, Any] = {k: raw.get(k) for k in _FINGERPRINT_KEYS if raw.get(k) is not None}
    if "num_attention_heads" in d and "hidden_size" in d:  # fill the defaults older writers leave out
        d.setdefault("num_key_value_heads", d["num_attention_heads"])
        d.setdefault("head_dim", d["hidden_size"] // d["num_attention_heads"])
    d.setdefault("tie_word_embeddings", False)
    params = raw.get("rope_parameters") or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        params = next(iter(params.values()))
    d["rope_theta"] = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def rope_from(raw: dict) -> RopeConfig:
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        # per-layer-type rope parameters (v5, e.g. {"full_attention": {...}}); one kind only here
        params = next(iter(params.values()))
    src = {**scaling, **params}
    theta = float(src.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = src.get("rope_type", src.get("type", "default")) or "default"
    if kind not in ("default", "linear", "llama3"):
        raise InputError(
            f"rope type {kind!r} is not implemented by eaglekit's compact decoder",
            fix="load this target with --backend hf (the transformers adapter handles every rope type)",
            code="E103",
        )
    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=float(src.get("factor", 1.0)),
        low_freq_factor=float(src.get("low_freq_factor", 1.0)),
        high_freq_factor=float(src.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(src.get("original_max_position_embeddings", 8192)),
    )


def rope_json(rope: RopeConfig) -> dict:
    """The config.json fields (v4 spelling, read by every engine) that describe `rope`."""
    out: dict[str, Any] = {"rope_theta": rope.theta}
    if rope.kind != "default":
        out["rope_scaling"] = {
            "rope_type": rope.kind,
            "factor": rope.factor,
            "low_freq_factor": rope.low_freq_factor,
            "high_freq_factor": rope.high_freq_factor,
            "original_max_position_embeddings": rope.original_max_position_embeddings,
        }
    return out


def _ids(v) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, int):
        return (v,)
    return tuple(int(x) for x in v)


def parse_target_config(raw: dict, where: str = "config.json") -> TargetConfig:
    family = raw.get("model_type")
    if family not in FAMILIES:
        raise InputError(
            f"model_type {family!r} in {where} is not one of the compact decoder's families {', '.join(FAMILIES)}",
            fix="use --backend hf to run it through transformers (any AutoModelForCausalLM architecture)",
            code="E104",
        )
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise InputError(
            f"hidden_act {act!r} in {where} is not supported (only silu)", code="E104", fix="use --backend hf"
        )
    if family in ("qwen2", "qwen3") and raw.get("use_sliding_window"):
        raise InputError(
            f"{family} with use_sliding_window=true is not supported by the compact decoder",
            fix="use --backend hf",
            code="E104",
        )
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        cfg = TargetConfig(
            family=family,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=rope_from(raw),
            # qwen2 always has q/k/v biases; llama and qwen3 put `attention_bias` on q, k, v and o
            qkv_bias=family == "qwen2" or (family in ("llama", "qwen3") and bool(raw.get("attention_bias", False))),
            o_bias=family in ("llama", "qwen3") and bool(raw.get("attention_bias", False)),
            mlp_bias=family == "llama" and bool(raw.get("mlp_bias", False)),
            qk_norm=family == "qwen3",
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            sliding_window=(int(raw["sliding_window"]) if family == "mistral" and raw.get("sliding_window") else None),
            eos_token_ids=_ids(raw.get("eos_token_id")),
            bos_token_id=raw.get("bos_token_id"),
            dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
            fingerprint=config_fingerprint(raw),
        )
    except KeyError as e:
        raise InputError(
            f"{where} lacks the field {e.args[0]!r}", fix="re-export the model folder", code="E102"
        ) from None
    return cfg


def load_target_config(folder: str | Path) -> TargetConfig:
    folder = Path(folder)
    return parse_target_config(read_json(folder / "config.json", "target config"), str(folder / "config.json"))


# --- field checks before any loader reads the folder ------------------------------------------------------------
# integer fields of a Hugging Face config: (smallest value, required for the compact decoder's families)
_INT_FIELDS = {
    "hidden_size": (1, True),
    "num_hidden_layers": (1, True),
    "num_attention_heads": (1, True),
    "vocab_size": (1, True),
    "intermediate_size": (1, False),
    "num_key_value_heads": (1, False),
    "head_dim": (1, False),
    "max_position_embeddings": (1, False),
    "draft_vocab_size": (1, False),
}
_ID_LISTS = ("eagle_aux_hidden_state_layer_ids",)


def _bad_field(where: str, name: str, value, rule: str) -> InputError:
    return InputError(
        f"{where}: the field {name!r} is {json.dumps(value)}, which is not {rule}",
        code="E117",
        fix=f"write {name} as {rule} in {where}",
    )


def _non_finite(obj, path: str = ""):
    """(dotted field name, value) of every NaN or infinite number in a config, nested objects and lists included."""
    if isinstance(obj, float) and not math.isfinite(obj):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _non_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _non_finite(v, f"{path}[{i}]")


def check_config_values(raw: dict, where: str = "config.json", target: bool = True) -> None:
    """The types and ranges of the fields every loader reads (E117), and the fields the compact decoder's
    families cannot do without (E102, `target` only: a draft's layout varies): a string "64" or a -3 named
    here, not in a loader's traceback (or as a tokenizer failure: transformers' tokenizer reads config.json)."""
    family = target and raw.get("model_type") in FAMILIES
    for name, v in _non_finite(raw):  # NaN / Infinity, which Python's JSON reader takes: a config error, by name
        raise _bad_field(where, name, v, "a finite number")
    for name, (lo, required) in _INT_FIELDS.items():
        if name not in raw or raw[name] is None:
            if required and family:
                raise InputError(
                    f"{where} lacks the field {name!r}",
                    code="E102",
                    fix=f"add {name} to {where} (re-export the model folder)",
                )
            continue
        v = raw[name]
        if isinstance(v, bool) or not isinstance(v, int):
            raise _bad_field(where, name, v, "an integer")
        if v < lo:
            raise _bad_field(where, name, v, f"an integer >= {lo}")
    for name in ("rms_norm_eps", "rope_theta"):
        v = raw.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
            raise _bad_field(where, name, v, "a number > 0")
    for scope, obj in (("", raw), ("eagle_config.", raw.get("eagle_config"))):
        if obj is not None and not isinstance(obj, dict):
            raise _bad_field(where, scope.rstrip("."), obj, "an object")
        for name in _ID_LISTS:
            v = (obj or {}).get(name)
            if v is not None and not (
                isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
            ):
                raise _bad_field(where, scope + name, v, "a list of integers, e.g. [1, 5, 8]")


def check_model_folder(folder: str | Path, target: bool = True) -> None:
    """A target's (or a draft's) folder: its JSON files parse (E150-E155) and its config.json's fields are sound
    (E117, E102)."""
    folder = Path(folder)
    raw = read_json(folder / "config.json", "target config" if target else "draft config")
    check_folder_json(folder)
    check_config_values(raw, str(folder / "config.json"), target)
