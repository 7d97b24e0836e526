"""What the sync and async clients share besides the calls: settings and request making.

Two ways to send a request, chosen once per client:

- ``http://`` with no transport given: the minimal keep-alive HTTP/1.1 path
  of `_wire`, because httpx's stack costs more CPU per call than a search's
  whole budget over the server's latency (see `_wire`'s doc);
- otherwise (``https://``, or a `transport=` the caller passes: TLS settings,
  a proxy, a mock in tests): straight to that httpx transport, not through
  `httpx.Client`, whose layer (cookies, auth flows, redirects, hooks) does
  nothing for this API.

Both raise httpx's exceptions, so retries and errors do not depend on the path.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Dict, List, Optional, Tuple

import httpx

from . import _limits
from ._retry import RetryPolicy
from ._wire import request_head

__version__ = "0.1.0"

DEFAULT_URL = "http://127.0.0.1:8080"

#: Small requests are written as head and body in two sends by httpx; with
#: Nagle's algorithm the body could wait for the ACK of the head.
SOCKET_OPTIONS: List[Tuple[int, int, int]] = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]

#: Idle connections kept per client: enough for an upload's parallel requests
#: and a search or two beside them, so an upload does not reconnect per batch.
IDLE_CONNECTIONS_MAX = _limits.UPLOAD_PARALLEL + 4


def transport_limits() -> httpx.Limits:
    return httpx.Limits(
        max_connections=None,
        max_keepalive_connections=IDLE_CONNECTIONS_MAX,
        keepalive_expiry=_limits.KEEPALIVE_EXPIRY_S,
    )


def _header_value(name: str, value: str) -> str:
    # A CR or LF in a header would let the value write headers of its own.
    if not value.isascii() or not value.isprintable():
        raise ValueError(f"{name}: expected printable ASCII")
    return value


class _Core:
    """Settings, headers and the making of requests (no I/O)."""

    def __init__(
        self,
        url: Optional[str],
        api_key: Optional[str],
        timeout_s: float,
        retry: Optional[RetryPolicy],
        consistency: Optional[str],
    ) -> None:
        url = url or os.environ.get("QUIVER_URL") or DEFAULT_URL
        if api_key is None:
            api_key = os.environ.get("QUIVER_API_KEY")
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise ValueError(f"url: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"url: expected http(s)://host:port, got {url!r}")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be above 0")
        self.url = url.rstrip("/")
        self.consistency = consistency
        self.retry = retry if retry is not None else RetryPolicy()
        self.timeout_s = timeout_s
        self.connect_timeout_s = min(timeout_s, _limits.CONNECT_TIMEOUT_S)
        self._scheme = parsed.scheme
        self._host = parsed.host
        self._port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._prefix = parsed.raw_path.decode("ascii").split("?")[0].rstrip("/")

        pairs = [("User-Agent", f"quiver-vectors/{__version__}"), ("Accept", "application/json")]
        if api_key:
            pairs.append(("X-Service-API-Key", _header_value("api_key", api_key)))
        # For httpx: lists of byte pairs, which it takes without re-encoding.
        self._headers = [(k.encode(), v.encode()) for k, v in pairs]
        self._body_headers = self._headers + [(b"Content-Type", b"application/json")]
        # For the wire path: the header lines, written once.
        self._head_lines = "".join(f"{k}: {v}\r\n" for k, v in pairs).encode("ascii")
        self._body_head_lines = self._head_lines + b"Content-Type: application/json\r\n"
        host = self._host if ":" not in self._host else f"[{self._host}]"
        self._host_header = host if parsed.port is None else f"{host}:{parsed.port}"

        timeout = httpx.Timeout(timeout_s, connect=self.connect_timeout_s)
        self._extensions: Dict[str, Any] = {"timeout": timeout.as_dict()}
        self._urls: Dict[str, httpx.URL] = {}

    def _uses_wire(self, transport: Any) -> bool:
        return transport is None and self._scheme == "http"

    def _head(self, method: str, path: str, body: Optional[bytes]) -> bytes:
        """The request head for the wire path."""
        if body is None:
            return request_head(method, self._prefix + path, self._host_header, self._head_lines, None)
        return request_head(method, self._prefix + path, self._host_header, self._body_head_lines, len(body))

    def _request(self, method: str, path: str, body: Optional[bytes]) -> httpx.Request:
        """The request for the httpx path."""
        url = self._urls.get(path)
        if url is None:
            # Parsing a URL is a good part of a small call's cost: each path
            # is parsed once.
            if len(self._urls) >= _limits.URL_CACHE_ENTRIES_MAX:
                self._urls.clear()
            url = self._urls[path] = httpx.URL(self.url + path)
        headers = self._headers if body is None else self._body_headers
        return httpx.Request(method, url, headers=headers, content=body, extensions=self._extensions)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"
