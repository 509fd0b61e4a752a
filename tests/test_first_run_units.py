"""The pieces of issue 19's first run that need no process: log lines (ISO-8601 time, the text
format), clean ids for model ids that are file paths, the docs naming the model `make serve`
serves, and the config error for an example path."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import svir.log
from svir.config.load import parse_config
from svir.errors import ConfigError
from svir.log import hide_in_logs, iso_time, json_line, log_request, setup_logging, text_line
from svir.wire.models import clean_model_id

ROOT = Path(__file__).resolve().parents[1]
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_json_lines_carry_an_iso_8601_utc_time() -> None:
    line = json.loads(json_line(1767323045.123, "info", "svir.x", "m"))
    assert line["ts"] == "2026-01-02T03:04:05.123Z"
    assert ISO.match(iso_time(0.9999)) and iso_time(0.9999) == "1970-01-01T00:00:01.000Z"


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_iso_time_is_always_iso(created: float) -> None:
    assert ISO.match(iso_time(created))


@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_iso_time_is_the_second_and_its_milliseconds(created: float) -> None:
    whole, millis = divmod(round(created * 1000), 1000)
    second = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    assert iso_time(created) == f"{second}.{millis:03d}Z"


@pytest.fixture
def svir_logging() -> Iterator[io.StringIO]:
    root = logging.getLogger("svir")
    saved = (root.handlers[:], root.level, root.propagate, svir.log._direct, svir.log._line)
    stream = io.StringIO()
    setup_logging("info", stream, fmt="text")
    try:
        yield stream
    finally:
        root.handlers[:], root.level, root.propagate, svir.log._direct, svir.log._line = saved


def test_the_text_format_is_one_plain_line_a_record(svir_logging: io.StringIO) -> None:
    hide_in_logs("sk-text-format-secret-1")
    logging.getLogger("svir.server").warning(
        "upstream said sk-text-format-secret-1", extra={"fields": {"provider": "lab", "n": 2}}
    )
    log_request({"method": "GET", "path": "/v1/models", "status": 200}, "rid-7")
    first, second = svir_logging.getvalue().splitlines()
    assert re.match(
        r"^\S+Z warning svir.server: upstream said \[redacted\] provider=lab n=2$", first
    )
    assert second.endswith(
        "info    svir.access: request request_id=rid-7 method=GET path=/v1/models status=200"
    )
    assert not first.startswith("{")


def test_the_text_format_shows_the_banner_as_its_block(svir_logging: io.StringIO) -> None:
    logging.getLogger("svir.server").info(
        "svir listening", extra={"fields": {"url": "u"}, "banner": "svir listening\n  store  x"}
    )
    assert svir_logging.getvalue() == "svir listening\n  store  x\n"


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(ValueError, match="json, text"):
        setup_logging("info", io.StringIO(), fmt="yaml")


def test_text_line_quotes_values_with_spaces() -> None:
    line = text_line(0, "info", "svir.x", "m", fields={"why": "two words", "ok": True})
    assert line.endswith('m why="two words" ok=true')


@pytest.mark.parametrize(
    ("model_id", "clean"),
    [
        ("/models/muse-glimmer-30b-q4_k_m.gguf", "muse-glimmer-30b-q4_k_m"),
        ("~/models/Qwen3-8B-Q4_K_M.gguf", "Qwen3-8B-Q4_K_M"),
        ("./gemma.GGUF", "gemma"),
        ("C:\\models\\phi-4.gguf", "phi-4"),
        ("phi-4.gguf", "phi-4"),
        ("/srv/models/qwen3-8b/", "qwen3-8b"),
        # Not paths: Hugging Face ids and plain names stay as they are.
        ("Qwen/Qwen3-8B", None),
        ("unsloth/Qwen3-8B-GGUF", None),
        ("gpt-4o-mini", None),
        ("/", None),
        ("/.gguf", None),
    ],
)
def test_clean_model_id(model_id: str, clean: str | None) -> None:
    assert clean_model_id(model_id) == clean


@given(st.text(max_size=80))
def test_clean_model_id_never_fails_and_has_no_separator(model_id: str) -> None:
    clean = clean_model_id(model_id)
    if clean is not None:
        assert clean.strip() and "/" not in clean and "\\" not in clean


def test_the_docs_name_the_model_make_serve_serves() -> None:
    texts = [ROOT / "README.md", ROOT / "svir.example.toml", *sorted((ROOT / "docs").glob("*.md"))]
    for path in texts:
        assert "lab/gemma-3-270m" not in path.read_text(), path
    readme = (ROOT / "README.md").read_text()
    assert "local/gemma-3-270m" in readme
    managed = readme[
        readme.index('"qwen3-8b" = { path') - 300 : readme.index('"qwen3-8b" = { path')
    ]
    assert "An example path: edit it to a GGUF file you have" in managed


def test_a_missing_model_path_says_it_may_be_an_example(tmp_path: Path) -> None:
    text = (
        '[[providers]]\nname = "local"\nkind = "llamacpp-managed"\n[providers.managed.models]\n'
        '"qwen3-8b" = { path = "~/no-such-dir/Qwen3-8B-Q4_K_M.gguf" }\n'
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text, source=tmp_path / "svir.toml")
    message = str(info.value)
    assert "no such file:" in message and "Qwen3-8B-Q4_K_M.gguf" in message
    assert "it is an example path: edit it to a GGUF file you have, or delete the line" in message
    assert "providers[0].managed.models.qwen3-8b.path" in message
