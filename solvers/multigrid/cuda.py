"""Batched CUDA kernels of the multigrid (solvers/multigrid/kernels/coarse.cu): the coarse 9-point stencil and the
Kahler-Dirac X^-1.

The array path (:class:`CoarseOperator`, :class:`KDBlocks`) costs, per application, 8 shifts (rolls) and 9 batched
products for the stencil, and two transposing reshapes around one batched product for X^-1: a dozen launches
and temporaries, on coarse lattices of a few hundred sites where a launch costs more than the arithmetic
(docs/multigrid.md: the coarse levels are latency-bound). Here each is ONE kernel that reads the neighbours through an
index table:

* :func:`stencil`: out(x) = sum_{d=0..8} Y_d(x) v(nb_d(x)), nb_0 = x, nb_{1+2mu} = x + mu, nb_{2+2mu} = x - mu
  (periodic on the local lattice); Y is (9, sites, n, n), v (sites, n, k); one thread per output (site, row,
  column), or, for one column (the solve phase), one warp per output row with the lanes splitting the sum, so that
  a warp reads a row of Y_d as contiguous runs (coalesced: Y is most of the traffic, 5.4 GB per application on
  8^4 x 96 unknowns).
* :func:`block_apply`: out(h, s, c) = sum_{s', c'} X_h[(s, c), (s', c')] v(site(h, s'), c'), the 48x48 block of
  hypercube h applied in place of the (to_blocks, matmul, from_blocks) sequence.

Both serve CuPy fields of complex128 or complex64 (the single-precision cycle) on any process grid. X^-1 is site-local (the hypercubes tile the local
volume). The stencil on a grid with partitioned dimensions reads an *extended* array: the local sites (flat, in
order) followed by the ghost buffer of ONE depth-1 exchange of the lattice's stencil over the partitioned
dimensions (:func:`extended`, comms/stencil.py: every transport, device to device with the GPU engine), with the
neighbour table :class:`HaloTable` pointing into it (built once per lattice with NumPy from the stencil's face
tables) - the same kernel.
The run configuration's ``mg_kernels`` (HMC_MG_KERNELS=0; or the override :func:`set_kernels`) turns them off.
The index tables are built with NumPy
(:func:`neighbour_table`, :func:`hypercube_table`, :class:`HaloTable`); :func:`stencil_reference` and
:func:`block_apply_reference` are the same contractions with NumPy fancy indexing, which the CPU tests compare with
the array path (the tables are right) and the GPU test with the kernels. :func:`set_emulation` (a testing hook)
sends NumPy fields through the kernel path with the references in place of the kernels, so that CPU runs under
mpiexec check the whole distributed route (tables, exchange, operator plumbing, timing) against the array path.
"""
from __future__ import annotations

import numpy as np

from lattice import cuda_source
from lattice.placement import set_switch, switch_on

from . import timing
from .lattice import to_blocks

_STATE = {"emulate": False}    # set_emulation (set_kernels: a switch of lattice.placement)

# The kernel file's variants (solvers/multigrid/kernels/coarse.cu, a template): complex<double> (suffix c128) and
# complex<float> (c64, the single-precision preconditioner of MultigridParams.precision).
PRECISIONS = {np.dtype(np.complex128): {"SUF": "c128", "C": "complex<double>", "R": "double"},
              np.dtype(np.complex64): {"SUF": "c64", "C": "complex<float>", "R": "float"}}

BLOCK = 128


def set_kernels(on: bool | None) -> bool | None:
    """Use the kernels (True) or the array path (False) for every geometry, or None: each geometry's configuration
    (``mg_kernels``) decides again; returns the previous override (None when there was none), to restore it with."""
    return set_switch("mg_kernels", on)


def set_emulation(on: bool) -> bool:
    """Testing hook: NumPy fields take the kernel path too, with :func:`stencil_reference` and
    :func:`block_apply_reference` in place of the kernels; returns the previous setting."""
    old, _STATE["emulate"] = _STATE["emulate"], bool(on)
    return old


def applies(geom, *arrays) -> bool:
    """Whether the kernels serve these fields: switched on, CuPy arrays (NumPy ones under :func:`set_emulation`)
    of one dtype, complex128 or complex64, on any process grid (partitioned dimensions: :func:`extended` and :class:`HaloTable`)."""
    if not switch_on("mg_kernels", geom.config) or not (geom.backend.is_gpu or _STATE["emulate"]):
        return False
    dtypes = {np.dtype(a.dtype) for a in arrays}
    return len(dtypes) == 1 and dtypes <= set(PRECISIONS)


def _kernel(backend, name, dtype):
    """The kernel ``name`` (mg_stencil, mg_stencil_row, mg_block_apply) for fields of ``dtype``."""
    params = PRECISIONS[np.dtype(dtype)]
    return cuda_source.function(backend, "solvers.multigrid", "coarse.cu", f"{name}_{params['SUF']}", params)


