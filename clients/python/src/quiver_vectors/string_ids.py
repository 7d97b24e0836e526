"""String ids on quiver's integer row ids: where a document's row lives, and how it is found.

quiver keys rows by signed 64-bit integers; LangChain and LlamaIndex key
documents by strings. This module maps one onto the other, for
`langchain-quiver` and `llama-index-vector-stores-quiver` (and any store keyed
by strings); only the metadata key that holds the string differs.

The scheme:

- **The string is the truth.** Every row holds its document's string id in
  its metadata under the id key (`_lc_id`, `_li_id`). Every lookup (get,
  delete, overwrite) finds rows by a filter on that key,
  ``{"_lc_id": {"$in": [...]}}``, which the server answers from its metadata
  index without reading rows. No lookup recomputes a hash.
- **A new document's row id comes from probing.** Probe n of the string s is
  ``slot_hash(s, n)``: by default the first 8 bytes of BLAKE2b of the UTF-8 of
  s (n = 0) or of ``f"{n}\\0{s}"`` (n > 0), read as a big-endian signed
  integer. The row goes to the first probe the server finds free, written
  with ``insert``, which refuses an id that exists: a taken id comes back as
  skipped ("already exists"). The row at that id is then read: if it holds
  the same string (another writer added this document a moment ago), the
  document overwrites it; otherwise the next probe is tried, at most
  `probes_max`.

Why lookups use the filter and not the probe sequence: deleting a row frees
its id, and a probe chain that passes through a freed id would end there
(open addressing's tombstone problem), losing the documents placed beyond it.
The filter finds a row wherever it lives, so any free probe is as good as the
first, deletes need no tombstones, and a delete of up to `LOOKUP_IDS_MAX`
documents is one ``delete_by_filter`` (one durable write).

Writers at once. quiver has no conditional write, so the scheme relies on
``insert`` refusing a taken id. What that covers: two writers adding the same
new document (the second finds its row and overwrites it), and writers whose
new documents collide (each insert refused is re-probed). What it does not:
(1) an overwrite of a document that another writer deletes, after which a
third places a new document on the freed id, all between the overwrite's
lookup and its upsert: the overwrite replaces the newcomer; (2) two writers
adding the same new document while a row on its first probe is deleted: one
may place it on the first probe and the other on the second, leaving two rows
for one id. Both need three writes to interleave within one round trip. A
second row for an id is harmless to reads (the stores keep the lowest row id)
and repaired by the next overwrite (which keeps that row and deletes the
rest) or delete (which removes all).

Everything that talks to the server is written once, as a *plan*: a
generator that yields `Call`s (a client method and its arguments) and
receives each call's result (or has its `QuiverError` thrown in). `run`
carries a plan out on a `Client`, `arun` on an `AsyncClient`, so the sync
and async paths of a store cannot drift apart and neither wraps the other in
a thread.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Callable, Dict, Generator, Iterable, List, Mapping, Optional, Sequence, TypeVar

import numpy as np
from quiver_vectors import AsyncClient, Client, IndexNotFoundError, QuiverError, Row

T = TypeVar("T")

#: ``slot_hash(doc_id, probe) -> row id``: a signed 64-bit integer for each
#: probe 0, 1, 2, ... of a string id.
SlotHash = Callable[[str, int], int]

ROW_ID_MIN = -(2**63)
ROW_ID_MAX = 2**63 - 1

#: Probes tried for a new document before it is reported not stored. With a
#: 64-bit hash a second probe is needed about once per 2^64 / rows new
#: documents (once in 18 billion at a billion rows), so 8 never runs out; the
#: bound only stops a broken injected hash (one that returns taken ids forever)
#: from looping.
PROBES_MAX = 8

#: String ids per lookup filter. The server takes at most 10,000 terms in a
#: filter (`--filter-terms-max`, which counts each value of ``$in``); 1,000
#: keeps well under it and each reply (rows with their metadata, up to 16 KiB
#: each) well under the reply limit.
LOOKUP_IDS_MAX = 1_000


def blake2b_slot(doc_id: str, probe: int) -> int:
    """The default `SlotHash`: BLAKE2b-64 of the id (probe 0) or of ``f"{probe}\\0{id}"``."""
    text = doc_id if probe == 0 else f"{probe}\x00{doc_id}"
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class NotStoredError(ValueError):
    """Some documents were not stored; every other document of the same call was.

    Attributes:
        failures: string id -> why, in the server's words where it gave them
            (e.g. ``"an all-zero vector has no direction in a cosine index"``).
    """

    def __init__(self, failures: Mapping[str, str]) -> None:
        self.failures = dict(failures)
        shown = "; ".join(f"{k!r}: {v}" for k, v in list(self.failures.items())[:3])
        more = len(self.failures) - 3
        super().__init__(
            f"{len(self.failures)} document(s) not stored ({shown}{f'; and {more} more' if more > 0 else ''})"
        )


# -- Plans and their drivers ----------------------------------------------------------------------


class Call:
    """One client call a plan asks for: the method's name and its arguments."""

    __slots__ = ("method", "args", "kwargs")

    def __init__(self, method: str, *args: Any, **kwargs: Any) -> None:
        self.method = method
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"Call({self.method!r}, ...)"


