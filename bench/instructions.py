"""Instructions per request: svir under valgrind's callgrind, a figure the machine's load does not
move (req/s and CPU time swing 10-20% between runs on these shared 2-core machines, so a change of
a few percent on the hot path is invisible to them).

For each svir tree (this one, and each `--compare-src`), svir runs under callgrind with
instrumentation off while it starts; after checked warm-up requests, instrumentation is switched
on (`callgrind_control`), `--requests` sequential requests of each kind (non-streamed; a 20-chunk
stream) are sent on one keep-alive connection, and the instructions counted are divided by their
number. Counted: every user-space instruction of svir's process (all its threads: the store's
and the ledger's work is part of a request's cost; the count starts and ends LEDGER_SETTLE s after
a request, so that it holds the ledger's writes of exactly the counted requests); not counted: time in the kernel (system calls
such as the socket writes), so this complements CPU time and req/s, it does not replace them.

    .venv/bin/python -m bench.instructions [--requests 200] [--compare-src DIR ...] [--messages]
        [--responses] [--ollama] [--completions] [--drip] [--fold] [--relays]
        [--features [--only TEXT]]

`--messages` adds the same 20-chunk stream asked through Anthropic's `/v1/messages`,
`--responses` through OpenAI's `/v1/responses` (`store: false`), `--ollama` through Ollama's
`/api/chat`, and `--completions` as a text completion through OpenAI's `/v1/completions` (the
fake upstream answers it on its own `/v1/completions` with `text_completion` chunks); every tree
compared must serve them.

`--relays` also counts the reference relays of `bench.suite` (`bench.relay_asgi`: svir's server
stack with no svir logic; `bench.relay_raw`: asyncio protocols only; `bench.relay_json`: the ASGI
relay decoding and encoding again every JSON it relays, each SSE event's) on the same requests, and
prints each svir tree's distance to them in instructions (kernel time is in none).

`--fold` adds a non-streamed chat request whose answer the upstream streams as the 20-chunk kind
does (svir folds the 20 chunks: what a non-streamed answer costs when its server streams it a
token a chunk; the `json` kind's upstream streams its whole answer in one chunk); svir trees only.

`--drip` adds the same 20-chunk chat stream paced by the upstream (`drip-20`, a chunk every
DRIP_INTERVAL s), so that each chunk arrives in a read of its own and leaves in a write of its own,
as a server that streams tokens while it makes them is relayed; the stream kind's upstream writes
its chunks at once, so its reads carry many. The relays (with `--relays`) are counted on it too.

`--features` measures this tree once per configuration of `FEATURES` instead (each feature off
against the default `svir serve` runs, and the key check with a key issued and used), for the
table of what each feature costs a request. `--only TEXT` keeps the configurations whose label
holds TEXT, and measures each on this tree and on each `--compare-src` (a feature's own change,
before and after).

Needs valgrind (`apt-get install -y valgrind`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import (
    CHAT,
    ROOT,
    STREAM_CHUNKS,
    Child,
    check_completion,
    check_completions_stream,
    check_messages_stream,
    check_ollama_stream,
    check_responses_stream,
    check_stream,
    completions_body,
    describe,
    free_port,
    messages_body,
    ollama_body,
    post,
    request_body,
    responses_body,
    start_fake_upstream,
    wait_healthy,
)
from bench.suite import BESIDE, RELAYS, SVIR_CONFIG

KINDS = {"json": ("fake/json", False), "stream": (f"fake/stream-{STREAM_CHUNKS}", True)}
DRIP = ("drip", f"fake/drip-{STREAM_CHUNKS}")
# A non-streamed request whose answer the upstream streams a token a chunk, as servers do: svir
# asks every upstream for a stream, so `json`'s one-chunk stream folds less than a real answer.
FOLD = ("fold", f"fake/stream-{STREAM_CHUNKS}")
# Seconds between the drip stream's chunks: longer than svir takes for a chunk under callgrind
# (~50x slower than without, more on a loaded machine), so that no read carries two.
DRIP_INTERVAL = 0.025
# Seconds to let the ledger write what it holds (it writes every second, from its own thread):
# before a count starts, so that no earlier request's row is counted, and before it ends, so that
# every counted request's row is.
LEDGER_SETTLE = 1.5
_TOTALS = re.compile(r"^(?:totals|summary):\s+(\d+)", re.MULTILINE)


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=120)


def counted(out_dir: Path, pid: int, before: set[Path]) -> int:
    """Instructions in the dump callgrind wrote since `before` was listed."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(out_dir.glob(f"callgrind.out.{pid}*")) - before
        for path in new:
            text = path.read_text(errors="replace")
            found = _TOTALS.search(text)
            if found:
                return int(found.group(1))
        time.sleep(0.2)
    raise RuntimeError("callgrind wrote no dump")


