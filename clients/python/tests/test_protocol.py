"""The pure parts, without a server: vectors in and out, bodies, envelopes, splitting, retries."""

from __future__ import annotations

import random

import httpx
import numpy as np
import orjson
import pytest

from quiver_vectors import (
    AuthenticationError,
    IndexExistsError,
    IndexNotCreatedError,
    IndexNotFoundError,
    InvalidRequestError,
    QuiverError,
    ReplyTooLargeError,
    RequestTooLargeError,
    RetryPolicy,
    Search,
    Skipped,
    UnavailableError,
    WriteResult,
)
from quiver_vectors import _protocol as P
from quiver_vectors._errors import error_for
from quiver_vectors._wire import parse_head, request_head

AWKWARD_FLOAT32 = np.array(
    [
        1e-45,  # the smallest subnormal
        -1e-45,
        1.1754942e-38,  # the largest subnormal
        1.1754944e-38,  # the smallest normal
        1e38,
        3.4028235e38,  # the largest finite
        -3.4028235e38,
        -0.0,
        0.0,
        0.1,
        1 / 3,
        1.0000001,  # 1 + one ulp: nine significant digits
        16777217.0,  # rounds to 16777216
        2.0**-149 * 3,
        123456.79,
        -9.8765434e-20,
    ],
    dtype=np.float32,
)


def bits(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


def read_back(text: bytes) -> np.ndarray:
    """How the client reads vectors: JSON numbers as float64, then cast to float32."""
    return np.array(orjson.loads(text), dtype=np.float32)


# -- float32 text round trip --------------------------------------------------------------


def test_awkward_float32_values_round_trip_bit_exactly_through_the_encoder() -> None:
    text = P.dumps(AWKWARD_FLOAT32)
    assert bits(read_back(text)).tolist() == bits(AWKWARD_FLOAT32).tolist()
    # -0.0 keeps its sign, and the shortest form is used (no float64 digits).
    assert b"-0.0" in text
    assert b"0.1," in text and b"0.33333334" in text and b"1.0000001" in text


def test_random_float32_bit_patterns_round_trip_bit_exactly() -> None:
    rng = np.random.default_rng(1)
    patterns = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    finite = patterns[np.isfinite(patterns)]
    assert bits(read_back(P.dumps(finite))).tolist() == bits(finite).tolist()


def test_encoder_writes_the_shortest_float32_text_not_float64_digits() -> None:
    # 0.1 as float32 is 0.100000001490116...; its shortest float32 text is "0.1".
    assert P.dumps(np.array([0.1], dtype=np.float32)) == b"[0.1]"
    assert len(P.dumps(np.array([1 / 3], dtype=np.float32))) <= len(b"[0.33333334]")


# -- vectors in ---------------------------------------------------------------------------


def test_as_matrix_takes_any_real_dtype_and_shape_and_gives_contiguous_float32() -> None:
    assert P.as_matrix([1, 2, 3]).shape == (1, 3)
    assert P.as_matrix(np.ones((2, 3, 4), dtype=np.float64)).shape == (6, 4)
    strided = np.arange(40, dtype=np.float64).reshape(4, 10)[:, ::2]
    out = P.as_matrix(strided)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == (4, 5)
    assert out.tolist() == strided.tolist()
    assert P.as_matrix(np.array([[1, 2]], dtype=np.int64)).dtype == np.float32
    assert P.as_matrix([]).shape == (0, 0)
    # float64 to float32 rounds to nearest.
    assert P.as_matrix([0.1]).tolist() == [[np.float32(0.1)]]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e39])
def test_nan_infinity_and_values_past_float32_are_refused_before_sending(bad: float) -> None:
    vectors = np.zeros((3, 4))
    vectors[2, 1] = bad
    with pytest.raises(ValueError, match=r"vectors\[2\]\[1\]"):
        P.as_matrix(vectors)
    with pytest.raises(ValueError, match=r"vector\[1\]"):
        P.as_query([0.0, bad])


def test_as_matrix_refuses_what_is_not_an_array_of_numbers() -> None:
    with pytest.raises(TypeError):
        P.as_matrix(["a", "b"])
    with pytest.raises(ValueError):
        P.as_matrix([[1.0, 2.0], [1.0]])
    with pytest.raises(ValueError):
        P.as_matrix(3.0)
    with pytest.raises(ValueError):
        P.as_query(np.ones((2, 3)))
    assert P.as_query(np.ones((1, 3))).shape == (3,)


