"""Errors a user can act on.

Every failure caused by input (a path, a config, a draft that does not fit its target, a sampling
parameter) is raised as an `EaglekitError` with a stable code, a sentence that names the problem with
the numbers involved, and a fix. The CLI prints these without a traceback; anything else is a bug.
"""

from __future__ import annotations


class EaglekitError(Exception):
    code = "E000"

    def __init__(self, message: str, fix: str | None = None, code: str | None = None):
        self.message = message
        self.fix = fix
        if code is not None:
            self.code = code
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = f"[{self.code}] {self.message}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class InputError(EaglekitError):
    """Bad path, missing file, unreadable or truncated checkpoint, unsupported architecture."""

    code = "E100"


class ContractError(EaglekitError):
    """The draft and the target disagree about the hidden-state contract (CaptureSpec, widths, vocab)."""

    code = "E200"


class GenerationError(EaglekitError):
    """Bad decoding parameters: sampling settings, tree shape, prompt too long for the cache."""

    code = "E300"


class FeatureError(EaglekitError):
    """NaN / inf or wrongly shaped features seen at run time."""

    code = "E400"
