"""quiver-vectors: the Python client of quiver, a vector database with exact k-NN search.

    from quiver_vectors import Client
    with Client("http://127.0.0.1:8080", api_key="...") as client:
        client.create_index("docs", 768, metric="cosine", exist_ok=True)
        client.upsert("docs", vectors, ids=range(len(vectors)))
        hits = client.search("docs", vectors[0], k=10)

`Client` is synchronous, `AsyncClient` its asyncio twin; both take NumPy
arrays (sent as float32, bit-exact) and return typed results. Failures raise a
`QuiverError` subclass carrying the server's status, code, description and
detail; partial writes, retrieves and deletes return what was done and what was
skipped instead of raising.
"""

from ._async import AsyncClient
from ._base import __version__
from ._errors import (
    AuthenticationError,
    ClusterError,
    IndexExistsError,
    IndexNotCreatedError,
    IndexNotFoundError,
    InvalidRequestError,
    QuiverConnectionError,
    QuiverError,
    ReplyTooLargeError,
    RequestTooLargeError,
    SearchError,
    StorageError,
    UnavailableError,
)
from ._retry import RetryPolicy
from ._sync import Client
from ._types import (
    ClusterMember,
    ClusterStatus,
    Deleted,
    Health,
    Hit,
    IndexStats,
    Metadata,
    MetadataValue,
    Retrieved,
    Row,
    Search,
    Skipped,
    WriteResult,
)

__all__ = [
    "AsyncClient",
    "AuthenticationError",
    "Client",
    "ClusterError",
    "ClusterMember",
    "ClusterStatus",
    "Deleted",
    "Health",
    "Hit",
    "IndexExistsError",
    "IndexNotCreatedError",
    "IndexNotFoundError",
    "IndexStats",
    "InvalidRequestError",
    "Metadata",
    "MetadataValue",
    "QuiverConnectionError",
    "QuiverError",
    "ReplyTooLargeError",
    "RequestTooLargeError",
    "Retrieved",
    "RetryPolicy",
    "Row",
    "Search",
    "SearchError",
    "Skipped",
    "StorageError",
    "UnavailableError",
    "WriteResult",
    "__version__",
]
