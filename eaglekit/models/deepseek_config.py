"""DeepSeekConfig: the fields of a DeepSeek-V2 / V3 / Kimi-K2 config.json our MLA + MoE decoder needs.

Read from the raw JSON (no transformers import), both spellings of the rope fields (v4 `rope_theta` +
`rope_scaling`, v5 `rope_parameters`). The routing follows transformers' classes, the reference the parity
tests compare with:

- deepseek_v2: softmax scores; top-k greedy, or group-limited greedy (the best score of each group picks
  `topk_group` groups); weights times `routed_scaling_factor` (transformers reads no norm_topk_prob here).
- deepseek_v3, kimi_k2: sigmoid scores; the choice adds `e_score_correction_bias`; groups ranked by the sum of
  their two best biased scores; the weights are the unbiased scores of the chosen experts, normalised when
  `norm_topk_prob`, times `routed_scaling_factor`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import InputError
from .config import _ids, config_fingerprint, read_json

DEEPSEEK_FAMILIES = ("deepseek_v2", "deepseek_v3", "kimi_k2")


@dataclass(frozen=True)
class MLARope:
    """The rotary embedding of the qk_rope_head_dim part of q and k: default or YaRN."""

    theta: float = 10000.0
    kind: str = "default"  # default | yarn
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """YaRN's attention temperature (its Eq. 21): 0.1 * mscale * ln(scale) + 1, 1 for scale <= 1."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def mla_inv_freq(dim: int, rope: MLARope) -> tuple[torch.Tensor, float]:
    """-> (inverse frequencies [dim / 2] float32, the factor cos and sin are multiplied by), as transformers'
    default and YaRN rope initialisers compute them for a rotary dimension `dim`."""
    exps = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    if rope.kind == "default":
        return 1.0 / (rope.theta**exps), 1.0
    factor = rope.factor
    if rope.attention_factor is not None:
        att = float(rope.attention_factor)
    elif rope.mscale and rope.mscale_all_dim:
        att = float(yarn_get_mscale(factor, rope.mscale) / yarn_get_mscale(factor, rope.mscale_all_dim))
    else:
        att = yarn_get_mscale(factor)

    def corr_dim(rot):
        return (dim * math.log(rope.original_max_position_embeddings / (rot * 2 * math.pi))) / (
            2 * math.log(rope.theta)
        )

    low, high = corr_dim(rope.beta_fast), corr_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos = rope.theta**exps
    extrapolated = 1 - ramp  # the share of the original (extrapolated) frequency
    inv = (1.0 / (factor * pos)) * (1 - extrapolated) + (1.0 / pos) * extrapolated
    return inv, att


@dataclass(frozen=True)
class DeepSeekConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # the dense layers' MLP
    moe_intermediate_size: int  # one expert's
    num_layers: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    first_k_dense_replace: int
    scoring: str  # softmax (V2) | sigmoid (V3, Kimi-K2)
    topk_method: str  # greedy | group_limited_greedy | noaux_tc
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    rms_norm_eps: float = 1e-6
    rope: MLARope = field(default_factory=MLARope)
    rope_interleave: bool = True  # q/k rope parts as interleaved pairs (x0, x1), (x2, x3), ..
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    dtype: str = "bfloat16"
    fingerprint: str = ""

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_width(self) -> int:
        """What the cache holds per layer and token: the normed latent and the rotated rope part of the key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim ** -0.5, times YaRN's mscale(factor, mscale_all_dim) squared where the rope is scaled (the
        DeepSeek reference scales the whole q.k, not only its rotary part)."""
        s = self.qk_head_dim**-0.5
        if self.rope.kind != "default" and self.rope.mscale_all_dim:
            m = yarn_get_mscale(self.rope.factor, self.rope.mscale_all_dim)
            s = s * m * m
        return s

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace and self.n_routed_experts > 0


def _unsupported(what: str, where: str) -> InputError:
    return InputError(
        f"{what} in {where} is not implemented by eaglekit's DeepSeek decoder",
        fix="load this target with --backend hf (the transformers adapter runs what transformers runs)",
        code="E190",
    )


