"""Where a client command connects: the base URL, the key, the httpx client, and the streamed
chat request every command makes, read into the wire core's events.

Every failure, before the stream or inside it, comes out as one `StreamError` event holding a
classified `UpstreamError`, so callers handle one shape of failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from svir.errors import SvirError
from svir.wire.classify import check_stream_response, classify_http_error
from svir.wire.decoder import StreamDecoder
from svir.wire.errors import BaseURLError, ErrorKind, UpstreamError
from svir.wire.events import Event, StreamError
from svir.wire.models import ModelInfo, endpoint_url, normalize_base_url, parse_model_list

__all__ = [
    "API_KEY_ENV",
    "BASE_URL_ENV",
    "DEFAULT_BASE_URL",
    "ClientFailure",
    "Connection",
    "error_of",
    "stream_chat",
]

DEFAULT_BASE_URL = "http://127.0.0.1:11434"
BASE_URL_ENV = "SVIR_BASE_URL"
# The key `svir chat` and `svir models` send to svir when no --api-key-env names another variable.
API_KEY_ENV = "SVIR_API_KEY"
# An error body worth showing fits in far less.
_ERROR_BODY_LIMIT = 64 * 1024

_encode = msgspec.json.encode


class ClientFailure(SvirError):
    """Something the user has to fix or know (a bad URL, an unset key, a server that is down)."""


class Unreachable(ClientFailure):
    """No answer from the server at all (a connection refused, a timeout)."""


def _transport_error(exc: httpx.HTTPError, url: str, in_stream: bool) -> UpstreamError:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamError(ErrorKind.TIMEOUT, f"no answer in time ({type(exc).__name__})",
                             in_stream=in_stream)  # fmt: skip
    if isinstance(exc, httpx.ConnectError):
        return UpstreamError(ErrorKind.TRANSIENT, f"cannot connect to {url}")
    return UpstreamError(
        ErrorKind.INCOMPLETE if in_stream else ErrorKind.TRANSIENT,
        f"the connection failed: {type(exc).__name__}: {exc}",
        in_stream=in_stream,
    )


# How long the body of a 401/403 is waited for: svir sends its words with the head, but some
# servers send the head of a refusal and never its body.
_AUTH_BODY_TIMEOUT = 2.0


def error_of(resp: httpx.Response) -> UpstreamError:
    """A non-2xx response, classified (§5), with the server's own words (svir's error text).
    The body of a 401/403 is waited for `_AUTH_BODY_TIMEOUT` seconds at most."""
    body = b""
    if resp.status_code in (401, 403) and not resp.is_stream_consumed:
        # httpcore reads the timeouts of the request's extensions at each read of the body.
        timeouts = dict(resp.request.extensions.get("timeout") or {})
        timeouts["read"] = min(timeouts.get("read") or _AUTH_BODY_TIMEOUT, _AUTH_BODY_TIMEOUT)
        resp.request.extensions["timeout"] = timeouts
    if not resp.is_stream_consumed:
        try:
            parts: list[bytes] = []
            size = 0
            for data in resp.iter_raw():
                parts.append(data)
                size += len(data)
                if size >= _ERROR_BODY_LIMIT:
                    break
            body = b"".join(parts)[:_ERROR_BODY_LIMIT]
        except (httpx.HTTPError, httpx.StreamError):
            pass
    return classify_http_error(resp.status_code, dict(resp.headers), body)


@dataclass(frozen=True)
class Connection:
    """A server to talk to: its base URL ending in /v1, and the key, if any."""

    base: str
    api_key: str | None = None
    timeout: float = 300.0

    @classmethod
    def open(
        cls,
        base_url: str | None,
        api_key_env: str | None = None,
        *,
        timeout: float = 300.0,
        environ: Mapping[str, str] | None = None,
        default_key_env: str | None = None,
    ) -> Connection:
        """A connection from the command line's options; ClientFailure for a bad URL or key.

        Without `api_key_env`, the key is read from `default_key_env` when that is set."""
        env = os.environ if environ is None else environ
        url = base_url or env.get(BASE_URL_ENV) or DEFAULT_BASE_URL
        try:
            base = normalize_base_url(url)
        except BaseURLError as exc:
            raise ClientFailure(f"bad base URL: {exc}") from None
        key = None
        if api_key_env:
            key = env.get(api_key_env) or None
            if key is None:
                raise ClientFailure(f"the environment variable {api_key_env} is not set or empty")
        elif default_key_env:
            key = env.get(default_key_env) or None
        return cls(base, key, timeout)

    @property
    def root(self) -> str:
        """The base URL without /v1, as people write it."""
        return self.base.removesuffix("/v1")

    def url(self, path: str) -> str:
        return endpoint_url(self.base, path)

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def client(self) -> httpx.Client:
        """An httpx client for this server: connect fast, then wait as long as a model reads."""
        return httpx.Client(
            headers=self.headers(),
            timeout=httpx.Timeout(self.timeout, connect=10.0),
            follow_redirects=False,
        )

    def list_models(self, client: httpx.Client) -> list[ModelInfo]:
        """GET /models, read with the wire core (§6); ClientFailure on any failure."""
        url = self.url("models")
        try:
            resp = client.get(url)
        except httpx.HTTPError as exc:
            raise Unreachable(_transport_error(exc, self.root, False).message) from None
        if resp.status_code >= 300:
            err = classify_http_error(resp.status_code, dict(resp.headers), resp.content)
            raise ClientFailure(f"GET {url}: HTTP {resp.status_code}: {err.message}")
        try:
            return parse_model_list(resp.content)
        except Exception as exc:
            raise ClientFailure(f"GET {url}: {exc}") from None

    def post_json(self, client: httpx.Client, path: str, body: Any) -> httpx.Response:
        """A small JSON POST; transport failures become ClientFailure."""
        url = self.url(path)
        try:
            return client.post(
                url, content=_encode(body), headers={"Content-Type": "application/json"}
            )
        except httpx.HTTPError as exc:
            raise ClientFailure(_transport_error(exc, self.root, False).message) from None


def not_a_stream(resp: httpx.Response) -> StreamError | None:
    """Why a streamed POST's response is no event stream to read (an HTTP error, or a 2xx that
    is not `text/event-stream`), or None."""
    if resp.status_code >= 300:
        return StreamError(error_of(resp))
    problem = check_stream_response(resp.status_code, resp.headers.get("content-type"))
    return StreamError(problem) if problem is not None else None


def stream_chat(
    client: httpx.Client,
    url: str,
    body: dict[str, Any] | bytes,
    *,
    clock: Callable[[], float] | None = None,
    think_tags: bool = False,
    tool_names: list[str] | None = None,
    decoder: StreamDecoder | None = None,
) -> Iterator[Event]:
    """POST a streamed chat request and yield the decoded events (§3), ending with `Done` or a
    `StreamError`. Closing the generator closes the connection, which stops the generation.

    `clock` goes to the decoder, which then measures tokens/s (§3.6); pass `decoder` to read
    `tokens_per_second`, `usage` and the rest after the stream.
    """
    if decoder is None:
        decoder = StreamDecoder(think_tags=think_tags, tool_names=tool_names, clock=clock)
    data = body if isinstance(body, bytes) else _encode(body)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    try:
        with client.stream("POST", url, content=data, headers=headers) as resp:
            refused = not_a_stream(resp)
            if refused is not None:
                yield refused
                return
            try:
                for chunk in resp.iter_raw():
                    events = decoder.feed(chunk)
                    yield from events
                    if decoder.complete or decoder.error is not None:
                        return
            except httpx.HTTPError as exc:
                yield from decoder.fail(_transport_error(exc, url, True))
                return
            yield from decoder.close()
    except httpx.HTTPError as exc:
        yield StreamError(_transport_error(exc, url, False))