def test_ids_are_checked_as_64_bit_signed_integers() -> None:
    assert P.as_ids(np.arange(3, dtype=np.uint8), 3) == [0, 1, 2]
    assert P.as_ids(range(2), 2) == [0, 1]
    assert P.as_ids(7, 1) == [7]
    assert P.as_ids([-(2**63), 2**63 - 1], 2) == [-(2**63), 2**63 - 1]
    for bad in ([2**63], [-(2**63) - 1], np.array([2**63], dtype=np.uint64)):
        with pytest.raises(ValueError, match="64-bit"):
            P.as_ids(bad, 1)
    with pytest.raises(TypeError):
        P.as_ids([1.0], 1)
    with pytest.raises(ValueError, match="2 ids for 3 vectors"):
        P.as_ids([1, 2], 3)


def test_metadata_is_one_mapping_or_none_per_row_and_values_pass_through() -> None:
    typed = {"s": "x", "n": 3, "f": 2.5, "b": True, "l": ["a", "b"]}
    assert P.as_metadata([typed, None], 2) == [typed, None]
    assert P.as_metadata(typed, 1) == [typed]
    with pytest.raises(ValueError):
        P.as_metadata([typed], 2)
    with pytest.raises(TypeError):
        P.as_metadata(["x"], 1)
    upload = P.Upload(np.ones((2, 2)), [1, 2], [typed, None])
    assert orjson.loads(upload.body(0, 2)) == {
        "embeddings": [{"id": 1, "data": [1.0, 1.0], "metadata": typed}, {"id": 2, "data": [1.0, 1.0]}]
    }


def test_metadata_values_are_checked_and_numpy_scalars_converted_before_sending() -> None:
    given = {"i": np.int64(7), "f": np.float32(0.5), "b": np.bool_(True), "s": np.str_("x"), "t": ("a", "b")}
    checked = P.as_metadata([given], 1)
    assert checked == [{"i": 7, "f": 0.5, "b": True, "s": "x", "t": ("a", "b")}]
    assert checked is not None and type(checked[0]["i"]) is int and type(checked[0]["f"]) is float
    assert type(checked[0]["b"]) is bool
    assert type(given["i"]) is np.int64  # the caller's mapping is left as it was
    plain = {"s": "x", "n": -(2**63), "f": 1e300, "b": False, "l": []}
    assert P.as_metadata([plain], 1)[0] is plain  # nothing to convert: not copied  # type: ignore[index]
    bad = [
        ({"k": None}, r"metadata\[1\]\['k'\]: None"),
        ({"k": {"a": "b"}}, r"metadata\[1\]\['k'\]: dict"),
        ({"k": {"a", "b"}}, r"metadata\[1\]\['k'\]: set"),
        ({"k": ["a", 1]}, r"metadata\[1\]\['k'\]\[1\]: a list in metadata holds strings only"),
        ({"k": [None]}, r"metadata\[1\]\['k'\]\[0\]"),
        ({"k": 2**63}, r"metadata\[1\]\['k'\]: 9223372036854775808 does not fit"),
        ({"k": np.uint64(2**64 - 1)}, r"does not fit"),
        ({"k": float("nan")}, r"metadata\[1\]\['k'\]: nan is not finite"),
        ({"k": np.float64("inf")}, r"is not finite"),
        ({"k": b"bytes"}, r"bytes is not a metadata value"),
        ({"k": np.datetime64("2020-01-01")}, r"NumPy datetime64"),
        ({1: "a"}, r"metadata\[1\]: key 1 is a int, not a str"),
    ]
    for value, message in bad:
        with pytest.raises(ValueError, match=message):
            P.as_metadata([{"ok": "yes"}, value], 2)


def test_checking_metadata_is_cheap_for_a_large_upload() -> None:
    import time

    rows = [{"title": f"t{i}", "year": 2000 + i % 30, "score": i / 7, "draft": i % 2 == 0} for i in range(100_000)]
    started = time.perf_counter()
    P.as_metadata(rows, len(rows))
    assert time.perf_counter() - started < 0.5  # ~30 ms here; uploading these rows takes seconds


# -- splitting uploads --------------------------------------------------------------------


