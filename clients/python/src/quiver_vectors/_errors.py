"""The exceptions the client raises, one class per kind of failure a caller handles.

The server answers every failure with an envelope whose `error.code` names it
exactly; the client keeps all of it (`status`, `code`, `message`,
`description`, `detail`) on one base class, `QuiverError`, so nothing the server
said is lost, and picks a subclass by code so callers can `except` the cases
they handle (an unknown index, a bad key, a malformed body, a busy server)
without comparing strings.

Partial results are not errors: an insert, upsert, retrieve or delete that
applied some items answers 500 `EMBEDDINGS_SKIPPED`, and the client returns a
result object listing what was done and what was skipped instead of raising.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Type, Union

Description = Union[str, List[str], None]


class QuiverError(Exception):
    """A call the server refused, or that could not reach it.

    Attributes:
        status: the HTTP status (None when no answer arrived).
        code: the server's `error.code`, e.g. ``"INDEX_NOT_FETCHED"`` (None when
            no answer arrived, or the answer was not quiver's envelope).
        message: the envelope's short `message`.
        description: `error.description`: a string, or one string per item.
        detail: for a malformed body, exactly what is wrong with it, e.g.
            ``"k: expected an integer from 1 to 10000"``.
        result: for a call sent as several requests that failed part-way,
            what the requests answered before the failure: a `WriteResult`
            for an insert or upsert (its `stored_ranges` say which rows are
            stored), a `Deleted` for a delete, a `Retrieved` for a retrieve,
            the results so far for a search batch; otherwise None.
    """

    def __init__(
        self,
        status: Optional[int],
        code: Optional[str],
        message: str,
        description: Description = None,
        detail: Optional[str] = None,
    ) -> None:
        super().__init__(status, code, message, description, detail)
        self.status = status
        self.code = code
        self.message = message
        self.description = description
        self.detail = detail
        self.result: Any = None

    def __str__(self) -> str:
        head = " ".join(str(part) for part in (self.status, self.code) if part is not None)
        text = f"{head}: {self.message}" if head else self.message
        if isinstance(self.description, list):
            shown = "; ".join(self.description[:3])
            more = len(self.description) - 3
            text += f" ({shown}{f'; and {more} more' if more > 0 else ''})"
        elif self.description:
            text += f" ({self.description})"
        if self.detail:
            text += f" [detail: {self.detail}]"
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status!r}, {self.code!r}, {self.message!r})"


class AuthenticationError(QuiverError):
    """401: the API key is missing (`NO_API_KEY_PROVIDED`) or wrong (`INVALID_API_KEY`)."""


class InvalidRequestError(QuiverError):
    """400 `INVALID_REQUEST_BODY`: the body was refused whole; `detail` names the place."""


class SearchError(QuiverError):
    """400 `SIMILARITY_SEARCH_ERROR`: a query the index cannot score (length, zero, domain)."""


class ReplyTooLargeError(QuiverError):
    """400 `REPLY_TOO_LARGE`: the answer would pass `--reply-bytes-max`; ask for less."""


class RequestTooLargeError(QuiverError):
    """413 `REQUEST_TOO_LARGE`: a body past `--body-bytes-max` (uploads split on it first)."""


class IndexNotFoundError(QuiverError):
    """500 `INDEX_NOT_FETCHED` or `INDEX_NOT_DELETED`: no index of that name."""


class IndexNotCreatedError(QuiverError):
    """500 `INDEX_NOT_CREATED` or `INVALID_SIMILARITY_METRIC`: create refused."""


class IndexExistsError(IndexNotCreatedError):
    """500 `INDEX_NOT_CREATED` because an index of that name exists (it is untouched)."""


class UnavailableError(QuiverError):
    """503: too many connections, read-only after a storage failure, or no cluster quorum."""


class StorageError(QuiverError):
    """500 `STORAGE_ERROR`: the write could not be made durable and was undone."""


class ClusterError(QuiverError):
    """A membership change or consistency level the cluster refused."""


class QuiverConnectionError(QuiverError):
    """No answer: the server could not be reached, or the connection broke (after retries)."""


_BY_CODE: Dict[str, Type[QuiverError]] = {
    "NO_API_KEY_PROVIDED": AuthenticationError,
    "INVALID_API_KEY": AuthenticationError,
    "INVALID_REQUEST_BODY": InvalidRequestError,
    "SIMILARITY_SEARCH_ERROR": SearchError,
    "REPLY_TOO_LARGE": ReplyTooLargeError,
    "REQUEST_TOO_LARGE": RequestTooLargeError,
    "INDEX_NOT_FETCHED": IndexNotFoundError,
    "INDEX_NOT_DELETED": IndexNotFoundError,
    "INDEX_NOT_CREATED": IndexNotCreatedError,
    "INVALID_SIMILARITY_METRIC": IndexNotCreatedError,
    "STORAGE_ERROR": StorageError,
    "INVALID_CONSISTENCY": ClusterError,
    "NOT_A_CLUSTER": ClusterError,
    "MEMBER_NOT_FOUND": ClusterError,
    "MEMBER_EXISTS": ClusterError,
    "LAST_VOTER": ClusterError,
}


def error_for(
    status: Optional[int],
    code: Optional[str],
    message: str,
    description: Description = None,
    detail: Optional[str] = None,
) -> QuiverError:
    """The exception for one error envelope: the class is chosen by code, then by status."""
    cls = _BY_CODE.get(code or "")
    if cls is IndexNotCreatedError and isinstance(description, str) and description.endswith("already exists"):
        # The one create failure a caller routinely handles (create-if-absent);
        # the server gives it no code of its own, only this description.
        cls = IndexExistsError
    if cls is None:
        cls = UnavailableError if status == 503 else QuiverError
    return cls(status, code, message, description, detail)