Plan = Generator[Call, Any, T]


def run(plan: "Plan[T]", client: Any) -> T:
    """Carries out a plan on a sync `quiver_vectors.Client`; returns what the plan returns."""
    send: Callable[[Any], Call] = plan.send
    value: Any = None
    while True:
        try:
            call = send(value)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            method = getattr(client, call.method)
            value = method(*call.args, **call.kwargs)
            if call.method == "scroll":
                value = list(value)
            send = plan.send
        except QuiverError as exc:
            value, send = exc, plan.throw  # the plan may handle it; if not, it comes back out


async def arun(plan: "Plan[T]", client: Any) -> T:
    """Carries out a plan on a `quiver_vectors.AsyncClient`; returns what the plan returns."""
    send: Callable[[Any], Call] = plan.send
    value: Any = None
    while True:
        try:
            call = send(value)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            method = getattr(client, call.method)
            if call.method == "scroll":
                value = [row async for row in method(*call.args, **call.kwargs)]
            else:
                value = await method(*call.args, **call.kwargs)
            send = plan.send
        except QuiverError as exc:
            value, send = exc, plan.throw


# -- The plans --------------------------------------------------------------------------------------


def lookup(index: str, key: str, doc_ids: Iterable[str], with_vectors: bool = False) -> "Plan[Dict[str, List[Row]]]":
    """The rows holding each string id, lowest row id first (more than one only after a race)."""
    unique = list(dict.fromkeys(doc_ids))
    found: Dict[str, List[Row]] = {}
    for lo in range(0, len(unique), LOOKUP_IDS_MAX):
        part = unique[lo : lo + LOOKUP_IDS_MAX]
        rows = yield Call("scroll", index, filter={key: {"$in": part}}, with_vectors=with_vectors)
        for row in rows:  # scroll lists rows by ascending id
            found.setdefault(row.metadata.get(key), []).append(row)
    return found


def delete(index: str, key: str, doc_ids: Sequence[str]) -> "Plan[int]":
    """Deletes every row holding one of the string ids; returns how many rows went."""
    unique = list(dict.fromkeys(doc_ids))
    deleted = 0
    for lo in range(0, len(unique), LOOKUP_IDS_MAX):
        deleted += yield Call("delete_by_filter", index, {key: {"$in": unique[lo : lo + LOOKUP_IDS_MAX]}})
    return deleted


def write(
    index: str,
    key: str,
    doc_ids: Sequence[str],
    vectors: np.ndarray,
    metadata: Sequence[Mapping[str, Any]],
    slot_hash: SlotHash = blake2b_slot,
    probes_max: int = PROBES_MAX,
) -> "Plan[None]":
    """Stores document i (`vectors[i]`, `metadata[i]`, which holds ``key: doc_ids[i]``).

    A document whose id has a row overwrites it; a new one gets a row by
    probing (module doc). The same id twice: the last wins, as two writes in
    turn would. Raises `NotStoredError` naming the documents not stored, after
    storing all the others.
    """
    last = {doc_id: i for i, doc_id in enumerate(doc_ids)}
    found = yield from lookup(index, key, last)
    failures: Dict[str, str] = {}

    # Documents that have a row: overwrite it in place; rows left by a race go.
    present = [doc_id for doc_id in last if doc_id in found]
    if present:
        rows = [found[doc_id][0].id for doc_id in present]
        yield from _overwrite(index, rows, [last[d] for d in present], doc_ids, vectors, metadata, failures)
        extra = [row.id for doc_id in present for row in found[doc_id][1:]]
        if extra:
            yield Call("delete", index, extra)

    # New documents: insert each at its next probe until the server takes it.
    probe = {last[doc_id]: 0 for doc_id in last if doc_id not in found}
    while probe:
        by_slot: Dict[int, int] = {}  # row id -> document, this round
        for i in list(probe):
            while probe[i] < probes_max:
                slot = _slot(slot_hash, doc_ids[i], probe[i])
                if slot not in by_slot:
                    by_slot[slot] = i
                    break
                # Two documents of this round on one id: the later one moves
                # on at once, as the server would refuse it anyway.
                probe[i] += 1
            else:
                failures[doc_ids[i]] = f"no free row id in {probes_max} probes"
                del probe[i]
        if not by_slot:
            break
        slots = list(by_slot)
        docs = [by_slot[s] for s in slots]
        result = yield Call("insert", index, vectors[docs], slots, [metadata[i] for i in docs])
        taken: List[int] = []
        for skipped in result.skipped:
            i = _sent(by_slot, skipped.id, skipped.reason)
            if skipped.reason.endswith("already exists"):
                taken.append(skipped.id)
            else:
                failures[doc_ids[i]] = skipped.reason
                del probe[i]
        done = set(taken)
        for slot in slots:
            if slot not in done and by_slot[slot] in probe:
                del probe[by_slot[slot]]  # stored
        if not taken:
            continue
        held = yield Call("retrieve", index, taken)
        holder = {row_id: md.get(key) for row_id, md in zip(held.ids, held.metadata)}
        ours = [slot for slot in taken if holder.get(slot) == doc_ids[by_slot[slot]]]
        for slot in taken:
            if slot in ours:
                del probe[by_slot[slot]]
            else:
                probe[by_slot[slot]] += 1  # another document's row, or one deleted since: any free id will do
        if ours:
            yield from _overwrite(index, ours, [by_slot[s] for s in ours], doc_ids, vectors, metadata, failures)

    if failures:
        raise NotStoredError(failures)


