"""OpenAI request bodies -> engine requests, and the error body every refusal uses.

Bodies are read as plain JSON and checked field by field here (not by a pydantic schema), so that each
refusal names the offending `param` the way OpenAI's API does, and so that fields we ignore harmlessly
(user, stream_options, ...) never cause a 422.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..decoding.stops import check_stop_strings
from ..errors import EaglekitError
from ..tokenizer import chat_template_of, token_ids


class ApiError(Exception):
    """An HTTP error with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, type: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or {
            400: "invalid_request_error",
            404: "not_found_error",
            408: "invalid_request_error",
            413: "invalid_request_error",
            429: "rate_limit_exceeded",
            503: "service_unavailable",
        }.get(status, "server_error")
        self.headers: dict | None = None  # extra response headers (Connection: close for an unread body)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def from_eaglekit(e: EaglekitError, param: str | None = None) -> ApiError:
    msg = e.message + (f" (fix: {e.fix})" if e.fix else "")
    return ApiError(400, msg, param, e.code)


@dataclass
class Parsed:
    """What a route needs after validation; `prompt_ids` is filled by the route (completion or chat)."""

    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    ignore_eos: bool
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    extra: dict = field(default_factory=dict)


SEED_RANGE = (-(2**63), 2**63 - 1)  # a signed 64-bit integer, as vLLM's `seed` (torch seeds a generator with it)


# digits an integer literal of a body may have: every integer field's range fits in 20 (a seed is 64-bit). A longer one
# is kept as its digit count, never converted (int() of a 5,000-digit string raised ValueError past Python's
# int_max_str_digits, and the conversion is quadratic below it), and a field that reads it refuses it as out of range
MAX_INT_DIGITS = 24


class HugeInt:
    """An integer literal of more than MAX_INT_DIGITS digits, as parse_json leaves it."""

    def __init__(self, text: str):
        self.negative, self.digits = text.startswith("-"), len(text.lstrip("-"))

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def _parse_int(text: str):
    return int(text) if len(text) <= MAX_INT_DIGITS else HugeInt(text)


