"""A request's cost per token is bounded, whatever it sends: its stop strings are limited (E310), the engine's stop
search and the stream's detokenizer decode a short window and search only the new text (not the whole output), and
integer literals of any length are refused as out of range without being converted."""

from pathlib import Path

import pytest

from eaglekit.decoding.stops import MAX_STOP_CHARS, MAX_STOP_STRINGS, Emitter, StopMatcher, check_stop_strings
from eaglekit.errors import GenerationError
from eaglekit.serve.detok import Detokenizer
from eaglekit.serve.protocol import ApiError, parse_completion, parse_json

TARGET = Path(__file__).resolve().parents[2] / "eaglekit" / "assets" / "demo" / "target"


@pytest.fixture(scope="module")
def tok():
    from eaglekit.tokenizer import load_tokenizer

    return load_tokenizer(TARGET)


class Counting:
    """A tokenizer whose decode records how many ids each call decodes."""

    def __init__(self, tok):
        self.tok, self.sizes = tok, []

    def decode(self, ids, **kw):
        self.sizes.append(len(ids))
        return self.tok.decode(ids, **kw)


def test_stop_string_limits_are_a_coded_error():
    assert check_stop_strings(["a", "", "b"]) == ("a", "b")
    check_stop_strings(["x"] * MAX_STOP_STRINGS)
    check_stop_strings(["x" * MAX_STOP_CHARS])
    for stops in (["x"] * (MAX_STOP_STRINGS + 1), ["x" * (MAX_STOP_CHARS + 1)], [""] * 250_000):
        with pytest.raises(GenerationError) as e:
            Emitter(8, (), stops, tokenizer=object())
        assert e.value.code == "E310"


def test_the_server_refuses_a_huge_stop_list_naming_the_param():
    for stop in (["ab"] * 250_000, "x" * (MAX_STOP_CHARS + 1)):
        with pytest.raises(ApiError) as e:
            parse_completion({"prompt": "x", "stop": stop}, ["m"])
        assert (e.value.status, e.value.param, e.value.code) == (400, "stop", "E310")


@pytest.mark.parametrize("field", ["max_tokens", "seed", "top_k", "temperature", "n"])
@pytest.mark.parametrize("sign", ["", "-"])
def test_a_5000_digit_integer_is_out_of_range_not_a_500(field, sign):
    raw = b'{"prompt": "x", "%s": %s%s}' % (field.encode(), sign.encode(), b"9" * 5000)
    body = parse_json(raw)  # no conversion: Python refuses int() of > 4300 digits with a ValueError
    with pytest.raises(ApiError) as e:
        parse_completion(body, ["m"])
    assert e.value.status == 400 and e.value.param == field and "5000 digits" in e.value.message


@pytest.mark.parametrize("lit", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_constants_are_refused(lit):
    with pytest.raises(ApiError) as e:
        parse_json(b'{"prompt": "x", "temperature": %s}' % lit)
    assert e.value.status == 400 and e.value.code == "invalid_json"
    with pytest.raises(ApiError) as e:  # a float literal past float's range reads as inf
        parse_completion(parse_json(b'{"prompt": "x", "top_p": 1e999}'), ["m"])
    assert e.value.param == "top_p"


def _reference_stop(text_so_far, stops):
    """The first stop string's start in the whole text (what a full search per token finds)."""
    hits = [i for s in stops if (i := text_so_far.find(s)) >= 0]
    return min(hits) if hits else None


def test_stop_matcher_agrees_with_a_full_search():
    import random

    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice("abc") for _ in range(60))
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4))]
        m, fed, cut = StopMatcher(stops), "", rng.randint(1, 4)
        for i in range(0, len(text), cut):
            fed += text[i:i + cut]
            at = m.feed(text[i:i + cut])
            ref = _reference_stop(fed, stops)
            assert at == ref, (text, stops, fed)
            if at is not None:
                break


def test_per_token_decode_does_not_grow_with_the_output(tok):
    """Every decode call over a 600-token output, with stop strings that never match, covers a few tokens: the
    engine's Emitter used to decode the whole output per token (250,000 stop strings slowed another client 7x)."""
    ids = tok("naïve café → 日本語のテキスト ✓ done; " * 40, add_special_tokens=False)["input_ids"]
    assert len(ids) > 600
    stops = ["zzz%d" % i for i in range(MAX_STOP_STRINGS)]
    counting = Counting(tok)
    em = Emitter(10_000, (), stops, counting)
    for t in ids:
        em.push([t])
    assert not em.done and max(counting.sizes) <= 16
    assert em.text() == tok.decode(ids, skip_special_tokens=True)
    counting.sizes.clear()
    d = Detokenizer(counting, tuple(stops))
    out = "".join(d.push([t]) for t in ids) + d.push([], final=True)
    assert out == tok.decode(ids, skip_special_tokens=True) and max(counting.sizes) <= 16
    assert len(d.pending) == 0


def test_emitter_and_stream_stop_at_the_same_text(tok):
    text = "alpha beta gamma delta END epsilon zeta"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for stops in (["END"], ["gamma delta", "zeta"], ["a d", "lta"], ["ta E"]):
        em = Emitter(100, (), stops, tok)
        taken = em.push(ids)
        assert em.reason == "stop_string"
        d = Detokenizer(tok, tuple(stops))
        out = "".join(d.push([t]) for t in ids[:taken]) + d.push([], final=True)
        cut = _reference_stop(tok.decode(ids, skip_special_tokens=True), stops)
        assert out == tok.decode(ids, skip_special_tokens=True)[:cut] and d.stopped
        assert em.text().startswith(out) and any(em.text() == out + s for s in stops)
