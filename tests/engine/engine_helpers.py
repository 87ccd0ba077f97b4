"""Shared by the engine tier's conftest and tests (a module of its own: two conftest.py files share one name)."""

import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEMO = REPO / "eaglekit" / "assets" / "demo"
# small on purpose: vLLM on two shared cores loads in ~45 s and decodes a few tokens per second
PROMPTS = 4
MAX_NEW = 48


def miswire(src: Path, dst: Path, ids: list[int]) -> Path:
    """A copy of an export whose config lists other aux layer ids (and no eaglekit block, as a folder written by
    another tool would be): the engine and eaglekit's own checks then see only the engine's fields."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = list(ids)
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(ids)
    cfg.pop("eaglekit", None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    (dst / "eaglekit_record.json").unlink(missing_ok=True)  # nor the training record eaglekit export carries
    return dst
