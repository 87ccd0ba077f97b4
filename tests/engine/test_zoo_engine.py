"""The fault zoo through `eaglekit doctor --engine vllm` (eaglekit.integrations.vllm.doctor.zoo_main): each case
starts vLLM once. Marked `engine`."""

import pytest

from eaglekit.doctor.zoo import CASES, Pairs, confusion, print_table, run_case
from eaglekit.integrations.vllm.doctor import run_engine_doctor
from eaglekit.options import DoctorOptions

pytestmark = pytest.mark.engine

# the rows and a clean pair of each family: the rest of the zoo is refused before vLLM matters
NAMES = ("clean", "ids+1-vllm", "ids-reversed", "d2t-rolled", "d2t-rolled-hash", "other-weights",
         "other-weights-third-party", "other-vocab", "other-hidden", "ids+2-vllm", "qwen2-clean")


def test_the_engine_doctor_never_calls_a_fault_clean(vllm_python, tmp_path_factory):
    pairs = Pairs(tmp_path_factory.mktemp("zoo_pairs"))

    def runner(model):
        return run_engine_doctor(model, DoctorOptions(prompts=8, max_new_tokens=32), python=vllm_python)

    rows = [run_case(c, pairs, tmp_path_factory.mktemp(c.name), runner) for c in CASES if c.name in NAMES]
    print_table(rows, "eaglekit doctor --engine vllm")
    c = confusion(rows)
    assert c["false clean"] == 0 and c["false alarm"] == 0
    assert c["right"] + c["cannot tell"] == c["cases"]
