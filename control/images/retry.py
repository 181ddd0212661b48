"""The retry policy of every store request (issue 14 item 1): botocore's
"standard" retry mode plus a time budget, so a pull rides out a store's
slow-down or 5xx window and a longer outage ends in one error saying how long
it was tried.

Twin: go/internal/fetch/retry.go, the one fetch engine's policy (the ranged
pack GETs of thaw-fetch and of thaw-gofer's stream, which get it as their
plan's "retry": `plan()`). The policy, its fields, defaults and formula are
written out in docs/store.md, "Retry policy"; both must decide alike
(go/internal/fetch/retry_test.go and tests/unit/test_retry.py have the cases).

control/images/store.py wraps the reads Python makes itself in it
(manifests, listings) on a botocore client that does not retry by itself
(total_max_attempts = 1), or the two would multiply.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Callable, TypeVar

from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError, HTTPClientError

T = TypeVar("T")

# botocore 1.44.8 botocore/retries/standard.py TransientRetryableChecker and
# ThrottledRetryableChecker (quoted in retry.go).
TRANSIENT_CODES = frozenset({"RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete"})
TRANSIENT_STATUSES = frozenset({500, 502, 503, 504})
THROTTLING_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
    "TooManyRequestsException", "ProvisionedThroughputExceededException", "TransactionInProgressException",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "LimitExceededException", "RequestThrottled",
    "SlowDown", "PriorRequestNotComplete", "EC2ThrottledException"})
MODELED_GET_OBJECT_ERRORS = frozenset({"NoSuchKey", "InvalidObjectState"})   # a 429 with one: not throttling


@dataclass(frozen=True)
class Failure:
    status: int = 0                 # HTTP status; 0: no response
    code: str = ""                  # S3 error code from the body
    retry_after_s: float = -1.0     # x-amz-retry-after / 1000; < 0: absent
    transport: bool = False         # ConnectionError / HTTPClientError (refused, reset, timeout, broken body)


def classify(f: Failure) -> tuple[bool, bool]:
    """(retryable, throttling) as botocore's standard mode decides."""
    throttling = f.code in THROTTLING_CODES or (f.status == 429 and f.code not in MODELED_GET_OBJECT_ERRORS)
    transient = f.transport or f.code in TRANSIENT_CODES or f.status in TRANSIENT_STATUSES
    return transient or throttling, throttling


def failure_of(e: BaseException) -> Failure | None:
    """What a botocore exception says for retrying; None: not a store failure."""
    if isinstance(e, ClientError):
        meta = e.response.get("ResponseMetadata", {})
        after = meta.get("HTTPHeaders", {}).get("x-amz-retry-after")
        try:
            after_s = int(after) / 1000 if after is not None and int(after) >= 0 else -1.0
        except ValueError:
            after_s = -1.0
        return Failure(status=meta.get("HTTPStatusCode", 0), code=e.response.get("Error", {}).get("Code", ""),
                       retry_after_s=after_s)
    if isinstance(e, (BotoConnectionError, HTTPClientError)):
        return Failure(transport=True)
    return None


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3           # retries after the first try, botocore's count (store.retries)
    budget_s: float = 30.0          # retry on past max_attempts until this long after the first try (store.retry_budget_s)
    base_s: float = 1.0             # backoff scale of throttling errors
    transient_base_s: float = 0.05  # backoff scale of other retryable errors
    max_backoff_s: float = 20.0     # cap of one backoff, before x-amz-retry-after

    @classmethod
    def from_settings(cls, settings) -> "RetryPolicy":
        return cls(max_attempts=settings.store_retries, budget_s=settings.store_retry_budget_s)

    def plan(self) -> dict:
        """The "retry" object of a Go fetch plan (thaw-fetch's and thaw-gofer stream's)."""
        return asdict(self)

    def describe(self) -> str:
        return f"{self.max_attempts} retries or {self.budget_s:g} s"   # as retry.go's String()

    def call(self, fn: Callable[[], T], *, now: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep, rand: Callable[[], float] = random.random,
             on_retry: Callable[[], None] | None = None) -> T:
        """fn() under this policy. A failure that is not retried, or the last one, is re-raised
        with `retry_note` set on it ("gave up after N tries in S s (retry policy: ...)") when it
        was retryable, for the caller's error message."""
        first = now()
        tries = retries = 0
        while True:
            try:
                return fn()
            except Exception as e:
                tries += 1
                f = failure_of(e)
                retryable, throttling = classify(f) if f else (False, False)
                if not retryable:
                    raise
                scale = self.base_s if throttling else self.transient_base_s
                wait = rand() * min(scale * 2 ** (tries - 1), self.max_backoff_s)
                if f.retry_after_s >= 0:
                    wait = max(wait, min(f.retry_after_s, wait + 5))
                if retries >= self.max_attempts:
                    left = first + self.budget_s - now()
                    if left <= 0:
                        e.retry_note = (f"gave up after {tries} tries in {now() - first:.1f} s "  # type: ignore[attr-defined]
                                        f"(retry policy: {self.describe()})")
                        raise
                    wait = min(wait, left)
                retries += 1
                if on_retry is not None:
                    on_retry()
                sleep(wait)
