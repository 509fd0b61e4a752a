"""The import graph holds the layers of the README's Layout table: no cycles between svir's
modules nor between its folders, nothing from `svir/wire` to outside it, and nothing from the core
or policy into the IO edges. It reads the source with `ast`; nothing is imported.

Every import counts, wherever it is written: at module level, inside a function, and under
`if TYPE_CHECKING:`. An import inside a function delays the dependency to the first call, and one
under TYPE_CHECKING to the type checker, but the module still needs the other to do its job or to
be read; a lazy import written to dodge a cycle is the cycle, hidden. (Today every function-level
import is an edge or the command line composing itself, which the layers allow anyway.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import svir

SRC = Path(svir.__file__).parent

# The layers, lowest first; a module may import from its own layer and the layers below. A module
# belongs to the entry with the longest prefix that names it (a package or a module).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # sans-IO protocol core: imports nothing of svir outside itself.
    ("wire", ("svir.wire",)),
    # The gateway's own errors; the wire core's are in svir.wire.errors.
    ("errors", ("svir.errors",)),
    # One small module per server kind: data, and what a server does to an answer.
    ("providers", ("svir.providers",)),
    # The core and policy: the chat call, the gateway, routing, retries and fallback, the key gate,
    # a key and its limits, the threads' domain logic, the config they read, what a request is
    # (svir.asgi).
    (
        "core",
        (
            "svir",
            "svir.log",
            "svir.config",
            "svir.transport",
            "svir.call",
            "svir.chat",
            "svir.asgi",
            "svir.policy",
            "svir.threads",
            "svir.keys",
        ),
    ),
    # The client protocols: one package each (request -> canonical chat request, canonical
    # events -> its bytes or its answer, its routes), their shared plumbing and the one router.
    ("protocols", ("svir.protocols",)),
    # IO: the upstream HTTP client, the ASGI app, the stores (threads, keys, captures, the ledger),
    # the admin API and the console's, the llama.cpp process; and the probe of a model server with
    # its connection (HTTP to a server, nothing of the command line), which the console runs.
    (
        "edges",
        (
            "svir.edges",
            "svir.console",
            "svir.client.connection",
            "svir.client.probe",
            "svir.store",
            "svir.ledger",
        ),
    ),
    # What a user runs: the command line, the server it starts (which composes the app of every
    # folder's parts) and the terminal client.
    ("entry", ("svir.__main__", "svir.cli", "svir.server", "svir.client")),
)

# Imports that break the rule, each with the reason it stands; an entry that no longer matches an
# import fails the test, so that the list only shrinks. None is left: an import against the layers
# is a design question to answer before it is written down here.
ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The svir module that `name` (a module, or a module's attribute) is, or None."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(module: str, path: Path) -> Iterator[str]:
    """Every svir module that `module` imports, anywhere in its source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            # `from pkg import mod` names a module; `from mod import name` names the module.
            names = [f"{source}.{alias.name}" for alias in node.names] + [source]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                yield target


GRAPH: dict[str, set[str]] = {m: set(_imported(m, p)) for m, p in MODULES.items()}


def layer_of(module: str) -> int:
    best = (-1, -1)
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (prefix.count("."), rank))
    return best[1]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            comp.append(v)
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def folder_of(module: str) -> str:
    """The folder `module` lives in: the name of its package under svir/, or for a module at svir's
    top the name of its layer. The top's modules are the core's, but for the gateway's errors
    (the layer below every folder, so that any of them may raise one) and what a user runs (the
    layer above every folder, which composes them all)."""
    parts = module.split(".")
    if len(parts) > 1 and (SRC / parts[1]).is_dir():
        return parts[1]
    return LAYERS[layer_of(module)][0]


