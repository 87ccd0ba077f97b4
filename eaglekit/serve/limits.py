"""What one client may cost the server before it is refused: the size of its body, the time its headers and
its body may take to arrive, and the length of its prompt before it is tokenized.

    read_body(request, max_bytes, timeout)   the body, or 413 (too large) / 408 (too slow) as OpenAI errors
    h11_protocol(header_timeout)             uvicorn's h11 protocol, closing a connection whose request
                                             headers are not complete `header_timeout` s after it opened
                                             (or after its previous response)
    PromptBound(tokenizer, context)          refuses a prompt that cannot fit the context without tokenizing it

Why: uvicorn has no body limit and no header or body deadline; a 10 MB prompt was tokenized whole (seconds of
CPU) and a client that stops sending held its socket and its request forever.
"""

from __future__ import annotations

import asyncio

from .protocol import ApiError

# past the limit the rest of the body is read and dropped (so that the client, still sending, reads the 413
# instead of a reset connection), up to this many bytes; a larger declared body is refused at once
DISCARD_CAP = 64 * 2**20

CLOSE = {"Connection": "close"}  # a refused body is not read to its end: the connection cannot be reused


class TooLarge(ApiError):
    def __init__(self, size: int, limit: int, at_least: bool = False):
        super().__init__(
            413,
            f"the request body is {'more than ' if at_least else ''}{size} bytes; this server "
            f"takes at most {limit} (--max-body-mb {limit / 2**20:g})",
            code="request_too_large",
        )
        self.headers = CLOSE


class TooSlow(ApiError):
    def __init__(self, timeout: float):
        super().__init__(
            408, f"the request body did not arrive within {timeout:g} s (--read-timeout)", code="request_timeout"
        )
        self.headers = CLOSE


async def read_body(request, max_bytes: int, timeout: float) -> bytes:
    """The whole body within `timeout` s and `max_bytes` bytes. A client that goes away mid-upload raises
    starlette's ClientDisconnect (answered quietly by the app: nobody is listening)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise ApiError(400, f"Content-Length {declared!r} is not a number", code="invalid_request") from None
        if n > DISCARD_CAP:
            raise TooLarge(n, max_bytes)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size <= max_bytes:
                    chunks.append(chunk)
                elif size > DISCARD_CAP:
                    break
    except TimeoutError:
        raise TooSlow(timeout) from None
    if size > max_bytes:
        raise TooLarge(size, max_bytes, at_least=size > DISCARD_CAP)
    return b"".join(chunks)


def h11_protocol(header_timeout: float):
    """uvicorn's h11 protocol with a header deadline: uvicorn times out idle keep-alive connections, but not a
    connection that sends part of its request line or headers and then stalls (or trickles)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _deadline = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self):
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc):
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

        def _arm(self):
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(header_timeout, self._expired)

        def _expired(self):
            # the client's side of h11 is IDLE until a request's headers are complete (then SEND_BODY or DONE)
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:
                pass
            self.transport.close()

    return GuardedH11Protocol


class PromptBound:
    """A lower bound on a text's token count, from the longest token of the vocabulary: a prompt of more than
    2 x context x longest-token characters cannot fit (2: a normalizer may merge characters), so it is refused
    before the tokenizer spends seconds on it."""

    def __init__(self, tokenizer, context: int):
        longest = 0
        try:
            vocab = tokenizer.get_vocab()
            longest = max((len(t) for t in vocab), default=0)
        except Exception:  # noqa: BLE001 -- a tokenizer without a readable vocabulary: no bound
            pass
        self.max_chars = 2 * context * longest if longest else None
        self.context = context

    def check(self, text: str, param: str) -> None:
        if self.max_chars is not None and len(text) > self.max_chars:
            raise ApiError(
                400,
                f"the prompt is {len(text)} characters, more than any {self.context}-token "
                f"context can hold (at most {self.max_chars} characters with this tokenizer); "
                f"shorten it",
                param,
                "context_length_exceeded",
            )
