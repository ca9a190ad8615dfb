"""The HISQ hop (one output parity of D, with an a*x + b*D psi epilogue) as a hand-written CUDA kernel.

Twin: :meth:`solvers.staggered.StaggeredDslash._hop_numpy`. One thread per output site of the parity. The link
blocks of the operator (16 hops: +-1 and +-3 in each direction, backward links precomputed) are re-laid here once
as structure of arrays, (nhop, 9, V/2) complex, so that a warp reads 32 consecutive values per element: fully
coalesced. Neighbour sites come from the thread's coordinates (no index tables): the lattice site of checkerboard
index j of parity p is x = 2k + ((p + y + z + t) & 1) on row j / (nx/2). Kernel file:
solvers/kernels/staggered_hop.cu.

Parity-compact fields (``compact=True``): psi, out and x hold the V/2 sites of one parity in checkerboard order
(the Krylov vectors of the multishift CG, docs/perf-notes.md): the neighbour at full-lattice index s is compact site
s >> 1 and the output site j is j itself; the arithmetic is the same, so the results are the same bits.

Bytes moved per output site (the figure ``hmc bench dslash`` divides by): 16 links (144 B each in double), 16
neighbour vectors (48 B), the output vector and, with a != 0, the x vector: 3216 + 48 B in double, half in single.
With long-link compression (:func:`link_table`, docs/perf-notes.md "Long-link compression") the 8 Naik links
are 7 complex numbers each instead of 9: 256 B a site less in double (3120 -> 2864 without the x vector).
"""
from __future__ import annotations

import numpy as np

from lattice import cuda_source
from lattice.placement import Placement, implements, switch_on

from .half_links import half_table_kernel, rounded_hops

BLOCK = 128
#: the run-configuration switch of long-link compression (lattice.placement consults it)
COMPRESS_SWITCH = "dslash_compress_long"
#: the largest error of a rebuilt third row, relative to the row's norm, that a table's precision takes as exact.
#: Double: the HISQ Naik links of Haar-random fields rebuild to 1.6e-12 (4^3 x 8) and 6.2e-12 (6^3 x 8), the
#: accuracy of W's U(3) projection, which the stored row has no more of than the rebuilt one; asqtad's to 1e-15.
#: Single: 2.3-2.7e-7, its rounding. Each well below the solves' 1e-10 (double) and the inner solves' 1e-5.
REBUILD_TOLERANCE = {np.dtype(np.complex128): 1e-10, np.dtype(np.complex64): 1e-5}


def hop_bytes(dtype, naik: bool = True, axpy: bool = False, compressed: bool = False, half: str = "off") -> int:
    """Bytes one output site must move: links (a compressed Naik link 7 complex numbers; a link of the hops
    ``half`` rounds, solvers.half_links: 9 pairs of 16-bit integers and a 4-byte scale), neighbour vectors, output
    (and x for the a*x epilogue)."""
    c = np.dtype(dtype).itemsize
    nhop = 16 if naik else 8
    if half != "off":
        nhalf = len(rounded_hops(nhop, half))
        links = nhalf * 4 * (9 + 1) + (nhop - nhalf) * 9 * c
    else:
        links = (8 * 9 + 8 * 7 if (naik and compressed) else nhop * 9) * c
    return links + nhop * 3 * c + 3 * c + (3 * c if axpy else 0)


