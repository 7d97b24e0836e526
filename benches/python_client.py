"""Measures the Python client against the floor a raw HTTP loop sets, on one server.

    python benches/python_client.py [path/to/quiver]   (or QUIVER_BIN; default target/release/quiver)

`make bench` runs it last, on the release build for this CPU, from the
client's virtual environment.

Starts the server on 127.0.0.1 (twice, each with a fresh data directory) and
in one run measures:

(a) raw ingest: 100,000 x 768 random float32 rows, pre-encoded into insert
    bodies of 1,000 rows (ids and data), sent in turn on one keep-alive
    connection (http.client) into a fresh index of a fresh server: MB/s of
    vector bytes (rows x dims x 4 / seconds), best of two runs;
(b) client ingest: `Client.insert` of the same array into a fresh index of
    another fresh server, encoding included: the same measure, best of two
    runs (alternating with (a)'s), and its ratio to (a) (target >= 0.8);
(c) search latency on (b)'s 100,000 x 768 index, k=10 with scores: the median of
    200 searches through a raw keep-alive socket sending pre-encoded requests,
    and of the same 200 through `Client.search`, in alternating blocks of 10
    back-to-back searches; the difference (target <= 0.3 ms); and, for
    comparison, the same client on httpx's transport (`transport=`), which
    https uses.

Prints a table. Takes a minute or two and about 3 GB of memory.
"""

from __future__ import annotations

import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import numpy as np
import orjson

from quiver_vectors import Client

ROWS = 100_000
DIMS = 768
RAW_BATCH_ROWS = 1_000
SEARCHES = 200
WARMUP_SEARCHES = 20
BLOCKS = 20
INGEST_RUNS = 2
K = 10
KEY = "bench-key-0123456789"
METRIC = "cosine"
SERVER_START_TIMEOUT_S = 30.0


