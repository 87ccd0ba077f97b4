"""Which inductor options a decode-time graph compiles with: coordinate-descent tuning for wide layers only
(docs/performance.md#d21, #d43)."""

from __future__ import annotations

import pytest

from eaglekit.kernels import compiling


@pytest.mark.parametrize("hidden, tuned", [(None, False), (256, False), (576, False), (2047, False), (2048, True),
                                           (4096, True), (7168, True)])
def test_wide_layers_are_tuned_and_narrow_ones_and_bookkeeping_are_not(hidden, tuned):
    opts = compiling.decode_options(hidden)
    assert opts == (compiling.DECODE_OPTIONS if tuned else {})
    opts["marker"] = 1  # a copy: a caller that edits it leaves the module's options alone
    assert "marker" not in compiling.DECODE_OPTIONS


def test_emptied_options_turn_tuning_off_everywhere(monkeypatch):
    # D43's `no_cd` measurement emptied DECODE_OPTIONS in the child process (docs/performance.md#d43)
    monkeypatch.setattr(compiling, "DECODE_OPTIONS", {})
    assert compiling.decode_options(8192) == {}
