"""The shipped prompt sets: counts per category, unique ids, no duplicates, the training set disjoint from the
held-out one (8-gram), and the committed train.jsonl equal to what the generator writes."""

from collections import Counter
from importlib import resources

import pytest

from eaglekit.errors import InputError
from eaglekit.train.prompts import (
    REJECT_N,
    build_training_prompts,
    check_disjoint,
    load_prompt_set,
    main,
    ngram_overlap,
    normalize,
    to_jsonl,
)

CHAT = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


@pytest.fixture(scope="module")
def heldout():
    return load_prompt_set("heldout")


@pytest.fixture(scope="module")
def train():
    return load_prompt_set("train")


def test_heldout_counts_per_category(heldout):
    n = Counter(r["category"] for r in heldout)
    assert set(n) == set(CHAT) | {"code_completion", "gsm"}
    assert all(n[c] >= 10 for c in CHAT), n
    assert n["code_completion"] >= 20 and n["gsm"] >= 20, n


def test_every_prompt_is_well_formed(heldout, train):
    for r in heldout + train:
        assert isinstance(r["id"], str) and isinstance(r["category"], str)
        assert isinstance(r["prompt"], str) and r["prompt"].strip()
    assert len({r["id"] for r in heldout + train}) == len(heldout) + len(train)  # ids unique over both sets


def test_code_completion_prompts_hold_a_signature_and_docstring(heldout):
    for r in heldout:
        if r["category"] == "code_completion":
            assert "def " in r["prompt"] and '"""' in r["prompt"], r["id"]


def test_gsm_problems_carry_a_numeric_answer(heldout):
    gsm = [r for r in heldout if r["category"] == "gsm"]
    for r in gsm:
        assert isinstance(r["answer"], (int, float)) and not isinstance(r["answer"], bool), r["id"]
    assert len({r["prompt"] for r in gsm}) == len(gsm)


def test_training_set_size_and_no_duplicates(train, heldout):
    assert len(train) >= 2000
    keys = [normalize(r["prompt"]) for r in train + heldout]
    assert len(set(keys)) == len(keys)
    assert len({r["category"] for r in train}) >= 20  # the template family, for balance checks


def test_training_set_shares_no_8gram_with_heldout(train, heldout):
    assert REJECT_N == 8
    assert check_disjoint(train, heldout, 8) == []


def test_committed_train_jsonl_is_the_generators_output(heldout):
    committed = resources.files("eaglekit").joinpath("assets", "prompts", "train.jsonl").read_text(encoding="utf-8")
    assert to_jsonl(build_training_prompts(heldout=heldout)) == committed


def test_generator_is_seeded_and_rejects_heldout_wording(heldout):
    a, b = build_training_prompts(50, seed=1, heldout=heldout), build_training_prompts(50, seed=1, heldout=heldout)
    assert a == b and a != build_training_prompts(50, seed=2, heldout=heldout)
    # a held-out set holding a training prompt's text: that prompt is no longer generated
    victim = a[0]["prompt"]
    again = build_training_prompts(50, seed=1, heldout=[{"id": "h", "category": "x", "prompt": victim}])
    assert victim not in {r["prompt"] for r in again}
    assert check_disjoint(again, [{"id": "h", "category": "x", "prompt": victim}], 8) == []


def test_ngram_overlap_and_check_disjoint_find_a_shared_run():
    a = "Explain, in SIMPLE terms: why the sky is blue today."
    b = "why the sky is blue at noon"
    assert ngram_overlap(a, b, 5) == {("why", "the", "sky", "is", "blue")}
    assert ngram_overlap(a, b, 6) == set()
    hits = check_disjoint([{"id": "t1", "prompt": a}, {"id": "t2", "prompt": "nothing alike"}],
                          [{"id": "h1", "prompt": b}], 5)
    assert hits == [("t1", "h1")]


def test_bad_input_is_a_coded_error():
    with pytest.raises(InputError) as e:
        load_prompt_set("mtbench")
    assert e.value.code == "E108"
    with pytest.raises(InputError) as e:
        build_training_prompts(0, heldout=[])
    assert e.value.code == "E108"


def test_main_writes_the_file_and_reports_overlap(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert main(["--out", str(out), "--n", "30", "--seed", "3"]) == 0
    assert len(out.read_text().splitlines()) == 30
    text = capsys.readouterr().out
    assert "8-gram overlap with the held-out set: 0 pairs" in text and "5-gram overlap" in text


def test_chat_output_is_what_regenerate_reads(tmp_path):
    from eaglekit.train.data import read_records

    out = tmp_path / "c.jsonl"
    assert main(["--out", str(out), "--n", "12", "--chat"]) == 0
    recs = list(read_records(out))
    assert len(recs) == 12 and all(kind == "chat" for kind, _ in recs)
    assert recs[0][1] == [{"role": "user", "content": build_training_prompts(12)[0]["prompt"]}]