def third_row_factors(links, xp):
    """(q, error) of Naik link blocks (..., 3, 3): per link the complex q with row 2 ~ q conj(row 0 x row 1) (least
    squares, in the links' precision) and the largest |row 2 - q conj(row 0 x row 1)| relative to |row 2|.

    Why it holds: a HISQ Naik link is c eta W W W (W in U(3), c = -(1+eps)/24, eta = +-1 the phases and boundary
    sign), an asqtad one c eta U U U: a real multiple s M of a unitary M, and for unitary M row 2 = det M conj(row 0
    x row 1) (M^dag = M^-1 = adj(M) / det M), so row 2 of s M is (det M / s) conj(row 0 x row 1). QUDA stores HISQ
    long links so too (its reconstruct 13). The error measures how far the links are from that form."""
    r0, r1, r2 = links[..., 0, :], links[..., 1, :], links[..., 2, :]
    cross = xp.conj(xp.stack([r0[..., 1] * r1[..., 2] - r0[..., 2] * r1[..., 1],
                              r0[..., 2] * r1[..., 0] - r0[..., 0] * r1[..., 2],
                              r0[..., 0] * r1[..., 1] - r0[..., 1] * r1[..., 0]], axis=-1))
    norm = (cross.real ** 2 + cross.imag ** 2).sum(-1)
    q = (xp.conj(cross) * r2).sum(-1) / xp.where(norm > 0, norm, 1)       # (0 where rows 0 and 1 are)
    miss = r2 - q[..., None] * cross
    row = (r2.real ** 2 + r2.imag ** 2).sum(-1)
    ratio = (miss.real ** 2 + miss.imag ** 2).sum(-1) / xp.where(row > 0, row, 1)
    return q, float(xp.sqrt(ratio.max()))


def link_table(blocks, xp, compress: bool):
    """(table, compressed): the link blocks (nhop, V/2, 3, 3) of one output parity as the kernel reads them,
    planes (element, site) so that a warp reads 32 consecutive sites: 9 planes a hop, or, ``compress`` with Naik
    hops and every Naik link rebuilding within :data:`REBUILD_TOLERANCE`, 7 for a Naik hop (rows 0 and 1, then q
    of :func:`third_row_factors`). Links of another form (a thin-link test field, links read from single
    precision) stay whole. The array twin of the table kernel (:meth:`CudaHop._build_table`), which the GPU runs."""
    nhop, vh = blocks.shape[0], blocks.shape[1]
    planes = blocks.reshape(nhop, vh, 9).transpose(0, 2, 1)
    if compress and nhop == 16:
        q, error = third_row_factors(blocks.reshape((4, 4) + blocks.shape[1:])[:, 2:], xp)   # (mu, +3/-3, V/2)
        if error <= REBUILD_TOLERANCE[np.dtype(blocks.dtype)]:
            table = xp.empty((4 * 32, vh), blocks.dtype)
            for mu in range(4):
                t = table[32 * mu:32 * (mu + 1)]
                t[:9], t[9:18] = planes[4 * mu], planes[4 * mu + 1]
                t[18:24], t[24], t[25:31], t[31] = planes[4 * mu + 2, :6], q[mu, 0], planes[4 * mu + 3, :6], q[mu, 1]
            return table, True
    return xp.ascontiguousarray(planes).reshape(nhop * 9, vh), False


def hop_suffix(dslash) -> str:
    """The name ending of the hop kernels for ``dslash``'s link table: ``double``, ``single`` or ``half``."""
    if dslash.half_links != "off":
        return "half"
    return "single" if np.dtype(dslash.dtype) == np.complex64 else "double"


