"""comms.watchdog: the deadline logic that bounds the GPU engine's device-side waits, with a fake event query."""
import threading
import time

from comms.watchdog import Watchdog


def test_completed_events_are_forgotten_and_late_ones_reported():
    done, seen = set(), []
    wd = Watchdog(lambda h: h in done, timeout=10.0, on_expire=seen.append)
    wd._thread = object()                                # no thread: rounds by hand
    wd.watch(0, "a", "halo A")
    wd.watch(1, "b", "halo B")
    t = time.monotonic()
    assert wd.check(t) == [] and wd.pending() == 2       # neither complete, neither late
    done.add("a")
    assert wd.check(t + 1) == [] and wd.pending() == 1   # A forgotten
    assert wd.check(t + 11) == ["halo B"] and seen == ["halo B"]
    done.add("b")
    assert wd.check(t + 12) == [] and wd.pending() == 0


def test_a_new_watch_of_the_same_key_replaces_the_old_deadline():
    seen = []
    wd = Watchdog(lambda h: False, timeout=5.0, on_expire=seen.append)
    wd._thread = object()
    wd.watch(0, "e", "first")
    t0 = time.monotonic()
    wd.watch(0, "e", "second")                           # the event recorded again, later
    assert wd.pending() == 1
    assert wd.check(t0 + 4.0) == []
    assert wd.check(t0 + 6.0) == ["second"] and seen == ["second"]


def test_the_thread_reports_a_wait_that_never_completes():
    fired = threading.Event()
    texts = []

    def expire(text):
        texts.append(text)
        fired.set()

    wd = Watchdog(lambda h: False, timeout=0.05, on_expire=expire, period=0.01)
    wd.watch(0, "e", "rank 0: no halo from rank 1 on link t+ (stream_gated)")
    assert fired.wait(5.0), "the watchdog did not fire"
    wd.close()
    assert texts[0].startswith("rank 0: no halo from rank 1")
