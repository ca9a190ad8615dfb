"""The transport registry: name -> capabilities and implementation (docs/halo-protocol.md, "Transports, per link").

``register(name, capabilities, impl)`` adds a transport; ``impl`` is the transport object (any object with the link
interface of its engine: comms/transport/host.py for host faces, comms/transport/gpu.py for device faces) or the
dotted name of a module whose ``TRANSPORT`` is that object, imported on the first :meth:`Entry.load`. The built-in
transports are declared below by module name, so that the names and capabilities are known (to the run
configuration's check, to ``check_transport_name``, to the engine choice) without importing their code: the GPU
transports' modules import CuPy and cuda-bindings, which a CPU build does not have.

Adding a transport: one module with its ``TRANSPORT`` and one ``register`` line here (or, outside the package, one
``register`` call before the grid is made: tests/comms/test_transport_registry.py).

This module imports nothing of the project: the run configuration (comms/config.py) reads the names from it.
"""
from __future__ import annotations

import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a transport needs and allows (the engine and the link resolution decide by these, never by name)."""

    #: faces live in device memory: the GPU engine runs it (needs CuPy, cuda-bindings and a GPU)
    gpu_buffers: bool = False
    #: peer-to-peer through memory mapped from the peer: only between ranks of one node, and only where both ends
    #: allow it (node, clique, mask, probe); the other links of the grid use ``mpi``
    same_node: bool = False
    #: an exchange can be captured in a CUDA graph (no host step per exchange)
    graph_capture: bool = False
    #: a host thread takes part in every exchange (waits, doorbells)
    host_driven: bool = True


class Entry:
    """One registered transport: ``name``, ``capabilities`` and its implementation (loaded on demand)."""

    __slots__ = ("name", "capabilities", "_impl")

    def __init__(self, name: str, capabilities: Capabilities, impl):
        self.name, self.capabilities, self._impl = name, capabilities, impl

    def load(self):
        """The transport object (its module imported on first use)."""
        if isinstance(self._impl, str):
            self._impl = importlib.import_module(self._impl).TRANSPORT
        return self._impl


_ENTRIES: dict = {}


def register(name: str, capabilities: Capabilities, impl) -> Entry:
    """Register transport ``name`` (lower case, no spaces); a name registered twice is an error."""
    if not isinstance(name, str) or not name or name != name.strip().lower() or " " in name or name == "auto":
        raise ValueError(f"transport name {name!r}: use a lower-case word (not 'auto')")
    if name in _ENTRIES:
        raise ValueError(f"transport {name!r} is registered already")
    if not isinstance(capabilities, Capabilities):
        raise TypeError(f"transport {name!r}: capabilities must be a comms.transport.Capabilities")
    entry = _ENTRIES[name] = Entry(name, capabilities, impl)
    return entry


def unregister(name: str) -> None:
    """Remove transport ``name`` (tests register their own and remove them)."""
    _ENTRIES.pop(name, None)


def names() -> tuple:
    """The registered names, in registration order."""
    return tuple(_ENTRIES)


def lookup(name: str) -> Entry:
    """The entry of ``name``; a KeyError naming the registered ones otherwise."""
    try:
        return _ENTRIES[name]
    except KeyError:
        raise KeyError(f"unknown transport {name!r}: use one of {', '.join(_ENTRIES)}") from None


def with_capabilities(**capabilities) -> tuple:
    """The registered names (in registration order) whose capabilities have the values given, e.g.
    ``with_capabilities(gpu_buffers=True)``: the GPU engine's transports, asked when needed (a transport registered
    later is included)."""
    return tuple(n for n, e in _ENTRIES.items()
                 if all(getattr(e.capabilities, k) == v for k, v in capabilities.items()))


def described() -> str:
    """'mpi, shm (CPU) or event, stream_gated (GPU)': the registered names by kind of buffer, for messages."""
    cpu = [n for n, e in _ENTRIES.items() if not e.capabilities.gpu_buffers]
    gpu = [n for n, e in _ENTRIES.items() if e.capabilities.gpu_buffers]
    return " or ".join(part for part in (f"{', '.join(cpu)} (CPU)" if cpu else "",
                                         f"{', '.join(gpu)} (GPU)" if gpu else "") if part)


# the built-in transports (docs/halo-protocol.md, "Transports, per link")
register("mpi", Capabilities(), "comms.transport.mpi")
register("shm", Capabilities(same_node=True), "comms.transport.shm")
register("event", Capabilities(gpu_buffers=True, same_node=True), "comms.transport.event")
register("stream_gated", Capabilities(gpu_buffers=True, same_node=True, graph_capture=True, host_driven=False),
         "comms.transport.stream_gated")
