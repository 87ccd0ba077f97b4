"""Where a generation stops: EOS, max_new_tokens, stop strings, even inside an accepted run.

Baseline and speculative decoding push their tokens through the same Emitter, so both stop on the
same token and return the same ids and text.
"""

from __future__ import annotations


class Emitter:
    def __init__(self, max_new_tokens: int, eos_ids=(), stop_strings=(), tokenizer=None):
        self.max_new_tokens = max_new_tokens
        self.eos = set(int(i) for i in eos_ids)
        self.stop_strings = [s for s in stop_strings if s]
        if self.stop_strings and tokenizer is None:
            from ..errors import GenerationError

            raise GenerationError("stop strings need a tokenizer to decode the output",
                                  fix="give the target folder's tokenizer, or use token ids", code="E304")
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.reason: str | None = None
        self._stop_at_char: int | None = None
        self._checked = 0
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
            elif self.stop_strings and self._hit_stop_string():
                self.reason = "stop_string"
            elif len(self.tokens) >= self.max_new_tokens:
                self.reason = "length"
        return taken

    def _hit_stop_string(self) -> bool:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        longest = max(len(s) for s in self.stop_strings)
        start = max(0, self._checked - longest)
        hits = [(i, s) for s in self.stop_strings if (i := text.find(s, start)) >= 0]
        self._checked = len(text)
        if hits:
            i, s = min(hits)
            self._stop_at_char = i + len(s)
            return True
        return False

    def text(self) -> str | None:
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        return text[: self._stop_at_char] if self._stop_at_char is not None else text
