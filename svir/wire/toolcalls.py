"""Assembling streamed tool calls from their pieces (§3.3).

Pieces of several calls interleave in any index order, and a name may arrive in pieces too. A
client must see each call's complete name on its first piece, so a call is started only once its
name cannot grow: when it equals a declared tool name that no other declared name extends, or
else when the answer finishes. Argument pieces of a started call stream as they come.
"""

from __future__ import annotations

from collections.abc import Collection

import msgspec

from svir.wire.errors import ToolCallError
from svir.wire.events import ToolCallDelta, ToolCallStart


class ToolCall(msgspec.Struct, frozen=True):
    """One assembled call."""

    index: int
    id: str
    name: str
    arguments: str


class ToolCallPiece(msgspec.Struct, gc=False):
    """A tool-call piece as servers send it in `delta.tool_calls`."""

    index: int | None = None
    id: str | None = None
    type: str | None = None
    function: _FunctionPiece | None = None


class _FunctionPiece(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | None = None


class _Call:
    __slots__ = ("args", "id", "index", "name", "pending", "started")

    def __init__(self, index: int) -> None:
        self.index = index
        self.id = ""
        self.name = ""
        self.args: list[str] = []
        self.pending: list[str] = []
        self.started = False


class ToolCallAssembler:
    """Feed `delta.tool_calls` lists; get start and argument events; validate at the end."""

    __slots__ = ("_by_index", "_final_names", "_last", "_problems")

    def __init__(self, tool_names: Collection[str] | None = None) -> None:
        names = set(tool_names or ())
        self._final_names = frozenset(
            n for n in names if n and not any(m != n and m.startswith(n) for m in names)
        )
        self._by_index: dict[int, _Call] = {}
        self._last: _Call | None = None
        self._problems: list[str] = []

    def __bool__(self) -> bool:
        return bool(self._by_index)

    def feed(self, pieces: list[ToolCallPiece]) -> list[ToolCallStart | ToolCallDelta]:
        """Take one delta's pieces."""
        out: list[ToolCallStart | ToolCallDelta] = []
        for piece in pieces:
            call = self._call_for(piece)
            if piece.id:
                if call.id and call.id != piece.id:
                    self._problems.append(f"tool call {call.index} changed its id")
                call.id = piece.id
            fn = piece.function
            if fn is not None:
                if fn.name:
                    if call.started:
                        self._problems.append(f"tool call {call.index}'s name grew after it began")
                    call.name += fn.name
                if fn.arguments:
                    call.args.append(fn.arguments)
                    if call.started:
                        out.append(ToolCallDelta(call.index, fn.arguments))
                    else:
                        call.pending.append(fn.arguments)
            if not call.started and call.id and call.name in self._final_names:
                self._start(call, out)
        return out

    def finish(self) -> list[ToolCallStart | ToolCallDelta]:
        """The answer finished: every name is complete, so start the calls not yet started."""
        out: list[ToolCallStart | ToolCallDelta] = []
        for index in sorted(self._by_index):
            call = self._by_index[index]
            if not call.started:
                self._start(call, out)
        return out

    def calls(self) -> list[ToolCall]:
        """The calls assembled so far, by index."""
        return [
            ToolCall(c.index, c.id, c.name, "".join(c.args))
            for _, c in sorted(self._by_index.items())
        ]

    def validate(self) -> list[ToolCall]:
        """Return the calls if they form a valid set, else raise ToolCallError (§3.3)."""
        calls = self.calls()
        problems = list(self._problems)
        if [c.index for c in calls] != list(range(len(calls))):
            problems.append(
                f"tool call indices are {[c.index for c in calls]}, not contiguous from 0"
            )
        seen: set[str] = set()
        for c in calls:
            if not c.id:
                problems.append(f"tool call {c.index} has no id")
            elif c.id in seen:
                problems.append(f"tool call id {c.id!r} is used twice")
            seen.add(c.id)
            if not c.name:
                problems.append(f"tool call {c.index} has no name")
        if problems:
            raise ToolCallError("; ".join(problems))
        return calls

    def _call_for(self, piece: ToolCallPiece) -> _Call:
        index = piece.index
        if index is None:
            # No index: a new id opens the next call, anything else continues the last one.
            if self._last is not None and (not piece.id or piece.id == self._last.id):
                return self._last
            index = max(self._by_index, default=-1) + 1
        call = self._by_index.get(index)
        if call is None:
            call = self._by_index[index] = _Call(index)
        self._last = call
        return call

    @staticmethod
    def _start(call: _Call, out: list[ToolCallStart | ToolCallDelta]) -> None:
        call.started = True
        out.append(ToolCallStart(call.index, call.id, call.name))
        if call.pending:
            out.append(ToolCallDelta(call.index, "".join(call.pending)))
            call.pending = []
