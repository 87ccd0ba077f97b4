"""Incremental detokenization for streaming, and stop strings cut out of the text.

The decoding and the stop search are decoding.stops' (`TextStream`, `StopMatcher`): the engine stops on the same
text. Cost per push: one decode of a short window and one search per stop string over the new text and the
characters held back, not over the whole output; only the text not yet sent is kept.

Stop strings: OpenAI leaves the stop string out of the output. The engine stops generating on it; here
the text is cut before it, and while streaming the last len(longest stop) - 1 characters are held back,
because they could be the start of a stop string that the next tokens complete.
"""

from __future__ import annotations

from ..decoding.stops import StopMatcher, TextStream


class Detokenizer:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.stream = TextStream(tokenizer)
        self.matcher = StopMatcher(stop) if any(stop) else None
        self.hold = self.matcher.hold if self.matcher is not None else 0
        self.pending = ""  # text decoded and not yet sent (held back: it could start a stop string)
        self.sent = 0  # characters handed out
        self.stopped = False  # a stop string was found: the text ends before it

    @property
    def window(self) -> int:
        """Tokens the next push decodes besides its own (TextStream.window)."""
        return self.stream.window

    def push(self, ids, final: bool = False) -> str:
        """Add tokens; return the text that may be sent now (all that is left when `final`)."""
        if self.stopped:
            return ""
        new = self.stream.push(ids)
        if final:
            new += self.stream.flush()
        self.pending += new
        end = len(self.pending)
        if self.matcher is not None:
            at = self.matcher.feed(new)
            if at is not None:  # at >= sent: the characters held back cover any stop string's start
                end = at - self.sent
                self.stopped = True
            elif not final:
                end = max(end - self.hold, 0)
        out, self.pending = self.pending[:end], self.pending[end:]
        self.sent += len(out)
        return out
