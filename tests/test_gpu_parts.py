"""tests/gpu_parts.py splits the GPU tier so that each part fits a device call: every GPU test must sit in exactly
one part, or a new GPU test would silently never run in the parts."""

import gpu_parts


def test_every_gpu_test_is_in_exactly_one_part():
    assert gpu_parts.check() == []
