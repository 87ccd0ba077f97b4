import pytest

from eaglekit.capture import CaptureSpec, default_after_layers
from eaglekit.errors import ContractError


def test_default_matches_ecosystem():
    assert default_after_layers(61) == (1, 29, 57)  # DeepSeek-V3: inputs [2, 30, 58]
    assert default_after_layers(32) == (1, 15, 28)  # Llama-3.1-8B
    assert CaptureSpec.default(61).input_of() == (2, 30, 58)


def test_tiny_targets_clamp_into_range():
    for n in range(1, 8):
        spec = CaptureSpec.default(n)
        spec.validate(n)
        assert all(0 <= i < n for i in spec.after_layers)


def test_conventions_round_trip():
    spec = CaptureSpec.from_input_of([2, 30, 58])
    assert spec.after_layers == (1, 29, 57)
    assert CaptureSpec.from_output_of([1, 29, 57]) == spec
    assert CaptureSpec.from_dict(spec.to_dict()) == spec
    assert CaptureSpec.from_dict({"convention": "input_of", "layers": [2, 30, 58]}) == spec


def test_range_is_checked():
    with pytest.raises(ContractError, match=r"outside this target's range: it has 8 decoder layers"):
        CaptureSpec((1, 3, 8)).validate(8)
    with pytest.raises(ContractError):
        CaptureSpec((-2, 1, 3)).validate(8)
    CaptureSpec((-1, 1, 3)).validate(8)  # the embedding is a legal (if unusual) capture


def test_width_mismatch_names_both_numbers_and_layers():
    # the story's bug: an extra embedding capture feeding 4 x 7168 into an fc trained on 3 x 7168
    spec = CaptureSpec((-1, 1, 29, 57))
    with pytest.raises(ContractError) as e:
        spec.check_fc(21504, 7168)
    msg = str(e.value)
    assert "draft fc expects 21504 = 3 x 7168 features but the target capture yields 28672 = 4 x 7168" in msg
    assert "after_layers -1, 1, 29, 57" in msg
    assert e.value.code == "E202"
    CaptureSpec((1, 29, 57)).check_fc(21504, 7168)