def check(kind: str, data: bytes) -> str | None:
    if kind in ("json", FOLD[0]):
        return check_completion(data)
    if kind == "messages":
        return check_messages_stream(data, STREAM_CHUNKS)
    if kind == "responses":
        return check_responses_stream(data, STREAM_CHUNKS)
    if kind == "ollama":
        return check_ollama_stream(data, STREAM_CHUNKS)
    if kind == "completions":
        return check_completions_stream(data, STREAM_CHUNKS)
    return check_stream(data, STREAM_CHUNKS)


@dataclass(frozen=True)
class Feature:
    """One configuration of svir measured by `--features`: TOML appended to the bench's config,
    arguments of `svir serve`, and a key to issue and send (with `svir keys create` arguments)."""

    toml: str = ""
    serve_args: tuple[str, ...] = ()
    key_args: tuple[str, ...] | None = None


# What `svir serve` runs by default (keys service with no key issued, ledger, metrics, access
# log), then each feature changed alone, then all of them off.
FEATURES: dict[str, Feature] = {
    "default (as `svir serve` starts)": Feature(),
    "metrics off": Feature("[telemetry]\nmetrics = false\n"),
    "ledger off": Feature("[ledger]\nenabled = false\n"),
    "access log off (--log-level warning)": Feature(serve_args=("--log-level", "warning")),
    "metrics, ledger and access log off": Feature(
        "[telemetry]\nmetrics = false\n[ledger]\nenabled = false\n",
        ("--log-level", "warning"),
    ),
    "a key issued and used (no limits)": Feature(key_args=()),
    "a key with an rpm limit (memory backend)": Feature(key_args=("--rpm", "1000000")),
    # Exported to the fake upstream, which answers 404: each batch is encoded and sent once, as to
    # a collector, without the retries and their back-off that a closed port would cost.
    "tracing on (OpenTelemetry, 100% sampled)": Feature(
        '[telemetry]\notel = true\notlp_endpoint = "http://127.0.0.1:{upstream}/v1/traces"\n'
    ),
}


def issue_key(src: Path, config: Path, args: tuple[str, ...]) -> str:
    """A new key (`svir keys create`) in `config`'s store."""
    argv = [sys.executable, "-m", "svir", "keys", "create", "--config", str(config)]
    argv += ["--name", "bench", "--json", *args]
    done = subprocess.run(
        argv, capture_output=True, text=True, check=True, cwd=src, env={**os.environ,
        "PYTHONPATH": str(src)},
    )  # fmt: skip
    return str(json.loads(done.stdout)["key"])


def measure(
    src: Path,
    name: str,
    up_port: int,
    tmp: Path,
    requests: int,
    *,
    beside: tuple[str, ...] = (),
    feature: Feature | None = None,
) -> dict[str, float]:
    """Instructions per request of each kind: json, stream, and the `beside` ones ("messages",
    "responses": the same stream through those front ends)."""
    feature = feature or Feature()
    port = free_port()
    config = tmp / f"{name}.toml"
    store = tmp / name
    store.mkdir()
    config.write_text(
        SVIR_CONFIG.format(
            upstream=up_port, slow=up_port, max_body=1 << 20, tmp=store, max_connections=1000
        )
        + feature.toml.replace("{upstream}", str(up_port))
    )
    headers: dict[str, str] = {}
    if feature.key_args is not None:
        headers["Authorization"] = f"Bearer {issue_key(src, config, feature.key_args)}"
    argv = [sys.executable, "-m", "svir", "serve", "--config", str(config), "--port", str(port)]
    argv += feature.serve_args
    bodies = {kind: request_body(model, stream) for kind, (model, stream) in KINDS.items()}
    builders = {
        "messages": messages_body,
        "responses": responses_body,
        "ollama": ollama_body,
        "completions": completions_body,
    }
    for kind in beside:
        if kind == DRIP[0]:
            bodies[kind] = request_body(DRIP[1], True)
        elif kind == FOLD[0]:
            bodies[kind] = request_body(FOLD[1], False)
        else:
            bodies[kind] = builders[kind](f"fake/stream-{STREAM_CHUNKS}")
    return count_requests(
        name, argv, port, src=src, tmp=tmp, bodies=bodies, headers=headers, requests=requests
    )


