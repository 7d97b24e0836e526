"""Everything about quiver's HTTP/JSON API that is not I/O: pure functions.

The sync and async clients differ only in how bytes travel; what they send and
how they read the answer is the same, so it lives here once: paths, request
bodies (as bytes, ready to send), the reading of envelopes into results or
exceptions, the conversion of vectors to and from NumPy, and the splitting of
uploads into requests. Nothing here touches a socket, so all of it can be
tested without a server.

Exactness: vectors are sent as float32 values written by orjson in the
shortest decimal form that reads back to the same float32, and the server
rounds that text once to the nearest float32: the stored bits are the bits the
caller had. Values read back are parsed as float64 and cast to float32; the
text is the shortest that identifies a float32, and float64 has more than
twice float32's precision, so that double rounding cannot change the value.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

import numpy as np
import orjson

from ._errors import (
    InvalidRequestError,
    QuiverError,
    ReplyTooLargeError,
    RequestTooLargeError,
    error_for,
)
from ._types import (
    ClusterMember,
    ClusterStatus,
    Health,
    Hit,
    IndexStats,
    Metadata,
    Retrieved,
    Row,
    Search,
    Skipped,
    WriteResult,
)

API_PREFIX = "/api/v1"
METRICS_PATH = "/metrics"

#: orjson writes NumPy arrays natively (a float32 array as shortest float32
#: text), without a Python float per value: the difference between an upload
#: bound by Python and one bound by the network.
_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY

ID_MIN = -(2**63)
ID_MAX = 2**63 - 1

EMBEDDINGS_SKIPPED = "EMBEDDINGS_SKIPPED"

VectorsLike = Union[np.ndarray, Sequence[float], Sequence[Sequence[float]]]
IdsLike = Union[int, Sequence[int], np.ndarray]
Filter = Mapping[str, Any]


def dumps(value: Any) -> bytes:
    """JSON bytes of a request body (NumPy arrays written natively)."""
    return orjson.dumps(value, option=_DUMPS_OPTIONS)


# -- Paths ---------------------------------------------------------------------------


def _quote_name(name: str) -> str:
    # A name is [a-z0-9-] on the server; quoting keeps any other string from
    # reaching another path (it then names no index, and the server says so).
    if not isinstance(name, str):
        raise TypeError(f"an index name is a string, not {type(name).__name__}")
    return quote(name, safe="")


def with_consistency(path: str, consistency: Optional[str]) -> str:
    """The read path with `?consistency=` when one is asked (clusters only)."""
    return path if consistency is None else f"{path}?consistency={quote(consistency, safe='')}"


def index_path(name: str, action: str) -> str:
    return f"{API_PREFIX}/indexes/{_quote_name(name)}/{action}"


def embeddings_path(name: str, action: str) -> str:
    return f"{API_PREFIX}/embeddings/{_quote_name(name)}/{action}"


def api_path(tail: str) -> str:
    return f"{API_PREFIX}/{tail}"


# -- Envelopes -------------------------------------------------------------------------


class Reply:
    """One answer, read from its envelope."""

    __slots__ = ("status", "message", "data", "code", "description", "detail")

    def __init__(
        self,
        status: int,
        message: str,
        data: Any = None,
        code: Optional[str] = None,
        description: Any = None,
        detail: Optional[str] = None,
    ) -> None:
        self.status = status
        self.message = message
        self.data = data
        self.code = code
        self.description = description
        self.detail = detail

    def error(self) -> QuiverError:
        return error_for(self.status, self.code, self.message, self.description, self.detail)


def decode_reply(status: int, content: Union[bytes, bytearray]) -> Reply:
    """Reads an envelope; an answer that is not one (a proxy's page) keeps its text as message."""
    try:
        envelope = orjson.loads(content)
    except orjson.JSONDecodeError:
        envelope = None
    if not isinstance(envelope, dict):
        text = content[:200].decode("utf-8", "replace").strip()
        return Reply(status, f"not a quiver reply: {text!r}")
    error = envelope.get("error")
    if isinstance(error, dict):
        return Reply(
            status,
            envelope.get("message", ""),
            envelope.get("data"),
            error.get("code"),
            error.get("description"),
            error.get("detail"),
        )
    return Reply(status, envelope.get("message", ""), envelope.get("data"))


def check(reply: Reply, *, skipped_ok: bool = False) -> Reply:
    """The reply if it succeeded (or, with `skipped_ok`, applied part); else its exception."""
    if reply.status == 200 and reply.code is None:
        return reply
    if skipped_ok and reply.code == EMBEDDINGS_SKIPPED:
        return reply
    raise reply.error()


_SKIPPED = re.compile(r"embedding with ID (-?\d+) was not \w+ - (.*)", re.DOTALL)


def parse_skipped(description: Any) -> List[Skipped]:
    """The items of an EMBEDDINGS_SKIPPED answer: one `Skipped` per description.

    The server gives each as text, `embedding with ID N was not inserted -
    REASON`; the id and reason are read from it. Text in another form is kept
    whole as the reason, so nothing the server said is dropped.
    """
    if description is None:
        return []
    items = description if isinstance(description, list) else [description]
    skipped = []
    for text in items:
        text = str(text)
        match = _SKIPPED.fullmatch(text)
        if match is None:
            skipped.append(Skipped(None, text))
        else:
            skipped.append(Skipped(int(match.group(1)), match.group(2)))
    return skipped


# -- Vectors in --------------------------------------------------------------------------


def as_matrix(vectors: VectorsLike) -> np.ndarray:
    """A batch of vectors as one C-contiguous 2-D float32 array, every value finite.

    1-D is one vector; 2-D or more is a batch whose last axis is the dimensions
    (reshaped to ``(-1, dims)``). Any real dtype converts to float32 (to nearest).
    """
    array = _as_float32(vectors, "vectors")
    if array.ndim == 0:
        raise ValueError("vectors: expected one vector (1-D) or a batch (2-D or more), got a scalar")
    if array.ndim == 1:
        array = array.reshape(1, -1) if array.size else array.reshape(0, 0)
    elif array.ndim > 2:
        array = array.reshape(-1, array.shape[-1])
    array = np.ascontiguousarray(array)
    _check_finite(array, "vectors")
    return array


def as_query(vector: VectorsLike, what: str = "vector") -> np.ndarray:
    """One query vector as a C-contiguous 1-D float32 array, every value finite."""
    array = _as_float32(vector, what)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        raise ValueError(f"{what}: expected one vector (1-D), got shape {array.shape}")
    array = np.ascontiguousarray(array)
    _check_finite(array, what)
    return array


def _as_float32(values: Any, what: str) -> np.ndarray:
    try:
        array = np.asarray(values)
    except ValueError as exc:  # ragged nested lists
        raise ValueError(f"{what}: not a regular array of numbers ({exc})") from None
    if array.dtype.kind == "O":  # ragged rows (older NumPy makes these objects), or not numbers
        raise ValueError(f"{what}: not a regular array of numbers")
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{what}: expected real numbers, got dtype {array.dtype}")
    if array.dtype != np.float32:
        # Values past float32's range become inf here and are refused below
        # with a message that says so, instead of a warning.
        with np.errstate(over="ignore"):
            array = array.astype(np.float32)
    return array


def _check_finite(array: np.ndarray, what: str) -> None:
    # NaN propagates through min and max, and an infinity is one of them: two
    # passes at memory speed, without a boolean array as large as the input.
    if array.size == 0 or (np.isfinite(array.min()) and np.isfinite(array.max())):
        return
    finite = np.isfinite(array)
    where = tuple(int(i) for i in np.argwhere(~finite)[0])
    place = "".join(f"[{i}]" for i in where)
    raise ValueError(
        f"{what}{place} is {array[where]} as float32: NaN, infinity and values beyond "
        "float32's range (about 3.4e38) cannot be stored or searched"
    )


def as_ids(ids: IdsLike, count: Optional[int] = None) -> List[int]:
    """Ids as Python ints (`count` of them, if given), each a 64-bit signed integer."""
    if isinstance(ids, (int, np.integer)) and not isinstance(ids, bool):
        ids = [int(ids)]
    try:
        array = np.asarray(ids)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"ids: not a flat sequence of integers ({exc})") from None
    if array.size == 0:
        array = array.astype(np.int64)
    if array.ndim != 1:
        raise ValueError(f"ids: expected a flat sequence, got shape {array.shape}")
    if array.dtype.kind == "O":
        values = list(array)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise TypeError("ids: expected integers")
        if values and (min(values) < ID_MIN or max(values) > ID_MAX):
            raise ValueError("ids: each id must be a 64-bit signed integer")
        listed = [int(v) for v in values]
    elif array.dtype.kind in "iu":
        if array.dtype.kind == "u" and array.size and int(array.max()) > ID_MAX:
            raise ValueError("ids: each id must be a 64-bit signed integer")
        listed = array.tolist()
    else:
        raise TypeError(f"ids: expected integers, got dtype {array.dtype}")
    if count is not None and len(listed) != count:
        raise ValueError(f"ids: {len(listed)} ids for {count} vectors")
    return listed


