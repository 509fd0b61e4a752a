"""An OpenAI Responses request (`POST /v1/responses`) as svir's canonical chat request, the OpenAI
Chat Completions body every upstream kind is built from.

`translate_request` is the whole translation, pure; the front end loads the items of the
`previous_response_id` chain from its store and passes them as `history`, checks the result as
any chat request (`validate_chat_request`), turns `warnings` into `x-svir-warning`, and keeps
`input_items` and `echo` for the response object and the store. Every client mistake is a
`ResponsesRequestError` naming the field as OpenAI does (`input[3].call_id`), for a 400 in
OpenAI's error shape; nothing else escapes for any JSON value. Field by field:

- `input`: a string (one user message) or items. `message` items (the `type` may be left out)
  of role user (`input_text`; `input_image` by data URL or http(s) URL; `input_file` with
  `file_data` as svir's file block), assistant (`output_text`, `refusal`), system and developer
  (both a system message; those before any other message join the first). `instructions` is
  the first system message.
- The assistant side of a turn (its `reasoning`, `message` and `function_call` items, in any
  order, up to the next user, system or developer message or function_call_output) is ONE
  assistant message: its text, its `tool_calls` (call_id as the call's id, `arguments` as
  written), its reasoning as `reasoning_content`. A `function_call_output` is the tool message
  right after the assistant message holding its call (a user message that came between moves
  after it); its `input_text` parts are the text, `input_file` parts file blocks, and
  `input_image` parts a user message after the results (a tool message takes text only).
- `reasoning` items: the text is what `unseal(encrypted_content)` gives back (a token svir sealed,
  svir.protocols.responses.sealed), else the `content` (reasoning_text) parts, else the `summary`
  parts. A token that does not verify is ignored with a warning, never trusted; null (Codex's) is
  nothing.
- `item_reference` items are the item of that id in the history or earlier in the input.
- tools: `function` tools as chat functions (`strict` kept); a `namespace` tool's functions
  offered as one flat function each (`<namespace>__<name>`, made unique and at most 64
  characters), which `names` maps back to (namespace, name) for the output, and which a
  history's `function_call` with a `namespace` is sent as; the default namespace `functions`
  (where Responses-lite clients put their top-level tools) is offered under the bare names;
  `additional_tools` input items (what Codex sends instead of `tools` to a model it knows as
  OpenAI's) add their tools the same way.
  Tool types no upstream of svir runs (web_search, file_search, image_generation, computer,
  local_shell, shell, apply_patch, mcp, code_interpreter, custom/grammar tools, tool_search) are
  dropped with a warning, as are items those tools leave in a history.
- `tool_choice` (auto, none, required, a function, allowed_tools as a filter of the offered
  tools); `parallel_tool_calls`; `max_output_tokens` -> `max_tokens`; `temperature`, `top_p`;
  `reasoning.effort` -> `reasoning_effort`; `text.format` json_schema / json_object ->
  `response_format` (text is the default and sent as nothing); `text.verbosity` -> `verbosity`;
  `user`, `safety_identifier` and `prompt_cache_key` as they are.
- Kept for the front end, not sent upstream: `stream`, `store` (default true),
  `previous_response_id`, `reasoning.summary`, `include`, `metadata`, and the fields a response
  object repeats (`echo`). `truncation`, `service_tier`, `background: false`, `top_logprobs`,
  `max_tool_calls`, `stream_options`, `prompt_cache_retention`, `context_management` are
  accepted and ignored; `background: true`, `conversation` and `prompt` are refused (svir has no
  background runs, conversations or stored prompts); any other field is ignored with a warning.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec

from svir.wire.errors import BodyError
from svir.wire.jsonbody import TypeChecks, json_type, shown
from svir.wire.request import file_text, split_text

__all__ = [
    "DEFAULT_NAMESPACE",
    "ResponsesRequest",
    "ResponsesRequestError",
    "flat_tool_name",
    "translate_request",
]


class ResponsesRequestError(BodyError):
    """A client's Responses request that cannot be translated: `param` names the field
    (`input[3].call_id`), `message` says what is wrong, naming it too."""

    def __init__(self, param: str | None, message: str) -> None:
        text = f"{param}: {message}" if param and not message.startswith(param) else message
        super().__init__(text)
        self.message = text
        self.param = param


class ResponsesRequest(msgspec.Struct, frozen=True):
    """A translated request.

    - `chat`: the canonical chat request, for validate_chat_request;
    - `warnings`: what was dropped or ignored, one line each (for `x-svir-warning`);
    - `stream`, `store` (OpenAI's default: true), `previous_response_id`;
    - `summary`: `reasoning.summary` (auto, concise, detailed) or None: whether reasoning is
      streamed as summary parts or as reasoning text;
    - `include_encrypted`: whether `include` asks for `reasoning.encrypted_content`;
    - `names`: a flat function name offered upstream -> (namespace, name), for namespace tools;
    - `input_items`: this request's input as items, each with an id (as input_items lists them);
    - `echo`: the request fields a response object repeats (`previous_response_id` among them),
      with OpenAI's defaults, in the response object's order;
    - `cache_key`: `prompt_cache_key`, to keep a conversation on one deployment;
    - `image_urls`: whether an image is given by URL (not every upstream fetches one);
    - `metadata`: the request's metadata (strings), for the response object.
    """

    chat: dict[str, Any]
    warnings: tuple[str, ...] = ()
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    summary: str | None = None
    include_encrypted: bool = False
    names: dict[str, tuple[str, str]] = msgspec.field(default_factory=dict)
    input_items: list[dict[str, Any]] = msgspec.field(default_factory=list)
    echo: dict[str, Any] = msgspec.field(default_factory=dict)
    cache_key: str | None = None
    image_urls: bool = False
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


# Fields translated below.
_TRANSLATED: Final = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "reasoning",
        "text",
        "metadata",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "include",
        "stream",
        "store",
        "previous_response_id",
        "background",
        "conversation",
        "prompt",
    }
)
# Fields known and deliberately not translated: they change nothing svir can honour (no warning).
_IGNORED: Final = frozenset(
    {
        "truncation",
        "service_tier",
        "top_logprobs",
        "max_tool_calls",
        "stream_options",
        "prompt_cache_retention",
        "context_management",
        "client_metadata",
    }
)
_KNOWN: Final = _TRANSLATED | _IGNORED
_EFFORTS: Final = frozenset({"none", "minimal", "low", "medium", "high", "xhigh"})
_SUMMARIES: Final = frozenset({"auto", "concise", "detailed"})
# Tools only OpenAI's own servers run: dropped (with a warning), since no upstream of svir does.
_HOSTED_TOOLS: Final = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "web_search_2025_08_26",
        "file_search",
        "image_generation",
        "computer",
        "computer_use",
        "computer_use_preview",
        "local_shell",
        "shell",
        "apply_patch",
        "mcp",
        "code_interpreter",
        "custom",
        "tool_search",
    }
)
# Items those tools leave in a conversation: dropped with a warning, as the tools are.
_HOSTED_ITEMS: Final = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "computer_call",
        "computer_call_output",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "code_interpreter_call",
        "custom_tool_call",
        "custom_tool_call_output",
        "tool_search_call",
        "tool_search_output",
        "compaction",
        "compaction_summary",
        "compaction_trigger",
        "program",
        "program_output",
    }
)
_ID_PREFIXES: Final = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
    "additional_tools": "at",
}
# The namespace of top-level tools (codex-rs's DEFAULT_FUNCTION_NAMESPACE): a Responses-lite
# client wraps its plain functions in it, and takes a call back with or without it.
DEFAULT_NAMESPACE: Final = "functions"
_IMAGE_DETAILS: Final = frozenset({"auto", "low", "high"})
_NAME_BAD_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# OpenAI's limit on a function's name, which the flat names of namespace tools stay within.
_NAME_LIMIT: Final = 64


def _unoffered_name(namespace: str, name: str) -> str:
    """The flat name of a call to a namespace function no longer offered: its own name in the
    default namespace, or in one named after itself (how the Agents SDK marks a deferred
    top-level function), else the name the namespace's function would have had."""
    if namespace in (DEFAULT_NAMESPACE, "", name):
        return name
    return flat_tool_name(namespace, name)


def flat_tool_name(namespace: str, name: str) -> str:
    """The function name a namespace tool's function is offered under before any collision is
    resolved: `<namespace>__<name>` (no second separator when the namespace ends in `_`, as
    Codex's `mcp__server__` do), only ASCII letters, digits, `_` and `-`, at most 64 characters
    (a longer one ends in a hash of the whole)."""
    joined = f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"
    clean = _NAME_BAD_CHARS.sub("_", joined) or "_"
    if len(clean) <= _NAME_LIMIT and clean == joined:
        return clean
    digest = hashlib.sha256(joined.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{clean[: _NAME_LIMIT - 11]}_{digest}"


def translate_request(
    body: Any,
    *,
    history: Sequence[dict[str, Any]] = (),
    unseal: Callable[[str], str | None] | None = None,
    new_id: Callable[[str], str] | None = None,
) -> ResponsesRequest:
    """The canonical chat request for a Responses request body (see the module's docstring).

    `history` is the items of the `previous_response_id` chain, oldest first (earlier input
    items and output items, as stored); they come before this request's input. `unseal(token)`
    is the reasoning text sealed in a reasoning item's `encrypted_content`, or None when it does
    not verify. `new_id(prefix)` is a fresh item id (`msg_…`) for an input item sent without
    one; without it, ids are derived from the item and its place (the same request, the same
    ids). Raises ResponsesRequestError, and nothing else, for any JSON."""
    if not isinstance(body, dict):
        raise ResponsesRequestError(
            None, f"the request body must be an object, not {json_type(body)}"
        )
    # The commonest request, translated without the general walk (`_plain`).
    if (type(history) is tuple or type(history) is list) and not history:
        plain = _plain(body, new_id)
        if plain is not None:
            return plain
    t = _Translation(unseal, new_id)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ResponsesRequestError("model", f"must be a non-empty string, not {shown(model)}")
    _refuse_unsupported(body)
    chat: dict[str, Any] = {"model": model}

    stream = _opt_bool(body, "stream", False)
    store = _opt_bool(body, "store", True)
    previous = body.get("previous_response_id")
    if previous is not None:
        previous = _check.string("previous_response_id", previous)
        if not previous:
            raise ResponsesRequestError("previous_response_id", "must not be empty")
    # The exact types first: the default `()` would otherwise cost an ABC check per request.
    if (
        type(history) is not tuple
        and type(history) is not list
        and (not isinstance(history, Sequence) or isinstance(history, str | bytes))
    ):
        raise ResponsesRequestError("previous_response_id", "the stored history is not a list")

    items = _input_items(body.get("input"), bool(history))
    # Tools first: a history's namespace calls are sent under the flat names the tools get.
    tools_raw = body.get("tools")
    if tools_raw is not None:
        if not isinstance(tools_raw, list):
            raise ResponsesRequestError("tools", f"must be an array, not {json_type(tools_raw)}")
        t.tools("tools", tools_raw)
    t.additional_tools(history, items)

    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        text = _check.string("instructions", instructions)
        if text:
            messages.append({"role": "system", "content": text})
    t.messages = messages
    for k, item in enumerate(history):
        t.item(f"previous_response_id: item {k}", item, stored=True)
    input_items = [t.item(f"input[{k}]", item) for k, item in enumerate(items)]
    t.close_turn()
    t.unanswered()
    # A loop, not `any` over a generator: no generator made per request.
    for m in messages:
        if m["role"] != "system":
            break
    else:
        raise ResponsesRequestError("input", "must hold at least one message or item")
    chat["messages"] = messages
    chat["stream"] = stream
    if t.chat_tools:
        chat["tools"] = t.chat_tools

    parallel = body.get("parallel_tool_calls")
    if parallel is not None:
        chat["parallel_tool_calls"] = _check.boolean("parallel_tool_calls", parallel)
    choice = body.get("tool_choice")
    if choice is not None:
        t.tool_choice(choice, chat)
    limit = body.get("max_output_tokens")
    if limit is not None:
        chat["max_tokens"] = _check.integer("max_output_tokens", limit)
    for key, check in _COPIED:
        value = body.get(key)
        if value is not None:
            chat[key] = check(key, value)
    summary = t.reasoning(body.get("reasoning"), chat)
    t.text(body.get("text"), chat)
    metadata = _metadata(body.get("metadata"))
    include = _include(body.get("include"))

    for key in body:
        if key not in _KNOWN:
            t.warnings.append(f"{key} ignored: svir does not translate it")
    return ResponsesRequest(
        chat=chat,
        warnings=tuple(t.warnings),
        stream=stream,
        store=store,
        previous_response_id=previous,
        summary=summary,
        include_encrypted="reasoning.encrypted_content" in include,
        names=t.names,
        input_items=input_items,
        echo=_echo(body, store, metadata, previous),
        cache_key=chat.get("prompt_cache_key"),
        image_urls=t.image_urls,
        metadata=metadata,
    )


# The fields of a plain request (`_plain`).
_PLAIN_FIELDS: Final = frozenset({"model", "input", "stream", "store", "instructions"})


def _plain(body: dict[str, Any], new_id: Callable[[str], str] | None) -> ResponsesRequest | None:
    """The translation of the commonest request, made without the general walk: a first request
    (no history) of `model`, `input` as a string or as user messages whose content is a string
    (`{role, content}`, `type` message or left out), and at most `stream`, `store` and
    `instructions`, each of its type. None for any other request, a mistake among them: the
    general walk translates it (or words the mistake), to the same result."""
    if not _PLAIN_FIELDS.issuperset(body):
        return None
    model = body.get("model")
    stream = body.get("stream", False)
    store = body.get("store", True)
    instructions = body.get("instructions")
    raw = body.get("input")
    if (
        type(model) is not str
        or not model
        or (stream is not None and type(stream) is not bool)
        or (store is not None and type(store) is not bool)
        or (instructions is not None and type(instructions) is not str)
    ):
        return None
    stream = stream or False
    store = True if store is None else store
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    given: list[dict[str, Any]]
    if type(raw) is str:
        if not raw:
            return None
        # A string is the one user message the walk makes of it (its id derived from this item).
        given = [{"type": "message", "role": "user", "content": raw}]
    elif type(raw) is list and raw:
        for item in raw:
            if (
                type(item) is not dict
                or item.get("role") != "user"
                or item.get("type", "message") != "message"
                or not _PLAIN_ITEM_FIELDS.issuperset(item)
                or type(item.get("content")) is not str
            ):
                return None
        given = raw
    else:
        return None
    # Only now, every item taken: no id is made for a request the general walk translates.
    input_items: list[dict[str, Any]] = []
    for k, item in enumerate(given):
        content = item["content"]
        messages.append({"role": "user", "content": content})
        parts = [{"type": "input_text", "text": content}]
        item_id = (
            new_id(_MESSAGE_PREFIX)
            if new_id is not None
            else _fresh_id(None, "message", f"input[{k}]", item)
        )
        input_items.append({"type": "message", "role": "user", "content": parts, "id": item_id})
    metadata: dict[str, str] = {}
    echo = _PLAIN_ECHO.copy()
    if instructions is not None:
        echo["instructions"] = instructions
    echo["metadata"] = metadata
    echo["reasoning"] = {"effort": None, "summary": None}
    echo["store"] = store
    echo["text"] = {"format": {"type": "text"}}
    echo["tools"] = []
    return ResponsesRequest(
        chat={"model": model, "messages": messages, "stream": stream},
        stream=stream,
        store=store,
        input_items=input_items,
        echo=echo,
        metadata=metadata,
    )


# The id prefix of a message item, for `_plain`'s.
_MESSAGE_PREFIX: Final = _ID_PREFIXES["message"]
# The fields of an input item `_plain` takes.
_PLAIN_ITEM_FIELDS: Final = frozenset({"type", "role", "content"})


def _fresh_id(new_id: Callable[[str], str] | None, kind: str, where: str, item: Any) -> str:
    """The id of an input item sent without one: `new_id`'s, else derived from the item and its
    place (`where`)."""
    prefix = _ID_PREFIXES.get(kind, "item")
    if new_id is not None:
        return new_id(prefix)
    try:
        raw = msgspec.json.encode(item)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError):
        raw = repr(item).encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(where.encode() + b"\0" + raw).hexdigest()[:24]
    return f"{prefix}_{digest}"


def _refuse_unsupported(body: dict[str, Any]) -> None:
    background = body.get("background")
    if background is not None and _check.boolean("background", background):
        raise ResponsesRequestError(
            "background", "background responses are not supported by svir; send background: false"
        )
    if body.get("conversation") is not None:
        raise ResponsesRequestError(
            "conversation",
            "conversations are not supported by svir; continue with previous_response_id",
        )
    if body.get("prompt") is not None:
        raise ResponsesRequestError(
            "prompt", "stored prompt templates are not supported by svir; send input"
        )


def _input_items(raw: Any, continued: bool) -> list[Any]:
    if raw is None:
        if continued:
            return []
        raise ResponsesRequestError("input", "is required")
    if isinstance(raw, str):
        if not raw and not continued:
            raise ResponsesRequestError("input", "must not be empty")
        return [{"type": "message", "role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise ResponsesRequestError(
            "input", f"must be a string or an array of items, not {json_type(raw)}"
        )
    if not raw and not continued:
        raise ResponsesRequestError("input", "must not be empty")
    return raw


class _Turn:
    """The assistant side of one turn, folded into one assistant message."""

    __slots__ = ("calls", "message", "reasoning", "texts")

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = message
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict[str, Any]] = []


class _Translation:
    """The state of one translation: the messages so far, the open assistant turn, the calls
    awaiting results, the tools offered and the names they map back to."""

    def __init__(
        self, unseal: Callable[[str], str | None] | None, new_id: Callable[[str], str] | None
    ) -> None:
        self.unseal = unseal
        self.new_id = new_id
        self.warnings: list[str] = []
        self.image_urls = False
        self.messages: list[dict[str, Any]] = []
        self.turn: _Turn | None = None
        # call_id -> the assistant message holding the call; answered ones are removed.
        self.calls: dict[str, dict[str, Any]] = {}
        self.call_at: dict[str, str] = {}
        self.answered: set[str] = set()
        # Messages made of a tool result's images (a tool message takes text only).
        self.image_messages: set[int] = set()
        self.chat_tools: list[dict[str, Any]] = []
        self.offered: set[str] = set()
        self.names: dict[str, tuple[str, str]] = {}
        self.flat: dict[tuple[str, str], str] = {}
        self.by_id: dict[str, dict[str, Any]] = {}
        self.seen_tools: set[str] = set()

    # -- tools

    def tools(self, where: str, tools: list[Any]) -> None:
        for k, tool in enumerate(tools):
            here = f"{where}[{k}]"
            kind = _check.tagged(here, tool)
            if kind == "function":
                self.function(here, tool, None)
            elif kind == "namespace":
                self.namespace(here, tool)
            else:
                name = tool.get("name")
                label = f"{kind} tool {name}" if isinstance(name, str) else f"{kind} tool"
                self.warn_once(f"{label} dropped: svir serves function tools only")

    def warn_once(self, text: str) -> None:
        if text not in self.seen_tools:
            self.seen_tools.add(text)
            self.warnings.append(text)

    def namespace(self, here: str, tool: dict[str, Any]) -> None:
        ns = _check.string(f"{here}.name", tool.get("name"))
        if not ns:
            raise ResponsesRequestError(f"{here}.name", "must not be empty")
        description = tool.get("description")
        if description is not None:
            description = _check.string(f"{here}.description", description)
        inner = tool.get("tools")
        if not isinstance(inner, list):
            raise ResponsesRequestError(
                f"{here}.tools", f"must be an array, not {json_type(inner)}"
            )
        for j, fn in enumerate(inner):
            where = f"{here}.tools[{j}]"
            kind = _check.tagged(where, fn)
            if kind == "function":
                self.function(where, fn, (ns, description or ""))
            else:
                self.warn_once(
                    f"{kind} tool in namespace {ns} dropped: svir serves function tools only"
                )

    def function(self, here: str, tool: dict[str, Any], ns: tuple[str, str] | None) -> None:
        name = _check.string(f"{here}.name", tool.get("name"))
        if not name:
            raise ResponsesRequestError(f"{here}.name", "must not be empty")
        function: dict[str, Any] = {}
        description = tool.get("description")
        if description is not None:
            description = _check.string(f"{here}.description", description)
        if ns is None or ns[0] == DEFAULT_NAMESPACE:
            # A top-level function, or one of the default namespace's (Responses-lite clients
            # such as Codex wrap their top-level tools in it): offered under its own name.
            flat = name
            if flat in self.offered:
                if self.names.get(flat, (DEFAULT_NAMESPACE,))[0] != DEFAULT_NAMESPACE:
                    raise ResponsesRequestError(
                        f"{here}.name", f"{shown(name)} is also a namespace tool's flat name"
                    )
                return  # the same tool again (tools and additional_tools): offered once
            if ns is not None:
                self.flat[(ns[0], name)] = flat
                self.names[flat] = (ns[0], name)
        else:
            key = (ns[0], name)
            if key in self.flat:
                return
            flat = self.unique(flat_tool_name(*key))
            self.names[flat] = key
            self.flat[key] = flat
            if ns[1]:
                # The model sees one flat list: the namespace's description tells it the group.
                description = f"{ns[1]}\n{description}" if description else ns[1]
        function["name"] = flat
        if description:
            function["description"] = description
        parameters = tool.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, dict):
                raise ResponsesRequestError(
                    f"{here}.parameters", f"must be an object, not {json_type(parameters)}"
                )
            function["parameters"] = parameters
        strict = tool.get("strict")
        if strict is not None:
            function["strict"] = _check.boolean(f"{here}.strict", strict)
        self.offered.add(flat)
        self.chat_tools.append({"type": "function", "function": function})

    def unique(self, flat: str) -> str:
        if flat not in self.offered and flat not in self.names:
            return flat
        n = 2
        while True:
            tail = f"_{n}"
            candidate = flat[: _NAME_LIMIT - len(tail)] + tail
            if candidate not in self.offered and candidate not in self.names:
                return candidate
            n += 1

    def additional_tools(self, history: Sequence[Any], items: list[Any]) -> None:
        """The tools of `additional_tools` items, in the history and in this input."""
        if not history and len(items) == 1:  # the common first request: one item, no history
            item = items[0]
            if not isinstance(item, dict) or item.get("type") != "additional_tools":
                return
        for where, group in (("previous_response_id: item", history), ("input", items)):
            for k, item in enumerate(group):
                if isinstance(item, dict) and item.get("type") == "additional_tools":
                    here = f"{where} {k}" if group is history else f"{where}[{k}]"
                    tools = item.get("tools")
                    if not isinstance(tools, list):
                        raise ResponsesRequestError(
                            f"{here}.tools", f"must be an array, not {json_type(tools)}"
                        )
                    self.tools(f"{here}.tools", tools)

    def tool_choice(self, choice: Any, chat: dict[str, Any]) -> None:
        if isinstance(choice, str):
            if choice not in ("auto", "none", "required"):
                raise ResponsesRequestError(
                    "tool_choice", f"must be 'auto', 'none' or 'required', not {shown(choice)}"
                )
            chat["tool_choice"] = choice
            return
        kind = _check.tagged("tool_choice", choice)
        if kind == "function":
            chat["tool_choice"] = {"type": "function", "function": {"name": self.chosen(choice)}}
        elif kind == "allowed_tools":
            mode = choice.get("mode")
            if mode not in ("auto", "required"):
                raise ResponsesRequestError(
                    "tool_choice.mode", f"must be 'auto' or 'required', not {shown(mode)}"
                )
            tools = choice.get("tools")
            if not isinstance(tools, list):
                raise ResponsesRequestError(
                    "tool_choice.tools", f"must be an array, not {json_type(tools)}"
                )
            allowed = set()
            for k, tool in enumerate(tools):
                here = f"tool_choice.tools[{k}]"
                if _check.tagged(here, tool) == "function":
                    allowed.add(self.chosen(tool, here))
            chat["tools"] = [t for t in self.chat_tools if t["function"]["name"] in allowed]
            chat["tool_choice"] = mode
        else:
            self.warnings.append(f"tool_choice {kind} ignored: svir serves function tools only")

    def chosen(self, choice: dict[str, Any], where: str = "tool_choice") -> str:
        name = _check.string(f"{where}.name", choice.get("name"))
        ns = choice.get("namespace")
        if ns is not None:
            flat = self.flat.get((_check.string(f"{where}.namespace", ns), name))
        else:
            flat = name if name in self.offered else None
        if flat is None:
            raise ResponsesRequestError(f"{where}.name", f"function {shown(name)} is not in tools")
        return flat

    # -- settings

    def reasoning(self, reasoning: Any, chat: dict[str, Any]) -> str | None:
        if reasoning is None:
            return None
        if not isinstance(reasoning, dict):
            raise ResponsesRequestError(
                "reasoning", f"must be an object, not {json_type(reasoning)}"
            )
        effort = reasoning.get("effort")
        if effort is not None:
            if not isinstance(effort, str) or effort not in _EFFORTS:
                raise ResponsesRequestError(
                    "reasoning.effort",
                    f"must be one of {', '.join(sorted(_EFFORTS))}, not {shown(effort)}",
                )
            chat["reasoning_effort"] = effort
        summary = None
        for key in ("summary", "generate_summary"):  # the second is the deprecated name
            value = reasoning.get(key)
            if value is not None and summary is None:
                if not isinstance(value, str) or value not in _SUMMARIES:
                    raise ResponsesRequestError(
                        f"reasoning.{key}",
                        f"must be one of {', '.join(sorted(_SUMMARIES))}, not {shown(value)}",
                    )
                summary = value
        return summary

    def text(self, text: Any, chat: dict[str, Any]) -> None:
        if text is None:
            return
        if not isinstance(text, dict):
            raise ResponsesRequestError("text", f"must be an object, not {json_type(text)}")
        verbosity = text.get("verbosity")
        if verbosity is not None:
            if verbosity not in ("low", "medium", "high"):
                raise ResponsesRequestError(
                    "text.verbosity", f"must be 'low', 'medium' or 'high', not {shown(verbosity)}"
                )
            chat["verbosity"] = verbosity
        fmt = text.get("format")
        if fmt is None:
            return
        kind = _check.tagged("text.format", fmt)
        if kind == "text":
            return
        if kind == "json_object":
            chat["response_format"] = {"type": "json_object"}
            return
        if kind != "json_schema":
            raise ResponsesRequestError(
                "text.format.type",
                f"must be 'text', 'json_object' or 'json_schema', not {shown(kind)}",
            )
        name = fmt.get("name")
        if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
            raise ResponsesRequestError(
                "text.format.name", "must be 1 to 64 ASCII letters, digits, '_' or '-'"
            )
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise ResponsesRequestError(
                "text.format.schema", f"must be an object, not {json_type(schema)}"
            )
        spec: dict[str, Any] = {"name": name, "schema": schema}
        description = fmt.get("description")
        if description is not None:
            spec["description"] = _check.string("text.format.description", description)
        strict = fmt.get("strict")
        if strict is not None:
            spec["strict"] = _check.boolean("text.format.strict", strict)
        chat["response_format"] = {"type": "json_schema", "json_schema": spec}

    # -- items

    def item(self, where: str, item: Any, *, stored: bool = False) -> dict[str, Any]:
        """Translate one item into the messages; return it as an item object with an id."""
        if not isinstance(item, dict):
            raise ResponsesRequestError(where, f"must be an object, not {json_type(item)}")
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"  # an easy input message: {role, content}
        if not isinstance(kind, str):
            raise ResponsesRequestError(f"{where}.type", f"must be a string, not {json_type(kind)}")
        if kind == "item_reference":
            ref = _check.string(f"{where}.id", item.get("id"))
            found = self.by_id.get(ref)
            if found is None:
                raise ResponsesRequestError(
                    f"{where}.id", f"no item {shown(ref)} in the history or earlier in the input"
                )
            return self.item(where, found, stored=True)
        given = item.get("id")
        if given is not None:
            _check.string(f"{where}.id", given)
        if kind == "message":
            out = self.message(where, item)
        elif kind == "function_call":
            out = self.function_call(where, item)
        elif kind == "function_call_output":
            out = self.function_call_output(where, item)
        elif kind == "reasoning":
            out = self.reasoning_item(where, item)
        elif kind == "additional_tools":
            out = dict(item)  # its tools were read before any item
        elif kind in _HOSTED_ITEMS:
            self.warn_once(f"{kind} items dropped: svir serves function tools only")
            out = dict(item)
        else:
            raise ResponsesRequestError(f"{where}.type", f"unknown item type {shown(kind)}")
        if given is None and not stored:
            out["id"] = _fresh_id(self.new_id, kind, where, item)
        elif given is not None:
            out["id"] = given
        if isinstance(out.get("id"), str):
            self.by_id[out["id"]] = out
        return out

    def open_turn(self) -> _Turn:
        if self.turn is None:
            message: dict[str, Any] = {"role": "assistant", "content": ""}
            self.messages.append(message)
            self.turn = _Turn(message)
        return self.turn

    def close_turn(self) -> None:
        turn = self.turn
        if turn is None:
            return
        self.turn = None
        message = turn.message
        message["content"] = "\n".join(t for t in turn.texts if t)
        if turn.calls:
            message["tool_calls"] = turn.calls
        reasoning = "\n".join(r for r in turn.reasoning if r)
        if reasoning:
            message["reasoning_content"] = reasoning

    def message(self, where: str, item: dict[str, Any]) -> dict[str, Any]:
        role = item.get("role")
        content = item.get("content")
        if content is None:
            raise ResponsesRequestError(f"{where}.content", "is required")
        out: dict[str, Any] = {"type": "message", "role": role}
        status = item.get("status")
        if status is not None:
            out["status"] = _check.string(f"{where}.status", status)
        if role == "assistant":
            texts, parts = self.assistant_content(f"{where}.content", content)
            self.open_turn().texts.extend(texts)
            out["content"] = parts
            phase = item.get("phase")
            if phase is not None:
                out["phase"] = _check.string(f"{where}.phase", phase)
            return out
        if role in ("system", "developer"):
            text, parts = self.system_content(f"{where}.content", content)
            self.close_turn()
            if self.messages and all(m["role"] == "system" for m in self.messages):
                first = self.messages[-1]
                first["content"] = "\n".join(t for t in (first["content"], text) if t)
            else:
                self.messages.append({"role": "system", "content": text})
            out["content"] = parts
            return out
        if role == "user":
            chat_content, parts = self.user_content(f"{where}.content", content)
            self.close_turn()
            self.messages.append({"role": "user", "content": chat_content})
            out["content"] = parts
            return out
        raise ResponsesRequestError(
            f"{where}.role",
            f"must be 'user', 'assistant', 'system' or 'developer', not {shown(role)}",
        )

    def system_content(self, where: str, content: Any) -> tuple[str, list[dict[str, Any]]]:
        if isinstance(content, str):
            return content, [{"type": "input_text", "text": content}]
        parts = _parts(where, content)
        texts = []
        for j, part in enumerate(parts):
            here = f"{where}[{j}]"
            kind = _check.tagged(here, part)
            if kind not in ("input_text", "text"):
                raise ResponsesRequestError(
                    f"{here}.type", f"a system or developer message takes no {shown(kind)} part"
                )
            texts.append(_check.string(f"{here}.text", part.get("text")))
        return "\n".join(t for t in texts if t), [dict(p) for p in parts]

    def assistant_content(self, where: str, content: Any) -> tuple[list[str], list[dict[str, Any]]]:
        if isinstance(content, str):
            return [content], [{"type": "output_text", "text": content, "annotations": []}]
        parts = _parts(where, content)
        texts = []
        for j, part in enumerate(parts):
            here = f"{where}[{j}]"
            kind = _check.tagged(here, part)
            if kind in ("output_text", "input_text", "text"):
                texts.append(_check.string(f"{here}.text", part.get("text")))
            elif kind == "refusal":
                # A refusal sent back is simply what the model said.
                texts.append(_check.string(f"{here}.refusal", part.get("refusal")))
            else:
                raise ResponsesRequestError(
                    f"{here}.type", f"an assistant message takes no {shown(kind)} part"
                )
        return texts, [dict(p) for p in parts]

    def user_content(
        self, where: str, content: Any
    ) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
        if isinstance(content, str):
            return content, [{"type": "input_text", "text": content}]
        parts = _parts(where, content)
        chat_parts: list[dict[str, Any]] = []
        for j, part in enumerate(parts):
            chat_parts.append(self.input_part(f"{where}[{j}]", part))
        if all(p["type"] == "text" for p in chat_parts):
            return "\n".join(p["text"] for p in chat_parts if p["text"]), [dict(p) for p in parts]
        return chat_parts, [dict(p) for p in parts]

    def input_part(self, here: str, part: Any) -> dict[str, Any]:
        """An input_text, input_image or input_file part as a canonical content part."""
        kind = _check.tagged(here, part)
        if kind in ("input_text", "text", "output_text"):
            return {"type": "text", "text": _check.string(f"{here}.text", part.get("text"))}
        if kind == "input_image":
            return self.image(here, part)
        if kind == "input_file":
            return {"type": "text", "text": _file(here, part)}
        raise ResponsesRequestError(f"{here}.type", f"unsupported content part type {shown(kind)}")

    def image(self, here: str, part: dict[str, Any]) -> dict[str, Any]:
        url = part.get("image_url")
        if url is None:
            if part.get("file_id") is not None:
                raise ResponsesRequestError(
                    f"{here}.file_id", "uploaded files are not supported; send image_url"
                )
            raise ResponsesRequestError(f"{here}.image_url", "is required")
        url = _check.string(f"{here}.image_url", url)
        head = url[:8].lower()
        if head.startswith(("http://", "https://")):
            self.image_urls = True
        elif not head.startswith("data:"):
            raise ResponsesRequestError(f"{here}.image_url", "must be an http(s) URL or a data URL")
        # The data URL itself is checked (strict base64) where the upstream body is built.
        image: dict[str, Any] = {"url": url}
        detail = part.get("detail")
        if detail is not None and _check.string(f"{here}.detail", detail) in _IMAGE_DETAILS:
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}

    def function_call(self, where: str, item: dict[str, Any]) -> dict[str, Any]:
        call_id = _check.string(f"{where}.call_id", item.get("call_id"))
        if not call_id:
            raise ResponsesRequestError(f"{where}.call_id", "must not be empty")
        if call_id in self.calls or call_id in self.answered:
            raise ResponsesRequestError(f"{where}.call_id", f"call {shown(call_id)} is used twice")
        name = _check.string(f"{where}.name", item.get("name"))
        if not name:
            raise ResponsesRequestError(f"{where}.name", "must not be empty")
        arguments = item.get("arguments")
        arguments = "{}" if arguments is None else _check.string(f"{where}.arguments", arguments)
        ns = item.get("namespace")
        flat = name
        if ns is not None:
            ns = _check.string(f"{where}.namespace", ns)
            flat = self.flat.get((ns, name)) or _unoffered_name(ns, name)
        turn = self.open_turn()
        turn.calls.append(
            {"id": call_id, "type": "function", "function": {"name": flat, "arguments": arguments}}
        )
        self.calls[call_id] = turn.message
        self.call_at[call_id] = where
        return dict(item)

    def function_call_output(self, where: str, item: dict[str, Any]) -> dict[str, Any]:
        call_id = _check.string(f"{where}.call_id", item.get("call_id"))
        if call_id in self.answered:
            raise ResponsesRequestError(
                f"{where}.call_id", f"call {shown(call_id)} is answered twice"
            )
        assistant = self.calls.pop(call_id, None)
        if assistant is None:
            raise ResponsesRequestError(
                f"{where}.call_id",
                f"no function_call with call_id {shown(call_id)} in the input or the history",
            )
        self.answered.add(call_id)
        output = item.get("output")
        images: list[dict[str, Any]] = []
        if isinstance(output, str):
            text = output
        elif isinstance(output, list):
            parts = [self.input_part(f"{where}.output[{j}]", p) for j, p in enumerate(output)]
            text, images = split_text(parts)
        else:
            raise ResponsesRequestError(
                f"{where}.output", f"must be a string or an array of parts, not {json_type(output)}"
            )
        self.close_turn()
        self.place_result({"role": "tool", "tool_call_id": call_id, "content": text}, assistant)
        if images:
            self.place_images(images, assistant)
        return dict(item)

    def unanswered(self) -> None:
        """A call without its output is a mistake, as OpenAI says ("No tool output found"):
        no chat server takes an assistant's tool calls without a result for each."""
        for call_id in self.calls:
            where = self.call_at[call_id]
            if where.startswith("input["):
                where = f"{where}.call_id"
                what = f"function_call {shown(call_id)}"
            else:
                where = "input"
                what = f"the previous response's function_call {shown(call_id)}"
            raise ResponsesRequestError(where, f"{what} has no function_call_output in input")

    def _after_results(self, assistant: dict[str, Any]) -> int:
        """The index after the assistant message and the tool results right after it."""
        out = self.messages
        at = len(out) - 1
        while out[at] is not assistant:
            at -= 1
        at += 1
        while at < len(out) and out[at]["role"] == "tool":
            at += 1
        return at

    def place_result(self, result: dict[str, Any], assistant: dict[str, Any]) -> None:
        # Chat servers want a call's results right after the calls, before any other message.
        self.messages.insert(self._after_results(assistant), result)

    def place_images(self, images: list[dict[str, Any]], assistant: dict[str, Any]) -> None:
        at = self._after_results(assistant)
        out = self.messages
        if at < len(out) and id(out[at]) in self.image_messages:
            out[at]["content"].extend(images)
            return
        message = {"role": "user", "content": images}
        self.image_messages.add(id(message))
        out.insert(at, message)

    def reasoning_item(self, where: str, item: dict[str, Any]) -> dict[str, Any]:
        text = ""
        sealed = item.get("encrypted_content")
        if sealed is not None:
            token = _check.string(f"{where}.encrypted_content", sealed)
            restored = self.unseal(token) if self.unseal is not None and token else None
            if restored is None:
                self.warn_once(
                    "reasoning encrypted_content ignored: not a token svir sealed, or changed"
                )
            else:
                text = restored
        texts = {}
        for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
            parts = item.get(key)
            if parts is None:
                texts[key] = ""
                continue
            parts = _parts(f"{where}.{key}", parts)
            found = []
            for j, part in enumerate(parts):
                here = f"{where}.{key}[{j}]"
                kind = _check.tagged(here, part)
                if kind not in (part_type, "text"):
                    raise ResponsesRequestError(
                        f"{here}.type", f"must be {shown(part_type)}, not {shown(kind)}"
                    )
                found.append(_check.string(f"{here}.text", part.get("text")))
            texts[key] = "\n".join(t for t in found if t)
        text = text or texts["content"] or texts["summary"]
        if text:
            self.open_turn().reasoning.append(text)
        return dict(item)