class CudaHop:
    """``f(psi, parity, out, a, x, b)`` for one StaggeredDslash, on its geometry's GPU."""

    def __init__(self, dslash):
        self.dslash = dslash
        be = dslash.geom.backend
        cp = be.xp
        self.cp = cp
        single = np.dtype(dslash.dtype) == np.complex64
        self.suffix = hop_suffix(dslash)
        self.kernel = cuda_source.function(be, "solvers", "staggered_hop.cu", f"hop_{self.suffix}")
        self.real = np.float32 if single else np.float64
        self._soa = {}

    def _entry(self, parity):
        """(table, compressed, blocks) of this parity (:func:`link_table`), rebuilt when the operator's links
        change."""
        blocks = self.dslash._links[parity]
        key = (parity, id(blocks))
        if key not in self._soa:
            old = [v[0] for k, v in self._soa.items() if k[0] == parity]
            self._soa = {k: v for k, v in self._soa.items() if k[0] != parity}
            reuse = old[0] if old else None
            if self.dslash.half_links != "off":
                scales, naik_only = self.dslash._store.scales[parity], self.dslash.half_links == "naik"
                table = half_table_kernel(self.dslash.geom.backend, blocks, scales, naik_only, reuse)
                compressed = naik_only         # the kernels' ``clong`` argument: the form of the half table
            else:
                table, compressed = self._build_table(blocks, switch_on(COMPRESS_SWITCH, self.dslash.geom.config),
                                                      reuse=reuse)
            self._soa[key] = (table, compressed, blocks)
        return self._soa[key]

    def _build_table(self, blocks, compress: bool, reuse=None):
        """(table, compressed) as :func:`link_table` (its twin) gives them, by one kernel launch (``table_*``):
        with ``compress`` it writes the compressed form and each site's rebuild error, and the table is built
        whole instead if the largest error is above :data:`REBUILD_TOLERANCE`. The table is written into
        ``reuse`` (the last links' table) where it has the shape and type: the address a captured hop bakes in
        (:meth:`graph_key`) then stays, and the solvers' CUDA graphs replay over the new links."""
        xp = self.dslash.geom.xp
        nhop, vh = blocks.shape[0], blocks.shape[1]
        clong = bool(compress and nhop == 16)
        shape = (4 * 32 if clong else nhop * 9, vh)
        fits = reuse is not None and tuple(reuse.shape) == shape and reuse.dtype == blocks.dtype
        table = reuse if fits else xp.empty(shape, blocks.dtype)
        err = xp.empty(vh, self.real) if clong else None
        name = "table_single" if self.real == np.float32 else "table_double"
        kernel = cuda_source.function(self.dslash.geom.backend, "solvers", "staggered_hop.cu", name)
        kernel(((vh + BLOCK - 1) // BLOCK,), (BLOCK,), (blocks, table, 0 if err is None else err, np.int32(nhop),
                                                        np.int64(vh), np.int32(clong)))
        if clong and not float(err.max()) <= REBUILD_TOLERANCE[np.dtype(blocks.dtype)] ** 2:   # err: squared ratios
            return self._build_table(blocks, False, reuse)
        return table, clong

    def _links(self, parity):
        """The operator's links of this parity as the kernel's table."""
        return self._entry(parity)[0]

    def _clong(self, parity) -> np.int32:
        return np.int32(self._entry(parity)[1])

    @property
    def nhop(self) -> int:
        return self.dslash._links[0].shape[0]

    @property
    def compressed(self) -> bool:
        """Whether the tables of both parities hold compressed Naik links (built now if they are not yet)."""
        return self.suffix != "half" and all(self._entry(p)[1] for p in (0, 1))

    def graph_key(self) -> tuple:
        """The device addresses a captured application bakes in (its links of both parities), built now if they
        are not yet: a graph of this hop stays valid while they are the same."""
        return tuple(self._links(p).data.ptr for p in (0, 1)) + self.table_form()

    def table_form(self) -> tuple:
        """(shape, compressed) of both parities' tables: a graph captured over one form is not replayed over another
        at the same address."""
        return tuple((self._links(p).shape, bool(self._clong(p))) for p in (0, 1))

    #: the kernel takes parity-compact psi, out and x (``compact=True``: :meth:`StaggeredDslash.hop`)
    compact = True

    #: the kernel takes the status slot of a device-resident solve and returns once it has stopped (``frozen``)
    skips_frozen = True

    def __call__(self, psi, parity, out, a, x, b, compact=False, frozen=None):
        geom = self.dslash.geom
        nx, ny, nz, nt = geom.local_dims
        links, clong, _ = self._entry(parity)
        vh = links.shape[1]
        psi = self.cp.ascontiguousarray(psi)
        xarg = self.cp.ascontiguousarray(x) if (x is not None and a != 0.0) else 0
        self.kernel(((vh + BLOCK - 1) // BLOCK,), (BLOCK,),
                    (psi, links, out, xarg, self.real(a), self.real(b), np.int32(parity), np.int32(self.nhop),
                     np.int32(nx), np.int32(ny), np.int32(nz), np.int32(nt), np.int32(bool(compact)),
                     np.int32(clong), 0 if frozen is None else frozen))

    def many(self, psis, parity, outs, a, xs, b, compact=False):
        """``self(psi_k, parity, out_k, a, x_k, b)`` for every k in one launch (``hop_many``: each hop's links loaded
        once for up to 4 fields): the same numbers. ``xs``: None (no a x term) or one field per psi. The fields'
        addresses go to the device in one table (psis, outs, then xs), one copy a call."""
        geom = self.dslash.geom
        nx, ny, nz, nt = geom.local_dims
        links, clong, _ = self._entry(parity)
        vh = links.shape[1]
        cp, n = self.cp, len(psis)
        psis = [cp.ascontiguousarray(p) for p in psis]
        use_x = xs is not None and a != 0.0
        fields = psis + list(outs) + ([cp.ascontiguousarray(x) for x in xs] if use_x else [])
        table = cp.asarray(np.array([_address(f) for f in fields], dtype=np.uint64))
        kernel = cuda_source.function(geom.backend, "solvers", "staggered_hop.cu", f"hop_many_{self.suffix}")
        kernel(((vh + BLOCK - 1) // BLOCK,), (BLOCK,),
               (table, links, table[n:], table[2 * n:] if use_x else 0, np.int32(n), self.real(a), self.real(b),
                np.int32(parity), np.int32(self.nhop), np.int32(nx), np.int32(ny), np.int32(nz), np.int32(nt),
                np.int32(bool(compact)), np.int32(clong)))


def _address(a) -> int:
    """A field's device address for a kernel's pointer table (a NumPy array's own address on the host build of the
    kernels, tests/force/cuda_host.py)."""
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr


def _double_links(geom, fat, long) -> bool:
    """The block kernel reads C-contiguous complex128 links of the whole lattice (others: the array twin)."""
    return all(a is None or (a.dtype == np.complex128 and a.flags.c_contiguous) for a in (fat, long))


@implements("staggered.link_blocks", Placement.WHOLE, fits=_double_links)
def link_blocks(geom, fat, long, sites, dtypes) -> dict:
    """The link blocks of :func:`solvers.staggered._link_blocks_array` (its twin: the same values, bit for bit) in
    one launch per output parity, in double and single at once where ``dtypes`` asks for both: one read of the
    links instead of the twin's shifts, daggers, stack and gathers: 2.05 ms at 32^4 with the single conversion,
    against 5.8 ms (docs/perf-notes.md, session 18)."""
    cp = geom.xp
    nhop = 16 if long is not None else 8
    nx, ny, nz, nt = geom.local_dims
    kernel = cuda_source.function(geom.backend, "solvers", "staggered_hop.cu", "link_blocks")
    want = [d for d in dtypes if d in (np.dtype(np.complex128), np.dtype(np.complex64))]
    made = {d: [] for d in want}
    for p in (0, 1):
        vh = int(sites[p].shape[0])
        outs = {d: cp.empty((nhop, vh, 3, 3), d) for d in want}
        kernel((-(-9 * nhop * vh // BLOCK),), (BLOCK,),
               (fat, 0 if long is None else long, sites[p], outs.get(np.dtype(np.complex128), 0),
                outs.get(np.dtype(np.complex64), 0), np.int32(nhop), np.int64(vh), np.int32(nx), np.int32(ny),
                np.int32(nz), np.int32(nt)))
        for d in want:
            made[d].append(outs[d])
    return made


def _even_x(geom, dslash) -> bool:
    """The checkerboard index arithmetic of the kernel needs an even local x extent (else the array body)."""
    return geom.local_dims[0] % 2 == 0


@implements("staggered.hop", Placement.WHOLE, fits=_even_x)
def whole_lattice_hop(dslash):
    """The kernel when the whole lattice lives on this GPU of a one-rank run (WHOLE; a partitioned grid or a
    one-rank sub-grid of a split one is DISTRIBUTED: the distributed hop of :mod:`solvers.staggered_dist_cuda`)."""
    return CudaHop(dslash)
