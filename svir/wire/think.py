"""Splitting inline `<think>…</think>` reasoning out of answer text, markers split anywhere (§4).

Only an opening marker starts reasoning: a closing marker with no opening one is answer text,
since it comes from a template that opened the tag itself and the server left it in (D23).
"""

from __future__ import annotations

OPEN = "<think>"
CLOSE = "</think>"


class ThinkSplitter:
    """Feed content pieces; get `(is_reasoning, text)` pieces with the markers removed."""

    __slots__ = ("_held", "_in_think", "_saw_marker", "plain")

    def __init__(self) -> None:
        self._in_think = False
        self._held = ""
        self._saw_marker = False
        # Outside reasoning with nothing held: a piece without "<" is answer text as it is
        # (the stream decoder's common case skips `feed` on it).
        self.plain = True

    @property
    def saw_marker(self) -> bool:
        """Whether any complete marker was found (the stream used the inline carrier)."""
        return self._saw_marker

    def feed(self, text: str) -> list[tuple[bool, str]]:
        """Split one content piece; a possible marker prefix at its end is held back."""
        if not self._held and "<" not in text:
            return [(self._in_think, text)] if text else []
        s = self._held + text
        self._held = ""
        out: list[tuple[bool, str]] = []
        while s:
            marker = CLOSE if self._in_think else OPEN
            i = s.find(marker)
            if i >= 0:
                if i:
                    out.append((self._in_think, s[:i]))
                s = s[i + len(marker) :]
                self._in_think = not self._in_think
                self._saw_marker = True
                continue
            # Both markers hold a single "<", at their start: only the last "<" can begin one.
            j = s.rfind("<", max(0, len(s) - len(marker) + 1))
            if j >= 0 and marker.startswith(s[j:]):
                if j:
                    out.append((self._in_think, s[:j]))
                self._held = s[j:]
            else:
                out.append((self._in_think, s))
            break
        self.plain = not self._in_think and not self._held
        return out

    def flush(self) -> list[tuple[bool, str]]:
        """End of content: an unfinished marker is plain text of the current part."""
        if not self._held:
            return []
        held, self._held = self._held, ""
        self.plain = not self._in_think
        return [(self._in_think, held)]
