"""The bare ASGI relay that reads what it relays: `bench.relay_asgi`, plus the one piece of work
every gateway that understands its traffic cannot skip. The request body and a JSON answer are
decoded and encoded again with msgspec; a streamed answer is split into its SSE events, and each
event's data is decoded and encoded again, framed as it came (`[DONE]` and comments as they are).
Nothing is checked, routed, counted or logged.

It is the floor under svir's normalizing path, measured beside svir as the other relays are: for
each chunk, `bench.per_chunk`'s floor (msgspec decode + encode); for each request, the bare
relay's server, client and hand-offs. svir's distance to it is what svir's own machinery costs
over that floor; its distance to `bench.relay_asgi` also counts the JSON itself.

    .venv/bin/python -m bench.relay_json --upstream 127.0.0.1:PORT --port PORT
"""

from __future__ import annotations

import msgspec

from bench.relay_asgi import Reader, Relay, main

_decode = msgspec.json.decode
_encode = msgspec.json.encode
_DATA = b"data: "
_DONE = b"data: [DONE]"


def reencoded(body: bytes) -> bytes:
    """`body` decoded and encoded again (a body that is not JSON as it is)."""
    try:
        return _encode(_decode(body))
    except msgspec.DecodeError:
        return body


def sse_reader() -> Reader:
    """A reader of one SSE body: each whole event's data decoded and encoded again; a partial
    event waits for the read that ends it."""
    held = b""

    def read(data: bytes, last: bool) -> bytes:
        nonlocal held
        events = (held + data).split(b"\n\n") if held else data.split(b"\n\n")
        held = events.pop()
        out = []
        for event in events:
            if event.startswith(_DATA) and event != _DONE:
                out.append(_DATA + reencoded(event[6:]) + b"\n\n")
            else:
                out.append(event + b"\n\n")
        if last and held:
            out.append(held)
            held = b""
        return b"".join(out)

    return read


def json_reader() -> Reader:
    """A reader of one JSON body: held whole, then decoded and encoded again."""
    parts: list[bytes] = []

    def read(data: bytes, last: bool) -> bytes:
        parts.append(data)
        if not last:
            return b""
        return reencoded(b"".join(parts))

    return read


def new_reader(content_type: bytes) -> Reader:
    if content_type.startswith(b"text/event-stream"):
        return sse_reader()
    if content_type.startswith(b"application/json"):
        return json_reader()
    return lambda data, last: data


class JSONRelay(Relay):
    """The bare ASGI relay, reading the JSON it relays."""

    rewrite_body = staticmethod(reencoded)
    new_reader = staticmethod(new_reader)


if __name__ == "__main__":
    main(relay=JSONRelay)
