"""Health probes: parsing at the edge, and the retry/deadline logic with a fake clock."""
import pytest

from control.errors import UserError
from runsc_hooks import probe as h


@pytest.mark.parametrize("text, probe", [
    ("running", h.RunningProbe()),
    ("tcp:8080", h.TcpProbe(8080)),
    ("http:8080", h.HttpProbe(8080, "/", 200, None)),
    ("http:8080/health", h.HttpProbe(8080, "/health", 200, None)),
    ("http:8080/ready=204", h.HttpProbe(8080, "/ready", 204, None)),
    ("http:8080/x=503~down", h.HttpProbe(8080, "/x", 503, "down")),
    ("http:8080/v1/models~llama", h.HttpProbe(8080, "/v1/models", 200, "llama")),
    ("gpu:8000", h.GpuProbe(8000, "/gpu", "gpu")),
    ("gpu:8000/infer#cuda_ok", h.GpuProbe(8000, "/infer", "cuda_ok")),
    ("exec:/bin/sh -c 'test -e /tmp/ready'", h.ExecProbe(("/bin/sh", "-c", "test -e /tmp/ready"))),
])
def test_parse(text, probe):
    assert h.parse(text) == probe
    assert h.parse(str(probe)) == probe  # the text form round-trips (records and images keep it)


@pytest.mark.parametrize("text", ["ftp:21", "tcp:0", "tcp:70000", "tcp:x", "http:80/x=99", "exec:", "nonsense",
                                  "http:/health", "gpu:abc"])
def test_parse_rejects_bad_probes_naming_them(text):
    with pytest.raises(UserError) as e:
        h.parse(text)
    assert repr(text) in str(e.value) and e.value.fields["probe"] == text


class Clock:
    def __init__(self):
        self.t = 100.0
        self.sleeps = []

    def now(self):
        return self.t

    def sleep(self, s):
        self.sleeps.append(round(s, 4))
        self.t += s


class Flaky:
    """Fails `n` times (each attempt costs `cost` seconds of fake time), then passes."""

    def __init__(self, clock, n, cost=0.0):
        self.clock, self.n, self.cost, self.calls, self.timeouts, self.starts = clock, n, cost, 0, [], []

    def attempt(self, target, timeout_s):
        self.calls += 1
        self.timeouts.append(round(timeout_s, 4))
        self.starts.append(self.clock.t)
        self.clock.t += self.cost
        if self.calls <= self.n:
            raise h.ProbeFailed(f"not yet ({self.calls})")
        return "ok"

    def __str__(self):
        return "flaky"


def test_check_retries_with_exponential_backoff_until_the_probe_passes():
    c = Clock()
    p = Flaky(c, 6)
    r = h.check([p], h.Target(), h.Policy(timeout_s=10, attempt_timeout_s=2), clock=c.now, sleep=c.sleep)
    assert r.healthy and p.calls == 7
    assert c.sleeps == [0.01, 0.02, 0.04, 0.08, 0.16, 0.25]  # doubling, capped at 250 ms
    assert r.probes[0].attempts == 7 and r.probes[0].ok and r.probes[0].detail == "ok"
    assert r.seconds == pytest.approx(sum(c.sleeps))
    assert set(p.timeouts) == {2.0}


def test_check_stops_at_the_deadline_and_skips_later_probes():
    c = Clock()
    bad, later = Flaky(c, 10**6, cost=0.3), Flaky(c, 0)
    r = h.check([bad, later], h.Target(), h.Policy(timeout_s=1.0, attempt_timeout_s=0.5), clock=c.now,
                sleep=c.sleep)
    assert not r.healthy
    assert r.probes[0].ok is False and "not yet" in r.probes[0].detail
    assert 2 <= r.probes[0].attempts <= 4
    assert later.calls == 0 and len(r.probes) == 1
    assert r.seconds <= 1.0 + 0.3 + 1e-9          # one attempt may straddle the deadline, no more
    assert all(t <= 0.5 for t in bad.timeouts)    # never longer than the attempt timeout
    # ... nor than what is left of the deadline
    assert all(t <= 101.0 - s + 1e-9 for t, s in zip(bad.timeouts, bad.starts))
    assert "FAILED" in r.summary() and r.to_dict()["healthy"] is False


def test_the_last_attempt_gets_its_whole_timeout():
    """The backoff's last sleep is cut short so that the last attempt has its whole
    attempt timeout: sleeping up to the deadline left it 1 ms, which timed out under
    load and reported "timed out" where 16 attempts before had answered 404 (CI)."""
    c = Clock()
    p = Flaky(c, 10**6, cost=0.003)   # answers at once, never what the probe wants
    r = h.check([p], h.Target(), h.Policy(timeout_s=3.0, attempt_timeout_s=0.5), clock=c.now, sleep=c.sleep)
    assert not r.healthy and r.probes[0].attempts == p.calls > 10
    assert set(p.timeouts) == {0.5}                          # every attempt had all of it
    assert 100.0 + 3.0 - 0.5 - 0.25 <= p.starts[-1] <= 100.0 + 3.0 - 0.5   # the last as late as that allows
    assert c.t <= 103.0 and all(s >= 0 for s in c.sleeps)
    # A check shorter than two attempt timeouts still retries: its attempts get half of it.
    c = Clock()
    p = Flaky(c, 10**6, cost=0.003)
    h.check([p], h.Target(), h.Policy(timeout_s=0.5, attempt_timeout_s=2.0), clock=c.now, sleep=c.sleep)
    assert p.calls > 3 and p.timeouts[0] == 0.5 and min(p.timeouts) >= 0.25


def test_no_probes_means_the_container_must_be_running():
    c = Clock()
    states = iter([False, False, True])
    r = h.check([], h.Target(running=lambda: next(states)), h.Policy(5, 1), clock=c.now, sleep=c.sleep)
    assert r.healthy and r.probes[0].probe == "running" and r.probes[0].attempts == 3
    r = h.check([], h.Target(), h.Policy(0.05, 1), clock=c.now, sleep=c.sleep)
    assert not r.healthy and "no way" in r.probes[0].detail


def test_exec_probe_uses_the_exit_status():
    calls = []

    def fake_exec(argv, timeout_s):
        calls.append((argv, timeout_s))
        return (0, "") if argv[-1] == "ok" else (3, "boom\n")

    t = h.Target(exec=fake_exec)
    assert h.ExecProbe(("check", "ok")).attempt(t, 1.5) == "exit 0"
    with pytest.raises(h.ProbeFailed, match="exited 3: boom"):
        h.ExecProbe(("check", "bad")).attempt(t, 1.5)
    assert calls[0] == (["check", "ok"], 1.5)
    with pytest.raises(h.ProbeFailed, match="no way to exec"):
        h.ExecProbe(("x",)).attempt(h.Target(), 1)


def test_network_probes_need_an_address():
    with pytest.raises(h.ProbeFailed, match="no network address"):
        h.TcpProbe(80).attempt(h.Target(), 1)


def test_result_dict_has_per_probe_attempts_and_timings():
    c = Clock()
    r = h.check([Flaky(c, 1, cost=0.1)], h.Target(), h.Policy(5, 1), clock=c.now, sleep=c.sleep)
    d = r.to_dict()
    assert d["healthy"] is True and d["checked_at"] > 0
    assert d["probes"] == [{"probe": "flaky", "ok": True, "attempts": 2, "seconds": pytest.approx(0.21),
                            "detail": "ok"}]
