"""Fused linear algebra of the CG solvers as hand-written CUDA kernels (CuPy RawModule), on one or several ranks.

The solvers in :mod:`solvers.cg` spend their vector work in a few fixed patterns; each is one kernel here, and
every reduction ends in a small device buffer that comes back to the host in ONE transfer:

* :meth:`CudaBlas.cg_update` (Chronopoulos-Gear CG): p = r + beta p, s = w + beta s, x += alpha p, r -= alpha s;
* :meth:`CudaBlas.norm2_redot`: (|r|^2, Re<r, w>), optionally first w += shift r (the base shift of multishift CG);
* :meth:`CudaBlas.xpay` (Hestenes-Stiefel): p = r + beta p;
* :meth:`CudaBlas.axpy2_norm2` (Hestenes-Stiefel): x += alpha p, r -= alpha s and |r|^2;
* :meth:`CudaBlas.multishift_update`: s = w + beta s, then for every shift p_i = zeta_i r + beta_i p_i,
  x_i += alpha_i p_i, and finally r -= alpha s; with complex64 Krylov vectors some x_i may be complex128 (the
  mixed-precision multishift, docs/conventions.md 3.2): the ``ms_update_mixed`` kernels, double coefficients, and
  those x_i's addresses tagged with bit 1 in the pointer table.

So a CG iteration is: update kernel, the operator, reduction kernel, one device-to-host copy of two numbers (the
only host synchronisation). The element-wise arithmetic is the NumPy path's, in the same order and precision
(coefficients rounded to the field precision as NumPy does with a Python float times a complex64 array), compiled
without contraction to fused multiply-adds (``--fmad=false``; the kernels: solvers/kernels/fused_blas.cu), so the
updated vectors are bitwise the NumPy ones; the reductions accumulate in double precision (each product in the
field precision, as the NumPy path) and are summed in a fixed order (per-block shared-memory trees, then the last
block adds the block partials), so they are deterministic from run to run and differ from NumPy's/cuBLAS's sums
only by rounding.

Sites: an even-odd operator's fields are full-lattice with exact zeros on the other parity. The kernels then run
over the V/2 sites of the operator's parity only, with the checkerboard mapping of :mod:`solvers.staggered_cuda`
(site j of parity p: x = 2k + ((p + y + z + t) & 1) on row j / (nx/2)); sites of the other parity are neither read
nor written. :func:`fused_cuda_blas` restricts to the parity only when the source vanishes there (else the NumPy path's
iterates would carry the other parity along, and so do these kernels over the whole lattice). Bytes: a site's
colour vector is 48 bytes and its neighbours along x have the other parity, so a parity-restricted kernel reads
whole 32-byte sectors anyway and writes half sectors, which DRAM with ECC may have to read, modify and write. On
the H200 at 32^4 the update and reduction kernels took about 300 us per iteration in this mode, several times what
their useful bytes need; ``HMC_SOLVER_FUSED=all`` (``set_fused_blas("all")``) runs the same kernels over every site
(whole sectors written) for comparison. The multishift update, which touches 2 + 2 x shifts fields, runs one thread
per complex number (a warp's words consecutive in every field): 617 us at 32^4 with 9 shifts on the H200 (1.0 GB,
1.7 TB/s), where a thread per site took 1565 us (tools/profile_dist_multishift.py). Its shifts' p_i and x_i are
loaded four shifts at a time before any is stored (a load after each store had a thread wait for one load at a
time), which costs registers (46 in single, 70 in double, ptxas sm_90), so its grid is not capped: one thread per
number.

Parity-compact vectors (``compact``, :class:`_Layout`): the CG and multishift CG ask for them (``fused_blas(op, b,
compact=True)``) and get them where the operator has a compact form (:class:`solvers.staggered.CompactNormal`, the
whole-lattice hop kernel) and the sums are the fast ones: their Krylov vectors (and the multishift's solutions) are
then (V/2, 3) arrays of the parity's sites in checkerboard order, the same kernels run with the identity site
mapping over their V/2 sites, every access is a whole, consecutive sector, and the solver gathers its source at the
start and scatters the solutions at the end. Site j is the same lattice site in both layouts and the grids are the
same, so the updates and the reductions (their order included) give the same bits as the parity's sites of
full-lattice vectors (``HMC_SOLVER_FUSED=strided``). The byte model of an iteration: docs/perf-notes.md.

Several ranks: the kernels work on the rank's local sites (their checkerboard is the local one, so a parity is
turned into the local parity of the rank's offset) and a reduction's two local results go through ``geom.sum``
(one exact sum of one number pair per rank, as the NumPy path's "fast" reductions), so a distributed multishift or
CG iteration costs the same three launches plus one small allreduce instead of 4 + 2 x shifts array operations.

Twin: :class:`BlasTwin`, the same interface in NumPy/CuPy array arithmetic (the NumPy formulas the tests compare
with). Selected in one place, :func:`solvers.operator.fused_blas`, by the solve's field space
(:class:`solvers.operator.FieldSpace`): the kernels serve spaces of staggered colour vectors (:data:`SITE_SHAPE`, the
site the kernels are written for) and keep one object per space.
"""
from __future__ import annotations