def _overwrite(
    index: str,
    rows: List[int],
    docs: List[int],
    doc_ids: Sequence[str],
    vectors: np.ndarray,
    metadata: Sequence[Mapping[str, Any]],
    failures: Dict[str, str],
) -> "Plan[None]":
    result = yield Call("upsert", index, vectors[docs], rows, [metadata[i] for i in docs])
    by_row = dict(zip(rows, docs))
    for skipped in result.skipped:
        failures[doc_ids[_sent(by_row, skipped.id, skipped.reason)]] = skipped.reason


#: quiver's rule for index names; a store checks it when it is made, so that a
#: bad name fails there, not as "no such index" on every read.
INDEX_NAME = re.compile(r"[a-z0-9-]{3,}")


def check_store(index_name: Any, probes_max: int) -> None:
    """Refuses a store's index name or probe count that could never work."""
    if not isinstance(index_name, str) or not INDEX_NAME.fullmatch(index_name):
        raise ValueError(f"index_name {index_name!r}: quiver index names are 3 to 32 characters of a-z, 0-9 and '-'")
    if probes_max < 1:
        raise ValueError("probes_max must be at least 1")


def clients(
    client: "Client | AsyncClient | None",
    async_client: Optional[AsyncClient],
    url: Optional[str],
    api_key: Optional[str],
) -> "tuple[Optional[Client], Optional[AsyncClient], bool]":
    """A store's sync and async clients, and whether the store made them (and closes them).

    `client` may be either kind; given neither, both are made from `url`
    and `api_key` (default ``$QUIVER_URL``, ``$QUIVER_API_KEY``).
    """
    if client is None and async_client is None:
        return Client(url, api_key), AsyncClient(url, api_key), True
    if isinstance(client, AsyncClient):
        if async_client is not None:
            raise ValueError("client is an AsyncClient and an async client is given too: pass one of each kind")
        return None, client, False
    return client, async_client, False


def index_ready(
    index: str, dimensions: Optional[int], metric: Optional[str], p: Optional[float]
) -> "Plan[Optional[str]]":
    """The index's metric, or None if it does not exist and `dimensions` is None.

    Given `dimensions`, a missing index is created with them and `metric`
    (default cosine). An index that exists must have `metric` (when given)
    and `dimensions` (when given).
    """
    try:
        stats = yield Call("stats", index)
    except IndexNotFoundError:
        if dimensions is None:
            return None
        # exist_ok: another writer may create it first; stats then says what it is.
        yield Call("create_index", index, dimensions, metric or "cosine", p=p, exist_ok=True)
        stats = yield Call("stats", index)
    if metric is not None and stats.metric != metric:
        raise ValueError(f"index {index!r} exists with metric {stats.metric!r}, not {metric!r}")
    if dimensions is not None and stats.dimensions != dimensions:
        raise ValueError(f"index {index!r} has {stats.dimensions} dimensions; the embeddings have {dimensions}")
    return str(stats.metric)


def _slot(slot_hash: SlotHash, doc_id: str, probe: int) -> int:
    slot = slot_hash(doc_id, probe)
    if not isinstance(slot, int) or isinstance(slot, bool) or not ROW_ID_MIN <= slot <= ROW_ID_MAX:
        raise ValueError(f"slot_hash({doc_id!r}, {probe}) returned {slot!r}: expected a signed 64-bit integer")
    return slot


def _sent(by_row: Dict[int, int], row_id: Optional[int], reason: str) -> int:
    """The document a skipped row id belongs to; the server names only ids it was sent."""
    if row_id is None or row_id not in by_row:
        raise QuiverError(None, None, f"the server skipped a row this write did not send: {reason}")
    return by_row[row_id]