@pytest.mark.parametrize(
    "rows_max, bytes_max, piece_rows_max",
    [(4000, 8 * 1024 * 1024, 256), (7, 10**9, 3), (1000, 5_000, 256), (1, 10**9, 256), (50, 10**9, 1)],
)
def test_batches_cover_every_row_once_within_their_bounds(rows_max: int, bytes_max: int, piece_rows_max: int) -> None:
    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((1234, 16), dtype=np.float32)
    metadata = [{"i": str(i)} if i % 3 else None for i in range(1234)]
    upload = P.Upload(matrix, np.arange(1234) * 7, metadata)
    seen = []
    one_row_bytes = len(upload.body(0, 1))
    for batch in P.iter_batches(upload, rows_max, bytes_max, piece_rows_max):
        assert 1 <= len(batch) <= rows_max
        assert len(batch.body) <= max(bytes_max, one_row_bytes * piece_rows_max + 32)
        items = orjson.loads(batch.body)["embeddings"]
        assert [item["id"] for item in items] == [7 * i for i in range(batch.lo, batch.hi)]
        got = np.array([item["data"] for item in items], dtype=np.float32)
        assert bits(got).tolist() == bits(matrix[batch.lo : batch.hi]).tolist()
        assert [item.get("metadata") for item in items] == metadata[batch.lo : batch.hi]
        seen.extend(range(batch.lo, batch.hi))
    assert seen == list(range(1234))


def test_an_upload_result_says_which_rows_the_server_answered_for() -> None:
    skipped = [Skipped(7, "expected 2 dimensions, got 3")]
    outcomes = [(500, 1000, 500, []), (0, 250, 249, skipped), (250, 500, 250, []), (1500, 2000, 500, [])]
    error = error_for(400, "INVALID_REQUEST_BODY", "Bad request")
    with pytest.raises(InvalidRequestError) as failed:
        P.tally_writes(outcomes, 2000, error)
    result = failed.value.result
    assert result == WriteResult(2000, 1499, skipped, [(0, 1000), (1500, 2000)])
    assert sum(hi - lo for lo, hi in result.stored_ranges) - len(result.skipped) == result.stored
    # Built without ranges: all of the input when every row was answered for.
    assert WriteResult(3, 2, skipped).stored_ranges == [(0, 3)]
    assert WriteResult(3, 2, []).stored_ranges == [] and WriteResult(0, 0, []).stored_ranges == []


def test_byte_bound_cuts_bodies_near_it() -> None:
    upload = P.Upload(np.random.default_rng(0).standard_normal((2000, 64), dtype=np.float32), np.arange(2000), None)
    sizes = [len(b.body) for b in P.iter_batches(upload, 100_000, 200_000, 256)]
    assert len(sizes) > 5
    assert max(sizes) <= 200_000
    assert min(sizes[:-1]) > 200_000 * 0.6  # not needlessly small


def test_smaller_chunk_follows_what_the_server_names() -> None:
    def invalid(detail: str) -> QuiverError:
        return error_for(400, "INVALID_REQUEST_BODY", "Bad request", "invalid", detail)

    assert P.smaller_chunk(invalid("embeddings: at most 3 per request"), 10) == 3
    assert P.smaller_chunk(invalid("ids: at most 500 per request"), 1000) == 500
    assert P.smaller_chunk(invalid("searches: expected 1 to 2 searches"), 5) == 2
    assert P.smaller_chunk(invalid("k: expected an integer from 1 to 10000"), 5) is None
    too_large = error_for(413, "REQUEST_TOO_LARGE", "Request too large", "the request body is larger")
    assert P.smaller_chunk(too_large, 9) == 4
    assert P.smaller_chunk(too_large, 1) is None
    reply = error_for(400, "REPLY_TOO_LARGE", "Reply too large", "...; ask for at most 7 ids per request)")
    assert P.smaller_chunk(reply, 100) == 7
    assert P.smaller_chunk(error_for(400, "REPLY_TOO_LARGE", "Reply too large", "no number"), 100) == 50
    assert P.smaller_chunk(error_for(500, "INDEX_NOT_FETCHED", "x"), 100) is None