def _between_folders(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """The imports from one folder into another, by the pair of folders."""
    crossing: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for m, targets in graph.items():
        for t in sorted(targets):
            if folder_of(m) != folder_of(t):
                crossing.setdefault((folder_of(m), folder_of(t)), []).append((m, t))
    return crossing


FOLDER_IMPORTS = _between_folders(GRAPH)


def test_every_module_has_a_layer() -> None:
    assert [m for m in MODULES if layer_of(m) < 0] == []


def test_no_import_cycles() -> None:
    assert _cycles(GRAPH) == []


def test_no_import_cycles_between_folders() -> None:
    # A folder is a unit a reader takes in whole: what it needs of another folder sits below it,
    # never beside it in a ring. Each cycle is shown with the imports that close it.
    folders: dict[str, set[str]] = {folder_of(m): set() for m in GRAPH}
    for a, b in FOLDER_IMPORTS:
        folders[a].add(b)
    rings = [
        {
            f"{a} -> {b}": FOLDER_IMPORTS[a, b]
            for a in ring
            for b in ring
            if (a, b) in FOLDER_IMPORTS
        }
        for ring in _cycles(folders)
    ]
    assert rings == []


def test_the_folders_are_the_packages_and_the_top_by_layer() -> None:
    assert folder_of("svir.keys.model") == "keys"
    assert folder_of("svir.protocols.anthropic.routes") == "protocols"
    assert folder_of("svir.chat") == "core"
    assert folder_of("svir") == "core"
    assert folder_of("svir.errors") == "errors"
    assert folder_of("svir.server") == "entry"
    # An import that would close a ring is seen: the core's chat call carries a key.
    assert ("svir.call", "svir.keys.model") in FOLDER_IMPORTS["core", "keys"]


def test_wire_imports_only_wire() -> None:
    out = [
        (m, t)
        for m, targets in GRAPH.items()
        if m.startswith("svir.wire")
        for t in sorted(targets)
        if not t.startswith("svir.wire")
    ]
    assert out == []


def test_imports_point_down_the_layers() -> None:
    upward = sorted(
        (m, t)
        for m, targets in GRAPH.items()
        for t in targets
        if layer_of(t) > layer_of(m) and (m, t) not in ALLOWED
    )
    named = [f"{m} ({LAYERS[layer_of(m)][0]}) -> {t} ({LAYERS[layer_of(t)][0]})" for m, t in upward]
    assert named == []


def _protocol(module: str) -> str | None:
    """The protocol package `module` belongs to (`svir.protocols.<name>`), or None."""
    parts = module.split(".")
    if (
        len(parts) >= 3
        and parts[:2] == ["svir", "protocols"]
        and (SRC / "protocols" / parts[2]).is_dir()
    ):
        return parts[2]
    return None


def test_protocols_do_not_import_each_other() -> None:
    # A protocol is a folder: what two of them share lives below them (svir.protocols.http, the
    # core, the wire), so that adding or removing one touches nothing else.
    crossing = sorted(
        (m, t)
        for m, targets in GRAPH.items()
        if _protocol(m) is not None
        for t in targets
        if _protocol(t) not in (None, _protocol(m))
    )
    assert crossing == []


def test_the_shared_protocol_modules_import_no_protocol() -> None:
    shared = sorted(
        (m, t)
        for m, targets in GRAPH.items()
        if m.startswith("svir.protocols") and _protocol(m) is None
        for t in targets
        if _protocol(t) is not None
    )
    assert shared == []


def test_every_allowed_exception_is_still_needed() -> None:
    stale = [edge for edge in ALLOWED if edge[1] not in GRAPH.get(edge[0], set())]
    assert stale == []


def test_the_reader_sees_each_kind_of_import() -> None:
    # The graph is only as good as the reader: a module-level, a function-level, a TYPE_CHECKING
    # and a relative-to-package import each show up.
    assert "svir.wire.events" in GRAPH["svir.chat"]  # module level
    assert "svir.edges.keys_service" in GRAPH["svir.server"]  # inside a function
    assert "svir.chat" in GRAPH["svir.edges.metrics"]  # under TYPE_CHECKING
    assert "svir.providers.azure" in GRAPH["svir.providers"]  # `from pkg import mod`
