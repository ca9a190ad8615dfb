"""Linear operators on colour-vector fields, composed as in gpt: a solver takes an operator and returns its inverse
as an operator (docs/architecture.md).

Every operator has
* ``op(psi)``: a new field, ``op.adjoint()``: the adjoint as an operator;
* ``op.space``: the :class:`FieldSpace` of its vectors (geometry, site shape, parity or None, dtype), which
  allocates them (``space.zeros()``, ``space.empty()``), checks them (``space.check(v)``) and keys the solvers'
  fused linear algebra; ``op.site_shape`` is declared by the operator's class (a staggered colour vector: (3,));
* ``op.geom``, ``op.dtype`` (complex128 or complex64) and ``op.precision`` ("double" or "single");
* ``op.flops``: the algorithmic flop count of one application, global over all ranks (the count MILC and QUDA
  quote, e.g. 1146 per output site for the HISQ dslash), not what the NumPy body happens to execute;
* ``op.hermitian``; ``op.sites``: the number of sites its vectors live on (the volume, or half of it for an
  even-odd operator), which the solvers use to count their own linear-algebra flops;
* ``op.converted(dtype)``: the same operator in another precision (mixed-precision solvers use it).

Field layout: see :mod:`solvers.staggered`. Solvers only use element-wise arithmetic and :func:`inner`/``geom.sum``,
so they work with any layout an operator chooses. On a GPU holding the whole lattice, the solvers' vector updates
and reductions run instead as a few fused kernels (:func:`fused_blas`, the one switch; :mod:`solvers.blas_cuda`).
"""
from __future__ import annotations

import dataclasses
import math
from functools import cached_property

import numpy as np

from comms.config import RunConfig
from lattice.placement import Placement, implements, lookup, placement_of

COMPLEX_DTYPES = (np.dtype(np.complex128), np.dtype(np.complex64))


def precision_of(dtype) -> str:
    dtype = np.dtype(dtype)
    if dtype == np.complex128:
        return "double"
    if dtype == np.complex64:
        return "single"
    raise ValueError(f"fields must be complex128 (double) or complex64 (single), not {dtype}")


def real_dtype(dtype):
    return np.float64 if np.dtype(dtype) == np.complex128 else np.float32


#: a staggered colour vector: three complex components per site (SU(3)); the site shape the staggered operators
#: declare, and a FunctionOperator's unless it is given another
COLOUR_VECTOR = (3,)


