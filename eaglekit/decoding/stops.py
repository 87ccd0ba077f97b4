"""Where a generation stops: EOS, max_new_tokens, stop strings, even inside an accepted run.

Baseline and speculative decoding push their tokens through the same Emitter, so both stop on the
same token and return the same ids and text.

Cost per token is independent of the output's length (a request must not slow the engine thread it shares with
others as its output grows): the text is decoded a short window at a time (`TextStream`), and each stop string is
looked for only where it could end in the new text (`StopMatcher`). A request's stop strings are bounded
(`check_stop_strings`, E310), so a token costs at most MAX_STOP_STRINGS searches over MAX_STOP_CHARS characters.
"""

from __future__ import annotations

from ..errors import GenerationError

# a request's stop strings: how many (empty ones included) and their total length in characters. OpenAI takes 4;
# these leave room for any real use while bounding the per-token search (docs/serving.md)
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 4096


def check_stop_strings(stops) -> tuple[str, ...]:
    """The non-empty stop strings of `stops`, or E310 when there are too many or they are too long together."""
    stops = tuple(stops or ())
    chars = sum(len(s) for s in stops)
    if len(stops) > MAX_STOP_STRINGS or chars > MAX_STOP_CHARS:
        raise GenerationError(
            f"{len(stops)} stop strings of {chars} characters in all; a request takes at most "
            f"{MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} characters in all",
            fix="pass fewer or shorter stop strings",
            code="E310",
        )
    return tuple(s for s in stops if s)


class TextStream:
    """Token ids -> text, decoding only a short window per push.

    Byte-level tokenizers split one character over several tokens; decoding a partial character gives U+FFFD. Text
    is released only when the decode of the pending tokens no longer ends in U+FFFD, and is decoded with the tokens
    of the previous piece as left context (`prefix`), because some tokenizers (SentencePiece) render a token
    differently at the start of a string."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] is context already turned into text
        self.read = 0

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    @property
    def window(self) -> int:
        """Tokens the next push decodes besides its own: the context and the tokens still pending (a character not
        yet complete). A few in a normal stream; it grows only while the output stays inside one character."""
        return len(self.ids) - self.prefix

    def push(self, ids) -> str:
        """Add tokens; return the text they complete ("" while a character is incomplete)."""
        self.ids.extend(int(i) for i in ids)
        before = self._decode(self.ids[self.prefix : self.read])
        now = self._decode(self.ids[self.prefix :])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return now[len(before) :]
        return ""

    def flush(self) -> str:
        """The text of tokens still pending (a character the output really ends inside: send what it is)."""
        if self.read >= len(self.ids):
            return ""
        out = self._decode(self.ids[self.prefix :])[len(self._decode(self.ids[self.prefix : self.read])) :]
        self.read = len(self.ids)
        return out


class StopMatcher:
    """The first stop string in a text fed piece by piece: keeps only the last len(longest) - 1 characters, and
    looks for each string only where it could end in the new piece."""

    def __init__(self, stops):
        self.stops = tuple(s for s in stops if s)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.tail = ""  # the last `hold` characters fed
        self.offset = 0  # characters fed before `tail`

    def feed(self, new: str) -> int | None:
        """Add text; return the index (in all text fed) where the first stop string starts, or None."""
        if not new:
            return None
        buf = self.tail + new
        hits = [i for s in self.stops if (i := buf.find(s, max(len(self.tail) - len(s) + 1, 0))) >= 0]
        if hits:
            return self.offset + min(hits)
        keep = len(buf) - self.hold if self.hold else len(buf)
        keep = max(keep, 0)
        self.offset += keep
        self.tail = buf[keep:]
        return None


class Emitter:
    def __init__(self, max_new_tokens: int, eos_ids=(), stop_strings=(), tokenizer=None):
        self.max_new_tokens = max_new_tokens
        self.eos = set(int(i) for i in eos_ids)
        self.stop_strings = list(check_stop_strings(stop_strings))
        if self.stop_strings and tokenizer is None:
            raise GenerationError(
                "stop strings need a tokenizer to decode the output",
                fix="give the target folder's tokenizer, or use token ids",
                code="E304",
            )
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.reason: str | None = None
        self._stream = TextStream(tokenizer) if self.stop_strings else None
        self._matcher = StopMatcher(self.stop_strings) if self.stop_strings else None
        if max_new_tokens <= 0:
            self.reason = "length"

    @property
    def done(self) -> bool:
        return self.reason is not None

    def push(self, ids) -> int:
        """Append tokens until a stop condition fires; returns how many were taken."""
        taken = 0
        for t in ids:
            if self.done:
                break
            self.tokens.append(int(t))
            taken += 1
            if int(t) in self.eos:
                self.reason = "eos"
            elif (
                self._matcher is not None
                and self._stream is not None  # (both made with the stop strings)
                and self._matcher.feed(self._stream.push((t,))) is not None
            ):
                self.reason = "stop_string"
            elif len(self.tokens) >= self.max_new_tokens:
                self.reason = "length"
        return taken

    def text(self) -> str | None:
        """The output's text, up to the end of the first stop string when one stopped it (decoded once, here)."""
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if self.reason == "stop_string":
            hits = [(i, s) for s in self.stop_strings if (i := text.find(s)) >= 0]
            if hits:
                i, s = min(hits)
                return text[: i + len(s)]
        return text