def as_metadata(metadata: Any, count: int) -> Optional[List[Optional[Metadata]]]:
    """Metadata per row (a mapping or None each), or None for none at all; every value checked.

    A value is what the server stores (see `check_metadata_value`); anything
    else raises `ValueError` naming the row and key, here, before any request
    is sent: an upload cut into requests must not fail part-way through for a
    value its encoder or the server would refuse.
    """
    if metadata is None:
        return None
    if isinstance(metadata, Mapping):
        metadata = [metadata]
    if not isinstance(metadata, Sequence) or isinstance(metadata, (str, bytes)):
        raise TypeError("metadata: expected a sequence with one mapping (or None) per vector")
    if len(metadata) != count:
        raise ValueError(f"metadata: {len(metadata)} entries for {count} vectors")
    rows: List[Optional[Metadata]] = []
    for i, entry in enumerate(metadata):
        if entry is None:
            rows.append(None)
            continue
        copied = type(entry) is not dict
        if copied:
            if not isinstance(entry, Mapping):
                raise TypeError(f"metadata[{i}]: expected a mapping or None, got {type(entry).__name__}")
            entry = dict(entry)  # the encoder writes dicts only
        converted: Optional[Dict[str, Any]] = None
        # The common values (str, bool, an int or a float in range) are
        # checked inline: this loop runs for every row of an upload.
        for key, value in entry.items():
            kind = type(value)
            if type(key) is str and (
                kind is str
                or kind is bool
                or (kind is int and ID_MIN <= value <= ID_MAX)
                or (kind is float and math.isfinite(value))
            ):
                continue
            if type(key) is not str:
                raise ValueError(f"metadata[{i}]: key {key!r} is a {type(key).__name__}, not a str")
            checked = check_metadata_value(value, i, key)
            if checked is not value:
                if converted is None:
                    converted = entry if copied else dict(entry)  # the caller's mapping is left as it was
                converted[key] = checked
        rows.append(entry if converted is None else converted)
    return rows