@dataclasses.dataclass(frozen=True)
class FieldSpace:
    """The vectors an operator acts on: full-lattice site arrays of shape ``geometry.shape + site_shape`` and
    ``dtype``, carried by the sites of ``parity`` (0 even, 1 odd; the other parity holds zeros) or, for None, by
    every site. Two spaces are equal when all four agree (the geometry by identity)."""

    geometry: object
    site_shape: tuple
    parity: int | None = None
    dtype: object = np.complex128

    def __post_init__(self):
        object.__setattr__(self, "site_shape", tuple(int(n) for n in self.site_shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        precision_of(self.dtype)
        if self.parity not in (None, 0, 1):
            raise ValueError(f"a field space's parity is 0 (even), 1 (odd) or None (every site), not {self.parity}")

    @property
    def shape(self) -> tuple:
        return tuple(self.geometry.shape) + self.site_shape

    @property
    def site_size(self) -> int:
        """Complex components per site."""
        return math.prod(self.site_shape)

    @property
    def xp(self):
        return self.geometry.xp

    def zeros(self):
        return self.xp.zeros(self.shape, dtype=self.dtype)

    def empty(self):
        return self.xp.empty(self.shape, dtype=self.dtype)

    def converted(self, dtype) -> "FieldSpace":
        return dataclasses.replace(self, dtype=dtype)

    def on_every_site(self) -> "FieldSpace":
        return dataclasses.replace(self, parity=None)

    def __str__(self):
        where = "every site" if self.parity is None else ("even sites" if self.parity == 0 else "odd sites")
        return (f"{self.dtype} fields of site shape {self.site_shape} on {where} of "
                f"{'x'.join(map(str, self.geometry.dims))}")

    def check(self, v, what: str = "vector", support: bool = True):
        """Raise a one-line ValueError naming this space when ``v`` is not one of its vectors: another shape, a
        dtype that is not a real or complex floating type (other precisions are converted by the solvers), or, with
        ``support``, a vector of the other parity (zero on this space's sites, not zero on the others). The support
        test is a global count of non-zero entries (collective on a distributed lattice), so it runs only on the
        ``ARRAY`` placement (NumPy fields: the CPU runs and tests): on the GPU it would add a reduction and a host
        sync to every solve on the hot path, and device solves skip it (the shape and dtype are always checked)."""
        shape, dtype = tuple(getattr(v, "shape", ())), getattr(v, "dtype", None)
        if shape != self.shape:
            raise ValueError(f"{what} has shape {shape}, not {self.shape} of the space ({self}): site axes "
                             f"(nt, nz, ny, nx) then the site shape {self.site_shape}")
        if dtype is None or np.dtype(dtype).kind not in "fc":
            raise ValueError(f"{what} has dtype {dtype}, not a floating dtype of the space ({self}): pass a "
                             f"{self.dtype} array")
        if support and self.parity is not None and self._support_is_free() and self._nonzero(v, self.parity) == 0 \
                and self._nonzero(v) > 0:
            raise ValueError(f"{what} lives on the other parity, not on the space's ({self}): project it onto "
                             f"parity {self.parity} or solve with the operator of parity {1 - self.parity}")

    def _support_is_free(self) -> bool:
        """Whether the support test costs no device reduction: the lattice's fields are NumPy arrays (``ARRAY``)."""
        return placement_of(self.geometry) is Placement.ARRAY

    def _nonzero(self, v, parity=None) -> float:
        geom, xp = self.geometry, self.xp
        v = xp.asarray(v)
        if parity is not None:
            v = v * (geom.parity() == parity).reshape(geom.shape + (1,) * len(self.site_shape))
        return geom.sum(xp.count_nonzero(v))


class Operator:
    """Base class. Subclasses implement ``_apply(psi)`` and, when they can, ``adjoint()`` and ``converted()``, and
    declare ``site_shape`` (the shape of one site's components), unless they pass it to the constructor."""

    hermitian = False
    name = "operator"
    site_shape: tuple | None = None

    def __init__(self, geom, dtype=np.complex128, flops: float = 0.0, sites: int | None = None,
                 site_shape: tuple | None = None):
        self.geom = geom
        self.dtype = np.dtype(dtype)
        precision_of(self.dtype)
        self.flops = float(flops)
        self.sites = geom.volume if sites is None else int(sites)
        if site_shape is not None:
            self.site_shape = tuple(site_shape)
        if self.site_shape is None:
            raise TypeError(f"{type(self).__name__} declares no site_shape: set the class attribute (e.g. "
                            "COLOUR_VECTOR) or pass site_shape=")

    # --- the interface ------------------------------------------------------------------------------------
    @property
    def xp(self):
        return self.geom.xp

    @property
    def precision(self) -> str:
        return precision_of(self.dtype)

    @cached_property
    def space(self) -> FieldSpace:
        """The space of this operator's vectors (made on first use, after the subclass set its attributes)."""
        return FieldSpace(self.geom, self.site_shape, self._space_parity(), self.dtype)

    def _space_parity(self) -> int | None:
        """The parity whose sites carry the fields: an operator's ``parity`` when it acts on half the sites."""
        parity = getattr(self, "parity", None)
        if parity in (0, 1) and 2 * self.sites == self.geom.volume:
            return int(parity)
        return None

    @property
    def field_shape(self) -> tuple:
        return self.space.shape

    def __call__(self, psi):
        return self._apply(psi)

    def _apply(self, psi):  # pragma: no cover - abstract
        raise NotImplementedError

    def apply_many(self, psis) -> list:
        """[self(psi) for psi in psis]; operators with a batched form (the even-odd normal operator) override it
        with the same numbers in fewer passes over their links."""
        return [self(psi) for psi in psis]

    def adjoint(self) -> "Operator":
        if self.hermitian:
            return self
        raise NotImplementedError(f"{self.name} has no adjoint")

    def converted(self, dtype) -> "Operator":
        """This operator acting on fields of ``dtype`` (complex128 or complex64)."""
        if np.dtype(dtype) == self.dtype:
            return self
        raise NotImplementedError(
            f"{self.name} cannot be converted to {np.dtype(dtype)}: mixed-precision solvers need an operator with "
            "converted(), e.g. a StaggeredDslash-based operator")

    # --- composition --------------------------------------------------------------------------------------
    def __mul__(self, other: "Operator") -> "Operator":
        """Composition: (A * B)(psi) = A(B(psi))."""
        if not isinstance(other, Operator):
            return NotImplemented
        return ProductOperator(self, other)

    def shifted(self, sigma: float) -> "Operator":
        """A + sigma (sigma real)."""
        return ShiftedOperator(self, sigma)

    def __repr__(self):
        return f"<{self.name} {self.precision} on {'x'.join(map(str, self.geom.dims))}>"


class FunctionOperator(Operator):
    """An operator from plain functions: ``FunctionOperator(geom, f, adjoint=g, hermitian=..., flops=...)``."""

    def __init__(self, geom, apply, adjoint=None, *, dtype=np.complex128, flops=0.0, sites=None,
                 hermitian=False, name="function operator", site_shape=COLOUR_VECTOR):
        super().__init__(geom, dtype, flops, sites, site_shape)
        self._f = apply
        self._g = adjoint
        self.hermitian = bool(hermitian)
        self.name = name

    def _apply(self, psi):
        return self._f(psi)

    def adjoint(self):
        if self.hermitian:
            return self
        if self._g is None:
            raise NotImplementedError(f"{self.name}: no adjoint function given")
        return FunctionOperator(self.geom, self._g, self._f, dtype=self.dtype, flops=self.flops, sites=self.sites,
                                name=f"{self.name}^dag", site_shape=self.site_shape)


class ProductOperator(Operator):
    def __init__(self, a: Operator, b: Operator):
        if a.site_shape != b.site_shape:
            raise ValueError(f"{a.name} * {b.name}: the fields of {a.space} and {b.space} differ in site shape")
        super().__init__(a.geom, a.dtype, a.flops + b.flops, a.sites, a.site_shape)
        self.a, self.b = a, b
        self.name = f"({a.name})({b.name})"

    def _apply(self, psi):
        return self.a(self.b(psi))

    def adjoint(self):
        return ProductOperator(self.b.adjoint(), self.a.adjoint())

    def converted(self, dtype):
        if np.dtype(dtype) == self.dtype:
            return self
        return ProductOperator(self.a.converted(dtype), self.b.converted(dtype))


def add_shift(out, psi, sigma: float):
    """out += sigma psi, in place, returned: the shift of (A + sigma) psi = A psi + sigma psi, in the one order
    that :class:`ShiftedOperator` and the refinement's batched residuals (solvers.multishift.true_residuals) share."""
    out += float(sigma) * psi
    return out


class ShiftedOperator(Operator):
    """A + sigma with a real shift sigma; Hermitian when A is."""

    def __init__(self, op: Operator, sigma: float):
        super().__init__(op.geom, op.dtype, op.flops + 4 * op.space.site_size * op.sites, op.sites, op.site_shape)
        self.op, self.sigma = op, float(sigma)
        self.hermitian = op.hermitian
        self.name = f"{op.name} + {self.sigma:g}"

    def _apply(self, psi):
        return add_shift(self.op(psi), psi, self.sigma)

    def _space_parity(self):
        return self.op.space.parity

    def adjoint(self):
        return self if self.hermitian else ShiftedOperator(self.op.adjoint(), self.sigma)

    def converted(self, dtype):
        if np.dtype(dtype) == self.dtype:
            return self
        return ShiftedOperator(self.op.converted(dtype), self.sigma)


# --- reductions -------------------------------------------------------------------------------------------------
# Every global sum goes through geom.sum (one host round trip per call), so that distribution is Geometry's business.
# Two modes:
# * "fast" (default): the local contraction runs on the device (BLAS / cuBLAS, or a double-accumulated sum for
#   single-precision fields) and geom.sum adds one number per rank. Results agree across decompositions to rounding.
# * "exact": geom.sum receives the per-element products and returns their correctly rounded sum, so every
#   reduction, and with it every solver iterate, is bitwise the same for any decomposition and rank count. It costs
#   an exact summation over the field (about 10 ms for a 16^4 field with NumPy) and, on a GPU, a copy to the host.
# The mode is the run configuration's ``solver_sums`` (HMC_SOLVER_SUMS=exact), read from the geometry at each
# reduction; set_reductions("exact") overrides it for the whole process (tests, timings). Two real numbers travel in
# one complex sum.

_REDUCTION_MODES = ("fast", "exact")
_reductions = {"override": None}        # set_reductions: a mode for every geometry, or None: each its configuration's


def set_reductions(mode: str | None) -> str | None:
    """Select the solvers' reduction mode ("fast" or "exact") for every geometry, or None to follow each geometry's
    configuration again; returns the previous override (None when there was none), to restore it with."""
    if mode is not None:
        mode = mode.lower()
        if mode not in _REDUCTION_MODES:
            raise ValueError(f"reduction mode {mode!r}: use one of {_REDUCTION_MODES}")
    old, _reductions["override"] = _reductions["override"], mode
    return old


def reductions(geom=None) -> str:
    """The reduction mode for ``geom``: the override, else its configuration's (default: the environment's)."""
    mode = _reductions["override"]
    if mode is not None:
        return mode
    return (geom.config if geom is not None else RunConfig.from_environment()).solver_sums


def _local_vdot(xp, a, b):
    """sum conj(a) b on this rank, accumulated in double precision also for single-precision fields."""
    if a.dtype == np.complex64 or b.dtype == np.complex64:
        return (a.conj() * b).sum(dtype=np.complex128)
    return xp.vdot(a.ravel(), b.ravel())


def inner(geom, a, b) -> complex:
    """<a, b> = sum_x a(x)^dag b(x), global."""
    if (_reductions["override"] or geom.config.solver_sums) == "exact":
        return complex(geom.sum(a.conj() * b))
    return complex(geom.sum(_local_vdot(geom.xp, a, b)))


def norm2(geom, a) -> float:
    """|a|^2, global."""
    if (_reductions["override"] or geom.config.solver_sums) == "exact":
        return float(geom.sum(a.real * a.real + a.imag * a.imag))
    return float(geom.sum(_local_vdot(geom.xp, a, a).real))


def norm2_many(geom, vectors) -> list[float]:
    """[norm2(geom, v) for v in ``vectors``], the same numbers, with one host synchronisation for all of them on a
    GPU in the default reduction mode: each local sum as norm2 makes it, stacked on the device and copied once, then
    summed over the ranks as norm2 sums it (the refinement's true residuals, :mod:`solvers.multishift`). Elsewhere
    (the host, the "exact" sums) one norm2 each."""
    if not vectors or not geom.backend.is_gpu or (_reductions["override"] or geom.config.solver_sums) == "exact":
        return [norm2(geom, v) for v in vectors]
    xp = geom.xp
    local = geom.backend.to_numpy(xp.stack([_local_vdot(xp, v, v).real for v in vectors]))
    return [float(geom.grid.sum_exact(value)) for value in local]       # geom.sum's path for a host scalar


def norm2_and_redot(geom, a, b) -> tuple[float, float]:
    """(|a|^2, Re<a, b>) with a single global reduction (one host synchronisation)."""
    xp = geom.xp
    if (_reductions["override"] or geom.config.solver_sums) == "exact":
        z = geom.sum((a.real * a.real + a.imag * a.imag) + 1j * (a.real * b.real + a.imag * b.imag))
    else:
        z = geom.sum(_local_vdot(xp, a, a).real + 1j * _local_vdot(xp, a, b).real)
    z = complex(z)
    return z.real, z.imag


# --- fused linear algebra ---------------------------------------------------------------------------------------
# The solvers' vector updates and reductions as a few fused kernels with one host synchronisation per reduction
# (solvers.blas_cuda registers them for the GPU placements of lattice.placement). The one switch is fused_blas(): a
# solver asks it once per solve and runs its NumPy path when it answers None, which it does on the array placement,
# where the kernels do not fit the call (an odd local x extent, a source that is not C-contiguous; with several
# ranks the kernels' sums go through geom.sum), and when switched off (the configuration's solver_fused:
# HMC_SOLVER_FUSED=0, or the override set_fused_blas(False)). In the "exact" reduction mode the kernels' sums are
# exact (lattice.exact_sum_cuda: per-rank fixed-point records added as integers, rounded once), so the iterates keep
# the mode's guarantee: the same bits for any decomposition. For an even-odd operator the kernels visit only the sites of its parity;
# solver_fused "all" (HMC_SOLVER_FUSED=all, set_fused_blas("all")) makes them
# visit every site (the NumPy path's full-array arithmetic; the other parity holds zeros): in the interleaved
# full-lattice layout a parity-restricted kernel writes 48 of every 96 bytes, so which one moves fewer bytes through
# DRAM depends on the hardware's partial-sector writes (see solvers.blas_cuda). A solver that asks with
# ``compact=True`` (CG, the multishift CG) gets parity-compact vectors where the operator has a compact form
# (``op.compact()``: the whole-lattice hop kernel) and the sums are the fast ones: every kernel then streams only the
# parity's bytes (docs/perf-notes.md, "Parity-compact Krylov vectors"); solver_fused "strided"
# (HMC_SOLVER_FUSED=strided) keeps the parity's sites in full-lattice vectors instead, for comparison.

_fused = {"override": None}             # set_fused_blas: a mode for every geometry, or None: each its configuration's


@implements("solvers.fused_blas", Placement.ARRAY)
def _numpy_path(space, source=None, exact=False, compact=False):
    """No fused linear algebra: the solver runs its NumPy path. (A GPU implementation, registered under the same
    name, returns an object with the methods of :class:`solvers.blas_cuda.CudaBlas` acting on the vectors of
    ``space``: the sites of its parity, or every site.)"""
    return None


def set_fused_blas(mode):
    """Switch the fused solver linear algebra on (True) or off (False), or on over every site of even-odd fields
    ("all"), or on without parity-compact vectors ("strided"), for every geometry; None follows each geometry's
    configuration (``solver_fused``, HMC_SOLVER_FUSED) again. Returns the previous override (None when there was
    none), to restore it with."""
    old = _fused["override"]
    if mode is None or isinstance(mode, str):
        _fused["override"] = None if mode is None else RunConfig(solver_fused=mode).solver_fused
    else:
        _fused["override"] = "on" if mode else "off"
    return old


def fused_blas(op, source=None, compact: bool = False):
    """The fused linear algebra for solving with ``op`` (the vectors of ``op.space``), looked up by that space, or
    None for the NumPy path. ``source``: the right-hand side; the kernels are restricted to the space's parity only
    when it vanishes on the other one. ``compact``: the solver can run on parity-compact vectors (gathering its
    source and scattering its solutions with the answer's ``gather``/``scatter``, applying ``op.compact()``); the
    answer's ``compact`` says whether it does (mode "on", ``op.compact()`` not None, a parity-restricted solve with
    fast sums)."""
    config = op.geom.config
    mode = _fused["override"] or config.solver_fused
    if mode == "off":
        return None
    exact = (_reductions["override"] or config.solver_sums) == "exact"
    if exact and np.dtype(op.dtype) != np.complex128:
        return None          # the single-precision exact kernel differs from its twin on subnormal products (GPU test)
    space = op.space.on_every_site() if mode == "all" else op.space
    compact = bool(compact) and mode == "on" and getattr(op, "compact", None) is not None and op.compact() is not None
    factory = lookup("solvers.fused_blas", space.geometry, space=space, source=source)
    return factory(space, source, exact=exact, compact=compact)
