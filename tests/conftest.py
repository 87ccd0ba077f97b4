import os
import sys
from pathlib import Path

# One intra-op thread per test process, set before torch loads (and inherited by the commands and servers the tests
# start): on a shared 2-core machine two threads per process wait on each other at every parallel region whenever
# another process holds a core, and a step costs 15-40x its quiet time instead of the load's share. A test that needs
# another count sets it itself; the fixture below puts the count back after every test.
TEST_THREADS = 1
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(TEST_THREADS)

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(TEST_THREADS)

from helpers import make_hf_model, make_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """One tiny random HF folder per family (+ a tokenizer in the llama one)."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for i, fam in enumerate(["llama", "mistral", "qwen2", "qwen3"]):
        d = root / fam
        make_hf_model(d, fam, seed=10 + i)
        out[fam] = d
    make_tokenizer(out["llama"], 96, chat_template="{% for m in messages %}<s>{{ m['content'] }}{% endfor %}")
    return out


# The smoke tier (`python -m pytest -m smoke`, under a minute on 2 cores): one fast test from each wide path, listed
# here by node id so that the files stay free of tier bookkeeping. Each one must still exist: running the tier fails
# on an id that no longer names a test (renamed or moved), instead of shrinking the tier unseen.
SMOKE = (
    "tests/test_help.py::test_the_top_level_help_lists_every_command",
    "tests/test_help.py::test_every_command_answers_help",
    "tests/test_capture.py::test_default_matches_ecosystem",
    "tests/test_capture.py::test_width_mismatch_names_both_numbers_and_layers",
    "tests/test_errors.py::test_every_code_raised_is_registered_and_documented",
    "tests/test_errors.py::test_cli_prints_the_error_without_a_traceback",
    "tests/test_interfaces.py::test_eagle3_draft_implements_the_draft_interface",
    "tests/decoding/test_lossless.py::test_greedy_speculative_equals_target[0]",
    "tests/decoding/test_lossless.py::test_greedy_speculative_equals_target[1]",
    "tests/draft/test_checkpoint.py::test_specforge_folder_loads_and_runs",
    "tests/kernels/test_products.py::test_the_choice_and_its_reason_are_kept_on_the_target",
    "tests/serve/test_serve.py::test_a_failing_engine_step_is_a_500_and_the_server_keeps_serving",
    "tests/serve/test_serve.py::test_completion_equals_generate_alone",
    "tests/interop/test_interop.py::test_round_trip_keeps_tensors_capture_and_output",
    "tests/test_cli.py::test_json_with_draft",
    "tests/test_demo.py::test_demo_table",
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    root = Path(config.rootpath)
    found = set()
    for item in items:
        rel = Path(item.path).relative_to(root).as_posix()
        for nid in (f"{rel}::{item.name}", f"{rel}::{item.originalname}"):
            if nid in SMOKE:
                item.add_marker(pytest.mark.smoke)
                found.add(nid)
    if "smoke" in (config.option.markexpr or ""):
        files = {Path(item.path).relative_to(root).as_posix() for item in items}
        missing = [nid for nid in SMOKE if nid.split("::")[0] in files and nid not in found]
        missing += [nid for nid in SMOKE if not (root / nid.split("::")[0]).exists()]
        if missing:
            raise pytest.UsageError(f"smoke tests listed in tests/conftest.py that name no test: {missing}")


@pytest.fixture(autouse=True)
def _one_thread():
    """A test that sets torch's thread count (the demo's thread pick, a test of it) leaves the next one at one."""
    yield
    if torch.get_num_threads() != TEST_THREADS:
        torch.set_num_threads(TEST_THREADS)


@pytest.fixture(autouse=True)
def _trace_off():
    from eaglekit.observe import trace

    trace.configure(enabled=False)
    yield
    trace.configure(enabled=False)