import numpy as np

from lattice import cuda_source
from lattice.placement import Placement, implements

BLOCK = 256           # threads per block (the reduction trees assume exactly this)
MAX_BLOCKS = 1024     # grid-stride loops beyond: a fixed grid keeps the reduction order fixed
NRED = 2              # numbers a reduction kernel returns
SITE_SHAPE = (3,)     # the kernels' site: one colour vector (solvers/kernels/fused_blas.cu loops over 3 components)

_KERNELS = ("cg_update", "xpay", "norm2_redot", "axpy2_norm2", "ms_update", "cg_update_dev", "ms_update_dev",
            "norm2_redot_dev")
_MIXED = ("ms_update_mixed", "ms_update_dev_mixed")


def _device_ptr(a) -> int:
    return a.data.ptr


def _precision(dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype == np.complex128:
        return "double"
    if dtype == np.complex64:
        return "single"
    raise ValueError(f"fused linear algebra takes complex128 or complex64 fields, not {dtype}")


class _Layout:
    """The layout of a solve's Krylov vectors, shared by :class:`CudaBlas` and :class:`BlasTwin`: full-lattice
    fields (``compact`` False: :meth:`gather` and :meth:`scatter` are the identity), or parity-compact ones
    (``compact``: the V/2 local sites of ``parity`` in checkerboard order, shape (V_local/2, 3), as the hop's
    compact mode and :class:`solvers.staggered.CompactNormal` take them): the solver gathers its source into that
    layout and scatters its solutions back (docs/perf-notes.md, "Parity-compact Krylov vectors")."""

    def __init__(self, compact):
        """(after ``geom``, ``parity`` and ``dtype`` are set)"""
        self.compact = bool(compact)
        self._sites = None
        geom = self.geom
        self.shape = ((geom.local_volume // 2,) if self.compact else tuple(geom.shape)) + SITE_SHAPE

    def _compact_sites(self):
        if self._sites is None:
            from .staggered import parity_sites

            self._sites = parity_sites(self.geom, self.parity)
        return self._sites

    def zeros(self, dtype=None):
        """A zero vector of this layout (``dtype``: default the kernels' precision)."""
        return self.geom.xp.zeros(self.shape, dtype=self.dtype if dtype is None else dtype)

    def gather(self, v):
        """A full-lattice field in this layout: its parity's sites, a new array (``v`` itself when not compact)."""
        if not self.compact:
            return v
        return self.geom.xp.take(v.reshape((-1,) + SITE_SHAPE), self._compact_sites(), axis=0)

    def scatter(self, c):
        """A vector of this layout as a full-lattice field, zero on the other parity (``c`` when not compact)."""
        if not self.compact:
            return c
        full = self.geom.xp.zeros(tuple(self.geom.shape) + SITE_SHAPE, dtype=c.dtype)
        full.reshape((-1,) + SITE_SHAPE)[self._compact_sites()] = c
        return full


class CudaBlas(_Layout):
    """The fused kernels for fields of one geometry and precision, over the sites of ``parity`` (0, 1) or, with
    ``parity=None``, over every site; ``compact``: on parity-compact vectors of that parity (:class:`_Layout`).
    Holds its own reduction buffers (block partials, a counter and the two
    results), used by one kernel at a time on the current stream; :func:`cuda_blas` keeps one per local lattice,
    precision and parity (global parity: on a rank whose offset is odd the kernels take the other local one)."""

    def __init__(self, geom, dtype, parity=None, exact=False, compact=False):
        if compact and (parity is None or exact):
            raise ValueError("parity-compact fused kernels need a parity and the fast sums")
        be = geom.backend
        cp = be.xp
        self.exact = bool(exact)             # the "exact" reduction mode: sums through lattice.exact_sum_cuda
        if self.exact:
            from lattice.exact_sum_cuda import ExactReducer, accumulator

            self._exact, self._records = ExactReducer(be), accumulator(cp, 2)
        self.cp, self.geom = cp, geom
        self.dtype = np.dtype(dtype)
        suffix = _precision(self.dtype)
        self.real = np.float32 if suffix == "single" else np.float64
        self._k = {name: cuda_source.function(be, "solvers", "fused_blas.cu", f"{name}_{suffix}") for name in _KERNELS}
        if suffix == "single":       # the mixed-precision multishift: float2 Krylov vectors, double2 solutions
            self._k.update({name: cuda_source.function(be, "solvers", "fused_blas.cu", name) for name in _MIXED})
        self.parity = None if parity is None else int(parity)
        _Layout.__init__(self, compact)
        # compact vectors: site j of the arrays is checkerboard site j (site_of's identity, parity -1)
        local_parity = -1 if self.parity is None or self.compact else (self.parity + sum(geom.offset)) & 1
        nx, ny, nz, _ = geom.local_dims
        self.n = geom.local_volume if self.parity is None else geom.local_volume // 2
        self._lat = (np.int64(self.n), np.int32(local_parity), np.int32(nx), np.int32(ny), np.int32(nz))
        self._global_sum = geom.grid.comm.size > 1
        self._grid = (max(1, min(MAX_BLOCKS, (self.n + BLOCK - 1) // BLOCK)),)
        numbers = self.n * SITE_SHAPE[0]
        # the multishift update: a thread per number and no grid-stride loop (no reduction, so the grid is free):
        # with its chunked loads' registers fewer blocks fit an SM, and a capped grid would end in a partial wave
        self._grid_numbers = (max(1, (numbers + BLOCK - 1) // BLOCK),)
        self._partial = cp.zeros(NRED * MAX_BLOCKS, dtype=np.float64)
        self._counter = cp.zeros(1, dtype=np.uint32)
        self._result = cp.zeros(NRED, dtype=np.float64)
        self._ptr_key, self._ptr_fields, self._ptrs = None, None, None
        self._coef = {}               # coefficient dtype -> (pinned host buffer, device buffer, copy event)

    # --- helpers --------------------------------------------------------------------------------------------
    def _f(self, a, dtype=None):
        """A field argument: checked to be a C-contiguous device array of this precision (or ``dtype``) and
        layout."""
        dtype = self.dtype if dtype is None else np.dtype(dtype)
        if (not isinstance(a, self.cp.ndarray) or a.dtype != dtype or tuple(a.shape) != self.shape
                or not a.flags.c_contiguous):
            raise ValueError(f"fused solver linear algebra: expected a C-contiguous {dtype} CuPy array of "
                             f"shape {self.shape}, got {type(a).__name__} "
                             f"{getattr(a, 'dtype', '?')} {tuple(getattr(a, 'shape', ()))}")
        return a

    def mixed_solutions(self, xs) -> bool:
        """Whether some of the multishift's solutions are complex128 with these complex64 Krylov vectors: the
        ``ms_update_mixed`` kernels (double coefficients, tagged addresses: :meth:`x_address`)."""
        return self.dtype == np.complex64 and any(x.dtype == np.complex128 for x in xs)

    def x_address(self, a) -> int:
        """A solution field's address in the multishift pointer table: a field of this precision, or, with
        complex64 Krylov vectors, a complex128 one tagged with bit 1 (fields are 16-byte aligned), which the
        ``ms_update_mixed`` kernels update in double."""
        if self.dtype == np.complex64 and getattr(a, "dtype", None) == np.complex128:
            return _device_ptr(self._f(a, np.complex128)) | 1
        return _device_ptr(self._f(a))

    def _launch(self, name, *args):
        grid = self._grid_numbers if name.startswith("ms_update") else self._grid
        self._k[name](grid, (BLOCK,), args + self._lat)

    def _red(self):
        return (self._partial, self._counter, self._result)

    def _fetch(self):
        """The two reduction results: the one device-to-host copy (and host synchronisation), summed over the
        ranks with several."""
        v = self._result.get()
        if self._global_sum:
            z = complex(self.geom.sum(np.asarray(complex(float(v[0]), float(v[1])))))
            return z.real, z.imag
        return float(v[0]), float(v[1])

    # --- the fused operations -------------------------------------------------------------------------------
    def cg_update(self, p, s, x, r, w, alpha, beta, fresh=False):
        """p = r + beta p, s = w + beta s (p = r, s = w when ``fresh``); x += alpha p; r -= alpha s."""
        f, R = self._f, self.real
        self._launch("cg_update", f(p), f(s), f(x), f(r), f(w), R(alpha), R(0.0 if fresh else beta),
                     np.int32(bool(fresh)))

    def xpay(self, p, r, beta, fresh=False):
        """p = r + beta p (p = r when ``fresh``)."""
        self._launch("xpay", self._f(p), self._f(r), self.real(0.0 if fresh else beta), np.int32(bool(fresh)))

    def norm2_redot(self, a, w, shift=0.0):
        """(|a|^2, Re<a, w>); with ``shift`` != 0, first w += shift a (in place). One host synchronisation."""
        self._launch("norm2_redot", self._f(a), self._f(w), self.real(shift), np.int32(shift != 0.0),
                     *self._red())
        return self._exact_pair(a, w) if self.exact else self._fetch()

    def _exact_pair(self, a, w):
        """(|a|^2, Re<a, w>) summed exactly (the records of every rank added as integers, rounded once): the same
        bits for any decomposition, and those of geom.sum of the products (the NumPy path's exact mode)."""
        from comms import superacc

        self._exact.norm2_redot(a, w, self._records)
        mine = self._records.get()
        comm = self.geom.grid.active_comm
        parts = comm.allgather(mine) if self._global_sum else [mine]
        return tuple(superacc.to_float(superacc.add(*[p[q] for p in parts])) for q in (0, 1))

    def norm2(self, a):
        """|a|^2 over this object's sites."""
        return self.norm2_redot(a, a)[0]

    def axpy2_norm2(self, p, s, x, r, alpha, reduce=True):
        """x += alpha p; r -= alpha s; returns |r|^2 (None with ``reduce=False``: no host synchronisation)."""
        f = self._f
        self._launch("axpy2_norm2", f(p), f(s), f(x), f(r), self.real(alpha), *self._red())
        if not reduce:
            return None
        return self._exact_pair(r, r)[0] if self.exact else self._fetch()[0]

    def multishift_update(self, s, r, w, ps, xs, coefs, alpha, beta, fresh=False):
        """s = w + beta s (s = w when ``fresh``); for each shift i with ``coefs[i] = (zeta, a, b)`` (None: a
        frozen shift, left alone): p_i = zeta r + b p_i (zeta r when ``fresh``), x_i += a p_i; then r -= alpha s."""
        if not (len(ps) == len(xs) == len(coefs)):
            raise ValueError("multishift_update: ps, xs and coefs must have one entry per shift")
        # the device table of the fields' addresses, rebuilt when the fields change: keyed by the objects (held
        # here, so that their ids stay theirs), so that the fields are checked once per solve, not per iteration
        mixed = self.mixed_solutions(xs)
        table = self.pointer_table(ps, xs)
        coef = self._coefficients(coefs, np.float64 if mixed else self.real)
        f, R = self._f, self.real
        self._launch("ms_update_mixed" if mixed else "ms_update", f(s), f(r), f(w), table[0], table[1], coef,
                     np.int32(len(coefs)), R(alpha), R(0.0 if fresh else beta), np.int32(bool(fresh)))

    def pointer_table(self, ps, xs):
        """The device tables of the shifts' p_i and x_i addresses, rebuilt when the fields change: keyed by the
        objects (held here, so that their ids stay theirs), so that the fields are checked once per solve, not per
        iteration."""
        key = tuple(map(id, ps)) + tuple(map(id, xs))
        if self._ptr_key != key:
            ptrs = tuple(_device_ptr(self._f(a)) for a in ps) + tuple(self.x_address(a) for a in xs)
            dev = self.cp.asarray(np.asarray(ptrs, dtype=np.uint64))
            self._ptr_key, self._ptr_fields, self._ptrs = key, (tuple(ps), tuple(xs)), (dev[:len(ps)], dev[len(ps):])
        return self._ptrs

    # --- the device-resident forms (solvers.krylov_graph): coefficients read from the state vector ``st`` -------
    def cg_update_dev(self, p, s, x, r, w, st):
        """:meth:`cg_update` with alpha, beta and the fresh flag from the state vector (no-op once it is frozen)."""
        f = self._f
        self._launch("cg_update_dev", f(p), f(s), f(x), f(r), f(w), st)

    def ms_update_dev(self, s, r, w, table, coef, nshift, st, mixed=False):
        """:meth:`multishift_update` with alpha, beta, fresh from the state vector and the shifts' (zeta, a, b,
        active) from ``coef`` on the device (no-op once the state is frozen); ``mixed``: complex128 solutions,
        double coefficients (``ms_update_dev_mixed``)."""
        f = self._f
        self._launch("ms_update_dev_mixed" if mixed else "ms_update_dev", f(s), f(r), f(w), table[0], table[1], coef,
                     np.int32(nshift), st)

    def norm2_redot_into(self, a, w, shift, result, st=None):
        """:meth:`norm2_redot` into the device pair ``result`` (this rank's sums; no host synchronisation). ``st``:
        the state vector of a device-resident solve (solvers/krylov_graph.py), whose stopped state skips it (no
        w += shift a past the solve's end)."""
        name, state = ("norm2_redot", ()) if st is None else ("norm2_redot_dev", (st,))
        self._launch(name, self._f(a), self._f(w), self.real(shift), np.int32(shift != 0.0),
                     self._partial, self._counter, result, *state)

    def _coefficients(self, coefs, real):
        """The shifts' (zeta, a, b, active) on the device, in ``real``: written into a pinned host buffer and copied
        on the current stream without a host synchronisation (a pageable cupy.asarray would block for ~10 us); the
        copy's event guards the buffer against the next call's writes. One buffer set per coefficient precision."""
        import cupyx

        n, key = 4 * len(coefs), np.dtype(real).str
        host_buf, dev_buf, copied = self._coef.get(key, (None, None, None))
        if host_buf is None or host_buf.size < n:
            host_buf, dev_buf, copied = cupyx.empty_pinned((n,), dtype=real), self.cp.empty(n, dtype=real), None
        if copied is not None:
            copied.synchronize()
        host = host_buf[:n].reshape(-1, 4)
        host[...] = 0
        for i, co in enumerate(coefs):
            if co is not None:
                host[i, :3] = co
                host[i, 3] = 1
        stream = self.cp.cuda.get_current_stream()
        dev = dev_buf[:n]
        dev.set(host_buf[:n], stream=stream)
        if copied is None:
            copied = self.cp.cuda.Event(disable_timing=True)
        copied.record(stream)
        self._coef[key] = (host_buf, dev_buf, copied)
        return dev

    def off_parity_norm2(self, a) -> float:
        """|a|^2 over the sites of the other parity (0 when a vanishes there), for any complex precision."""
        if self.parity is None:
            return 0.0
        return cuda_blas(self.geom, a.dtype, 1 - self.parity).norm2(a)      # (a full-lattice field)


class BlasTwin(_Layout):
    """The NumPy/CuPy twin of :class:`CudaBlas`: the same operations in array arithmetic, in the order of the
    solvers' NumPy path, on the sites of ``parity`` (all sites for None; ``compact``: parity-compact vectors, every
    one of their sites). What the kernels are tested against."""

    def __init__(self, geom, dtype, parity=None, compact=False):
        from .staggered import parity_sites

        self.geom, self.xp = geom, geom.xp
        self.dtype = np.dtype(dtype)
        self.parity = None if parity is None else int(parity)
        _Layout.__init__(self, compact)
        self.idx = None if self.parity is None or self.compact else parity_sites(geom, self.parity)

    def _get(self, a):
        v = a.reshape((-1,) + SITE_SHAPE)
        return v.copy() if self.idx is None else v[self.idx]

    def _set(self, a, val):
        v = a.reshape((-1,) + SITE_SHAPE)
        if self.idx is None:
            v[...] = val
        else:
            v[self.idx] = val

    def _sum(self, v):
        if v.dtype == np.complex64:
            return complex(v.sum(dtype=np.complex128))
        return complex(v.sum())

    def cg_update(self, p, s, x, r, w, alpha, beta, fresh=False):
        P, S, X, Rr, W = (self._get(a) for a in (p, s, x, r, w))
        if fresh:
            P, S = Rr.copy(), W.copy()
        else:
            P *= beta
            P += Rr
            S *= beta
            S += W
        X += alpha * P
        Rr -= alpha * S
        for a, v in ((p, P), (s, S), (x, X), (r, Rr)):
            self._set(a, v)

    def xpay(self, p, r, beta, fresh=False):
        P, Rr = self._get(p), self._get(r)
        if fresh:
            P = Rr.copy()
        else:
            P *= beta
            P += Rr
        self._set(p, P)

    def norm2_redot(self, a, w, shift=0.0):
        A, W = self._get(a), self._get(w)
        if shift != 0.0:
            W += shift * A
            self._set(w, W)
        return self._sum(A.conj() * A).real, self._sum(A.conj() * W).real

    def norm2(self, a):
        return self.norm2_redot(a, a)[0]

    def axpy2_norm2(self, p, s, x, r, alpha, reduce=True):
        P, S, X, Rr = (self._get(a) for a in (p, s, x, r))
        X += alpha * P
        Rr -= alpha * S
        self._set(x, X)
        self._set(r, Rr)
        return self._sum(Rr.conj() * Rr).real if reduce else None

    def multishift_update(self, s, r, w, ps, xs, coefs, alpha, beta, fresh=False):
        S, Rr, W = self._get(s), self._get(r), self._get(w)
        if fresh:
            S = W.copy()
        else:
            S *= beta
            S += W
        self._set(s, S)
        for p, x, co in zip(ps, xs, coefs):
            if co is None:
                continue
            zi, ai, bi = co
            if fresh:
                P = zi * Rr
            else:
                P = self._get(p)
                P *= bi
                P += zi * Rr
            X = self._get(x)
            X += ai * (P.astype(X.dtype) if X.dtype != P.dtype else P)     # a mixed multishift: x in double
            self._set(p, P)
            self._set(x, X)
        Rr -= alpha * S
        self._set(r, Rr)

    def off_parity_norm2(self, a) -> float:
        if self.parity is None:
            return 0.0
        return BlasTwin(self.geom, a.dtype, 1 - self.parity).norm2(a)


def cuda_blas(geom, dtype, parity=None, exact=False, compact=False) -> CudaBlas:
    """The :class:`CudaBlas` of this local lattice, precision, parity, reduction mode and layout, made once per
    backend and process grid (its reductions sum over that grid's ranks; the cached object keeps the grid alive, so
    its id stays unique)."""
    key = ("solver_blas", tuple(geom.local_dims), np.dtype(dtype).str, None if parity is None else int(parity),
           sum(geom.offset) & 1, id(geom.grid), bool(exact), bool(compact))
    return geom.backend.kernel(key, lambda: CudaBlas(geom, dtype, parity, exact, compact))


def _fits(geom, source=None, space=None) -> bool:
    """A space of colour vectors (the kernels' site), an even local x extent (the checkerboard rows of the kernels)
    and a C-contiguous source (the solver's fields follow the source's layout); else the NumPy path."""
    return ((space is None or space.site_shape == SITE_SHAPE) and geom.local_dims[0] % 2 == 0
            and (source is None or source.flags.c_contiguous))


@implements("solvers.fused_blas", Placement.WHOLE, Placement.DISTRIBUTED, fits=_fits)
def fused_cuda_blas(space, source=None, exact=False, compact=False):
    """A :class:`CudaBlas` for one solve on the vectors of ``space``, restricted to its parity when the source
    vanishes on the other parity; ``exact``: its sums exact (the "exact" reduction mode); ``compact``: on
    parity-compact vectors where it is restricted to the parity and its sums are the fast ones."""
    geom, dtype, parity = space.geometry, space.dtype, space.parity
    blas = cuda_blas(geom, dtype, parity, exact)
    if parity is not None and source is not None and blas.off_parity_norm2(source) != 0.0:
        blas = cuda_blas(geom, dtype, None, exact)
    if compact and blas.parity is not None and not exact:
        blas = cuda_blas(geom, dtype, parity, exact, compact=True)
    return blas