def _parts(where: str, content: Any) -> list[Any]:
    if not isinstance(content, list):
        raise ResponsesRequestError(
            where, f"must be a string or an array of parts, not {json_type(content)}"
        )
    return content


def _file(here: str, part: dict[str, Any]) -> str:
    if part.get("file_data") is None:
        if part.get("file_url") is not None:
            raise ResponsesRequestError(
                f"{here}.file_url", "files by URL are not supported; send file_data"
            )
        if part.get("file_id") is not None:
            raise ResponsesRequestError(
                f"{here}.file_id", "uploaded files are not supported; send file_data"
            )
    try:
        return file_text(here, part)
    except ResponsesRequestError:
        raise
    except BodyError as exc:
        raise ResponsesRequestError(here, str(exc)) from None


def _metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise ResponsesRequestError("metadata", f"must be an object, not {json_type(metadata)}")
    for key, value in metadata.items():
        _check.string(f"metadata.{key}", value)
    return dict(metadata)


def _include(include: Any) -> list[str]:
    if include is None:
        return []
    if not isinstance(include, list):
        raise ResponsesRequestError("include", f"must be an array, not {json_type(include)}")
    for k, value in enumerate(include):
        _check.string(f"include[{k}]", value)
    return include


# The request fields a response object repeats as they were sent, in the order the response
# object has them (svir.protocols.responses.encode writes an echo in that order as it is), each with
# OpenAI's default when unset (those `_echo` derives are None here and set there, in place).
_ECHOED: Final = (
    ("instructions", None),
    ("max_output_tokens", None),
    ("metadata", None),
    ("parallel_tool_calls", True),
    ("previous_response_id", None),
    ("reasoning", None),
    ("store", None),
    ("temperature", 1.0),
    ("text", None),
    ("tool_choice", "auto"),
    ("tools", None),
    ("top_p", 1.0),
    ("truncation", "disabled"),
    ("user", None),
    ("safety_identifier", None),
    ("prompt_cache_key", None),
    ("service_tier", "auto"),
    ("background", None),
    ("top_logprobs", 0),
    ("max_tool_calls", None),
)

