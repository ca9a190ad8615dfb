"""Array backend: NumPy on the CPU, CuPy on NVIDIA GPUs.

Physics code receives a :class:`Backend` and uses ``backend.xp`` for every array operation; the only places
that know which library is underneath are this module and the hand-written kernels (which each have a NumPy
twin). Selected by the run configuration (:class:`comms.config.RunConfig`: ``--backend``, the deck's ``[run]
backend``, ``HMC_BACKEND=numpy|cupy|auto``; auto: cupy when a GPU is visible).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from comms.config import RunConfig

BACKEND_NAMES = ("numpy", "cupy", "auto")


class BackendError(RuntimeError):
    pass


def _cupy_usable() -> bool:
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@dataclass
class Backend:
    """Carries the array module, its name and a cache for compiled kernels."""

    name: str
    xp: object
    kernels: dict = field(default_factory=dict, repr=False)

    @property
    def is_gpu(self) -> bool:
        return self.name == "cupy"

    def asarray(self, a, dtype=None):
        return self.xp.asarray(a, dtype=dtype)

    def to_numpy(self, a) -> np.ndarray:
        """A host copy (NumPy array) of ``a``, whatever backend holds it."""
        if self.is_gpu and not isinstance(a, np.ndarray):
            return self.xp.asnumpy(a)
        return np.asarray(a)

    def synchronize(self) -> None:
        if self.is_gpu:
            self.xp.cuda.get_current_stream().synchronize()

    def kernel(self, key, build):
        """Return the compiled kernel stored under ``key``, building it once with ``build()``."""
        if key not in self.kernels:
            self.kernels[key] = build()
        return self.kernels[key]


_cache: dict[str, Backend] = {}


def get_backend(name: str | None = None, config: RunConfig | None = None) -> Backend:
    """The backend named ``name`` (or the configuration's ``backend``; ``config`` default: built from the environment
    now); ``auto`` picks cupy if a GPU is visible. The first cupy backend selects the configuration's GPU
    (:meth:`RunConfig.gpu_ordinal`) before the first allocation, so that fields and the comms engine
    (comms.cuda.cu.device, which picks the same ordinal) live on the same GPU."""
    if not name:
        config = config if config is not None else RunConfig.from_environment()
        name = config.backend
    name = name.lower()
    if name not in BACKEND_NAMES:
        raise BackendError(f"unknown backend {name!r}: use one of numpy, cupy, auto (--backend or HMC_BACKEND)")
    if name == "auto":
        name = "cupy" if _cupy_usable() else "numpy"
    if name not in _cache:
        if name == "cupy":
            if not _cupy_usable():
                raise BackendError(
                    "backend cupy asked for, but CuPy or a CUDA GPU is missing: install the gpu extra "
                    "(pip install '.[gpu]') on a machine with a GPU, or use --backend numpy")
            import cupy

            config = config if config is not None else RunConfig.from_environment()
            cupy.cuda.Device(config.gpu_ordinal(cupy.cuda.runtime.getDeviceCount())).use()
            _cache[name] = Backend("cupy", cupy)
        else:
            _cache[name] = Backend("numpy", np)
    return _cache[name]


def backend_of(a) -> Backend:
    """The backend whose arrays ``a`` is (cupy for a CuPy array, else numpy)."""
    return get_backend("cupy" if type(a).__module__.startswith("cupy") else "numpy")


def array_module(a):
    """numpy or cupy, whichever owns ``a``."""
    mod = type(a).__module__
    if mod.startswith("cupy"):
        import cupy

        return cupy
    return np
