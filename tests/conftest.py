import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(2)

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


@pytest.fixture(autouse=True)
def _trace_off():
    from eaglekit.observe import trace

    trace.configure(enabled=False)
    yield
    trace.configure(enabled=False)