def _no_constant(name: str):
    # strict JSON: Python's reader takes NaN, Infinity and -Infinity, which no JSON writer emits
    raise bad(f"the request body holds {name}, which is not valid JSON (numbers must be finite)", code="invalid_json")


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw, parse_int=_parse_int, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:  # the C decoder's recursion guard: arrays or objects nested ~1000 deep
        raise bad("the request body's JSON is nested too deep", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object", code="invalid_json")
    return body


def _num(body, name, default, lo=None, hi=None, integer=False):
    v = body.get(name, default)
    if v is None:
        return default
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    if isinstance(v, HugeInt):  # out of every field's range (MAX_INT_DIGITS)
        raise bad(f"'{name}' must be {rng}, got {v!r}", name)
    if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)):
        raise bad(f"'{name}' must be {'an integer' if integer else 'a number'}, got {v!r}", name)
    if isinstance(v, float) and not math.isfinite(v):  # 1e999 reads as inf
        raise bad(f"'{name}' must be a finite number, got {v!r}", name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise bad(f"'{name}' must be {rng}, got {v!r}", name)
    return v


def check_text(s: str, param: str) -> str:
    """`s` if it is encodable as UTF-8. JSON may carry a lone surrogate (\\ud800 with no low half): Python
    keeps it in the str, and the tokenizer (or any UTF-8 writer) fails on it later."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise bad(
            f"'{param}' holds a lone surrogate (U+{ord(s[e.start]):04X} at character {e.start}): a JSON "
            f"\\u escape of a high surrogate must be followed by its low half",
            param,
            "invalid_unicode",
        ) from None
    return s


def _unsupported(body, name, ok, what):
    if name in body and body[name] is not None and not ok(body[name]):
        raise bad(f"'{name}'={body[name]!r} is not supported by this server ({what})", name, "unsupported")


def parse_common(body: dict, served: list[str], chat: bool) -> Parsed:
    model = body.get("model", served[0])
    if not isinstance(model, str) or model not in served:
        raise bad(f"the model {model!r} does not exist; this server serves {served}", "model", "model_not_found")
    _unsupported(body, "n", lambda v: v == 1, "n=1 only")
    _unsupported(body, "best_of", lambda v: v == 1, "best_of=1 only")
    _unsupported(body, "echo", lambda v: v is False, "echo=false only")
    _unsupported(body, "logprobs", lambda v: v is False or v == 0, "no logprobs")
    _unsupported(body, "top_logprobs", lambda v: v == 0, "no logprobs")
    _unsupported(body, "presence_penalty", lambda v: v == 0, "no penalties")
    _unsupported(body, "frequency_penalty", lambda v: v == 0, "no penalties")
    _unsupported(body, "repetition_penalty", lambda v: v == 1, "no penalties")  # vLLM's extension; bench sends 1.0
    _unsupported(body, "logit_bias", lambda v: not v, "no logit_bias")
    _unsupported(body, "suffix", lambda v: not v, "no suffix")
    _unsupported(body, "tools", lambda v: not v, "no tool calling")
    _unsupported(body, "response_format", lambda v: isinstance(v, dict) and v.get("type") == "text", "text only")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad(f"'stream' must be true or false, got {stream!r}", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    mt_name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _num(body, mt_name, None, lo=1, integer=True)
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    else:
        raise bad(f"'stop' must be a string or a list of strings, got {stop!r}", "stop")
    try:
        check_stop_strings(stop)  # E310: their count and length bound each token's search (decoding/stops.py)
    except EaglekitError as e:
        raise from_eaglekit(e, "stop") from None
    for s in stop:
        check_text(s, "stop")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad("'ignore_eos' must be true or false", "ignore_eos")
    top_k = _num(body, "top_k", 0, lo=-1, integer=True)
    return Parsed(
        model=model,
        stream=stream,
        include_usage=bool(opts.get("include_usage")),
        max_tokens=max_tokens,
        temperature=float(_num(body, "temperature", 1.0, lo=0, hi=2)),
        top_p=float(_num(body, "top_p", 1.0, lo=0, hi=1)),
        top_k=max(top_k, 0),
        seed=_num(body, "seed", None, *SEED_RANGE, integer=True),
        stop=tuple(s for s in stop if s),
        ignore_eos=ignore_eos,
    )


def parse_completion(body: dict, served: list[str]) -> Parsed:
    p = parse_common(body, served, chat=False)
    prompt = body.get("prompt")
    # OpenAI accepts a string, token ids, or a batch of either; one prompt per request here
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad("'prompt' is empty", "prompt")
        check_text(prompt, "prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        pass
    elif isinstance(prompt, list) and prompt and all(isinstance(t, (str, list)) for t in prompt):
        raise bad(
            f"a batch of {len(prompt)} prompts was sent; this server takes one prompt per request",
            "prompt",
            "unsupported",
        )
    else:
        raise bad("'prompt' must be a non-empty string or a list of token ids", "prompt")
    p.prompt = prompt
    return p


def parse_chat(body: dict, served: list[str]) -> Parsed:
    p = parse_common(body, served, chat=True)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise bad(
                        f"messages[{i}].content: only text parts are supported", f"messages[{i}].content", "unsupported"
                    )
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")
        out.append(
            {
                "role": check_text(m["role"], f"messages[{i}].role"),
                "content": check_text(content, f"messages[{i}].content"),
            }
        )
    p.messages = out
    return p


def chat_ids(tokenizer, messages: list[dict], template: str | None) -> list[int]:
    """The target's chat template (or --chat-template) over `messages`, with the assistant prompt opened;
    tokenized as `eaglekit generate --chat` does, so that server and CLI give the draft the same ids."""
    template = template or chat_template_of(tokenizer)
    if not template:
        raise bad(
            "this model has no chat template, so /v1/chat/completions cannot render messages",
            "messages",
            "no_chat_template",
        )
    try:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, chat_template=template)
    except Exception as e:  # a jinja error raised by the template itself (e.g. "roles must alternate")
        raise bad(f"the chat template refused these messages: {e}", "messages", "chat_template_error") from None
    return token_ids(out)