def mla_rope_from(raw: dict, where: str = "config.json") -> MLARope:
    params = raw.get("rope_parameters") or {}
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        params = next(iter(params.values()))
    src = {**(raw.get("rope_scaling") or {}), **params}
    theta = float(src.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = src.get("rope_type", src.get("type", "default")) or "default"
    if kind not in ("default", "yarn"):
        raise _unsupported(f"rope type {kind!r}", where)
    if kind == "default":
        return MLARope(theta=theta)
    orig = (
        raw.get("original_max_position_embeddings")
        or src.get("original_max_position_embeddings")
        or raw.get("max_position_embeddings", 4096)
    )
    factor = src.get("factor")
    if factor is None:
        factor = float(raw.get("max_position_embeddings", 4096)) / float(orig)

    def opt(k):
        v = src.get(k)
        return None if v is None else float(v)

    return MLARope(
        theta=theta,
        kind="yarn",
        factor=float(factor),
        original_max_position_embeddings=int(orig),
        beta_fast=float(src.get("beta_fast") or 32),
        beta_slow=float(src.get("beta_slow") or 1),
        mscale=opt("mscale"),
        mscale_all_dim=opt("mscale_all_dim"),
        attention_factor=opt("attention_factor"),
        truncate=bool(src.get("truncate", True)),
    )


def _check_supported(raw: dict, where: str) -> str:
    """The family of `raw`, after the checks that refuse a config the decoder cannot run whatever its sizes (E104,
    E190 through _unsupported): another family, another activation, MoE on some layers only, quantized weights."""
    family = raw.get("model_type")
    if family not in DEEPSEEK_FAMILIES:
        raise InputError(
            f"model_type {family!r} in {where} is not a DeepSeek family ({', '.join(DEEPSEEK_FAMILIES)})",
            fix="load it with the backend of its family (auto picks it)",
            code="E104",
        )
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise _unsupported(f"hidden_act {act!r}", where)
    if int(raw.get("moe_layer_freq", 1) or 1) != 1:
        raise _unsupported(
            f"moe_layer_freq {raw.get('moe_layer_freq')} (MoE every layer past the dense ones only)", where
        )
    quant = raw.get("quantization_config")
    if quant:  # DeepSeek-V3 / Kimi-K2 ship block-FP8 weights with per-block scales (weight_scale_inv)
        raise _unsupported(
            f"quantization_config {quant.get('quant_method', quant)!r} (FP8 / quantized weights; "
            "eaglekit's decoder reads bf16 / fp16 / fp32 checkpoints)",
            where,
        )
    return family


def _routing(raw: dict, where: str, v2: bool) -> dict:
    """DeepSeekConfig's routing fields (scoring, topk_method, n_routed_experts, num_experts_per_tok, n_group,
    topk_group) as transformers reads them for the family, checked against each other: every expert group holds
    the same number of experts and a token's k fit in them (E191). Reads only optional keys (no KeyError)."""
    family = raw.get("model_type")
    scoring = "softmax" if v2 else "sigmoid"
    if raw.get("scoring_func") not in (None, scoring):
        raise _unsupported(
            f"scoring_func {raw.get('scoring_func')!r} for {family} (transformers scores it by {scoring})", where
        )
    method = raw.get("topk_method") or ("greedy" if v2 else "noaux_tc")
    if v2 and method not in ("greedy", "group_limited_greedy"):
        raise _unsupported(f"topk_method {method!r}", where)
    n_routed = int(raw.get("n_routed_experts") or raw.get("num_experts") or raw.get("num_local_experts") or 0)
    n_group = int(raw.get("n_group") or 1)
    if v2 and method == "greedy":
        n_group = 1
    topk_group = int(raw.get("topk_group") or 1) if n_group > 1 else 1
    k = int(raw.get("num_experts_per_tok") or 0)
    if n_routed and (
        k < 1
        or k > n_routed
        or n_routed % n_group
        or topk_group > n_group
        or (not v2 and n_group > 1 and n_routed // n_group < 2)
    ):
        raise InputError(
            f"{where}: the routing does not fit its experts (n_routed_experts {n_routed}, "
            f"num_experts_per_tok {k}, n_group {n_group}, topk_group {topk_group})",
            fix="check config.json against the model's weights",
            code="E191",
        )
    return dict(
        scoring=scoring,
        topk_method=method,
        n_routed_experts=n_routed,
        num_experts_per_tok=k,
        n_group=n_group,
        topk_group=topk_group,
    )


def _mla_heads(raw: dict, where: str) -> int:
    """num_attention_heads; MLA has one latent kv per token, so a num_key_value_heads other than it is refused."""
    heads = int(raw["num_attention_heads"])
    kv_heads = raw.get("num_key_value_heads")
    if kv_heads is not None and int(kv_heads) != heads:
        raise _unsupported(f"num_key_value_heads {kv_heads} != num_attention_heads {heads}", where)
    return heads


def parse_deepseek_config(raw: dict, where: str = "config.json") -> DeepSeekConfig:
    """A DeepSeekConfig from a config.json's dict (`where` names it in errors): refused first where the decoder
    cannot run the family at all, then read field by field; a missing required field is E102."""
    family = _check_supported(raw, where)
    v2 = family == "deepseek_v2"
    routing = _routing(raw, where, v2)
    try:
        q_lora = raw.get("q_lora_rank")
        heads = _mla_heads(raw, where)
        cfg = DeepSeekConfig(
            family=family,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            moe_intermediate_size=int(raw.get("moe_intermediate_size") or 0),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            q_lora_rank=int(q_lora) if q_lora else None,
            kv_lora_rank=int(raw["kv_lora_rank"]),
            qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
            qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
            v_head_dim=int(raw["v_head_dim"]),
            n_shared_experts=int(raw.get("n_shared_experts") or 0),
            first_k_dense_replace=int(raw.get("first_k_dense_replace") or 0),
            **routing,
            norm_topk_prob=bool(raw.get("norm_topk_prob", False)) and not v2,
            routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=mla_rope_from(raw, where),
            rope_interleave=True if v2 else bool(raw.get("rope_interleave", True)),
            attention_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=v2 and bool(raw.get("mlp_bias", False)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            eos_token_ids=_ids(raw.get("eos_token_id")),
            bos_token_id=raw.get("bos_token_id"),
            dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "bfloat16"),
            fingerprint=config_fingerprint(raw),
        )
    except KeyError as e:
        raise InputError(
            f"{where} lacks the field {e.args[0]!r}", fix="re-export the model folder", code="E102"
        ) from None
    if cfg.qk_rope_head_dim % 2:
        raise InputError(
            f"{where}: qk_rope_head_dim {cfg.qk_rope_head_dim} is odd (rotary pairs)",
            fix="check config.json",
            code="E191",
        )
    return cfg


def load_deepseek_config(folder: str | Path) -> DeepSeekConfig:
    folder = Path(folder)
    return parse_deepseek_config(read_json(folder / "config.json", "target config"), str(folder / "config.json"))