def count_requests(
    name: str,
    argv: list[str],
    port: int,
    *,
    src: Path,
    tmp: Path,
    bodies: dict[str, bytes],
    headers: dict[str, str],
    requests: int,
) -> dict[str, float]:
    """Instructions per request of each kind of `bodies` (checked first), the server `argv`
    listening on `port` run under callgrind."""
    out_dir = tmp / f"cg-{name}"
    out_dir.mkdir()
    grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    grind += [f"--callgrind-out-file={out_dir}/callgrind.out.%p"]
    child = Child(name, grind + argv, tmp / f"{name}.log", env={"PYTHONPATH": str(src)}, cwd=src)
    try:
        wait_healthy(child, port, "/healthz", timeout=300)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        paths = {kind: BESIDE.get(kind, CHAT) for kind in bodies}
        for _ in range(20):  # warm-up, and a check that the answers are right
            for kind, body in bodies.items():
                status, data = post(conn, body, headers, path=paths[kind])
                problem = check(kind, data)
                if status != 200 or problem:
                    raise RuntimeError(f"{name} {kind}: {status} {problem}")
        result: dict[str, float] = {}
        # valgrind runs the child itself: its pid is the process's.
        pid = str(child.pid)
        for kind, body in bodies.items():
            before = set(out_dir.glob("callgrind.out.*"))
            time.sleep(LEDGER_SETTLE)
            control("-z", pid)
            control("-i", "on", pid)
            for _ in range(requests):
                status, _ = post(conn, body, headers, path=paths[kind])
                if status != 200:
                    raise RuntimeError(f"{name} {kind}: {status}")
            time.sleep(LEDGER_SETTLE)
            control("-d", pid)
            control("-i", "off", pid)
            result[kind] = counted(out_dir, child.pid, before) / requests
        conn.close()
        return result
    finally:
        child.stop()


