"""svir.log's batched handler: one write per event-loop turn, at once outside a loop."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import uuid
from collections.abc import Iterator
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

import svir.log
from svir.log import (
    BatchedHandler,
    JSONFormatter,
    hide_in_logs,
    hundredths,
    log_request,
    setup_logging,
)


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


def make_logger(name: str) -> tuple[logging.Logger, CountingStream]:
    stream = CountingStream()
    handler = BatchedHandler(stream)
    handler.setFormatter(JSONFormatter())
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, stream


def lines(stream: CountingStream) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_outside_a_loop_each_line_is_written_at_once() -> None:
    logger, stream = make_logger("svir.test.sync")
    logger.info("one")
    assert [d["msg"] for d in lines(stream)] == ["one"]
    logger.info("two", extra={"fields": {"status": 200}})
    assert lines(stream)[1] == {**lines(stream)[1], "msg": "two", "status": 200}
    assert stream.writes == 2


def test_lines_of_one_loop_turn_go_out_in_one_write() -> None:
    logger, stream = make_logger("svir.test.batched")

    async def main() -> None:
        for i in range(5):
            logger.info("request", extra={"fields": {"n": i}})
        assert stream.getvalue() == ""  # not before this turn of the loop ends
        await asyncio.sleep(0)
        assert [d["n"] for d in lines(stream)] == [0, 1, 2, 3, 4]
        assert stream.writes == 1
        logger.info("later")
        await asyncio.sleep(0)
        assert lines(stream)[-1]["msg"] == "later"
        assert stream.writes == 2

    asyncio.run(main())


def test_a_loop_that_stopped_before_its_flush_does_not_hold_the_next_one_up() -> None:
    logger, stream = make_logger("svir.test.stopped")
    first = asyncio.new_event_loop()

    def log_and_stop() -> None:
        logger.info("left behind")  # schedules a flush on `first` ...
        first.stop()  # ... which stops before running it

    try:
        first.call_soon(log_and_stop)
        first.run_forever()
    finally:
        first.close()
    assert stream.getvalue() == ""

    async def main() -> None:
        logger.info("next loop")
        await asyncio.sleep(0)

    asyncio.run(main())
    assert [d["msg"] for d in lines(stream)] == ["left behind", "next loop"]


def test_a_line_from_another_thread_is_written_at_once_with_what_waits() -> None:
    logger, stream = make_logger("svir.test.thread")

    async def main() -> None:
        logger.info("in the loop")
        await asyncio.to_thread(logger.info, "from a thread")
        # The thread's line took the loop's pending line with it, in order.
        assert [d["msg"] for d in lines(stream)][:2] == ["in the loop", "from a thread"]

    asyncio.run(main())


@pytest.fixture
def svir_logging() -> Iterator[CountingStream]:
    """svir's own logging set-up (as `svir serve` makes it) into a stream, undone afterwards."""
    root = logging.getLogger("svir")
    saved = (root.handlers[:], root.level, root.propagate, svir.log._direct)
    stream = CountingStream()
    setup_logging("info", stream)
    try:
        yield stream
    finally:
        root.handlers[:], root.level, root.propagate, svir.log._direct = saved


def without_ts(line: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in line.items() if k != "ts"}


def test_the_access_line_is_the_line_a_record_makes(svir_logging: CountingStream) -> None:
    fields = {"method": "POST", "status": 200, "duration_ms": 1.5}
    hide_in_logs("sk-upstream-secret-1")
    with mock.patch.object(logging.Logger, "makeRecord", side_effect=AssertionError("a record")):
        log_request({**fields, "path": "/v1/x?k=sk-upstream-secret-1"}, "rid-1")
    logging.getLogger("svir.access").info(
        "request",
        extra={"fields": {**fields, "path": "/v1/x?k=sk-upstream-secret-1"}, "request_id": "rid-1"},
    )
    direct, recorded = lines(svir_logging)
    assert without_ts(direct) == without_ts(recorded)
    assert direct["logger"] == "svir.access" and direct["request_id"] == "rid-1"
    assert direct["path"] == "/v1/x?k=[redacted]"


@pytest.mark.parametrize(
    ("fields", "request_id"),
    [
        (
            {"method": "POST", "path": "/v1/chat/completions", "status": 200, "duration_ms": 1.5},
            "r1",
        ),
        ({"status": 200, "ttft_ms": 0.1, "attempts": ["a", "b"], "upstream_id": None}, "r-2"),
        ({"path": '/v1/x?q="\\\u00e9\u2028\x01', "prompt_tokens": 12}, 'r"\\\n\u00e9'),
        ({"status": 200, "path": "/v1/x?k=sk-upstream-secret-2"}, "rid-sk-upstream-secret-2"),
        # A field named as one of the line's own keys takes that key's place.
        ({"status": 200, "msg": "mine", "request_id": "theirs"}, "r3"),
        ({"status": 200, "ts": "then", "level": 1, "logger": "x", "exc": "y"}, "r4"),
        ({}, "r5"),
        ({"status": 204}, ""),
    ],
)
def test_the_access_line_is_json_lines_own_bytes(
    svir_logging: CountingStream, fields: dict[str, object], request_id: str
) -> None:
    hide_in_logs("sk-upstream-secret-2")
    with mock.patch("svir.log.time.time", return_value=1764650000.1234):
        log_request(fields, request_id)
    expected = svir.log.json_line(
        1764650000.1234, "info", "svir.access", "request", request_id=request_id, fields=fields
    )
    assert svir_logging.getvalue() == expected + "\n"


