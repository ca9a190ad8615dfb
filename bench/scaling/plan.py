"""The plan of a strong-scaling study: one configuration per (lattice, rank count, transport, graph), which
transports this machine has, and whether the graph-capturing runners can be used."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common import ScalingError, gpu_transports, lat_name


@dataclass
class Config:
    lattice: tuple
    ranks: int
    transport: str
    graph: bool = False
    grid: tuple | None = None
    skip: str | None = None
    explicit: bool = False          # a --grid grid: launched as given (the worker checks that it splits the lattice)

    @property
    def key(self) -> str:
        g = f"_g{lat_name(self.grid)}" if self.explicit else ""
        return f"l{lat_name(self.lattice)}_n{self.ranks}_{self.transport}{g}{'_graph' if self.graph else ''}"

    @property
    def label(self) -> str:
        return self.transport + ("+graph" if self.graph else "")

    @property
    def local_dims(self):
        if self.grid is None or any(n % p for n, p in zip(self.lattice, self.grid)):
            return None
        return tuple(n // p for n, p in zip(self.lattice, self.grid))


def plan(lattices, ranks, transports, graph=False, grids=()) -> list:
    """Every configuration, in run order: per lattice the 1-rank baseline, then rank counts ascending, transports
    in the given order (with ``graph``, a CUDA-graph row after each graph-capable transport). Rank counts without a
    grid of even local extents are planned as skipped, with the reason. An explicit grid (``grids``) replaces the
    automatic one of its rank count and is launched as given, even if it cannot split the lattice (the worker's
    error is then recorded)."""
    from comms import CommsError, choose_grid

    configs = []
    capture = graph_transports() if graph else ()
    for lat in lattices:
        configs.append(Config(lat, 1, "serial", grid=(1, 1, 1, 1)))
        counts = sorted(set(ranks) | {int(np.prod(g)) for g in grids})
        for n in counts:
            if n == 1:
                continue
            chosen = []                                   # (grid, skip reason, explicit)
            for g in grids:
                if int(np.prod(g)) == n:
                    chosen.append((tuple(g), None, True))
            if not chosen and n in ranks:
                grid, why = None, None
                try:
                    grid = choose_grid(n, lat, even_only=True)
                except CommsError:
                    why = (f"{n} ranks cannot split the {lat_name(lat)} lattice into even local extents (each split "
                           "dimension needs an even number of sites per rank)")
                chosen.append((grid, why, False))
            for grid, why, explicit in chosen:
                for t in transports:
                    configs.append(Config(lat, n, t, grid=grid, skip=why, explicit=explicit))
                    if t in capture:
                        configs.append(Config(lat, n, t, graph=True, grid=grid, skip=why, explicit=explicit))
    return configs


def check_transports(transports, graph) -> list:
    """The transports, validated against comms.transport.registry: unknown names and GPU transports this machine
    or build cannot run are one-line errors (nothing is launched)."""
    from comms.transport import registry

    out = []
    for t in transports:
        for name in t.replace(",", " ").split():
            name = name.strip().lower()
            if name not in registry.names():
                raise ScalingError(f"unknown transport {name!r}: use {registry.described()}")
            if name not in out:
                out.append(name)
    if not out:
        raise ScalingError(f"--transports is empty: give {registry.described()}")
    if graph:
        if not set(out) & set(graph_transports()):
            capture = " or ".join(graph_transports())
            raise ScalingError(f"--graph captures the {capture} exchange in CUDA graphs: add {capture} to "
                               "--transports")
        why = graph_module_missing()
        if why:
            raise ScalingError(f"--graph {why}")
    for name in out:
        why = transport_unavailable(name)
        if why:
            raise ScalingError(f"transport {name!r} cannot run here: {why}")
    return out


def transport_unavailable(name) -> str | None:
    """Why ``name`` cannot run on this machine and build, or None. The CPU transports always can (shm needs MPI-3
    shared windows; a failure there is recorded per configuration)."""
    if name not in gpu_transports():
        return None
    if not _gpu_visible():
        return (f"no CUDA GPU with CuPy is visible, and the GPU transports ({', '.join(gpu_transports())}) need one: "
                "drop it from --transports or run the study on a GPU machine")
    from comms import CommsError
    from comms.halo import check_transport_name

    try:
        check_transport_name(name)
    except CommsError as e:
        return f"the GPU transports could not be loaded ({str(e).splitlines()[0]})"
    return None


GRAPH_MODULE = "solvers.staggered_dist_cuda"    # the distributed GPU dslash / CG that can be graph-captured


def graph_transports() -> tuple:
    """The transports whose dslash and CG iterations can be captured in CUDA graphs (no host in the loop): those
    registered with ``graph_capture``."""
    from comms.transport import registry

    return registry.with_capabilities(graph_capture=True)


def graph_module_missing() -> str | None:
    """Why the graph-capturing module cannot be used, or None (checked without importing it: no CUDA here)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(GRAPH_MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return (f"needs {GRAPH_MODULE.replace('.', '/')}.py (the distributed GPU dslash and CG with CUDA-graph "
                "capture), which this checkout does not have: run without --graph")
    return None


def _gpu_visible() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False

