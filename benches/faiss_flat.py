"""FAISS's exact flat search on the data the `exact` bench wrote, one thread.

Reads `<rows>x<dims>.f32` (rows, then queries, little-endian f32) and prints
one JSON object: for each metric asked for, the median milliseconds of a
lone search (k = 10) over the queries, each searched alone.
"""

import json
import statistics
import sys
import time

import faiss
import numpy as np


def main():
    path, rows, dims, queries = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    metrics = sys.argv[5].split(",")
    faiss.omp_set_num_threads(1)
    data = np.fromfile(path, dtype="<f4").reshape(rows + queries, dims)
    base, asked = data[:rows], data[rows:]
    out = {}
    for metric in metrics:
        if metric == "l2":
            index, qs = faiss.IndexFlatL2(dims), asked
            index.add(base)
        else:
            index = faiss.IndexFlatIP(dims)
            if metric == "cosine":
                # Cosine is the inner product of unit vectors: normalised
                # once when the index is built, as a FAISS user would.
                vectors, qs = base.copy(), asked.copy()
                faiss.normalize_L2(vectors)
                faiss.normalize_L2(qs)
                index.add(vectors)
                del vectors
            else:
                qs = asked
                index.add(base)
        times = []
        for _ in range(3):
            for q in range(queries):
                started = time.perf_counter()
                index.search(qs[q : q + 1], 10)
                times.append((time.perf_counter() - started) * 1000.0)
        out[metric] = statistics.median(times)
        del index
    print(json.dumps(out))


if __name__ == "__main__":
    main()
