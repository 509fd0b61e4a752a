"""svir.log's batched handler: one write per event-loop turn, at once outside a loop."""

from __future__ import annotations

import asyncio
import io
import json
import logging

from svir.log import BatchedHandler, JSONFormatter


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