def check_metadata_value(value: Any, row: int, key: Any) -> Any:
    """A metadata value as sent, or `ValueError` naming its row and key.

    What the server stores: a string, a boolean, a number (an integer as a
    64-bit signed one; a float finite, as JSON has no NaN or infinity and the
    encoder would write them as null), or a list of strings. NumPy scalars are
    converted to the Python value they hold. Not None (the server refuses
    null: leave the key out), nor mappings, sets or other lists.
    """
    place = f"metadata[{row}][{key!r}]"
    if isinstance(value, np.generic) and not isinstance(value, np.str_):
        if isinstance(value, (np.bool_, np.integer, np.floating)):
            value = value.item()
        else:
            raise ValueError(f"{place}: NumPy {type(value).__name__} is not a metadata value")
    if isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        if not ID_MIN <= value <= ID_MAX:
            raise ValueError(f"{place}: {value} does not fit a 64-bit signed integer")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{place}: {value} is not finite (JSON has no NaN or infinity)")
        return value
    if isinstance(value, (list, tuple)):
        for j, item in enumerate(value):
            if not isinstance(item, str):
                raise ValueError(f"{place}[{j}]: a list in metadata holds strings only, not {type(item).__name__}")
        return value
    if value is None:
        raise ValueError(f"{place}: None is not a metadata value (leave the key out instead)")
    raise ValueError(
        f"{place}: {type(value).__name__} is not a metadata value "
        "(expected a string, number, boolean or list of strings)"
    )


