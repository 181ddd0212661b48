"""The store's retry policy (control/images/retry.py) on a fake clock: the same
cases as its Go twin's test (go/internal/fetch/retry_test.go)."""
from __future__ import annotations

import random

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from control.images.retry import Failure, RetryPolicy, classify, failure_of


@pytest.mark.parametrize("f, retryable, throttling", [
    (Failure(status=503, code="SlowDown"), True, True),
    (Failure(status=503), True, False),
    (Failure(status=500, code="InternalError"), True, False),
    (Failure(status=502), True, False),
    (Failure(status=504), True, False),
    (Failure(status=429), True, True),
    (Failure(status=429, code="NoSuchKey"), False, False),   # a modeled error: the model says no
    (Failure(status=400, code="RequestTimeout"), True, False),
    (Failure(status=400, code="Throttling"), True, True),
    (Failure(status=400, code="PriorRequestNotComplete"), True, True),
    (Failure(transport=True), True, False),
    (Failure(status=408), False, False),
    (Failure(status=501), False, False),
    (Failure(status=505), False, False),
    (Failure(status=403, code="AccessDenied"), False, False),
    (Failure(status=404, code="NoSuchKey"), False, False),
])
def test_classify_is_botocore_standard(f, retryable, throttling):
    assert classify(f) == (retryable, throttling)


def client_error(status: int, code: str = "", retry_after: str | None = None) -> ClientError:
    headers = {"x-amz-retry-after": retry_after} if retry_after is not None else {}
    return ClientError({"Error": {"Code": code, "Message": "m"},
                        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers}}, "GetObject")


def test_failure_of_reads_status_code_and_retry_after():
    assert failure_of(client_error(503, "SlowDown", "3000")) == Failure(503, "SlowDown", 3.0)
    assert failure_of(client_error(503, "SlowDown", "soon")).retry_after_s < 0
    assert failure_of(EndpointConnectionError(endpoint_url="http://x")).transport
    assert failure_of(ValueError("not a store failure")) is None


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.waits: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.waits.append(round(s, 6))
        self.t += s


def failing(errors, then=None):
    it = iter(errors)

    def fn():
        e = next(it, None)
        if e is None:
            return then
        raise e
    return fn


def test_backoff_is_botocores():
    c = Clock()
    p = RetryPolicy(max_attempts=7, budget_s=0, base_s=1, transient_base_s=0.05, max_backoff_s=20)
    with pytest.raises(ClientError):
        p.call(failing([client_error(503, "SlowDown")] * 20), now=c.now, sleep=c.sleep, rand=lambda: 0.5)
    assert c.waits == [0.5, 1, 2, 4, 8, 10, 10]
    c = Clock()
    assert p.call(failing([client_error(502)] * 2, then="ok"), now=c.now, sleep=c.sleep, rand=lambda: 0.5) == "ok"
    assert c.waits == [0.025, 0.05]
    c = Clock()
    p.call(failing([client_error(503, "SlowDown", "3000"), client_error(503, "SlowDown", "60000")], then=1),
           now=c.now, sleep=c.sleep, rand=lambda: 0.5)
    assert c.waits == [3, 6]   # retry-after raises a wait up to 5 s past the jittered one


def test_budget_extends_retries_and_cuts_the_last_wait():
    c = Clock()
    p = RetryPolicy(max_attempts=2, budget_s=30, base_s=1, transient_base_s=0.05, max_backoff_s=20)
    tries = []

    def fn():
        tries.append(c.t)
        c.t += 0.1   # each try takes 100 ms
        raise client_error(503, "SlowDown")
    with pytest.raises(ClientError) as e:
        p.call(fn, now=c.now, sleep=c.sleep, rand=lambda: 0.999999)
    assert len(tries) == 6 and abs(tries[-1] - 30.0) < 1e-6   # the last try starts exactly at the budget
    assert e.value.retry_note.startswith("gave up after 6 tries in 30.1 s (retry policy: 2 retries or 30 s)")
    # max_attempts is a floor: a budget shorter than botocore's retries does not cut them.
    c = Clock()
    p = RetryPolicy(max_attempts=3, budget_s=0.001)
    with pytest.raises(ClientError):
        p.call(failing([client_error(500)] * 10), now=c.now, sleep=c.sleep, rand=lambda: 0.5)
    assert len(c.waits) == 3


def test_not_retryable_fails_at_once():
    c = Clock()
    with pytest.raises(ClientError):
        RetryPolicy().call(failing([client_error(403, "AccessDenied")]), now=c.now, sleep=c.sleep)
    assert c.waits == []


def test_defaults_survive_ten_second_windows():
    """However the jitter falls and wherever in the window a request starts, the
    defaults ride out a 10 s window of SlowDown (or 502), and an endless outage
    ends between 30 s and 30 s plus one try."""
    rng = random.Random(7)
    p = RetryPolicy()
    for _ in range(2000):
        c = Clock()
        c.t = rng.uniform(0, 10)           # the request starts somewhere in a window [0, 10)
        err = client_error(503, "SlowDown") if rng.random() < 0.5 else client_error(502)

        def fn():
            if c.t < 10:
                raise err
            return "ok"
        assert p.call(fn, now=c.now, sleep=c.sleep, rand=rng.random) == "ok"
    c = Clock()
    with pytest.raises(ClientError) as e:
        p.call(failing([client_error(503, "SlowDown")] * 1000), now=c.now, sleep=c.sleep, rand=rng.random)
    assert 30 <= c.t <= 30.001 and "retry policy: 3 retries or 30 s" in e.value.retry_note
