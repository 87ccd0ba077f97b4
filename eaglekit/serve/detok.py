"""Incremental detokenization for streaming, and stop strings cut out of the text.

Byte-level tokenizers split one character over several tokens; decoding a partial character gives
U+FFFD. Text is released only when the decode of the pending tokens no longer ends in U+FFFD, and is
decoded with a few tokens of left context (`prefix`), because some tokenizers (SentencePiece) render a
token differently at the start of a string. Cost per step: one decode of a short window, not of the
whole output.

Stop strings: OpenAI leaves the stop string out of the output. The engine stops generating on it; here
the text is cut before it, and while streaming the last len(longest stop) - 1 characters are held back,
because they could be the start of a stop string that the next tokens complete.
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tok = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] is context already turned into text
        self.read = 0
        self.text = ""  # all text decoded so far
        self.sent = 0  # characters of self.text already handed out
        self.stopped = False  # a stop string was found: the text ends before it

    def _decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def _advance(self) -> None:
        before = self._decode(self.ids[self.prefix:self.read])
        now = self._decode(self.ids[self.prefix:])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            self.text += now[len(before):]
            self.prefix, self.read = self.read, len(self.ids)

    @property
    def window(self) -> int:
        """Tokens the next push decodes besides its own: the context and the tokens still pending (a character not
        yet complete). A few in a normal stream; it grows only while the output stays inside one character."""
        return len(self.ids) - self.prefix

    def push(self, ids, final: bool = False) -> str:
        """Add tokens; return the text that may be sent now (all that is left when `final`)."""
        if self.stopped:
            return ""
        self.ids.extend(int(i) for i in ids)
        self._advance()
        if final and self.read < len(self.ids):  # a character the output really ends inside: send what it is
            self.text += self._decode(self.ids[self.prefix:])[len(self._decode(self.ids[self.prefix:self.read])):]
            self.read = len(self.ids)
        end = len(self.text)
        if self.stop:
            start = max(self.sent - self.hold, 0)
            hits = [i for s in self.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                end = min(hits)
                self.text = self.text[:end]
                self.stopped = True
            elif not final:
                end = max(len(self.text) - self.hold, self.sent)
        out = self.text[self.sent:end]
        self.sent = end
        return out