def test_a_search_batch_too_large_for_a_reply_is_cut_by_the_hits_that_fit() -> None:
    # The server's descriptions, as written by src/api/error.rs.
    def too_large(tail: str) -> QuiverError:
        text = "the reply would take up to 700000 bytes, more than the 65536 one reply may (--reply-bytes-max); " + tail
        return error_for(400, "REPLY_TOO_LARGE", "Reply too large", text)

    fit_425 = too_large("ask for at most 425 hits in all (a smaller k, or fewer searches) per request")
    assert P.fewer_searches(fit_425, [40] * 200) == 10  # hits in all, divided by k
    assert P.fewer_searches(fit_425, [100, 300, 26, 1]) == 2  # each search its own k
    assert P.fewer_searches(fit_425, [500, 1, 1]) == 1  # the first alone, once: fewer than k rows may match
    assert P.fewer_searches(fit_425, [500]) is None
    assert P.fewer_searches(fit_425, [1, 1, 1]) == 1  # "fits" all: the estimate moved; half
    none_fit = too_large("not even one of the hits in all (a smaller k, or fewer searches) fits")
    assert P.fewer_searches(none_fit, [10] * 50) is None  # no number of searches fits: at once
    assert P.fewer_searches(error_for(400, "INVALID_REQUEST_BODY", "Bad", "x", "searches: expected 1 to 3 searches"), [1] * 9) == 3
    ids_fit = too_large("ask for at most 7 ids per request")
    assert P.smaller_chunk(ids_fit, 100) == 7
    assert P.smaller_chunk(fit_425, 1000) == 500  # hits are not ids


def test_search_batch_objects_take_their_own_options_or_the_calls() -> None:
    plain = P.batch_searches(np.ones((2, 3)), 5, {"a": "b"}, True, False)
    assert [(s["k"], s["filter"], s["include"]) for s in plain] == [(5, {"a": "b"}, ["score"])] * 2
    own = P.batch_searches(
        [Search([1, 2, 3]), Search(np.ones(3), 2, filter={}, with_scores=False, with_vectors=True)],
        5,
        {"a": "b"},
        True,
        False,
    )
    assert (own[0]["k"], own[0]["filter"], own[0]["include"]) == (5, {"a": "b"}, ["score"])
    assert (own[1]["k"], own[1]["filter"], own[1]["include"]) == (2, {}, ["data"])
    assert own[0]["queryVector"].dtype == np.float32
    with pytest.raises(ValueError, match=r"searches\[1\].vector"):
        P.batch_searches([Search([1.0]), Search([np.nan])], 1, None, True, False)
    with pytest.raises(TypeError, match=r"searches\[1\]"):
        P.batch_searches([Search([1.0]), [1.0]], 1, None, True, False)


# -- envelopes and errors -------------------------------------------------------------------


def test_error_classes_follow_the_code_and_keep_every_field() -> None:
    cases = {
        ("NO_API_KEY_PROVIDED", 401): AuthenticationError,
        ("INVALID_API_KEY", 401): AuthenticationError,
        ("INVALID_REQUEST_BODY", 400): InvalidRequestError,
        ("INDEX_NOT_FETCHED", 500): IndexNotFoundError,
        ("INDEX_NOT_DELETED", 500): IndexNotFoundError,
        ("INVALID_SIMILARITY_METRIC", 500): IndexNotCreatedError,
        ("REPLY_TOO_LARGE", 400): ReplyTooLargeError,
        ("REQUEST_TOO_LARGE", 413): RequestTooLargeError,
        ("TOO_MANY_CONNECTIONS", 503): UnavailableError,
        ("SOMETHING_NEW", 503): UnavailableError,
        ("SOMETHING_NEW", 418): QuiverError,
    }
    for (code, status), cls in cases.items():
        error = P.decode_reply(
            status,
            orjson.dumps({"status": status, "message": "m", "error": {"code": code, "description": "d", "detail": "x"}}),
        ).error()
        assert type(error) is cls
        assert (error.status, error.code, error.message, error.description, error.detail) == (status, code, "m", "d", "x")
    exists = error_for(500, "INDEX_NOT_CREATED", "An error occurred while creating the index.", "index 'abc' already exists")
    assert isinstance(exists, IndexExistsError) and isinstance(exists, IndexNotCreatedError)
    text = str(error_for(400, "INVALID_REQUEST_BODY", "Bad request", "The body is invalid.", "k: expected an integer"))
    assert text == "400 INVALID_REQUEST_BODY: Bad request (The body is invalid.) [detail: k: expected an integer]"


def test_a_reply_that_is_not_an_envelope_becomes_an_error_with_its_text() -> None:
    reply = P.decode_reply(502, b"<html>Bad Gateway</html>")
    error = reply.error()
    assert error.status == 502 and error.code is None and "Bad Gateway" in error.message


def test_skipped_items_are_read_from_the_descriptions() -> None:
    skipped = P.parse_skipped(
        [
            "embedding with ID 2 was not inserted - an all-zero vector has no direction in a cosine index",
            "embedding with ID -9223372036854775808 was not upserted - expected 3 dimensions, got 2",
            "something else entirely",
        ]
    )
    assert skipped == [
        Skipped(2, "an all-zero vector has no direction in a cosine index"),
        Skipped(-(2**63), "expected 3 dimensions, got 2"),
        Skipped(None, "something else entirely"),
    ]


