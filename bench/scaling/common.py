"""What the parts of ``hmc scaling`` share: the file format name, the transports and operations, the phase names,
the user error, and the parsing of lattices, operations and process grids (the layout is in the docstring of
:mod:`bench.scaling.study`)."""
from __future__ import annotations

from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]      # the checkout: bench/scaling/ is two below
FORMAT = "hmc-scaling/1"
OPS = ("halo", "dslash", "cg", "mg", "trajectory", "rhmc")
OP_NAMES = "halo, dslash, cg, trajectory, rhmc"          # what --what takes (mg: refused, see parse_what)
DEFAULT_WHAT = ("halo", "dslash", "cg")
PHASE_NAMES = ("halo_start", "halo_wait", "halo_finish", "local_shift", "reductions", "compute")
# the parameters a resumed study must share with the file (they change what a number means)
MEASUREMENT_KEYS = ("what", "repeats", "cg_iters", "mass", "min_time", "halo_sizes", "traj_steps", "backend",
                    "threads", "rhmc_tau")

# how each built-in transport moves its data and signals completion, for the report's table; a transport registered
# later gets the row its capabilities give (transport_notes)
TRANSPORT_TABLE = {
    "serial": {"data": "none (one process, no partitioned dimension)", "signal": "-", "host_in_loop": "-",
               "device": "cpu or gpu"},
    "mpi": {"data": "host-staged (or device) buffers through MPI Isend/Irecv", "signal": "MPI request",
            "host_in_loop": "yes", "device": "cpu or gpu"},
    "shm": {"data": "MPI-3 shared-memory window between ranks of one node", "signal":
            "monotonic 64-bit counter in the peer's slot, polled (GEQ)", "host_in_loop": "yes (CPU)",
            "device": "cpu"},
    "event": {"data": "CUDA IPC / VMM mapping of the peer's receive buffer, copy engine", "signal":
              "interprocess CUDA event + MPI doorbell", "host_in_loop": "yes", "device": "gpu"},
    "stream_gated": {"data": "CUDA VMM mapping of the peer's receive buffer", "signal":
                     "cuStreamWriteValue64 / cuStreamWaitValue64 (GEQ)", "host_in_loop": "no", "device": "gpu"},
}


def cpu_transports() -> tuple:
    from comms.transport import registry

    return registry.with_capabilities(gpu_buffers=False)


def gpu_transports() -> tuple:
    from comms.transport import registry

    return registry.with_capabilities(gpu_buffers=True)


def transport_notes(name) -> dict:
    """The report's row of ``name`` (data, completion signal, host in the loop, device): the built-in's prose, else
    what its registered capabilities say."""
    if name in TRANSPORT_TABLE:
        return TRANSPORT_TABLE[name]
    from comms.transport import registry

    caps = registry.lookup(name).capabilities
    return {"data": ("peer's buffer mapped in this process" if caps.same_node else "through MPI") + " (registered)",
            "signal": "-", "host_in_loop": "yes" if caps.host_driven else "no",
            "device": "gpu" if caps.gpu_buffers else "cpu"}


class ScalingError(ValueError):
    """A user-facing error of ``hmc scaling`` (printed as one line)."""


# parsing and planning

def parse_lattices(groups) -> list:
    """Lattices from --lattice values: groups of 4 integers, or tokens '8x8x8x16' / '16^4'."""
    if not groups:
        raise ScalingError("give the lattice: --lattice NX NY NZ NT (e.g. --lattice 16 16 16 16)")
    out = []
    for tokens in groups:
        ints = []
        for tok in tokens:
            t = tok.strip().lower()
            if "^" in t:
                a, _, b = t.partition("^")
                if b != "4" or not a.isdigit():
                    raise ScalingError(f"--lattice {tok}: write L^4 or NXxNYxNZxNT or four numbers")
                out.append((int(a),) * 4)
            elif "x" in t:
                parts = t.split("x")
                if len(parts) != 4 or not all(p.isdigit() for p in parts):
                    raise ScalingError(f"--lattice {tok}: write NXxNYxNZxNT (four extents)")
                out.append(tuple(int(p) for p in parts))
            elif t.isdigit():
                ints.append(int(t))
            else:
                raise ScalingError(f"--lattice {tok!r} is not an extent")
        if len(ints) % 4:
            raise ScalingError(f"--lattice {' '.join(tokens)}: give four extents per lattice (NX NY NZ NT)")
        out += [tuple(ints[i:i + 4]) for i in range(0, len(ints), 4)]
    for lat in out:
        if any(n < 2 or n % 2 for n in lat):
            raise ScalingError(f"lattice {lat_name(lat)}: every extent must be even and at least 2 (even-odd "
                               "staggered operator)")
    seen = []
    for lat in out:
        if lat not in seen:
            seen.append(lat)
    return seen


def parse_what(values) -> list:
    names = [w.strip().lower() for v in values for w in v.replace(",", " ").split() if w.strip()]
    if not names:
        raise ScalingError(f"--what is empty: give some of {OP_NAMES}")
    for w in names:
        if w not in OPS:
            raise ScalingError(f"--what {w!r}: unknown operation; use {OP_NAMES}")
        if w == "mg":
            raise ScalingError("--what mg: hmc scaling does not time the multigrid solver yet (it needs a smooth "
                               f"gauge configuration, not the random links of the dslash and CG timings); use "
                               f"{OP_NAMES}")
    return [w for w in OPS if w in names]


def lat_name(lat) -> str:
    return "x".join(map(str, lat))


def parse_grids(values) -> list:
    """Explicit process grids from --grid: 'PXxPYxPZxPT' tokens or groups of four integers."""
    out, ints = [], []
    for tok in values or []:
        t = tok.strip().lower()
        if "x" in t:
            parts = t.split("x")
            if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
                raise ScalingError(f"--grid {tok}: write PXxPYxPZxPT (four positive rank counts, e.g. 1x1x2x2)")
            out.append(tuple(int(p) for p in parts))
        elif t.isdigit() and int(t) > 0:
            ints.append(int(t))
        else:
            raise ScalingError(f"--grid {tok!r}: write PXxPYxPZxPT (e.g. 1x1x2x2)")
    if len(ints) % 4:
        raise ScalingError(f"--grid {' '.join(values)}: give four rank counts per grid (PX PY PZ PT)")
    out += [tuple(ints[i:i + 4]) for i in range(0, len(ints), 4)]
    return list(dict.fromkeys(out))