# -- Uploads ------------------------------------------------------------------------------


class Upload:
    """The rows of one insert or upsert, checked, ready to be cut into requests."""

    __slots__ = ("ids", "matrix", "metadata")

    def __init__(self, vectors: VectorsLike, ids: IdsLike, metadata: Any) -> None:
        self.matrix = as_matrix(vectors)
        self.ids = as_ids(ids, len(self.matrix))
        self.metadata = as_metadata(metadata, len(self.matrix))

    def __len__(self) -> int:
        return len(self.ids)

    def items(self, lo: int, hi: int) -> bytes:
        """Rows lo..hi as a JSON array of embeddings, ``[{...},...]``.

        One encoder call for all of them: the per-row Python work is a small
        dict, and orjson writes each row's float32 array in C.
        """
        ids, matrix = self.ids[lo:hi], self.matrix[lo:hi]
        if self.metadata is None:
            return dumps([{"id": i, "data": row} for i, row in zip(ids, matrix)])
        return dumps(
            [
                {"id": i, "data": row} if m is None else {"id": i, "data": row, "metadata": m}
                for i, row, m in zip(ids, matrix, self.metadata[lo:hi])
            ]
        )

    def body(self, lo: int, hi: int) -> bytes:
        """The request body for rows lo..hi."""
        return join_body([self.items(lo, hi)])

    def has_repeats(self) -> bool:
        """Whether an id appears more than once (the server keeps the last one it is sent)."""
        return len(set(self.ids)) < len(self.ids)


class Batch:
    """One request of an upload: rows lo..hi and their body."""

    __slots__ = ("lo", "hi", "body")

    def __init__(self, lo: int, hi: int, body: bytes) -> None:
        self.lo = lo
        self.hi = hi
        self.body = body

    def __len__(self) -> int:
        return self.hi - self.lo


_BODY_HEAD = b'{"embeddings":['
_BODY_TAIL = b"]}"


def join_body(pieces: List[bytes]) -> bytes:
    """The request body holding the items of `pieces`, each a JSON array from `Upload.items`.

    Joined once (head, each piece without its brackets, commas, tail): one
    copy of the bytes, no second encoding.
    """
    parts: List[Any] = [_BODY_HEAD]
    for piece in pieces:
        if len(parts) > 1:
            parts.append(b",")
        parts.append(memoryview(piece)[1:-1])  # no copy
    parts.append(_BODY_TAIL)
    return b"".join(parts)