def test_deleted_ids_are_the_asked_ones_less_the_skipped_as_a_multiset() -> None:
    reply = P.Reply(
        500,
        "1/3 embeddings successfully deleted.",
        None,
        "EMBEDDINGS_SKIPPED",
        [
            "embedding with ID 7 was not deleted - embedding with ID 7 does not exist",
            "embedding with ID 1 was not deleted - embedding with ID 1 does not exist",
        ],
    )
    deleted, skipped = P.deleted_outcome([1, 7, 1], reply)
    assert deleted == [1]
    assert [s.id for s in skipped] == [7, 1]
    assert P.deleted_outcome([4, 5], P.Reply(200, "2/2 embeddings successfully deleted.")) == ([4, 5], [])


def test_hits_are_ordered_by_rank_with_exact_float32_scores() -> None:
    data = orjson.loads(
        b'{"nearest_neighbors": {"9": {"metadata": {}, "rank": 1, "score": 0.1, "data": [0.1, 2.0]},'
        b' "3": {"metadata": {"a": "b"}, "rank": 0, "score": 0.99602383, "data": [1e-45, -0.0]}}}'
    )
    hits = P.parse_hits(data)
    assert [h.id for h in hits] == [3, 9]
    assert hits[0].score == float(np.float32(0.99602383)) and hits[1].score == float(np.float32(0.1))
    assert hits[0].vector is not None and bits(hits[0].vector).tolist() == bits(np.array([1e-45, -0.0])).tolist()
    infinite = P.parse_hits({"nearest_neighbors": {"1": {"metadata": {}, "rank": 0, "score": None}}})
    assert infinite[0].score is None
    # An infinite distance sorts last: a null after finite scores stays None (not NaN).
    after = P.parse_hits(
        {"nearest_neighbors": {"1": {"metadata": {}, "rank": 0, "score": 0.2}, "2": {"metadata": {}, "rank": 1, "score": None}}}
    )
    assert after[0].score == float(np.float32(0.2)) and after[1].score is None


# -- retries ---------------------------------------------------------------------------------


def test_retry_delays_grow_stay_jittered_and_stop_at_their_bounds() -> None:
    policy = RetryPolicy(retries_max=5, backoff_s=0.1, backoff_max_s=0.4, time_max_s=10.0)
    rng = random.Random(4)
    for retry, bound in enumerate([0.1, 0.2, 0.4, 0.4, 0.4]):
        delays = [policy.delay_s(retry, 0.0, rng) for _ in range(200)]
        assert all(d is not None and 0.0 <= d <= bound for d in delays)
        assert max(d for d in delays if d is not None) > bound * 0.8  # jitter spans the range
    assert policy.delay_s(5, 0.0, rng) is None  # count bound
    assert policy.delay_s(0, 10.0, rng) is None  # time bound
    assert RetryPolicy(retries_max=0).delay_s(0, 0.0) is None


def test_only_failures_without_an_answer_are_retryable_transport_errors() -> None:
    from quiver_vectors._retry import RETRYABLE_TRANSPORT_ERRORS

    for exc in (httpx.ConnectError("x"), httpx.ReadError("x"), httpx.RemoteProtocolError("x"), httpx.ConnectTimeout("x")):
        assert isinstance(exc, RETRYABLE_TRANSPORT_ERRORS)
    for exc in (httpx.ReadTimeout("x"), httpx.WriteTimeout("x"), httpx.PoolTimeout("x")):
        assert not isinstance(exc, RETRYABLE_TRANSPORT_ERRORS)


# -- the wire path's HTTP -------------------------------------------------------------------


def test_request_head_and_reply_head() -> None:
    head = request_head("POST", "/api/v1/x", "127.0.0.1:8080", b"A: b\r\n", 12)
    assert head == b"POST /api/v1/x HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nA: b\r\nContent-Length: 12\r\n\r\n"
    assert parse_head(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length: 66") == (200, 66, True)
    assert parse_head(b"HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Length: 5") == (413, 5, False)
    assert parse_head(b"HTTP/1.0 200 OK\r\nContent-Length: 5") == (200, 5, False)
    assert parse_head(b"HTTP/1.1 200 OK") == (200, None, False)
    for bad in (b"SSH-2.0", b"HTTP/1.1 abc OK", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked"):
        with pytest.raises(httpx.RemoteProtocolError):
            parse_head(bad)
