"""A generated reply, read once for every front end: events while it streams, then the whole reply.

`ReplyAssembler` is fed the core's `StreamChunk`s for one `ChatRequest` and releases
framework-free events, each exactly once: `TextDelta` (text that can no longer be the start
of a tool call), `ToolCallEvent` (a whole call) and `InvalidToolCallEvent` (a call written
wrongly). After the last chunk, `reply` holds the whole `Reply`: content and calls as
`chat.tool_calls.parse_reply` reads the text (the calls are the very objects the events
carried, ids included), the finish reason in chat-API words, usage and the method's summary.
`read_reply` gives the same `Reply` for a whole `GenerationResult`, through the same assembler,
so a streamed and a non-streamed reply always mean the same thing.

Example:
    >>> from ensemble_core.chat.request import ChatRequest
    >>> assembler = ReplyAssembler(ChatRequest(prompt=[], settings={}))
    >>> assembler.feed(StreamChunk("Hi <tool_"))
    [TextDelta(text='Hi ')]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

from ensemble_core.chat.request import ChatRequest
from ensemble_core.chat.tool_calls import InvalidToolCall, StreamEvent, ToolCall, ToolCallStream
from ensemble_core.errors import GenerationError
from ensemble_core.results import GenerationResult, StreamChunk, Usage


@dataclass(frozen=True)
class TextDelta:
    """New text of the reply (held back while it could still open a tool call)."""

    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    """A whole, valid tool call; `index` is its position among the reply's valid calls."""

    call: ToolCall
    index: int


@dataclass(frozen=True)
class InvalidToolCallEvent:
    """A tool call the model attempted but wrote wrongly (never an exception)."""

    call: InvalidToolCall


ReplyEvent: TypeAlias = TextDelta | ToolCallEvent | InvalidToolCallEvent


@dataclass(frozen=True)
class Reply:
    """The whole reply to one request.

    Attributes:
        content: the text meant for the user (stripped around tool calls, as `parse_reply` does).
        tool_calls: the valid calls, in order.
        invalid_tool_calls: the calls written wrongly, in order.
        result: the core's `GenerationResult` (its `text` excludes the request's `reply_prefix`).
    """

    content: str
    tool_calls: tuple[ToolCall, ...]
    invalid_tool_calls: tuple[InvalidToolCall, ...]
    result: GenerationResult

    @property
    def finish_reason(self) -> str:
        """In chat-API words: "tool_calls", "length" or "stop" (`GenerationResult.api_finish_reason`)."""
        return self.result.api_finish_reason(bool(self.tool_calls))

    @property
    def usage(self) -> Usage:
        """Token counts (the headline in the tokens of `usage.counted_by`, plus every member's)."""
        return self.result.usage

    def summary(self) -> dict[str, Any]:
        """How the reply was made, as plain JSON values (`GenerationResult.summary`)."""
        return self.result.summary()


class ReplyAssembler:
    """Core stream chunks of one request -> `ReplyEvent`s as they are settled, then the `Reply`.

    The request's `reply_prefix` (a forced call's or a JSON object's opening) is read as the
    start of the reply, so its text or call is released with the first chunk.
    """

    def __init__(self, request: ChatRequest):
        self._splitter = ToolCallStream(request.tool_names)
        self._waiting = self._splitter.feed(request.reply_prefix) if request.reply_prefix else []
        self._text: list[str] = []
        self._calls: list[ToolCall] = []
        self._invalid: list[InvalidToolCall] = []
        self.reply: Reply | None = None
        """The whole reply, once the last chunk (the one with a `result`) was fed; else None."""

    @property
    def text(self) -> str:
        """The text released so far (not stripped: the deltas joined)."""
        return "".join(self._text)

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The valid calls released so far."""
        return tuple(self._calls)

    @property
    def invalid_tool_calls(self) -> tuple[InvalidToolCall, ...]:
        """The invalid calls released so far."""
        return tuple(self._invalid)

    def feed(self, chunk: StreamChunk) -> list[ReplyEvent]:
        """The events `chunk` settles; the last chunk also releases everything held back.

        Raises:
            GenerationError: a chunk came after the last one.
        """
        if self.reply is not None:
            raise GenerationError("the reply already ended; a ReplyAssembler reads one reply")
        found = [*self._waiting, *self._splitter.feed(chunk.text)]
        self._waiting = []
        if chunk.result is not None:
            found += self._splitter.finish()
        events = [event for item in found if (event := self._record(item)) is not None]
        if chunk.result is not None:
            content = self.text.strip() if self._calls or self._invalid else self.text
            self.reply = Reply(content, self.tool_calls, self.invalid_tool_calls, chunk.result)
        return events

    def _record(self, item: StreamEvent) -> ReplyEvent | None:
        if item.call is not None:
            self._calls.append(item.call)
            return ToolCallEvent(item.call, len(self._calls) - 1)
        if item.invalid is not None:
            self._invalid.append(item.invalid)
            return InvalidToolCallEvent(item.invalid)
        if item.text:
            self._text.append(item.text)
            return TextDelta(item.text)
        return None


def read_reply(request: ChatRequest, result: GenerationResult) -> Reply:
    """The `Reply` for a whole (non-streamed) result: the assembler fed it as one chunk."""
    assembler = ReplyAssembler(request)
    assembler.feed(StreamChunk(result.text, finish_reason=result.finish_reason, result=result))
    if assembler.reply is None:  # cannot happen: a chunk with a result ends the reply
        raise GenerationError("the reply did not end")
    return assembler.reply