def iter_batches(upload: Upload, rows_max: int, bytes_max: int, piece_rows_max: int) -> Iterator[Batch]:
    """Cuts an upload into request bodies of at most `rows_max` rows and about `bytes_max` bytes.

    Rows are encoded in pieces of at most `piece_rows_max` rows, whose sizes
    are then known exactly, and pieces are joined into bodies while both
    bounds hold. A single piece larger than `bytes_max` is still sent (as one
    body); the server's own limit is far above the default, and a 413 is
    answered by splitting.
    """
    if rows_max < 1 or bytes_max < 1 or piece_rows_max < 1:
        raise ValueError("batch bounds must be at least 1")
    total = len(upload)
    if total == 0:
        return
    # Pieces: as many rows as fit in an eighth of the byte bound (judged by the
    # first row), so a body usually holds several pieces and ends near its
    # bound; rows_max divided evenly, so bodies are not left with a stub.
    row_bytes = len(upload.items(0, 1))
    by_bytes = max(1, bytes_max // (8 * row_bytes))
    pieces_per_body = -(-rows_max // min(piece_rows_max, rows_max, by_bytes))
    piece_rows = max(1, -(-rows_max // pieces_per_body))

    pieces: List[bytes] = []
    lo = rows = 0
    size = len(_BODY_HEAD) + len(_BODY_TAIL)  # of the body joined from `pieces`
    for start in range(0, total, piece_rows):
        stop = min(start + piece_rows, total)
        piece = upload.items(start, stop)
        if rows and (rows + (stop - start) > rows_max or size + len(piece) - 1 > bytes_max):
            yield Batch(lo, start, join_body(pieces))
            pieces, lo, rows, size = [], start, 0, len(_BODY_HEAD) + len(_BODY_TAIL)
        pieces.append(piece)
        rows += stop - start
        size += len(piece) - 1  # without its brackets, with a comma
    yield Batch(lo, total, join_body(pieces))


#: One answered request of an upload: its rows lo..hi, how many were stored, those skipped.
Outcome = Tuple[int, int, int, List[Skipped]]


def first_error(done: Any, error: Optional[QuiverError]) -> Optional[QuiverError]:
    """The first error among finished futures or tasks, if none was seen before.

    Anything but a `QuiverError` (a bug, an interrupt) is raised at once.
    """
    for future in done:
        exc = future.exception()
        if exc is None or error is not None:
            continue
        if not isinstance(exc, QuiverError):
            raise exc
        error = exc
    return error


def tally_writes(outcomes: List[Outcome], requested: int, error: Optional[QuiverError]) -> WriteResult:
    """The result of an upload from its answered requests; with an error, raises it carrying the result."""
    outcomes.sort(key=lambda o: o[0])
    ranges: List[Tuple[int, int]] = []
    for lo, hi, _, _ in outcomes:
        if ranges and ranges[-1][1] == lo:
            ranges[-1] = (ranges[-1][0], hi)
        else:
            ranges.append((lo, hi))
    stored = sum(o[2] for o in outcomes)
    skipped = [s for o in outcomes for s in o[3]]
    result = WriteResult(requested, stored, skipped, ranges)
    if error is not None:
        error.result = result
        raise error
    return result


def write_outcome(reply: Reply, requested: int) -> Tuple[int, List[Skipped]]:
    """Rows stored and rows skipped by one insert or upsert answer."""
    skipped = parse_skipped(reply.description) if reply.code == EMBEDDINGS_SKIPPED else []
    return requested - len(skipped), skipped


# -- Other bodies -----------------------------------------------------------------------


def create_body(dimensions: int, metric: str, p: Optional[float]) -> bytes:
    body: Dict[str, Any] = {"dimensions": dimensions, "metric": metric}
    if p is not None:
        body["p"] = p
    return dumps(body)


def include_list(with_scores: bool, with_vectors: bool) -> Optional[List[str]]:
    if with_scores:
        return ["score", "data"] if with_vectors else ["score"]
    return ["data"] if with_vectors else None


def search_object(query: np.ndarray, k: int, include: Optional[List[str]], filter: Optional[Filter]) -> Dict[str, Any]:
    search: Dict[str, Any] = {"queryVector": query, "k": k}
    if include is not None:
        search["include"] = include
    if filter is not None:
        search["filter"] = filter
    return search


def search_body(query: np.ndarray, k: int, include: Optional[List[str]], filter: Optional[Filter]) -> bytes:
    return dumps(search_object(query, k, include, filter))


def batch_searches(
    searches: Union[VectorsLike, Sequence[Search]],
    k: int,
    filter: Optional[Filter],
    with_scores: bool,
    with_vectors: bool,
) -> List[Dict[str, Any]]:
    """The search objects of a search batch, ready to encode: one per vector, or one per `Search`.

    A `Search`'s options left None take the call's.
    """
    if isinstance(searches, (list, tuple)) and any(isinstance(s, Search) for s in searches):
        objects = []
        for i, s in enumerate(searches):
            if not isinstance(s, Search):
                raise TypeError(f"searches[{i}]: expected a Search like the others, got {type(s).__name__}")
            include = include_list(
                with_scores if s.with_scores is None else s.with_scores,
                with_vectors if s.with_vectors is None else s.with_vectors,
            )
            query = as_query(s.vector, f"searches[{i}].vector")
            objects.append(
                search_object(query, k if s.k is None else s.k, include, filter if s.filter is None else s.filter)
            )
        return objects
    include = include_list(with_scores, with_vectors)
    return [search_object(q, k, include, filter) for q in as_matrix(searches)]  # type: ignore[arg-type]


def search_batch_body(searches: List[Dict[str, Any]]) -> bytes:
    return dumps({"searches": searches})


def ids_body(ids: Sequence[int]) -> bytes:
    return dumps({"ids": ids})


def filter_body(filter: Filter) -> bytes:
    if not isinstance(filter, Mapping):
        raise TypeError("filter: expected a mapping (use {} to match every row)")
    return dumps({"filter": filter})


def scroll_body(limit: int, after: Optional[int], filter: Optional[Filter], with_vectors: bool) -> bytes:
    body: Dict[str, Any] = {"limit": limit}
    if after is not None:
        body["after"] = after
    if filter is not None:
        body["filter"] = filter
    if with_vectors:
        body["include"] = ["data"]
    return dumps(body)


def member_body(id: int, address: str) -> bytes:
    return dumps({"id": id, "address": address})


_COUNT_LIMITS = (
    re.compile(r"(?:embeddings|ids): at most (\d+) per request"),
    re.compile(r"searches: expected 1 to (\d+) searches"),
)
# The server's REPLY_TOO_LARGE descriptions: "...; ask for at most N ids per
# request" (retrieve), "...; ask for at most N hits in all (a smaller k, or
# fewer searches) per request" (search batch), "...; not even one of the ...
# fits" when N would be 0.
_IDS_FIT = re.compile(r"ask for at most (\d+) ids")
_HITS_FIT = re.compile(r"ask for at most (\d+) hits in all")
_NONE_FITS = "not even one of the"


def smaller_chunk(error: QuiverError, size: int) -> Optional[int]:
    """A smaller number of items per request that the server may take, or None.

    The server's limits are flags the client cannot ask about, so a request
    of `size` items that meets one is sent again smaller: the number the
    server names where it names one (`--items-max`, `--search-batch-max`, how
    many ids fit a reply), else half (a body past `--body-bytes-max`, a reply
    past `--reply-bytes-max`: the server's figure is from the average row, so
    even "not even one fits" may not hold for every row). None when smaller
    would not help.
    """
    if size <= 1:
        return None
    if isinstance(error, InvalidRequestError) and error.detail:
        for pattern in _COUNT_LIMITS:
            match = pattern.fullmatch(error.detail)
            if match is not None:
                limit = int(match.group(1))
                return limit if 1 <= limit < size else None
        return None
    if isinstance(error, ReplyTooLargeError):
        match = _IDS_FIT.search(str(error.description or ""))
        if match is not None and 1 <= int(match.group(1)) < size:
            return int(match.group(1))
        return size // 2
    if isinstance(error, RequestTooLargeError):
        return size // 2
    return None


def fewer_searches(error: QuiverError, ks: Sequence[int]) -> Optional[int]:
    """How many of a refused request's searches (with these `k`s) to send in one request, or None.

    A reply too large names the hits that fit in all, not searches: the
    searches sent are those whose k's add up to at most that. When the server
    says not even one hit fits, no number of searches does: None, at once.
    When the first search's k alone is more than fit, that search is tried
    alone once (it fits if fewer than k rows match), and raises if refused.
    Other refusals are as `smaller_chunk`.
    """
    if not isinstance(error, ReplyTooLargeError):
        return smaller_chunk(error, len(ks))
    description = str(error.description or "")
    match = _HITS_FIT.search(description)
    if match is None:
        return None if _NONE_FITS in description else smaller_chunk(error, len(ks))
    room = int(match.group(1))
    count = 0
    for k in ks:
        room -= k
        if room < 0:
            break
        count += 1
    if count >= len(ks):  # the server's estimate moved between its checks
        count = len(ks) // 2
    if count == 0:
        return 1 if len(ks) > 1 else None
    return count


# -- Results out -------------------------------------------------------------------------


def _float32_rows(rows: List[List[float]]) -> np.ndarray:
    # One conversion for all rows; float64 -> float32 is exact for this text
    # (see the module doc).
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    return np.array(rows, dtype=np.float32)


def parse_hits(data: Any) -> List[Hit]:
    """The hits of one search, nearest first."""
    neighbors: Dict[str, Dict[str, Any]] = data["nearest_neighbors"]
    hits = [
        Hit(int(key), value["rank"], value.get("score"), value["metadata"], value.get("data"))
        for key, value in neighbors.items()
    ]
    # The server writes hits in rank order; a JSON object promises no order,
    # so the order is taken from the ranks, not from the text.
    hits.sort(key=_rank)
    scores = [h.score for h in hits]
    if scores and scores[0] is not None and None not in scores:
        # Scores are float32 on the server: make each Python float exactly it.
        for hit, score in zip(hits, np.array(scores, dtype=np.float32).tolist()):
            hit.score = score
    else:  # none asked for, or an infinite distance (null): None stays None
        for hit in hits:
            if hit.score is not None:
                hit.score = float(np.float32(hit.score))
    if hits and hits[0].vector is not None:
        for hit, row in zip(hits, _float32_rows([h.vector for h in hits])):  # type: ignore[misc]
            hit.vector = row
    return hits


def _rank(hit: Hit) -> int:
    return hit.rank


def parse_search_batch(data: Any) -> List[List[Hit]]:
    return [parse_hits(result) for result in data["results"]]


def parse_retrieved(reply: Reply) -> Tuple[List[int], np.ndarray, List[Metadata], List[int]]:
    """Found ids, their vectors (2-D), metadata, and the ids reported missing."""
    rows = (reply.data or {}).get("embeddings", [])
    ids = [row["id"] for row in rows]
    vectors = _float32_rows([row["data"] for row in rows])
    metadata = [row.get("metadata") or {} for row in rows]
    missing: List[int] = []
    if reply.code == EMBEDDINGS_SKIPPED:
        missing = [s.id for s in parse_skipped(reply.description) if s.id is not None]
    return ids, vectors, metadata, missing


def join_retrieved(parts: List[Tuple[List[int], np.ndarray, List[Metadata], List[int]]]) -> Retrieved:
    ids: List[int] = []
    metadata: List[Metadata] = []
    missing: List[int] = []
    arrays = []
    for part_ids, part_vectors, part_metadata, part_missing in parts:
        ids += part_ids
        metadata += part_metadata
        missing += part_missing
        if part_ids:
            arrays.append(part_vectors)
    vectors = np.concatenate(arrays) if arrays else np.zeros((0, 0), dtype=np.float32)
    return Retrieved(ids, vectors, metadata, missing)


def deleted_outcome(ids: Sequence[int], reply: Reply) -> Tuple[List[int], List[Skipped]]:
    """Ids deleted and ids skipped by one delete answer.

    The server lists only what it skipped; the deleted ids are those asked
    for less those, counted as a multiset (an id listed twice is deleted once
    and skipped once).
    """
    if reply.code != EMBEDDINGS_SKIPPED:
        return list(ids), []
    skipped = parse_skipped(reply.description)
    left = Counter(s.id for s in skipped if s.id is not None)
    asked = Counter(ids)
    keep = {i: asked[i] - left.get(i, 0) for i in asked}
    deleted = []
    # The first occurrence of an id listed twice is the one deleted; the
    # server reports the later one as not existing any more.
    for i in ids:
        if keep[i] > 0:
            deleted.append(i)
            keep[i] -= 1
    return deleted, skipped


def parse_scroll(data: Any) -> Tuple[List[Row], Optional[int]]:
    rows = data["embeddings"]
    if rows and "data" in rows[0]:
        vectors = _float32_rows([row["data"] for row in rows])
        page = [Row(row["id"], vector, row.get("metadata") or {}) for row, vector in zip(rows, vectors)]
    else:
        page = [Row(row["id"], None, row.get("metadata") or {}) for row in rows]
    return page, data.get("next")


def parse_stats(data: Any) -> IndexStats:
    return IndexStats(data["index_name"], data["dimensions"], data["metric"], data["count"], data.get("p"))


def parse_health(data: Any) -> Health:
    return Health(data["cpu_usage_percent"], data["mem_usage_percent"], data["uptime"])


def parse_cluster(data: Any) -> ClusterStatus:
    members = [
        ClusterMember(m["id"], m.get("address"), m["voter"], m["reachable"], m.get("match_index"))
        for m in data.get("members", [])
    ]
    return ClusterStatus(
        data.get("node_id"),
        data["role"],
        data["term"],
        data.get("leader_id"),
        data["commit_index"],
        data["applied_index"],
        members,
    )


def parse_member(data: Any) -> ClusterMember:
    return ClusterMember(data["id"], data.get("address"), data.get("voter", True), True, None)
