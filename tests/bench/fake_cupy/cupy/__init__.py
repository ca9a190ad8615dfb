"""A stand-in for the few CuPy names that the scaling worker's GPU timing (bench.scaling) uses (events, streams, array helpers),
on host clocks and NumPy arrays: tests/bench/scaling_gpu_plumbing.py puts this folder first on sys.path of its own
processes, to drive the worker's GPU code paths on a machine without a GPU. Nothing else imports it."""
import time

import numpy as _np

ndarray = _np.ndarray
asarray = _np.asarray
ascontiguousarray = _np.ascontiguousarray
asnumpy = _np.asarray
zeros_like = _np.zeros_like


class _Event:
    def __init__(self):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def synchronize(self):
        pass


class _Stream:
    ptr = 1

    def __init__(self, non_blocking=False):
        pass

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Device:
    def synchronize(self):
        pass


class cuda:  # noqa: N801 - the CuPy name
    Event = _Event
    Stream = _Stream
    Device = _Device

    @staticmethod
    def get_elapsed_time(a, b):
        return (b.t - a.t) * 1e3

    @staticmethod
    def get_current_stream():
        return _Stream()
