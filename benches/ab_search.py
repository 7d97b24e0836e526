"""Lone and batched search latency of two quiver binaries on the same data,
measured in turns (A, B, B, A, ...) so that a noisy machine weighs on both.

    python3 benches/ab_search.py BEFORE_BINARY AFTER_BINARY

Each server gets ROWS random rows of DIMS values (environment, default
20,000 x 768, l2, metadata {"n": id mod 10}) on loopback, and an index of
METRIC_ROWS x 128 non-negative rows for each other metric; then, four
rounds of 200 lone searches (k = 10, one keep-alive connection), 40
search-batch requests of 16 searches, 200 lone searches with a filter a
tenth of the rows match, 200 one-row upserts (unsynced: the request's own
path), and 100 lone searches of each other metric.
Prints each round's medians and the ratio of the medians.
"""
import http.client
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROWS, DIMS = int(os.environ.get("ROWS", 20000)), int(os.environ.get("DIMS", 768))
METRIC_ROWS = int(os.environ.get("METRIC_ROWS", 20000))
METRICS = [("cosine", None), ("ip", None), ("l1", None), ("linf", None), ("lp", 3), ("canberra", None), ("bc", None),
           ("js", None)]
HEADERS = {"X-Service-API-Key": "ab-key"}


def start(binary, port):
    data_dir = tempfile.mkdtemp()
    args = [binary, "--host", "127.0.0.1", "--port", str(port), "--data-dir", data_dir, "--api-key", "ab-key",
            "--unsafe-no-sync"]
    process = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        if "listening on" in line:
            break
    return process, http.client.HTTPConnection("127.0.0.1", port), data_dir


def call(connection, method, path, body):
    connection.request(method, path, body=json.dumps(body), headers=HEADERS)
    response = connection.getresponse()
    data = response.read()
    assert response.status == 200, data[:300]
    return data


def load(connection, name, create, rows):
    call(connection, "PUT", f"/api/v1/indexes/{name}/create", create)
    for start_row in range(0, len(rows), 1000):
        ids = range(start_row, min(start_row + 1000, len(rows)))
        call(connection, "PUT", f"/api/v1/embeddings/{name}/insert",
             {"embeddings": [{"id": i, "data": rows[i], "metadata": {"n": str(i % 10)}} for i in ids]})


def median_ms(connection, path, bodies, count, method="POST"):
    times = []
    for n in range(count):
        started = time.perf_counter()
        connection.request(method, path, body=bodies[n % len(bodies)], headers=HEADERS)
        connection.getresponse().read()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main():
    rng = random.Random(7)
    rows = [[round(rng.uniform(-1, 1), 4) for _ in range(DIMS)] for _ in range(ROWS)]
    queries = [[round(rng.uniform(-1, 1), 4) for _ in range(DIMS)] for _ in range(64)]
    lone = [json.dumps({"queryVector": q, "k": 10}) for q in queries]
    batch = [json.dumps({"searches": [{"queryVector": q, "k": 10} for q in queries[:16]]})]
    filtered = [json.dumps({"queryVector": q, "k": 10, "filter": {"n": "3"}}) for q in queries]
    upserts = [json.dumps({"embeddings": [{"id": ROWS + n, "data": q, "metadata": {"n": "x"}}]})
               for n, q in enumerate(queries)]
    positive = [[round(rng.uniform(0, 1), 4) for _ in range(128)] for _ in range(METRIC_ROWS)]
    positive_queries = [json.dumps({"queryVector": [round(rng.uniform(0, 1), 4) for _ in range(128)], "k": 10})
                        for _ in range(32)]
    servers = {}
    for n, name in enumerate(["before", "after"]):
        servers[name] = start(sys.argv[1 + n], 18300 + n)
        load(servers[name][1], "ab-search", {"dimensions": DIMS, "metric": "l2"}, rows)
        for metric, p in METRICS:
            create = {"dimensions": 128, "metric": metric, **({"p": p} if p else {})}
            load(servers[name][1], f"ab-{metric}", create, positive)
    kinds = ["lone", "batch", "filtered", "upsert"] + [metric for metric, _ in METRICS]
    results = {name: {what: [] for what in kinds} for name in servers}
    for round_ in range(4):
        for name in ["before", "after"] if round_ % 2 == 0 else ["after", "before"]:
            connection = servers[name][1]
            median_ms(connection, "/api/v1/embeddings/ab-search/search", lone, 20)
            results[name]["lone"].append(median_ms(connection, "/api/v1/embeddings/ab-search/search", lone, 200))
            results[name]["batch"].append(median_ms(connection, "/api/v1/embeddings/ab-search/search-batch", batch, 40))
            path = "/api/v1/embeddings/ab-search/search"
            results[name]["filtered"].append(median_ms(connection, path, filtered, 200))
            path = "/api/v1/embeddings/ab-search/upsert"
            results[name]["upsert"].append(median_ms(connection, path, upserts, 200, "PUT"))
            for metric, _ in METRICS:
                path = f"/api/v1/embeddings/ab-{metric}/search"
                results[name][metric].append(median_ms(connection, path, positive_queries, 100))
    for process, _, data_dir in servers.values():
        process.terminate()
        process.wait()
        shutil.rmtree(data_dir)
    for name, rounds in results.items():
        print(name, {what: [round(ms, 3) for ms in values] for what, values in rounds.items()})
    for what in kinds:
        before, after = (statistics.median(results[name][what]) for name in ["before", "after"])
        print(f"{what}: before {before:.3f} ms, after {after:.3f} ms, after/before {after / before:.3f}")


if __name__ == "__main__":
    main()
