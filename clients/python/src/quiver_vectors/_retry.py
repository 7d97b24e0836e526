"""When a failed call is sent again, and after how long.

Only calls that may be sent twice are retried: a read, a search, an upsert
(the same rows again leave the same state), and deletes, with what a second
attempt means spelled out. A delete by ids deletes nothing more; if the first
attempt was applied and its answer lost, the retry reports those ids as
skipped ("does not exist") though the call deleted them. A delete by filter
deletes what the filter matches when the retry arrives: if the first attempt
was applied, that is nothing (the count returned is then 0, not the rows the
call deleted) or rows written in between by others, which the caller did not
ask to delete when they did not yet exist. Callers for whom that matters turn
retries off (`RetryPolicy(retries_max=0)`).

An insert is not retried: if its first attempt was applied but the answer was
lost, a second one reports the rows as already existing, and the caller would
be told the opposite of what happened. Creating or deleting an index is not
retried for the same reason (the second attempt answers "exists" or "does not
exist"), nor are changes of cluster membership, which can take a minute and
whose 503 means "still under way".

What is retried: a connection that failed or broke (the server restarting, a
kept-alive connection closed under us) and 503 (too many connections, a
cluster without a leader for a moment). Timeouts of a request that reached a
working server are not: the server is slow, and sending the work again adds
load where there is too much.

Backoff is exponential with full jitter (a random wait between zero and the
exponential bound), so clients failed by the same event do not come back in
step, and bounded both in count and in total time, so a dead server fails a
call within seconds rather than hanging it.
"""

from __future__ import annotations

import random
from typing import Optional

import httpx

from . import _limits

#: Failures after which the request is known not to have been answered:
#: nothing reached the server, or the connection broke before the answer.
RETRYABLE_TRANSPORT_ERRORS = (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ConnectTimeout)

RETRYABLE_STATUS = 503


class RetryPolicy:
    """How idempotent calls are retried; `RetryPolicy(retries_max=0)` turns retries off."""

    __slots__ = ("retries_max", "backoff_s", "backoff_max_s", "time_max_s")

    def __init__(
        self,
        retries_max: int = _limits.RETRIES_MAX,
        backoff_s: float = _limits.RETRY_BACKOFF_S,
        backoff_max_s: float = _limits.RETRY_BACKOFF_MAX_S,
        time_max_s: float = _limits.RETRY_TIME_MAX_S,
    ) -> None:
        if retries_max < 0 or backoff_s < 0 or backoff_max_s < 0 or time_max_s < 0:
            raise ValueError("retry bounds must not be negative")
        self.retries_max = retries_max
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.time_max_s = time_max_s

    def delay_s(self, retry: int, elapsed_s: float, rng: Optional[random.Random] = None) -> Optional[float]:
        """Seconds to wait before retry number `retry` (0 first), or None to give up.

        `elapsed_s` is the time the call has taken so far; a wait that would
        end past `time_max_s` is not started.
        """
        if retry >= self.retries_max:
            return None
        bound = min(self.backoff_max_s, self.backoff_s * (2**retry))
        delay = (rng or random).uniform(0.0, bound)
        if elapsed_s + delay > self.time_max_s:
            return None
        return delay

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(retries_max={self.retries_max}, backoff_s={self.backoff_s}, "
            f"backoff_max_s={self.backoff_max_s}, time_max_s={self.time_max_s})"
        )
