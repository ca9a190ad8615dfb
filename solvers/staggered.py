"""The HISQ (fat + Naik) staggered Dirac operator in MILC's conventions (docs/conventions.md 1.2, 1.6).

With the staggered phases and boundary signs folded into the fat links X and the long links L,

    D psi(x) = sum_mu [ X_mu(x) psi(x+mu) - X_mu^dag(x-mu) psi(x-mu) + L_mu(x) psi(x+3mu) - L_mu^dag(x-3mu) psi(x-3mu) ]

with no factor 1/2. D is anti-Hermitian and connects even and odd sites; M = 2m + D, M^dag = 2m - D. The
even-odd form solves A_m x_e = (M^dag b)_e with A_m = 4m^2 - D_eo D_oe (Hermitian positive) and reconstructs
x_o = (b_o - D_oe x_e)/(2m).

Field layout
------------
A colour-vector field is a full-lattice site array of shape (nt, nz, ny, nx, 3), x fastest (the order of
``Geometry`` and of MILC's files), complex128 or complex64. A field "on even sites" is such an array whose odd sites
are zero (and vice versa); every even-odd operator here returns exact zeros on the sites it does not own and ignores
the input on the sites it does not read. Why full-lattice and not checkerboarded (half volume per parity):

* neighbours are reached with ``geom.shift`` on full site arrays, which the domain-decomposition issue replaces by
  halo exchanges; a checkerboarded x-shift would need a parity-dependent shift that Geometry does not have;
* fields go to and from the rest of the code (pseudofermions drawn by global site index, the fermion force, I/O)
  without conversion;
* the cost that matters is not doubled: each application computes only the sites of its output parity, with
  the links stored per output parity (below), so an even-odd application does half-volume work. Only the BLAS-1
  linear algebra of the solvers runs over the full array (a factor 2 on a small part of the time).

The operator's *links* are private and are kept in the layout a kernel wants: for each output parity p a contiguous
block ``links[p]`` of shape (nhop, V/2, 3, 3), one 3x3 matrix per hop and output site, with the backward links
-X_mu^dag(x-mu) and -L_mu^dag(x-3mu) precomputed once when the links are set (as MILC's ``fatback``/``longback``) so
an application is 16 matrix-vector products per site and no daggers. A CUDA kernel reads these blocks coalesced
(thread = output site, structure of arrays per parity).

GPU
---
All hopping goes through one primitive, :meth:`StaggeredDslash.hop` (dslash on one output parity, with an
optional a*x + b*D psi epilogue). Its body is chosen once per operator, in :meth:`StaggeredDslash._select_hop`:
the implementation of ``"staggered.hop"`` that :mod:`lattice.placement` chooses for the geometry (the whole-lattice
kernel of :mod:`solvers.staggered_cuda`, the distributed one of :mod:`solvers.staggered_dist_cuda`, else the
NumPy/CuPy body :meth:`StaggeredDslash._hop_numpy`, which is the CPU twin that a kernel is tested against), unless
a factory installed with :func:`register_hop_kernel` overrides it for the backend.
"""
from __future__ import annotations

import numpy as np

from lattice import su3
from lattice.placement import Placement, implements, lookup

from .half_links import half_mode, rounded_hops
from .operator import COLOUR_VECTOR, Operator

# flops of one 3x3 complex matrix times complex 3-vector, and of one complex 3-vector addition
FLOPS_MATVEC = 66
FLOPS_VADD = 6
FLOPS_AXPY = 12  # real a * x + y on a complex 3-vector

#: backend name -> factory(dslash) overriding the placement's choice (register_hop_kernel)
_HOP_KERNELS: dict = {}


def register_hop_kernel(backend_name: str, factory) -> None:
    """Install a factory for ``hop`` on every geometry of one backend, in place of what :mod:`lattice.placement`
    chooses (tests, experiments; the kernels of the project register with ``@implements("staggered.hop", ...)``).
    ``factory(dslash)`` is called once per operator and returns ``f(psi, parity, out, a, x, b)`` with the semantics
    of :meth:`StaggeredDslash._hop_numpy`; it may use ``dslash.geom.backend.kernel(key, build)`` to cache compiled
    modules, and must read the links from ``dslash._links`` at each call (``set_links`` replaces them)."""
    _HOP_KERNELS[backend_name] = factory


