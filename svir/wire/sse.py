"""Incremental Server-Sent Events framing (§3.1): bytes of any split in, events and comments out.

The parser works on bytes and never decodes `data` itself: a line end never falls inside a UTF-8
character, so joining complete lines keeps every character whole and the JSON decoder sees valid
text however the network split it.

Bytes are searched with `find`, never with `in`: CPython's `bytes.__contains__` first tries its
argument as an integer (`65 in b"A"`), and for a bytes argument that raises and drops a formatted
TypeError each time, ~4x the cost of the search itself, paid per read of a stream.
"""

from __future__ import annotations

import msgspec

from svir.wire.errors import EventTooLarge, LineTooLong

DEFAULT_MAX_LINE = 1 << 20
DEFAULT_MAX_EVENT = 4 << 20


class SSEEvent(msgspec.Struct, frozen=True, gc=False):
    """One dispatched event: its data lines joined with LF, and its fields."""

    data: bytes
    event: str | None = None
    id: str | None = None
    retry: int | None = None


class SSEComment(msgspec.Struct, frozen=True, gc=False):
    """A comment line (`: …`), which servers send as a keep-alive."""

    text: str


class SSEParser:
    """Feed bytes, get events. Line ends may be LF, CRLF or CR, and may be split across feeds."""

    __slots__ = (
        "_buf",
        "_data",
        "_data_size",
        "_event",
        "_id",
        "_max_event",
        "_max_line",
        "_retry",
        "_skip_lf",
    )

    def __init__(
        self, *, max_line: int = DEFAULT_MAX_LINE, max_event: int = DEFAULT_MAX_EVENT
    ) -> None:
        self._max_line = max_line
        self._max_event = max_event
        self._buf = bytearray()
        self._data: list[bytes] = []
        self._data_size = 0
        self._event: str | None = None
        self._id: str | None = None
        self._retry: int | None = None
        # A CR ended the last feed: an LF starting the next one belongs to the same line end.
        self._skip_lf = False

    @property
    def last_event_id(self) -> str | None:
        """The last `id:` seen; it persists across events, as the SSE standard says."""
        return self._id

    def feed(self, chunk: bytes) -> list[SSEEvent | SSEComment]:
        """Parse more bytes; return the events and comments they completed."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
                if not chunk:
                    return []
        if chunk.find(b"\n") < 0 and chunk.find(b"\r") < 0:
            # No line ends: only accumulate. A bytearray keeps long lines linear in their length.
            self._buf += chunk
            if len(self._buf) > self._max_line:
                raise LineTooLong(f"SSE line longer than {self._max_line} bytes")
            return []
        if self._buf:
            self._buf += chunk
            buf = bytes(self._buf)
            self._buf.clear()
        else:
            buf = chunk
        if buf.find(b"\r") >= 0:
            if buf[-1] == 0x0D:
                self._skip_lf = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        # Events end at a blank line: split there first, so that an event of one `data:` line,
        # almost every event of every stream, is one slice and no per-line work. What follows the
        # last blank line is an event still arriving (its whole lines, then an unfinished one).
        parts = buf.split(b"\n\n")
        tail = parts.pop().split(b"\n")
        rest = tail.pop()
        if len(rest) > self._max_line:
            raise LineTooLong(f"SSE line longer than {self._max_line} bytes")
        out: list[SSEEvent | SSEComment] = []
        # Lines of an event begun in an earlier feed continue it in the first part.
        pending = bool(self._data) or self._event is not None
        inline_max = min(self._max_line, self._max_event)  # no limit can be reached below it
        for part in parts:
            if (
                not pending
                and part.startswith(b"data: ")
                and len(part) <= inline_max
                and part.find(b"\n") < 0
            ):
                out.append(SSEEvent(part[6:], None, self._id, self._retry))
            else:
                lines = part.split(b"\n")
                lines.append(b"")  # the blank line the split took
                self._lines(lines, out)
                pending = False
        if tail:
            self._lines(tail, out)
        if rest:
            self._buf += rest
        return out

    def feed_plain(self, chunk: bytes) -> list[bytes] | None:
        """`feed`'s fast path for the events almost every stream is made of: when no event is
        pending and every event `chunk` completes is one `data: ` line and nothing else, take
        the bytes and return those events' data, as `feed` would have returned them in
        `SSEEvent`s (with no name; the id and retry are the parser's, unchanged). Otherwise
        (a comment, another field, a CR, a line of an event still arriving, a limit near, no
        event completed) take nothing and return None: the caller feeds the bytes to `feed`."""
        if self._skip_lf or self._data or self._event is not None:
            return None
        if not (self._buf or chunk).startswith(b"data: "):
            return None  # (or a first line begun with fewer bytes: `feed` is right anyway)
        if not self._buf:
            # A read of one whole event, as a server that writes each token as it makes it is
            # read: its only LFs are the last two.
            last = len(chunk) - 2
            if (
                chunk.find(b"\n") == last
                and chunk[-1] == 0x0A
                and chunk.find(b"\r") < 0
                and last <= self._max_line
                and last <= self._max_event
            ):
                return [chunk[6:last]]
        buf = bytes(self._buf) + chunk if self._buf else chunk
        end = buf.rfind(b"\n\n")
        # Below the limits as a whole, no line or event can reach them.
        if end < 0 or len(buf) > self._max_line or len(buf) > self._max_event:
            return None
        if buf.find(b"\r") >= 0 or buf.find(b"\n", end + 2) >= 0:
            return None
        # Data lines hold no LF: when no piece between the separators holds one, each piece is
        # one event's only line. (The LF test is on the pieces joined: one memchr, where
        # `count(b"\n")` walks the bytes one by one.)
        data = buf[6:end].split(b"\n\ndata: ")
        if (b"".join(data) if len(data) > 1 else data[0]).find(b"\n") >= 0:
            return None
        self._buf.clear()
        if end + 2 < len(buf):
            self._buf += buf[end + 2 :]
        return data

    def _lines(self, lines: list[bytes], out: list[SSEEvent | SSEComment]) -> None:
        """Handle whole lines, in order (a blank one dispatches the event they made)."""
        inline_max = min(self._max_line, self._max_event)
        for line in lines:
            if line.startswith(b"data: "):
                if self._data or len(line) > inline_max:
                    self._add_data(line[6:])
                else:
                    self._data_size = len(line) - 5
                    self._data.append(line[6:])
            elif not line:
                data = self._data
                if len(data) == 1 and self._event is None:
                    out.append(SSEEvent(data[0], None, self._id, self._retry))
                    data.clear()
                    self._data_size = 0
                elif data:
                    out.append(self._dispatch())
                else:
                    self._event = None
            else:
                self._field(line, out)

    def close(self) -> list[SSEEvent | SSEComment]:
        """End of input. An event with no blank line after it is incomplete and is dropped."""
        self._buf.clear()
        self._data.clear()
        self._data_size = 0
        self._event = None
        return []

    def _add_data(self, value: bytes) -> None:
        if len(value) > self._max_line:
            raise LineTooLong(f"SSE line longer than {self._max_line} bytes")
        self._data_size += len(value) + 1
        if self._data_size > self._max_event:
            raise EventTooLarge(f"SSE event larger than {self._max_event} bytes")
        self._data.append(value)

    def _dispatch(self) -> SSEEvent:
        data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        event = SSEEvent(data, self._event, self._id, self._retry)
        self._data = []
        self._data_size = 0
        self._event = None
        return event

    def _field(self, line: bytes, out: list[SSEEvent | SSEComment]) -> None:
        if len(line) > self._max_line:
            raise LineTooLong(f"SSE line longer than {self._max_line} bytes")
        colon = line.find(b":")
        if colon == 0:
            out.append(SSEComment(line[1:].strip().decode("utf-8", "replace")))
            return
        if colon < 0:
            name, value = line, b""
        else:
            name, value = line[:colon], line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if name == b"data":
            self._add_data(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id":
            if value.find(b"\0") < 0:
                self._id = value.decode("utf-8", "replace")
        elif name == b"retry":
            if value.isdigit():
                self._retry = int(value)
        # Any other field name is ignored, as the SSE standard requires.


def encode_data(payload: bytes) -> bytes:
    """Frame one payload as an SSE event; a payload of several lines takes several data lines."""
    if payload.find(b"\n") >= 0:
        return b"".join(b"data: " + line + b"\n" for line in payload.split(b"\n")) + b"\n"
    return b"data: " + payload + b"\n\n"


def encode_comment(text: str = "") -> bytes:
    """Frame an SSE comment, as used for keep-alives."""
    return b": " + text.encode() + b"\n\n" if text else b":\n\n"