def _grid(total):
    return (int(min(max((total + BLOCK - 1) // BLOCK, 1), 65535)),)


# ------------------------------------------------------------------------------------------------ index tables
def neighbour_table(geom) -> np.ndarray:
    """(9, local sites) int64: flat local index of x (d = 0), x + mu (d = 1 + 2 mu) and x - mu (d = 2 + 2 mu),
    periodic on the local lattice (site axes (t, z, y, x), x fastest)."""
    ids = np.arange(int(np.prod(geom.shape))).reshape(geom.shape)
    out = [ids.ravel()]
    for mu in range(4):
        axis = 3 - mu
        out.append(np.roll(ids, -1, axis=axis).ravel())
        out.append(np.roll(ids, 1, axis=axis).ravel())
    return np.ascontiguousarray(np.stack(out)).astype(np.int64)


def hypercube_table(geom) -> np.ndarray:
    """(hypercubes, 16) int64: flat local index of each site of each 2^4 hypercube, in the order of
    :func:`lattice.to_blocks` (hypercubes in (T, Z, Y, X) order, sites in a hypercube x fastest)."""
    ids = np.arange(int(np.prod(geom.shape))).reshape(geom.shape)
    return np.ascontiguousarray(to_blocks(ids, (2, 2, 2, 2))).astype(np.int64)


def halo_stencil(geom):
    """The lattice's :class:`comms.stencil.Stencil` of the coarse stencil's halo: the hops +-1 along every
    partitioned dimension at depth 1 (the one :class:`lattice.geometry.HaloHandle` of ``geom.halo`` uses)."""
    dims = [mu for mu in range(4) if geom.grid.partitioned[mu]]
    return geom.stencil(tuple((mu, s) for mu in dims for s in (1, -1)), 1)


class HaloTable:
    """The neighbour table of the stencil on a grid with partitioned dimensions, into the *extended* array: rows
    0..nsite-1 are the local sites (flat, x fastest), then the ghost buffer of the lattice's depth-1 stencil
    (:func:`halo_stencil`; comms/stencil.py): for each partitioned mu (increasing) the face received from the
    backward neighbour (its last slab, side 0) and the one from the forward neighbour (its first slab, side 1),
    each in the C order of the face (the local site shape with extent 1 along mu).

    ``nb`` (9, nsite): as :func:`neighbour_table`, except that x + mu of a site on the last local slab of a
    partitioned mu (the sites of the stencil's face (mu, 1)) is the ghost row of its transverse position on side 1,
    and x - mu of a site on the first slab (face (mu, 0)) the ghost row on side 0 (a local extent 1 sends both hops
    to ghosts). Every face and site list comes from the stencil: ``stencil``; ``faces``: its ghost rows ((mu, side),
    first row, face site shape) offset by nsite; ``rows``: nsite plus every ghost site. Built with NumPy."""

    def __init__(self, geom):
        self.stencil = halo_stencil(geom)
        self.nsite = int(np.prod(geom.shape))
        self.dims = list(self.stencil.dims)
        nb = neighbour_table(geom)
        sends = {f.key: f for f in self.stencil.faces}
        for ghost in self.stencil.faces:                   # the ghost on side s is read by the sites face (mu, s) sends
            mu, side = ghost.recv_key
            hop = 1 + 2 * mu if side == 1 else 2 + 2 * mu
            nb[hop, sends[ghost.recv_key].sites] = self.nsite + ghost.ghost_at + np.arange(ghost.size)
        self.faces = [(key, self.nsite + at, shape) for key, at, shape in self.stencil.ghost_rows()]
        self.rows = self.nsite + sum(f.size for f in self.stencil.faces)
        self.nb = np.ascontiguousarray(nb)


def tables(geom, xp, what: str):
    """An index table of ``geom`` as an ``xp`` array, built once per lattice and process-grid layout (cached on
    the geometry). ``what``: "stencil" -> (nb, HaloTable or None): :func:`neighbour_table` on a grid without
    partitioned dimensions, else :class:`HaloTable` and its ``nb``; "hypercubes" -> :func:`hypercube_table`."""
    part = tuple(bool(p) for p in geom.grid.partitioned)
    key = (what, tuple(geom.shape), part if what == "stencil" else None, xp.__name__)
    cache = geom.__dict__.setdefault("_mg_tables", {})
    if key not in cache:
        if what == "hypercubes":
            cache[key] = xp.asarray(hypercube_table(geom))
        elif any(part):
            halo = HaloTable(geom)
            cache[key] = (xp.asarray(halo.nb), halo)
        else:
            cache[key] = (xp.asarray(neighbour_table(geom)), None)
    return cache[key]


def extended(geom, table: HaloTable, w):
    """The extended array of ``w`` (*sites, n[, k]) for :class:`HaloTable` ``table``: (rows, n[, k]), the local
    sites copied first, then the ghost buffer of one exchange of ``table.stencil`` (comms/stencil.py: every
    transport, device to device with the GPU engine). The exchange is charged to the active level clock as one halo
    exchange (:mod:`.timing`; its clock readings synchronize the device while timing is on)."""
    xp = geom.xp
    rest = tuple(w.shape[4:])
    ext = xp.empty((table.rows,) + rest, dtype=w.dtype)
    ext[:table.nsite] = w.reshape((table.nsite,) + rest)
    t0 = timing.now()
    st = table.stencil
    bufs = st.begin(w)
    st.complete(bufs)
    nghost = table.rows - table.nsite
    ext[table.nsite:] = bufs.ghost[0][:nghost * bufs.per].reshape((nghost,) + rest)
    timing.charge_halo(timing.now() - t0)
    return ext


# ------------------------------------------------------------------------------------------------ the kernels
def _columns(v, nsite, n):
    batched = v.ndim == 6
    w = v if batched else v[..., None]
    k = w.shape[-1]
    return batched, k, w.reshape(nsite, n, k)


def stencil(backend, Y, v, nb, ext=None):
    """The 9-point stencil by one kernel of ``backend``: Y (9, *sites, n, n), v (*sites, n[, k]), nb the device copy of
    :func:`neighbour_table`; or, on partitioned grids, ``ext`` the :func:`extended` array of v and nb the device
    copy of ``HaloTable.nb`` (the kernel reads the neighbours from ext). NumPy fields (:func:`set_emulation`):
    :func:`stencil_reference`."""
    if isinstance(v, np.ndarray):
        return stencil_reference(Y, v, nb, ext)
    import cupy as cp

    nsite = int(nb.shape[1])
    n = int(Y.shape[-1])
    batched, k, w = _columns(v, nsite, n)
    src = cp.ascontiguousarray(w if ext is None else ext.reshape(-1, n, k))
    Yc = cp.ascontiguousarray(Y)
    out = cp.empty((nsite, n, k), dtype=src.dtype)
    if k == 1:                                              # a warp per output row (coalesced reads of Y)
        _kernel(backend, "mg_stencil_row", src.dtype)(_grid(nsite * n * 32), (BLOCK,),
                                                      (Yc, src, nb, out, np.int64(nsite), np.int32(n)))
    else:
        _kernel(backend, "mg_stencil", src.dtype)(_grid(nsite * n * k), (BLOCK,),
                                                  (Yc, src, nb, out, np.int64(nsite), np.int32(n), np.int32(k)))
    return out.reshape(v.shape)


def block_apply(backend, X, v, hc):
    """X_h applied to every hypercube h by one kernel of ``backend``: X (hypercubes, 48, 48), v (*sites, 3[, k]),
    hc the device copy of :func:`hypercube_table`. NumPy fields (:func:`set_emulation`):
    :func:`block_apply_reference`."""
    if isinstance(v, np.ndarray):
        return block_apply_reference(X, v, hc)
    import cupy as cp

    nhc = int(hc.shape[0])
    nsite = nhc * 16
    batched, k, w = _columns(v, nsite, 3)
    w = cp.ascontiguousarray(w)
    out = cp.empty_like(w)
    total = nhc * 48 * k
    _kernel(backend, "mg_block_apply", w.dtype)(
        _grid(total), (BLOCK,), (cp.ascontiguousarray(X), w, hc, out, np.int64(nhc), np.int32(k)))
    return out.reshape(v.shape)


# ------------------------------------------------------------------------------------------------ references
def stencil_reference(Y, v, nb, ext=None):
    """:func:`stencil` with array indexing (NumPy or CuPy): the same contraction, the same table (rows of ``ext``,
    the :func:`extended` array, when given; else of v)."""
    nsite = int(nb.shape[1])
    n = int(Y.shape[-1])
    batched, k, w = _columns(v, nsite, n)
    src = w if ext is None else ext.reshape(-1, n, k)
    Yf = Y.reshape(9, nsite, n, n)
    out = 0
    for d in range(9):
        out = out + Yf[d] @ src[nb[d]]
    return out.reshape(v.shape)


def block_apply_reference(X, v, hc):
    """:func:`block_apply` with array indexing (NumPy or CuPy)."""
    nhc = int(hc.shape[0])
    batched, k, w = _columns(v, nhc * 16, 3)
    g = w[hc].reshape(nhc, 48, k)                           # (hypercubes, 16 sites x 3 colours, k)
    r = (X @ g).reshape(nhc, 16, 3, k)
    out = w.copy()
    out[hc.reshape(-1)] = r.reshape(nhc * 16, 3, k)
    return out.reshape(v.shape)
