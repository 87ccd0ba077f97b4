"""eaglekit's Triton ops are named after their code (compiling.op_name): inductor's persistent cache keys a triton_op
by name and kernel source only, so a change to the Python that launches the kernels (or to the tuned configs it
reads) must change the name, or a warm cache serves the old code (docs/performance.md#d49: it did on the H200)."""

import pytest
from helpers import use_triton_interpreter

use_triton_interpreter()  # before triton is imported

from eaglekit.kernels import (  # noqa: E402
    invariant_attention,
    invariant_attention_triton,
    invariant_gemm,
    invariant_gemm_triton,
    invariant_norm,
)
from eaglekit.kernels.compiling import op_name  # noqa: E402


def test_op_name_follows_every_byte_of_its_sources_and_extra(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    first = op_name("op", a, b)
    assert first == op_name("op", a, b) and first.startswith("eaglekit::op_")
    assert op_name("op", a, b, extra="{}") != first
    a.write_text("x = 1  # a comment\n")
    assert op_name("op", a, b) != first
    assert op_name("op", b, a) != op_name("op", a, b)
    gone = op_name("op", tmp_path / "missing.py")  # bytecode-only install: still a name, stable
    assert gone == op_name("op", tmp_path / "missing.py") and gone != op_name("op", tmp_path / "other.py")


@pytest.mark.parametrize("module,base,files", [
    (invariant_attention, "invariant_attention", (invariant_attention.__file__, invariant_attention_triton.__file__)),
    (invariant_norm, "invariant_rms_norm", (invariant_norm.__file__,)),
])
def test_each_registered_op_carries_the_digest_of_its_files(module, base, files):
    assert module.kernels().op._qualname == op_name(base, *files)


def test_a_new_tuned_table_or_tile_sharing_names_a_new_small_m_op_and_an_old_one_is_reused(monkeypatch):
    monkeypatch.setattr(invariant_gemm, "_KERNELS", None)
    monkeypatch.setattr(invariant_gemm, "_TABLE", {})
    monkeypatch.setattr(invariant_gemm, "SHARED_TILES", 1)
    plain = invariant_gemm.kernels()
    assert plain.op._qualname == op_name("small_m_linear", invariant_gemm.__file__, invariant_gemm_triton.__file__,
                                         extra="{}tiles1")
    monkeypatch.setattr(invariant_gemm, "_TABLE", {"4096x4096": [64, 128, 1, 4, 3]})  # as tune() leaves it, read again
    tuned = invariant_gemm.kernels()
    assert tuned.op._qualname != plain.op._qualname
    monkeypatch.setattr(invariant_gemm, "_TABLE", {})
    assert invariant_gemm.kernels() is plain  # the same name registers once: the op built before is reused
    monkeypatch.setattr(invariant_gemm, "SHARED_TILES", 4)  # programs of four tiles: other launch code, another name
    shared = invariant_gemm.kernels()
    assert shared.op._qualname not in (plain.op._qualname, tuned.op._qualname)
    monkeypatch.setattr(invariant_gemm, "SHARED_TILES", 1)
    assert invariant_gemm.kernels() is plain


def test_twin_is_the_function_itself_or_one_compiled_twin():
    """compiling.twin: the plain function where nothing is compiled; else its compiled twin, built once per function
    (the tree's bookkeeping and the cycle's accept ask for it every call)."""
    from eaglekit.kernels.compiling import twin

    def f(x):
        return x + 1

    def g(x):
        return x * 2

    assert twin(f, False) is f
    assert twin(f, True) is twin(f, True) is not f
    assert twin(g, True) is not twin(f, True)
    # (not called here: compiling costs ~17 s on 2 cores; the slow tests run the compiled twins)