@implements("staggered.hop", Placement.ARRAY)
def _array_hop(dslash):
    return dslash._hop_numpy


def hop_table(naik: bool = True) -> list[tuple[int, int]]:
    """(mu, step) of each hop, in the order of the link blocks: +1, -1, (+3, -3) for mu = x, y, z, t."""
    steps = (1, -1, 3, -3) if naik else (1, -1)
    return [(mu, s) for mu in range(4) for s in steps]


def parity_sites(geom, parity: int):
    """Flat (x-fastest) indices of the local sites of one parity, an integer array of length V_local/2."""
    xp = geom.xp
    return xp.flatnonzero((geom.parity() == parity).ravel()).astype(xp.int64)


def epsilon(geom, dtype=np.float64):
    """eps(x) = +1 on even sites, -1 on odd ones, shape (nt, nz, ny, nx, 1), ready to multiply a field (made once:
    :meth:`lattice.geometry.Geometry.kept`)."""
    dtype = np.dtype(dtype)
    return geom.kept(("epsilon", dtype.str), lambda: (1 - 2 * geom.parity()).astype(dtype)[..., None])


def project(psi, geom, parity: int):
    """The field with the sites of the other parity set to zero."""
    return psi * (geom.parity() == parity)[..., None]


def _check_links(geom, a, what):
    shape = (4,) + tuple(geom.shape) + (3, 3)
    if tuple(a.shape) != shape:
        raise ValueError(f"{what} links have shape {tuple(a.shape)}, expected {shape} (4, nt, nz, ny, nx, 3, 3) "
                         "for this geometry")


@implements("staggered.link_blocks", Placement.ARRAY)
def _link_blocks_array(geom, fat, long, sites, dtypes) -> dict:
    """{dtypes[0]: [blocks of output parity 0, of parity 1]}: per output parity p the (nhop, V/2, 3, 3) matrices
    multiplying psi(x + step) at the sites ``sites[p]``, per direction mu: fat_mu(x), -fat_mu(x - mu)^dag and, with
    ``long``, long_mu(x), -long_mu(x - 3 mu)^dag. The other dtypes are left to the link store's conversion. The
    GPU's one-launch version (solvers.staggered_cuda, kernel ``link_blocks``) also makes them."""
    xp = geom.xp
    blocks = []
    for mu in range(4):
        blocks.append(fat[mu])
        blocks.append(-su3.dagger(geom.shift(fat[mu], mu, -1)))
        if long is not None:
            blocks.append(long[mu])
            blocks.append(-su3.dagger(geom.shift(long[mu], mu, -3)))
    full = xp.stack(blocks).astype(dtypes[0], copy=False).reshape(len(blocks), -1, 3, 3)
    return {dtypes[0]: [xp.ascontiguousarray(xp.take(full, sites[p], axis=1)) for p in (0, 1)]}


class _LinkStore:
    """The link blocks shared by a dslash and its adjoint, with the parity site lists and the operators in other
    precisions made from them (dtype -> StaggeredDslash): a link update converts their links again, so that they,
    and the solvers' CUDA graphs over them, live as long as this store (solvers.krylov_graph)."""

    def __init__(self, geom, sites=None, half="off"):
        self.geom = geom
        self.sites = sites if sites is not None else [parity_sites(geom, 0), parity_sites(geom, 1)]
        self.links = None
        self.naik = False
        self.converted = {}
        self.half, self.half_hops, self.scales = half, (), None   # 16-bit links (solvers.half_links)

    def set(self, links, naik, made=None):
        """New link blocks (a new list: the multigrid tells new links by its identity); every conversion follows,
        from ``made`` ({dtype: blocks}, :func:`link_blocks`) where it holds the conversion's blocks. A half store
        keeps the blocks rounded to 16 bits and their scales (:func:`solvers.half_links.round_links`)."""
        self.half_hops = rounded_hops(links[0].shape[0], self.half)
        if self.half_hops:
            fn = lookup("staggered.round_links", self.geom, blocks=links[0], hops=self.half_hops)
            links, self.scales = map(list, zip(*(fn(self.geom, b, self.half_hops) for b in links)))
        self.links, self.naik = links, bool(naik)
        for dtype, other in self.converted.items():
            mine = (made or {}).get(dtype)
            other._store.set(mine if mine is not None else [l.astype(dtype) for l in links], naik)


