"""OpenAI's legacy `/v1/completions` request checked into the canonical completion request
(svir.wire.completions), pure: every field svir reads is checked, with the field named in the
error (`CompletionRequestError`); anything else is the client's extra for the upstream, passed on
as it is. docs/completions.md says what each field does.
"""

from __future__ import annotations

import math
from typing import Any, Final

from svir.wire.errors import BodyError
from svir.wire.jsonbody import json_type, shown

__all__ = ["DEFAULT_MAX_TOKENS", "CompletionRequestError", "parse_completion_request"]

# OpenAI's (and vLLM's) default for a completion without `max_tokens`: a base model left
# unbounded writes until its context is full.
DEFAULT_MAX_TOKENS: Final = 16
_INT64: Final = 2**63

# Fields of the legacy request svir reads itself; anything else is the client's extra for the
# upstream (llama-server's `min_p`, vLLM's `repetition_penalty`), passed on as it is.
_READ: Final = frozenset(
    {
        "model",
        "prompt",
        "suffix",
        "max_tokens",
        "temperature",
        "top_p",
        "stop",
        "stream",
        "stream_options",
        "echo",
        "logprobs",
        "n",
        "best_of",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "user",
        "logit_bias",
    }
)


class CompletionRequestError(BodyError):
    """A completion request svir will not send: `param` names the field, `code` what is wrong."""

    def __init__(self, param: str | None, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def _fail(param: str, message: str, code: str = "invalid_value") -> CompletionRequestError:
    return CompletionRequestError(param, f"{param}: {message}" if param else message, code)


def _number(key: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(key, f"must be a number, not {json_type(value)}", "invalid_type")
    if isinstance(value, float) and not math.isfinite(value):
        raise _fail(key, "must be a finite number")
    if isinstance(value, int) and abs(value) >= _INT64:
        raise _fail(key, "is out of range")
    return value


def _integer(key: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer() and abs(value) < _INT64:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(key, f"must be an integer, not {json_type(value)}", "invalid_type")
    if abs(value) >= _INT64:
        raise _fail(key, "is out of range")
    return value


def stop_list(key: str, value: Any) -> list[str]:
    """`stop`: a string or an array of strings; the empty ones dropped (they stop nothing)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise _fail(key, f"must be a string or an array of strings, not {json_type(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _fail(f"{key}[{i}]", f"must be a string, not {json_type(item)}", "invalid_type")
    return [s for s in value if s]


def _prompt(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if len(value) == 1 and isinstance(value[0], str):
            return value[0]
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise _fail("prompt", "token arrays are not supported; send the prompt as text")
        if len(value) != 1:
            # The stream carries one choice; several prompts would be several answers.
            raise _fail("prompt", f"must be one prompt (n=1), not an array of {len(value)}")
        raise _fail("prompt[0]", f"must be a string, not {json_type(value[0])}", "invalid_type")
    if value is None:
        raise _fail("prompt", "is required", "missing_required_parameter")
    raise _fail("prompt", f"must be a string or an array of one string, not {json_type(value)}")


def _typed(body: dict[str, Any], key: str, kind: type, words: str) -> Any:
    """`body[key]` if it is of `kind` (None when absent or null); else the client's 400."""
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise _fail(key, f"must be {words}, not {json_type(value)}", "invalid_type")
    return value


def parse_completion_request(body: Any) -> dict[str, Any]:
    """The canonical completion request for an OpenAI `/v1/completions` body; raises
    CompletionRequestError (a 400) and nothing else, for any JSON value."""
    if not isinstance(body, dict):
        raise CompletionRequestError(
            None, f"the request body must be a JSON object, not {json_type(body)}"
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        if model is None or model == "":
            raise _fail("model", "is required", "missing_required_parameter")
        raise _fail("model", f"must be a string, not {json_type(model)}", "invalid_type")
    out: dict[str, Any] = {"model": model, "prompt": _prompt(body.get("prompt"))}
    suffix = _typed(body, "suffix", str, "a string")
    if suffix:
        out["suffix"] = suffix
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _fail("stream", f"must be a boolean, not {json_type(stream)}", "invalid_type")
    out["stream"] = bool(stream)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise _fail("stream_options", f"must be an object, not {json_type(options)}")
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise _fail("stream_options.include_usage", f"must be a boolean, not {shown(usage)}")
        out["stream_options"] = {"include_usage": bool(usage)}
    limit = body.get("max_tokens")
    if limit is None:
        out["max_tokens"] = DEFAULT_MAX_TOKENS
    else:
        limit = _integer("max_tokens", limit)
        if limit < 1:
            raise _fail("max_tokens", f"must be at least 1, not {limit}")
        out["max_tokens"] = limit
    for key in ("temperature", "top_p", "frequency_penalty", "presence_penalty"):
        value = body.get(key)
        if value is not None:
            out[key] = _number(key, value)
    seed = body.get("seed")
    if seed is not None:
        out["seed"] = _integer("seed", seed)
    stop = body.get("stop")
    if stop is not None:
        stops = stop_list("stop", stop)
        if stops:
            out["stop"] = stops
    echo = body.get("echo")
    if echo not in (None, False):
        # svir streams what the model writes; echoing the prompt back is the client's to do.
        raise _fail("echo", f"only false is supported, not {shown(echo)}", "unsupported_value")
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0, False):
        # No upstream dialect's log-probabilities reach the canonical events.
        raise _fail(
            "logprobs",
            "is not supported: svir does not pass log-probabilities through; leave it out",
            "unsupported_value",
        )
    for key in ("n", "best_of"):
        value = body.get(key)
        if value is not None and _integer(key, value) != 1:
            raise _fail(key, f"only {key}=1 is supported", "unsupported_value")
    user = _typed(body, "user", str, "a string")
    if user is not None:
        out["user"] = user
    bias = _typed(body, "logit_bias", dict, "an object")
    if bias:
        out["logit_bias"] = bias
    for key, value in body.items():
        if key not in _READ and value is not None:
            out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# Upstream bodies and URLs