_ECHO_DEFAULTS: Final = dict(_ECHOED)
# The echo of a request that sets none of the echoed fields, but for the few `_echo` makes
# fresh per request (`_plain` sets them).
_PLAIN_ECHO: Final[dict[str, Any]] = {**_ECHO_DEFAULTS, "background": False}


def _echo(
    body: dict[str, Any], store: bool, metadata: dict[str, str], previous: str | None
) -> dict[str, Any]:
    """The request fields a response object repeats, each with OpenAI's default when unset."""
    get = body.get
    # The defaults in their order, then the body's few fields over them (in place, so the order
    # stays): a walk of the body's keys, not a lookup per echoed field.
    echo: dict[str, Any] = _ECHO_DEFAULTS.copy()
    for key, value in body.items():
        if value is not None and key in echo:
            echo[key] = value
    if echo["tools"] is None:
        echo["tools"] = []
    # Both were checked to be objects or null.
    text = get("text")
    text = dict(text) if text else {}
    if "format" not in text:
        text["format"] = {"type": "text"}
    echo["metadata"] = metadata
    echo["text"] = text
    reasoning = get("reasoning")
    if reasoning:
        echo["reasoning"] = {
            "effort": reasoning.get("effort"),
            "summary": reasoning.get("summary") or reasoning.get("generate_summary"),
        }
    else:
        echo["reasoning"] = {"effort": None, "summary": None}
    echo["store"] = store
    echo["background"] = False
    echo["previous_response_id"] = previous
    return echo


def _opt_bool(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    return default if value is None else _check.boolean(key, value)


_check = TypeChecks(ResponsesRequestError)
# Fields sent upstream as they came, once their type is checked.
_COPIED: Final = (
    ("temperature", _check.number),
    ("top_p", _check.number),
    ("user", _check.string),
    ("safety_identifier", _check.string),
    ("prompt_cache_key", _check.string),
)