class StaggeredDslash(Operator):
    """D, the HISQ hopping operator on the full lattice (anti-Hermitian).

    ``StaggeredDslash(geom, fat, long=None, dtype=complex128)``: ``fat`` and ``long`` are (4, nt, nz, ny, nx, 3, 3)
    arrays with the phases and boundary signs folded in; ``long=None`` gives a one-link (fat-only) operator.
    """

    site_shape = COLOUR_VECTOR

    name = "HISQ dslash"

    def __init__(self, geom, fat=None, long=None, dtype=np.complex128, *, _store=None, _sign=1.0):
        super().__init__(geom, dtype)
        self._sign = float(_sign)
        self._adjoint = None
        if _store is not None:
            self._store = _store
        else:
            if fat is None:
                raise ValueError("StaggeredDslash needs the fat links")
            self._store = _LinkStore(geom)
            self.set_links(fat, long)
        self._hop_impl = self._select_hop()

    # --- links --------------------------------------------------------------------------------------------------
    def set_links(self, fat, long=None) -> None:
        """(Re)load the links: precompute the backward links and split them per output parity.

        The operator and its adjoint (and every operator built on them: M, the even-odd pieces) see the new links,
        and so do the operators ``converted()`` made (their links are converted again here). On a GPU the hop's
        link tables are rebuilt at the same addresses (solvers.staggered_cuda), so a solver's CUDA graph over this
        operator replays after a link update instead of being captured anew.
        """
        geom = self.geom
        _check_links(geom, fat, "fat")
        if long is not None:
            _check_links(geom, long, "long")
        st = self._store
        dtypes = (np.dtype(self.dtype),) + tuple(d for d in st.converted if d != np.dtype(self.dtype))
        made = lookup("staggered.link_blocks", geom, fat=fat, long=long)(geom, fat, long, st.sites, dtypes)
        st.set(made[dtypes[0]], long is not None, made)

    @property
    def _links(self):
        """The link blocks, per output parity p: (nhop, V/2, 3, 3) matrices multiplying psi(x + step mu)."""
        return self._store.links

    @property
    def _sites(self):
        return self._store.sites

    @property
    def naik(self) -> bool:
        return self._store.naik

    @property
    def hops(self) -> list:
        return hop_table(self.naik)

    @property
    def site_flops(self) -> int:
        """Flops per output site of one dslash: 1146 with the Naik term (MILC, QUDA), 570 without."""
        nhop = len(self.hops)
        return nhop * FLOPS_MATVEC + (nhop - 1) * FLOPS_VADD

    @property
    def flops(self) -> float:
        return float(self.site_flops * self.geom.volume)

    @flops.setter
    def flops(self, value):      # set by Operator.__init__; derived from the links here
        pass

    def converted(self, dtype) -> "StaggeredDslash":
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return self
        cache = self._store.converted
        if dtype not in cache:
            store = _LinkStore(self.geom, self._store.sites, half=half_mode(self.geom, dtype))
            store.set([l.astype(dtype) for l in self._links], self.naik)
            cache[dtype] = StaggeredDslash(self.geom, dtype=dtype, _store=store)
        d = cache[dtype]
        return d if self._sign > 0 else d.adjoint()

    def adjoint(self) -> "StaggeredDslash":
        """D^dag = -D (the same link blocks, opposite sign)."""
        if self._adjoint is None:
            self._adjoint = StaggeredDslash(self.geom, dtype=self.dtype, _store=self._store, _sign=-self._sign)
            self._adjoint._adjoint = self
        return self._adjoint

    # --- the one primitive --------------------------------------------------------------------------------------
    def _select_hop(self):
        """The single switch: a factory registered for this backend, else the placement's choice for the geometry
        (module docstring)."""
        factory = _HOP_KERNELS.get(self.geom.backend.name)
        if factory is None:
            factory = lookup("staggered.hop", self.geom, dslash=self)
        return factory(self)

    def hop(self, psi, parity: int, out=None, a: float = 0.0, x=None, b: float = 1.0, compact: bool = False,
            frozen=None):
        """On the sites of ``parity``: out = a*x + b*(D psi); the other sites of ``out`` are left as they are.

        D psi on a site of one parity reads psi only on sites of the other parity. ``out=None`` allocates a zero
        field; ``out`` must be C-contiguous. Returns ``out``. ``compact``: ``psi`` (on parity 1 - p), ``out`` and
        ``x`` (on parity p) are parity-compact fields (:attr:`compact_shape`), where the hop has that mode
        (:attr:`has_compact`): the same numbers on the parity's sites. ``frozen``: the status slot of a
        device-resident solve (solvers/krylov_graph.py); a GPU hop kernel returns at once while it is nonzero
        (the solve has stopped), other hops ignore it.
        """
        shape = self.compact_shape if compact else self.field_shape
        if compact and not self.has_compact:
            raise ValueError(f"hop: {type(self._hop_impl).__name__} has no parity-compact mode")
        psi = self._as_field(psi, shape)
        if out is None:
            out = self.xp.zeros(shape, dtype=self.dtype)
        elif not out.flags.c_contiguous or out.dtype != self.dtype or tuple(out.shape) != shape:
            raise ValueError(f"hop: out must be a C-contiguous {self.dtype} array of shape {shape}")
        if x is not None:
            x = self._as_field(x, shape)
        args = (psi, parity, out, float(a), x, float(b) * self._sign)
        kw = {"compact": True} if compact else {}
        if frozen is not None and getattr(self._hop_impl, "skips_frozen", False):
            kw["frozen"] = frozen
        self._hop_impl(*args, **kw)
        return out

    def hop_many(self, psis, parity: int, outs=None, a: float = 0.0, xs=None, b: float = 1.0) -> list:
        """[hop(psi_k, parity, out_k, a=a, x=x_k, b=b) for each k] on full-lattice fields, the same numbers: with the
        run configuration's ``batched_hops``, one launch of the one-GPU kernel (``CudaHop.many``: each hop's links
        read once for up to 4 fields), else (or on hops without it) one hop each. ``outs``: None (zero fields) or C-contiguous fields, whose other parity is left as it is;
        ``xs``: None or one field per psi."""
        shape = self.field_shape
        psis = [self._as_field(p, shape) for p in psis]
        if outs is None:
            outs = [self.xp.zeros(shape, dtype=self.dtype) for _ in psis]
        elif any(not o.flags.c_contiguous or o.dtype != self.dtype or tuple(o.shape) != shape for o in outs):
            raise ValueError(f"hop_many: outs must be C-contiguous {self.dtype} arrays of shape {shape}")
        xs = None if xs is None else [self._as_field(x, shape) for x in xs]
        many = getattr(self._hop_impl, "many", None) if self.geom.config.batched_hops else None
        if many is None or len(psis) < 2:
            for k, (psi, out) in enumerate(zip(psis, outs)):
                self.hop(psi, parity, out, a=a, x=None if xs is None else xs[k], b=b)
            return outs
        many(psis, parity, outs, float(a), xs, float(b) * self._sign)
        return outs

    @property
    def compact_shape(self) -> tuple:
        """A parity-compact field's shape, (V_local/2, 3): the local sites of one parity in checkerboard order, x
        fastest (with an even local x extent the full-lattice site s of the parity is compact site s >> 1)."""
        return (int(np.prod(self.field_shape[:-1])) // 2,) + tuple(self.site_shape)

    @property
    def links_compressed(self) -> bool:
        """Whether the hop reads its Naik links compressed (the GPU kernel's table: docs/perf-notes.md "Long-link
        compression")."""
        return bool(getattr(self._hop_impl, "compressed", False))

    @property
    def half_links(self) -> str:
        """Which links are rounded to 16 bits (:mod:`solvers.half_links`): "off", "naik" or "all"."""
        return self._store.half if self._store.half_hops else "off"

    @property
    def has_compact(self) -> bool:
        """Whether :meth:`hop` takes parity-compact fields: the whole-lattice kernel and the NumPy body (its twin)."""
        return bool(getattr(self._hop_impl, "compact", self._hop_impl == self._hop_numpy))

    def _hop_numpy(self, psi, parity, out, a, x, b, compact=False):
        """NumPy (and CuPy) body of :meth:`hop`; ``b`` already carries the adjoint sign. ``compact``: psi, out and
        x parity-compact (psi placed on its parity's sites of a full field first)."""
        xp, geom = self.xp, self.geom
        idx = self._sites[parity]
        links = self._links[parity]
        if compact:
            full = self.space.zeros()
            full.reshape(-1, 3)[self._sites[1 - parity]] = psi
            psi = full
        nb = xp.stack([xp.take(geom.shift(psi, mu, s).reshape(-1, 3), idx, axis=0) for mu, s in self.hops])
        acc = links[..., 0] * nb[..., None, 0]
        acc += links[..., 1] * nb[..., None, 1]
        acc += links[..., 2] * nb[..., None, 2]
        res = acc.sum(axis=0)
        if b != 1.0:
            res *= b
        if x is not None and a != 0.0:
            res += a * (x if compact else xp.take(x.reshape(-1, 3), idx, axis=0))
        if compact:
            out[...] = res
        else:
            out.reshape(-1, 3)[idx] = res

    def _as_field(self, psi, shape=None):
        shape = self.field_shape if shape is None else shape
        psi = self.xp.asarray(psi)
        if tuple(psi.shape) != shape:
            raise ValueError(f"field has shape {tuple(psi.shape)}, expected {shape}"
                             + (" (nt, nz, ny, nx, 3)" if shape == self.field_shape else " (V/2, 3): parity-compact"))
        return psi.astype(self.dtype, copy=False)

    def hop_flops(self, axpy: bool = False) -> float:
        """Flops of one :meth:`hop` (one output parity, global)."""
        return (self.site_flops + (FLOPS_AXPY if axpy else 0)) * self.geom.volume / 2

    # --- operator interface -------------------------------------------------------------------------------------
    def _apply(self, psi):
        out = self.space.empty()
        self.hop(psi, 0, out)
        self.hop(psi, 1, out)
        return out

    # --- derived operators --------------------------------------------------------------------------------------
    def matrix(self, mass: float) -> "StaggeredMatrix":
        """M = 2m + D on the full lattice."""
        return StaggeredMatrix(self, mass)

    def even_odd(self, mass: float, parity: int = 0) -> "StaggeredEvenOdd":
        """The even-odd (Schur) form of M, solving on ``parity`` (0 = even, as MILC)."""
        return StaggeredEvenOdd(self, mass, parity)


class ParityHop(Operator):
    """One block of D: D_{p q} maps fields on parity q to fields on parity p = ``out_parity``.

    ``ParityHop(D, 0)`` is D_eo (odd -> even), ``ParityHop(D, 1)`` is D_oe. Its adjoint is -D_{q p}.
    """

    site_shape = COLOUR_VECTOR

    def __init__(self, dslash: StaggeredDslash, out_parity: int):
        super().__init__(dslash.geom, dslash.dtype, dslash.hop_flops(), dslash.geom.volume // 2)
        self.dslash, self.out_parity = dslash, int(out_parity)
        self.name = "D_eo" if self.out_parity == 0 else "D_oe"

    def _apply(self, psi):
        return self.dslash.hop(psi, self.out_parity)

    def adjoint(self):
        return ParityHop(self.dslash.adjoint(), 1 - self.out_parity)

    def converted(self, dtype):
        return ParityHop(self.dslash.converted(dtype), self.out_parity)


class StaggeredMatrix(Operator):
    """M = 2m + D (or M^dag = 2m - D with ``dagger=True``) on the full lattice."""

    site_shape = COLOUR_VECTOR

    def __init__(self, dslash: StaggeredDslash, mass: float, dagger: bool = False):
        super().__init__(dslash.geom, dslash.dtype, 2 * dslash.hop_flops(axpy=True))
        self.dslash, self.mass, self.dagger = dslash, float(mass), bool(dagger)
        self.name = f"M{'^dag' if dagger else ''}(m={self.mass:g})"

    def _apply(self, psi):
        d = self.dslash.adjoint() if self.dagger else self.dslash
        out = self.space.empty()
        for p in (0, 1):
            d.hop(psi, p, out, a=2 * self.mass, x=psi)
        return out

    def adjoint(self):
        return StaggeredMatrix(self.dslash, self.mass, not self.dagger)

    def converted(self, dtype):
        return StaggeredMatrix(self.dslash.converted(dtype), self.mass, self.dagger)

    def normal(self) -> "StaggeredNormal":
        """M^dag M = 4m^2 - D^2 on the full lattice (Hermitian positive)."""
        return StaggeredNormal(self.dslash, self.mass)


class StaggeredNormal(Operator):
    """M^dag M = M M^dag = 4m^2 - D^2 on the full lattice; it does not mix parities."""

    site_shape = COLOUR_VECTOR

    hermitian = True

    def __init__(self, dslash: StaggeredDslash, mass: float):
        super().__init__(dslash.geom, dslash.dtype, 2 * dslash.hop_flops() + 2 * dslash.hop_flops(axpy=True))
        self.dslash, self.mass = dslash, float(mass)
        self.name = f"M^dag M(m={self.mass:g})"

    def _apply(self, psi):
        d = self.dslash
        t = d(psi)
        out = self.space.empty()
        for p in (0, 1):
            d.hop(t, p, out, a=4 * self.mass ** 2, x=psi, b=-1.0)
        return out

    def converted(self, dtype):
        return StaggeredNormal(self.dslash.converted(dtype), self.mass)


class EvenOddNormal(Operator):
    """A_m = 4m^2 - D_pq D_qp on the sites of parity p (p = 0: MILC's 4m^2 - D_eo D_oe), Hermitian positive.

    Input: a field on parity p (its other sites are ignored); output: a field on parity p, exactly zero elsewhere.
    ``mass = 0`` gives the massless operator of RHMC, whose shifts 4 m_i^2 go to the multishift solver.
    """

    site_shape = COLOUR_VECTOR

    hermitian = True

    def __init__(self, dslash: StaggeredDslash, mass: float, parity: int = 0):
        super().__init__(dslash.geom, dslash.dtype, dslash.hop_flops() + dslash.hop_flops(axpy=True),
                         dslash.geom.volume // 2)
        self.dslash, self.mass, self.parity = dslash, float(mass), int(parity)
        self._converted = {}                 # dtype -> this operator in it (converted)
        self.name = f"4m^2 - D_{'eo' if self.parity == 0 else 'oe'} D_{'oe' if self.parity == 0 else 'eo'}" \
                    f"(m={self.mass:g})"

    def _apply(self, psi):
        d, p = self.dslash, self.parity
        t = d.hop(psi, 1 - p)
        return d.hop(t, p, a=4 * self.mass ** 2, x=psi, b=-1.0)

    def apply_many(self, psis) -> list:
        """[self(psi) for psi in psis], the same numbers, each hop batched over the fields
        (:meth:`StaggeredDslash.hop_many`)."""
        d, p = self.dslash, self.parity
        ts = d.hop_many(psis, 1 - p)
        return d.hop_many(ts, p, a=4 * self.mass ** 2, xs=psis, b=-1.0)

    def reserve_into(self):
        """Allocate what :meth:`apply_into` needs (before a CUDA-graph capture, which must not allocate)."""
        if getattr(self, "_scratch", None) is None:
            self._scratch = self.space.zeros()

    def graph_key(self) -> tuple:
        """What a CUDA graph of :meth:`apply_into` bakes in besides its arguments (solvers.krylov_graph)."""
        self.reserve_into()
        return (self.parity, self.mass, self.dslash._sign, self._scratch.data.ptr) + self.dslash._hop_impl.graph_key()

    def apply_into(self, psi, out, frozen=None):
        """out = A psi on the sites of parity p, the same bits as ``A(psi)``; the other sites of ``out`` are left
        as they are (zero for the solvers' fields). No allocation after :meth:`reserve_into`. ``frozen``: see
        :meth:`StaggeredDslash.hop`."""
        d, p = self.dslash, self.parity
        self.reserve_into()
        d.hop(psi, 1 - p, self._scratch, frozen=frozen)
        d.hop(self._scratch, p, out, a=4 * self.mass ** 2, x=psi, b=-1.0, frozen=frozen)

    def converted(self, dtype):
        """This operator in ``dtype``, made once per precision (its scratch field and compact form, which a solver's
        CUDA graph bakes in, stay the same across link updates: the dslash's conversion follows them)."""
        d = self.dslash.converted(dtype)
        if d is self.dslash:
            return self
        if np.dtype(dtype) not in self._converted:
            self._converted[np.dtype(dtype)] = EvenOddNormal(d, self.mass, self.parity)
        return self._converted[np.dtype(dtype)]

    def compact(self) -> "CompactNormal | None":
        """This operator on parity-compact vectors (:class:`CompactNormal`, made once), or None where the hop has
        no parity-compact mode (the distributed hop, a registered override)."""
        if not self.dslash.has_compact:
            return None
        if getattr(self, "_compact", None) is None:
            self._compact = CompactNormal(self)
        return self._compact


class CompactNormal:
    """An :class:`EvenOddNormal` A_m on parity-compact vectors: ``apply_into(psi, out)`` writes out = A_m psi for
    psi and out of shape ``dslash.compact_shape`` (the V/2 sites of parity p in checkerboard order), the two hops in
    their compact mode (:meth:`StaggeredDslash.hop`), so every vector kernel of a solve on them streams only the
    parity's bytes (docs/perf-notes.md, "Parity-compact Krylov vectors"). The numbers are A_m's on the parity's
    sites, bit for bit. What the multishift CG's Krylov loop uses when its fused linear algebra is compact
    (solvers.blas_cuda)."""

    def __init__(self, normal: EvenOddNormal):
        self.normal = normal
        self.dslash, self.parity, self.mass = normal.dslash, normal.parity, normal.mass
        self.geom, self.dtype, self.flops, self.name = normal.geom, normal.dtype, normal.flops, normal.name
        self.shape = self.dslash.compact_shape
        self._scratch = None

    def reserve_into(self):
        """Allocate the compact scratch field of the inner hop (before a CUDA-graph capture)."""
        if self._scratch is None:
            self._scratch = self.dslash.xp.zeros(self.shape, dtype=self.dtype)

    def graph_key(self) -> tuple:
        """What a CUDA graph of :meth:`apply_into` bakes in besides its arguments (solvers.krylov_graph)."""
        self.reserve_into()
        return ("compact", self.parity, self.mass, self.dslash._sign,
                self._scratch.data.ptr) + self.dslash._hop_impl.graph_key()

    def apply_into(self, psi, out, frozen=None):
        """out = A_m psi, both parity-compact; no allocation after :meth:`reserve_into`; ``frozen``: see
        :meth:`StaggeredDslash.hop`."""
        d, p = self.dslash, self.parity
        self.reserve_into()
        d.hop(psi, 1 - p, self._scratch, compact=True, frozen=frozen)
        d.hop(self._scratch, p, out, a=4 * self.mass ** 2, x=psi, b=-1.0, compact=True, frozen=frozen)

    def __call__(self, psi):
        out = self.dslash.xp.empty(self.shape, dtype=self.dtype)
        self.apply_into(psi, out)
        return out


class StaggeredEvenOdd:
    """The even-odd decomposition of M = 2m + D, solving on ``parity`` (0 = even).

    * ``normal``: A_m on parity p (an :class:`EvenOddNormal`);
    * ``prepare(b)``: the parity-p source (M^dag b)_p = 2m b_p - D_pq b_q;
    * ``reconstruct(x_p, b)``: the full solution, x_q = (b_q - D_qp x_p)/(2m);
    * ``D_eo``, ``D_oe``, ``matrix`` (the full M), ``converted(dtype)``.

    Pass it to :func:`solvers.even_odd.even_odd_inverse` to get M^-1.
    """

    def __init__(self, dslash: StaggeredDslash, mass: float, parity: int = 0):
        if parity not in (0, 1):
            raise ValueError(f"parity must be 0 (even) or 1 (odd), not {parity}")
        self.dslash, self.mass, self.parity = dslash, float(mass), int(parity)
        self.geom, self.dtype = dslash.geom, dslash.dtype
        self.normal = EvenOddNormal(dslash, mass, parity)
        self.D_eo = ParityHop(dslash, 0)
        self.D_oe = ParityHop(dslash, 1)
        self.matrix = StaggeredMatrix(dslash, mass)

    @property
    def prepare_flops(self) -> float:
        return self.dslash.hop_flops(axpy=True)

    reconstruct_flops = prepare_flops

    def prepare(self, b):
        """(M^dag b) on parity p: 2m b_p - D_pq b_q, a field on parity p."""
        return self.dslash.hop(b, self.parity, a=2 * self.mass, x=b, b=-1.0)

    def reconstruct(self, x_p, b):
        """The full solution of M x = b from its parity-p part: x_q = (b_q - D_qp x_p)/(2m)."""
        if self.mass == 0:
            raise ZeroDivisionError("even-odd reconstruction divides by 2m: the mass must not be zero")
        d = self.dslash
        out = d._as_field(x_p).copy()
        c = 1.0 / (2 * self.mass)
        return d.hop(x_p, 1 - self.parity, out, a=c, x=b, b=-c)

    def converted(self, dtype) -> "StaggeredEvenOdd":
        return StaggeredEvenOdd(self.dslash.converted(dtype), self.mass, self.parity)