def test_the_access_line_is_a_record_for_a_handler_of_ones_own(
    svir_logging: CountingStream,
) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    access = logging.getLogger("svir.access")
    keep = Keep()
    access.addHandler(keep)
    try:
        log_request({"status": 204}, "rid-2")
    finally:
        access.removeHandler(keep)
    assert [(r.getMessage(), r.fields, r.request_id) for r in records] == [  # type: ignore[attr-defined]
        ("request", {"status": 204}, "rid-2")
    ]
    # ... and it still reaches svir's own handler, as any record does.
    assert [d["status"] for d in lines(svir_logging)] == [204]
    logging.getLogger("svir").setLevel(logging.WARNING)
    log_request({"status": 205}, "rid-3")
    assert [d["status"] for d in lines(svir_logging)] == [204]
    # A level set on svir's handler itself is respected as a record's would be.
    logging.getLogger("svir").setLevel(logging.INFO)
    svir.log._svir.handlers[0].setLevel(logging.WARNING)
    log_request({"status": 206}, "rid-4")
    assert [d["status"] for d in lines(svir_logging)] == [204]


def test_an_app_hides_every_secret_its_config_names_without_the_keys_service() -> None:
    from svir.config.load import parse_config
    from svir.edges.app import App

    upstream, admin, metrics = (f"{what}-{uuid.uuid4().hex}" for what in ("up", "ad", "me"))
    config = parse_config(
        '[[providers]]\nname = "lab"\nkind = "openai-compatible"\n'
        'base_url = "http://127.0.0.1:9/v1"\napi_key_env = "SVIR_TEST_LOG_UPSTREAM_KEY"\n'
    )
    environ = {
        "SVIR_TEST_LOG_UPSTREAM_KEY": upstream,
        "SVIR_ADMIN_KEY": admin,
        "SVIR_METRICS_TOKEN": metrics,
    }
    App(config, environ)  # no front end installed: no keys service
    record = logging.LogRecord(
        "svir.test", logging.WARNING, __file__, 1, f"said {upstream} {admin}", None, None
    )
    record.fields = {"error": f'quoted "{metrics}"', "nested": [upstream]}
    line = JSONFormatter().format(record)
    assert line.count("[redacted]") == 4, line
    assert upstream not in line and admin not in line and metrics not in line


def test_each_app_holds_the_secrets_of_its_own_config() -> None:
    # The console redacts an app's secrets (svir.console.observe.clean, the captures): two apps
    # in one process, each with its environment, hold their own, not each other's.
    from svir.config.load import parse_config
    from svir.console.observe import clean
    from svir.edges.app import App

    config = parse_config(
        '[[providers]]\nname = "lab"\nkind = "openai-compatible"\n'
        'base_url = "http://127.0.0.1:9/v1"\napi_key_env = "SVIR_TEST_APP_KEY"\n'
    )
    first, second = (f"key-{uuid.uuid4().hex}" for _ in range(2))
    app_one = App(config, {"SVIR_TEST_APP_KEY": first})
    app_two = App(config, {"SVIR_TEST_APP_KEY": second})
    assert first in app_one.secrets and first not in app_two.secrets
    assert second in app_two.secrets and second not in app_one.secrets
    said = f"upstream said {first} and {second}"
    assert clean(said, app_one.secrets) == f"upstream said [redacted] and {second}"


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_hundredths_is_round_to_two_decimals_and_prints_as_such(value: float) -> None:
    got = hundredths(value)
    # round(value, 2) itself, but for a tie that value * 100 misstates: then one hundredth off.
    assert abs(got - round(value, 2)) <= 0.01 + 1e-9 * value
    assert got == round(value, 2) or abs(value * 100 % 1 - 0.5) < 1e-6 * max(1.0, value)
    decimals = repr(got).partition(".")[2]
    assert "e" in repr(got) or len(decimals) <= 2


def test_hundredths_of_times_logs_give() -> None:
    assert [hundredths(v) for v in (0.0, 1.234, 1.235001, 12.999, 152.604999)] == [
        0.0,
        1.23,
        1.24,
        13.0,
        152.6,
    ]
