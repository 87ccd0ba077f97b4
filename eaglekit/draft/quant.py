"""A draft's weight-only int8 (eaglekit.kernels.int8): inference only, half the bytes a draft step reads; the draft's
arithmetic never reaches the output (the target verifies), only its accept length."""

from __future__ import annotations

from ..errors import InputError


def quantize_draft(draft, mode: str = "int8") -> None:
    """The fc, the layer's products and the lm_head of `draft` as weight-only int8, in place (a second call does
    nothing). After fuse(): the fused [q; k; v] and [gate; up] weights become int8 too, and every bf16 weight they
    came from is let go. The draft's products are its own afterwards (set_products keeps F.linear's policy for
    anything else)."""
    from ..kernels import int8

    if mode not in int8.MODES:
        raise InputError(
            f"draft quantization {mode!r} is not one of {', '.join(int8.MODES)}",
            code="E108",
            fix="pass --draft-quant int8, or leave it out",
        )
    if draft.quantized is not None:
        return
    attn, mlp = draft.midlayer.self_attn, draft.midlayer.mlp
    names = (
        ["fc", "lm_head"]
        + [f"midlayer.self_attn.{n}_proj" for n in "qkvo"]
        + [f"midlayer.mlp.{n}_proj" for n in ("gate", "up", "down")]
    )
    int8.quantize_linears(draft, names)
    if attn.qkv_weight is not None:
        # the projections become Int8Linear modules (the call interface of the nn.Linear they replace)
        attn.qkv_weight, (attn.q_proj, attn.k_proj, attn.v_proj) = int8.fused([attn.q_proj, attn.k_proj, attn.v_proj])
        attn.qkv_bias = None  # (in the fused Int8Linear)
    if mlp.gate_up_weight is not None:
        mlp.gate_up_weight, (mlp.gate_proj, mlp.up_proj) = int8.fused([mlp.gate_proj, mlp.up_proj])
    draft.quantized = mode
    draft.set_products(None)