def measure_relay(
    name: str, module: str, up_port: int, tmp: Path, requests: int, *, drip: bool = False
) -> dict[str, float]:
    """Instructions per request of a reference relay (`RELAYS`): the
    same non-streamed and streamed chat requests (and the drip stream), forwarded to the same
    fake upstream."""
    port = free_port()
    argv = [sys.executable, "-m", module, "--upstream", f"127.0.0.1:{up_port}", "--port", str(port)]
    # The fake upstream's own model names: a relay passes the body on as it is.
    bodies = {
        kind: request_body(model.removeprefix("fake/"), stream)
        for kind, (model, stream) in KINDS.items()
    }
    if drip:
        bodies[DRIP[0]] = request_body(DRIP[1].removeprefix("fake/"), True)
    return count_requests(
        name, argv, port, src=ROOT, tmp=tmp, bodies=bodies, headers={}, requests=requests
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--compare-src", type=Path, action="append", default=[])
    parser.add_argument("--messages", action="store_true", help="also /v1/messages, streamed")
    parser.add_argument("--responses", action="store_true", help="also /v1/responses, streamed")
    parser.add_argument("--ollama", action="store_true", help="also /api/chat, streamed")
    parser.add_argument("--completions", action="store_true", help="also /v1/completions, streamed")
    parser.add_argument(
        "--features", action="store_true", help="this tree once per configuration of FEATURES"
    )
    parser.add_argument(
        "--only",
        help="with --features: only the configurations whose label holds this text, measured on "
        "this tree and on each --compare-src",
    )
    parser.add_argument(
        "--relays",
        action="store_true",
        help="also the reference relays (bench.relay_asgi, raw, json)",
    )
    parser.add_argument(
        "--drip", action="store_true", help="also the chat stream paced, a chunk a read"
    )
    parser.add_argument(
        "--fold", action="store_true", help="also a non-streamed request of a 20-chunk answer"
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed: apt-get install -y valgrind", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="svir-instructions-"))
    upstream, up_port = start_fake_upstream(
        tmp / "upstream.log", "--drip-interval", str(DRIP_INTERVAL)
    )
    rows: list[tuple[str, dict[str, float]]] = []
    relays: list[tuple[str, dict[str, float]]] = []
    beside = tuple(kind for kind in BESIDE if getattr(args, kind))
    if args.drip:
        beside += (DRIP[0],)
    if args.fold:
        beside += (FOLD[0],)
    try:
        if args.features:
            chosen = [(k, v) for k, v in FEATURES.items() if args.only is None or args.only in k]
            # With --only, each configuration on each tree (this one first).
            sources = [("", ROOT)]
            if args.only is not None:
                sources += [
                    (f"other{i + 1}: ", p.resolve()) for i, p in enumerate(args.compare_src)
                ]
            for j, (tree, src) in enumerate(sources):
                for i, (label, feature) in enumerate(chosen):
                    print(f"{tree}{label} under callgrind ...", flush=True)
                    measured = measure(
                        src,
                        f"f{j}-{i}",
                        up_port,
                        tmp,
                        args.requests,
                        beside=beside,
                        feature=feature,
                    )
                    rows.append((tree + label, measured))
        trees = [] if args.features else [("svir", ROOT)]
        if args.only is None:
            trees += [(f"other{i + 1}", p) for i, p in enumerate(args.compare_src)]
        for name, src in trees:
            print(f"{name} ({src}) under callgrind ...", flush=True)
            measured = measure(src.resolve(), name, up_port, tmp, args.requests, beside=beside)
            rows.append((name, measured))
        if args.relays:
            for name, module in RELAYS.items():
                print(f"{name} ({module}) under callgrind ...", flush=True)
                relay = measure_relay(
                    name.replace(" ", "-"), module, up_port, tmp, args.requests, drip=args.drip
                )
                relays.append((name, relay))
    finally:
        upstream.stop()
    print(f"\n{describe()}\n")
    print(f"Instructions per request (callgrind, {args.requests} sequential requests each):\n")
    what = "svir configuration" if args.features else "svir tree"
    print(f"| {what} | non-stream | stream (20 chunks) | vs the first, non-stream / stream |")
    print("|---|---|---|---|")
    base = rows[0][1]
    for name, r in rows:
        ratio = f"{r['json'] / base['json']:.3f}x / {r['stream'] / base['stream']:.3f}x"
        print(f"| {name} | {r['json']:,.0f} | {r['stream']:,.0f} | {ratio} |")
    if relays:
        print(
            "\n| svir tree | "
            + " | ".join(f"/ {name}, non-stream / stream" for name, _ in relays)
            + " |"
        )
        print("|---|" + "---|" * len(relays))
        for name, r in rows:
            ratios = [
                f"{r['json'] / x['json']:.2f}x / {r['stream'] / x['stream']:.2f}x"
                for _, x in relays
            ]
            print(f"| {name} | " + " | ".join(ratios) + " |")
        for name, x in relays:
            print(
                f"| ({name} itself: {x['json']:,.0f} / {x['stream']:,.0f}) |" + " |" * len(relays)
            )
    if args.fold:
        print(f"\n| svir tree | non-stream, {FOLD[1]} folded | vs the non-stream of one chunk |")
        print("|---|---|---|")
        for name, r in rows:
            print(f"| {name} | {r[FOLD[0]]:,.0f} | {r[FOLD[0]] / r['json']:.3f}x |")
    for kind in beside:
        if kind in (DRIP[0], FOLD[0]):
            continue
        print(f"\n| svir tree | {BESIDE[kind]} stream (20 chunks) | vs its chat stream |")
        print("|---|---|---|")
        for name, r in rows:
            print(f"| {name} | {r[kind]:,.0f} | {r[kind] / r['stream']:.3f}x |")
    if args.drip:
        kind = DRIP[0]
        against = "".join(f" / {name} |" for name, _ in relays)
        print(
            f"\n| | chat stream, a chunk a read ({DRIP[1]}) | vs the stream of one read |{against}"
        )
        print("|---|---|---|" + "---|" * len(relays))
        for name, r in rows + relays:
            ratios = "".join(f" {r[kind] / x[kind]:.2f}x |" for _, x in relays)
            print(f"| {name} | {r[kind]:,.0f} | {r[kind] / r['stream']:.3f}x |{ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
