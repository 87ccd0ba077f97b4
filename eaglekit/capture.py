"""CaptureSpec: which target tensors feed the draft. The one contract object.

Internally there is exactly one convention, `after_layers`: the 0-based decoder layers whose *output*
(the residual stream right after that layer, before any norm) is captured, in the order they are
concatenated (low, mid, high). -1 means the embedding output. Other conventions are converted at the
edges only:

    "input of layer i"  (SGLang internals, vLLM, EAGLE reference)  == after_layers i - 1
    "output of layer i" (SpecForge, SGLang config ids)              == after_layers i

The spec travels with the feature manifest, the draft checkpoint and trace records; mismatches are
refused where they are first visible, with both sides and the numbers in the message.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ContractError


def default_after_layers(num_layers: int) -> tuple[int, ...]:
    """The ecosystem default, outputs of layers [1, n//2-1, n-4] (= inputs of [2, n//2, n-3]).

    For toy models with fewer than 7 layers the formula leaves the valid range; each id is clamped
    into [0, n-1] so the default still names real layers.
    """
    if num_layers < 1:
        raise ContractError(f"a target needs at least one decoder layer, got {num_layers}")
    raw = (1, num_layers // 2 - 1, num_layers - 4)
    return tuple(min(max(i, 0), num_layers - 1) for i in raw)


@dataclass(frozen=True)
class CaptureSpec:
    after_layers: tuple[int, ...]

    def __post_init__(self):
        layers = tuple(int(i) for i in self.after_layers)
        if not layers:
            raise ContractError("a CaptureSpec needs at least one layer", fix="use CaptureSpec.default(num_layers)")
        object.__setattr__(self, "after_layers", layers)

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def default(cls, num_layers: int) -> "CaptureSpec":
        return cls(default_after_layers(num_layers))

    @classmethod
    def from_input_of(cls, input_ids: list[int] | tuple[int, ...]) -> "CaptureSpec":
        """From ids in the "input of layer i" convention (vLLM, EAGLE reference)."""
        return cls(tuple(int(i) - 1 for i in input_ids))

    @classmethod
    def from_output_of(cls, output_ids: list[int] | tuple[int, ...]) -> "CaptureSpec":
        """From ids in the "output of layer i" convention (SpecForge, SGLang config ids): the same ids."""
        return cls(tuple(int(i) for i in output_ids))

    # --- views ----------------------------------------------------------------------------------
    @property
    def num_captures(self) -> int:
        return len(self.after_layers)

    def input_of(self) -> tuple[int, ...]:
        return tuple(i + 1 for i in self.after_layers)

    def width(self, target_hidden: int) -> int:
        return self.num_captures * target_hidden

    def describe(self) -> str:
        a = ", ".join(str(i) for i in self.after_layers)
        b = ", ".join(str(i) for i in self.input_of())
        return f"after_layers {a} (= input of layers {b})"

    def shifted(self, delta: int) -> "CaptureSpec":
        return CaptureSpec(tuple(i + delta for i in self.after_layers))

    # --- checks ---------------------------------------------------------------------------------
    def validate(self, num_layers: int) -> "CaptureSpec":
        bad = [i for i in self.after_layers if i < -1 or i >= num_layers]
        if bad:
            raise ContractError(
                f"capture layers {bad} are outside this target's range: it has {num_layers} decoder layers, "
                f"so after_layers must lie in -1..{num_layers - 1} ({self.describe()})",
                fix="check the convention of the ids (output-of vs input-of) and that the draft was made for "
                "this target",
                code="E201",
            )
        return self

    def check_fc(self, fc_in_features: int, target_hidden: int, what: str = "draft fc") -> None:
        """Refuse a capture whose concatenated width differs from what the draft's fc was trained on."""
        got = self.width(target_hidden)
        if fc_in_features == got:
            return
        if fc_in_features % target_hidden == 0:
            expect = f"{fc_in_features} = {fc_in_features // target_hidden} x {target_hidden}"
        else:
            expect = f"{fc_in_features} (not a multiple of the target hidden size {target_hidden})"
        raise ContractError(
            f"{what} expects {expect} features but the target capture yields "
            f"{got} = {self.num_captures} x {target_hidden} ({self.describe()})",
            fix="capture exactly the layers the draft was trained on (its config's eagle_aux_hidden_state_layer_ids "
            "or eaglekit.capture block); an extra embedding capture (-1) or a missing layer changes the width",
            code="E202",
        )

    # --- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"convention": "after_layers", "after_layers": list(self.after_layers)}

    @classmethod
    def from_dict(cls, d: dict) -> "CaptureSpec":
        conv = d.get("convention", "after_layers")
        if conv == "after_layers":
            return cls(tuple(d["after_layers"]))
        if conv == "input_of":
            return cls.from_input_of(d["layers"])
        raise ContractError(f"unknown capture convention {conv!r}", fix="use 'after_layers' or 'input_of'")