def start_server(binary: str, data_dir: str) -> "tuple[subprocess.Popen, str]":
    process = subprocess.Popen(
        [binary, "--host", "127.0.0.1", "--port", "0", "--data-dir", data_dir, "--api-key", KEY],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    assert process.stderr is not None
    for line in process.stderr:
        if "listening on " in line:
            address = line.split("listening on ")[1].split(",")[0]
            break
        if time.monotonic() > deadline:
            break
    else:
        raise RuntimeError("quiver exited before listening")
    threading.Thread(target=lambda: [None for _ in process.stderr], daemon=True).start()  # type: ignore[union-attr]
    return process, address


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def raw_ingest(host: str, port: int, index: str, bodies: "list[bytes]") -> float:
    connection = http.client.HTTPConnection(host, port)
    headers = {"X-Service-API-Key": KEY, "Content-Type": "application/json"}
    started = time.perf_counter()
    for body in bodies:
        connection.request("PUT", f"/api/v1/embeddings/{index}/insert", body=body, headers=headers)
        response = connection.getresponse()
        reply = response.read()
        if response.status != 200:
            raise RuntimeError(f"raw insert answered {response.status}: {reply[:200]!r}")
    seconds = time.perf_counter() - started
    connection.close()
    return seconds


class RawSearcher:
    """A keep-alive socket sending pre-encoded search requests: the floor of a search's latency."""

    def __init__(self, host: str, port: int, index: str) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.head = (
            f"POST /api/v1/embeddings/{index}/search HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"X-Service-API-Key: {KEY}\r\nContent-Type: application/json\r\nContent-Length: "
        ).encode()

    def request_bytes(self, query: np.ndarray) -> bytes:
        body = orjson.dumps({"queryVector": query, "k": K, "include": ["score"]}, option=orjson.OPT_SERIALIZE_NUMPY)
        return self.head + str(len(body)).encode() + b"\r\n\r\n" + body

    def search(self, request: bytes) -> bytes:
        self.sock.sendall(request)
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += self.sock.recv(65536)
        head, _, body = buffer.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += self.sock.recv(65536)
        return body


def expected_ids(reply: bytes) -> "list[int]":
    neighbors = orjson.loads(reply)["data"]["nearest_neighbors"]
    return [int(key) for key, _ in sorted(neighbors.items(), key=lambda kv: kv[1]["rank"])]


def client_ingest(client: Client, matrix: np.ndarray, ids: np.ndarray) -> float:
    client.create_index("client", DIMS, METRIC)
    started = time.perf_counter()
    result = client.insert("client", matrix, ids)
    seconds = time.perf_counter() - started
    assert result.stored == ROWS and not result.skipped, result
    assert client.stats("client").count == ROWS
    return seconds


def ingest_raw_on_fresh_server(binary: str, bodies: "list[bytes]") -> float:
    with tempfile.TemporaryDirectory(prefix="quiver-bench-") as data_dir:
        process, address = start_server(binary, data_dir)
        host, port = address.rsplit(":", 1)
        try:
            with Client(f"http://{address}", api_key=KEY) as client:
                client.create_index("raw", DIMS, METRIC)
                seconds = raw_ingest(host, int(port), "raw", bodies)
                assert client.stats("raw").count == ROWS
        finally:
            stop_server(process)
    return seconds


def ingest_client_on_fresh_server(binary: str, matrix: np.ndarray, ids: np.ndarray) -> float:
    with tempfile.TemporaryDirectory(prefix="quiver-bench-") as data_dir:
        process, address = start_server(binary, data_dir)
        try:
            with Client(f"http://{address}", api_key=KEY) as client:
                return client_ingest(client, matrix, ids)
        finally:
            stop_server(process)


def main() -> None:
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("QUIVER_BIN", "target/release/quiver")
    rng = np.random.default_rng(7)
    matrix = rng.standard_normal((ROWS, DIMS), dtype=np.float32)
    ids = np.arange(ROWS)
    bodies = [
        orjson.dumps(
            {"embeddings": [{"id": int(i), "data": matrix[i]} for i in range(lo, lo + RAW_BATCH_ROWS)]},
            option=orjson.OPT_SERIALIZE_NUMPY,
        )
        for lo in range(0, ROWS, RAW_BATCH_ROWS)
    ]
    vector_mb = ROWS * DIMS * 4 / 1e6
    body_mb = sum(len(b) for b in bodies) / 1e6

    # Each ingest runs on a server of its own, started for it: a second ingest
    # into the same server runs measurably slower (its log and memory hold
    # the first), which would favour whichever way went first. Each way runs
    # INGEST_RUNS times, in turn, and its best run counts: on a shared machine
    # a run is only ever slowed by others, never sped up.
    raw_runs_s: "list[float]" = []
    client_runs_s: "list[float]" = []
    for run in range(INGEST_RUNS):
        raw_runs_s.append(ingest_raw_on_fresh_server(binary, bodies))
        if run < INGEST_RUNS - 1:
            client_runs_s.append(ingest_client_on_fresh_server(binary, matrix, ids))
    del bodies
    raw_s = min(raw_runs_s)

    with tempfile.TemporaryDirectory(prefix="quiver-bench-") as data_dir:
        process, address = start_server(binary, data_dir)
        host, port = address.rsplit(":", 1)
        try:
            client = Client(f"http://{address}", api_key=KEY)
            client_runs_s.append(client_ingest(client, matrix, ids))
            client_s = min(client_runs_s)

            queries = rng.standard_normal((SEARCHES + WARMUP_SEARCHES, DIMS), dtype=np.float32)
            raw = RawSearcher(host, int(port), "client")
            requests = [raw.request_bytes(q) for q in queries]
            expected = [expected_ids(raw.search(r)) for r in requests]  # also warms the index up
            # The same client on httpx's transport (what https and a custom
            # transport use): the cost the default http:// path avoids.
            through_httpx = Client(f"http://{address}", api_key=KEY, transport=httpx.HTTPTransport())
            for query in queries[:WARMUP_SEARCHES]:
                client.search("client", query, k=K)
                through_httpx.search("client", query, k=K)
            # Blocks of back-to-back searches, raw and client in turn (ABAB),
            # so each way sees the same conditions: one search right after the
            # last one, and the machine's drift spread over both.
            raw_ms, client_ms, httpx_ms, block_medians = [], [], [], []
            measured = list(range(WARMUP_SEARCHES, WARMUP_SEARCHES + SEARCHES))
            for block in range(BLOCKS):
                part = measured[block::BLOCKS]
                raw_block, client_block = [], []
                for i in part:
                    t0 = time.perf_counter()
                    reply = raw.search(requests[i])
                    raw_block.append((time.perf_counter() - t0) * 1e3)
                    assert expected_ids(reply) == expected[i]
                for i in part:
                    t0 = time.perf_counter()
                    hits = client.search("client", queries[i], k=K)
                    client_block.append((time.perf_counter() - t0) * 1e3)
                    assert [h.id for h in hits] == expected[i]
                for i in part:
                    t0 = time.perf_counter()
                    hits = through_httpx.search("client", queries[i], k=K)
                    httpx_ms.append((time.perf_counter() - t0) * 1e3)
                    assert [h.id for h in hits] == expected[i]
                raw_ms += raw_block
                client_ms += client_block
                block_medians.append((statistics.median(raw_block), statistics.median(client_block)))
            client.close()
            through_httpx.close()
        finally:
            stop_server(process)

    raw_mbs = vector_mb / raw_s
    client_mbs = vector_mb / client_s
    raw_med, client_med = statistics.median(raw_ms), statistics.median(client_ms)
    print(f"quiver client benchmark: {ROWS:,} x {DIMS} float32 ({vector_mb:.1f} MB of vectors, {body_mb:.0f} MB of JSON), {METRIC}")
    print(f"{'measure':<44}{'raw':>12}{'client':>12}{'ratio/diff':>14}{'target':>10}")
    print(f"{'(a,b) ingest, MB/s of float32 vectors':<44}{raw_mbs:>12.1f}{client_mbs:>12.1f}{client_mbs / raw_mbs:>13.2f}x{'>= 0.8x':>10}")
    print(f"{'     seconds for all rows, best run':<44}{raw_s:>12.2f}{client_s:>12.2f}")
    print(f"{'     seconds, each run':<44}{' '.join(f'{t:.2f}' for t in raw_runs_s):>12}{' '.join(f'{t:.2f}' for t in client_runs_s):>12}")
    print(f"{'(c) search k=10, median of 200, ms':<44}{raw_med:>12.3f}{client_med:>12.3f}{client_med - raw_med:>+11.3f} ms{'<= 0.3':>10}")
    httpx_med = statistics.median(httpx_ms)
    print(f"{'(c) the same, client on httpx transport, ms':<44}{raw_med:>12.3f}{httpx_med:>12.3f}{httpx_med - raw_med:>+11.3f} ms{'(info)':>10}")
    block_diffs = sorted(c - r for r, c in block_medians)
    print(
        f"{'     blocks of 10: median diff (p10..p90)':<44}{'':>24}{statistics.median(block_diffs):>+11.3f} ms"
        f"  ({block_diffs[len(block_diffs) // 10]:+.3f}..{block_diffs[len(block_diffs) * 9 // 10]:+.3f})"
    )


if __name__ == "__main__":
    main()
