"""Gauge actions built from closed Wilson loops: Wilson and MILC's one-loop Symanzik (docs/conventions.md 2, 3.4).

    S_g = beta * sum_x sum_shapes c_i sum_{loops of shape i} (1 - ReTr W_loop(x) / 3)

is the ``g`` of MILC's ``ACTION: g,h,f`` line (``generic/gauge_stuff.c: imp_gauge_action``, which computes
(beta/3) sum c_i (3 - ReTr W)). Links must be given with the staggered phases removed, as MILC does.

The force is the momentum derivative (docs/conventions.md 3.4)

    Pdot_mu(x) = TA[U_mu(x) G_mu(x)^dag],   G = dS/dRe U + i dS/dIm U,

so that along U -> exp(tau Omega) U, dS/dtau at tau = 0 equals sum_{x,mu} Tr(Pdot_mu(x) Omega_mu(x)). For a loop
W = M_1 ... M_L (M_k = U_mu(y) for a forward step, U_mu(y)^dag for a backward one), the derivative of ReTr W
with respect to the link at step k is ReTr(Omega_mu(y) R) with R the loop W cyclically rotated to start at y
along +mu: R = U_mu(y) S(y), S the staple (the rest of the path). For a forward step that is
R = (M_k ... M_L)(M_1 ... M_{k-1}); for a backward step it is the adjoint of (M_{k+1} ... M_L)(M_1 ... M_k).
Hence Pdot_mu = -(beta/3) TA[sum_i c_i sum R]. The partial products M_1...M_k and M_k...M_L are computed once per
loop (reverse-mode differentiation of the path product), so one loop of length L costs about 3L - 4 matrix
products at every site. Everything is written with ``geom.xp`` and ``geom.shift``, so the same code runs on
NumPy and CuPy.
"""
from __future__ import annotations

import math

from lattice import su3
from lattice.gauge import GaugeField
from lattice.padded import pad_links
from lattice.placement import Placement, choose, implements, lookup

from . import loops as _loops

QUARK_LOOPS = ("hisq", "asqtad", "asqtad_nf", "none")


def symanzik_coefficients(u0: float, nf: int = 0, quark_loops: str = "hisq") -> dict:
    """One-loop Symanzik loop coefficients (c_pl, c_rt, c_pg), plaquette normalized to 1, as MILC's gauge-action
    headers (``generic/imp_actions/``) compute them.

    * ``hisq``: HISQ quark loops (``symanzik_1loop_hisq_action.h``, the gauge action of MILC's HISQ builds; Hart,
      von Hippel, Horgan, PRD 79 074008):
      c_rt = -1/(20 u0^2) [1 - (0.6264 - 1.1746 nf) ln u0],  c_pg = (1/u0^2)(0.0433 - 0.0156 nf) ln u0.
    * ``asqtad``: the gauge action of MILC's asqtad builds (``ks_imp_rhmc/Make_template``: su3_leapfrog,
      su3_omelyan_rhmc, su3_rhmc, su3_rhmd), ``symanzik_1loop_action.h``, which has no quark-loop correction:
      the ``none`` coefficients whatever nf (MILC applies the nf-dependent terms only to HISQ sea quarks).
    * ``asqtad_nf``: asqtad quark loops (``symanzik_1loop_nf_action.h``, MILC's ASQ_OPTIONS_NF targets; Hao et
      al., arXiv:0705.4660):
      c_rt = -1/(20 u0^2) [1 - (0.6264 - 0.4742 nf) ln u0],  c_pg = (1/u0^2)(0.0433 - 0.012 nf) ln u0.
    * ``none``: pure gauge (Alford et al., hep-lat/9507010; MILC's ``symanzik_1loop_action.h``):
      c_rt = -1/(20 u0^2) (1 - 0.6264 ln u0),  c_pg = 0.04335 ln u0 / u0^2. ``nf`` must be 0.
    """
    u0 = float(u0)
    if not u0 > 0:
        raise ValueError(f"u0 = {u0} must be positive")
    if nf < 0:
        raise ValueError(f"nf = {nf} must be >= 0")
    lnu = math.log(u0)
    inv = 1.0 / (u0 * u0)
    if quark_loops == "hisq":
        c_rt = -inv / 20.0 * (1.0 - (0.6264 - 1.1746 * nf) * lnu)
        c_pg = inv * (0.0433 - 0.0156 * nf) * lnu
    elif quark_loops == "asqtad_nf":
        c_rt = -inv / 20.0 * (1.0 - (0.6264 - 0.4742 * nf) * lnu)
        c_pg = inv * (0.0433 - 0.012 * nf) * lnu
    elif quark_loops in ("none", "asqtad"):
        if quark_loops == "none" and nf != 0:
            raise ValueError(f"quark_loops 'none' is the pure-gauge action, but nf = {nf}: use nf = 0, or "
                             "quark_loops 'hisq' or 'asqtad' for dynamical flavours")
        c_rt = -inv / 20.0 * (1.0 - 0.6264 * lnu)
        c_pg = inv * 0.04335 * lnu
    else:
        raise ValueError(f"quark_loops {quark_loops!r}: use one of {', '.join(QUARK_LOOPS)}")
    return {"plaquette": 1.0, "rectangle": c_rt, "parallelogram": c_pg}


def _shift_by(geom, f, disp):
    """The field at x + disp, at x."""
    for mu, d in enumerate(disp):
        if d:
            f = geom.shift(f, mu, d)
    return f


class _Links:
    """Shifted links and their adjoints, computed once per (direction, displacement)."""

    def __init__(self, u: GaugeField):
        self.geom = u.geom
        self.links = u.links
        self._cache = {}

    def get(self, mu: int, disp: tuple, adjoint: bool = False):
        key = (mu, disp, adjoint)
        m = self._cache.get(key)
        if m is None:
            if adjoint:
                m = su3.dagger(self.get(mu, disp))
            elif any(disp):
                # reuse the field shifted one step less along the first non-zero axis
                nu = next(i for i, d in enumerate(disp) if d)
                s = 1 if disp[nu] > 0 else -1
                prev = list(disp)
                prev[nu] -= s
                m = self.geom.shift(self.get(mu, tuple(prev)), nu, s)
            else:
                m = self.links[mu]
            self._cache[key] = m
        return m

    def path(self, path):
        """The link matrices M_k (fields at the starting site x) and the site offset y_k - x of the link each one
        belongs to (U_mu(y_k) is M_k or M_k^dag)."""
        pos = [0, 0, 0, 0]
        mats, offs = [], []
        for s in path:
            mu = _loops.direction(s)
            if s > 0:
                off = tuple(pos)
                mats.append(self.get(mu, off))
                pos[mu] += 1
            else:
                pos[mu] -= 1
                off = tuple(pos)
                mats.append(self.get(mu, off, adjoint=True))
            offs.append(off)
        return mats, offs


def _retrace_product(a, b):
    """ReTr(a b) at every site, without forming the product."""
    return (a * b.swapaxes(-1, -2)).real.sum(axis=(-2, -1))


def _loop_retrace(links: _Links, path):
    """ReTr of the path product starting at every site."""
    mats, _ = links.path(path)
    h = len(mats) // 2
    left = mats[0]
    for m in mats[1:h]:
        left = left @ m
    right = mats[-1]
    for m in reversed(mats[h:-1]):
        right = m @ right
    return _retrace_product(left, right)


class GaugeAction:
    """S = beta sum_shapes c_i sum_{loops} sum_x (1 - ReTr W / 3) for a set of loop shapes.

    ``shapes`` maps a shape name to (coefficient, tuple of paths in the encoding of :mod:`force.loops`).
    """

    name = "gauge action"

    def __init__(self, beta: float, shapes: dict):
        self.beta = float(beta)
        self.shapes = {k: (float(c), tuple(tuple(p) for p in paths)) for k, (c, paths) in shapes.items()}
        for k, (_, paths) in self.shapes.items():
            for p in paths:
                if not _loops.is_closed(p):
                    raise ValueError(f"loop {p} of shape {k} is not closed")

    @property
    def coefficients(self) -> dict:
        """{shape name: loop coefficient c_i} (the plaquette's is 1 for MILC's actions)."""
        return {k: c for k, (c, _) in self.shapes.items()}

    @property
    def multiplicities(self) -> dict:
        """{shape name: number of distinct loops per site}."""
        return {k: len(p) for k, (_, p) in self.shapes.items()}

    def describe(self) -> str:
        terms = ", ".join(f"{k} x{len(p)} c={c:.6e}" for k, (c, p) in self.shapes.items())
        return f"{self.name}, beta={self.beta:g}: {terms}"

    def __repr__(self) -> str:
        return f"<{self.describe()}>"

    # action ----------------------------------------------------------------------------------------------
    def _weighted_deficit(self, u: GaugeField):
        """sum_i c_i sum_loops (3 - ReTr W) at every local site (one CUDA kernel on a GPU holding the lattice)."""
        return lookup("gauge.deficit", u.geom, action=self)(self, u)

    def weighted_deficit_reference(self, u: GaugeField):
        """The array-operation twin of the action-density kernel."""
        links = _Links(u)
        acc = None
        for c, paths in self.shapes.values():
            if c == 0.0:
                continue
            for p in paths:
                term = c * (3.0 - _loop_retrace(links, p))
                acc = term if acc is None else acc + term
        if acc is None:
            acc = u.xp.zeros(u.geom.shape)
        return acc

    def action(self, u: GaugeField) -> float:
        """S_g = (beta/3) sum_x sum_i c_i sum_loops (3 - ReTr W_loop(x)); exactly 0 on the unit field."""
        return self.beta / 3.0 * u.geom.sum(self._weighted_deficit(u))

    def gaction(self, u: GaugeField) -> float:
        """MILC's ``GACTION``: sum_i c_i sum_loops sum_x (3 - ReTr W) / V (= 3 S / (beta V))."""
        return u.geom.sum(self._weighted_deficit(u)) / u.geom.volume

    def loop_traces(self, u: GaugeField) -> dict:
        """{shape name: [<ReTr W>_x for each loop of that shape]}, MILC's ``G_LOOP`` averages (maximum 3). Where the
        action-density kernel serves the lattice (a GPU), each loop is that kernel on the one loop and the average
        3 - <3 - ReTr W>_x (at 32^4 the array path took 2.9 s for MILC's 34 loops); else the array path."""
        vol = u.geom.volume
        if choose("gauge.deficit", u.geom, action=self).placement is Placement.ARRAY:
            links = _Links(u)
            return {k: [u.geom.sum(_loop_retrace(links, p)) / vol for p in paths]
                    for k, (_, paths) in self.shapes.items()}
        return {k: [3.0 - u.geom.sum(loop._weighted_deficit(u)) / vol for loop in self._single_loops(k)]
                for k in self.shapes}

    def _single_loops(self, shape: str) -> list:
        """One GaugeAction per loop of ``shape`` (coefficient 1), kept: their kernels' path tables stay on the device."""
        cache = self.__dict__.setdefault("_single", {})
        if shape not in cache:
            cache[shape] = [GaugeAction(self.beta, {shape: (1.0, (p,))}) for p in self.shapes[shape][1]]
        return cache[shape]

    # force -----------------------------------------------------------------------------------------------
    def loop_derivative(self, u: GaugeField):
        """A_mu(y) = sum_i c_i sum_{loops, steps through the link (y, mu)} R, with ReTr R = ReTr W: the rotated
        loop U_mu(y) S(y) (see the module docstring). dS/dtau = -(beta/3) sum ReTr(Omega A)."""
        geom, xp = u.geom, u.xp
        links = _Links(u)
        buckets = {}  # (mu, offset) -> sum of R, at the loop's starting site

        def add(mu, off, c, r):
            key = (mu, off)
            if key in buckets:
                buckets[key] += c * r
            else:
                buckets[key] = c * r

        for c, paths in self.shapes.values():
            if c == 0.0:
                continue
            for p in paths:
                mats, offs = links.path(p)
                n = len(mats)
                # fwd[k] = M_1 ... M_k (k = 1 .. n-1), bwd[k] = M_{k+1} ... M_n (k = 1 .. n-1); 1-based as above
                fwd = [None] * (n + 1)
                bwd = [None] * (n + 1)
                fwd[1] = mats[0]
                for k in range(2, n):
                    fwd[k] = fwd[k - 1] @ mats[k - 1]
                bwd[n - 1] = mats[n - 1]
                for k in range(n - 2, 0, -1):
                    bwd[k] = mats[k] @ bwd[k + 1]
                for k in range(1, n + 1):
                    s = p[k - 1]
                    mu = _loops.direction(s)
                    if s > 0:
                        # (M_k ... M_n)(M_1 ... M_{k-1})
                        if k == 1:
                            r = mats[0] @ bwd[1]
                        elif k == n:
                            r = mats[n - 1] @ fwd[n - 1]
                        else:
                            r = bwd[k - 1] @ fwd[k - 1]
                    else:
                        # [(M_{k+1} ... M_n)(M_1 ... M_k)]^dag
                        if k == n:
                            r = su3.dagger(fwd[n - 1] @ mats[n - 1])
                        else:
                            r = su3.dagger(bwd[k] @ fwd[k])
                    add(mu, offs[k - 1], c, r)

        out = xp.zeros_like(u.links)
        for (mu, off), r in buckets.items():
            out[mu] += _shift_by(geom, r, tuple(-d for d in off))
        return out

    def force(self, u: GaugeField):
        """Pdot_mu(x) = TA[U_mu(x) G_mu(x)^dag] = -(beta/3) TA[A_mu(x)], shape (4, nt, nz, ny, nx, 3, 3).

        On a GPU these are the CUDA kernels of :mod:`force.gauge_force_cuda` (staples shared between links for
        Wilson and Symanzik, a path table otherwise: ``force_kernel``), whose NumPy twin is
        :meth:`force_reference`: on the links as they are when the GPU holds the whole lattice, on halo-padded
        links (:meth:`_padded_links`) when the grid is partitioned."""
        return lookup("gauge.force", u.geom, action=self)(self, u)

    def force_reference(self, u: GaugeField):
        """The force from array operations on ``geom.xp`` (the twin of the CUDA kernel)."""
        a = self.loop_derivative(u)
        return su3.traceless_antihermitian((-self.beta / 3.0) * a)

    @property
    def halo_depth(self) -> int:
        """The padding the kernels need on a partitioned grid: the largest excursion of the loops (2 for
        Symanzik's rectangles and parallelograms, 1 for the plaquette)."""
        from .gauge_force_cuda import halo_depth

        d = self.__dict__.get("_halo_depth")
        if d is None:
            d = self.__dict__["_halo_depth"] = halo_depth(self.shapes)
        return d

    def _padded_links(self, u: GaugeField):
        """(links on the padded box (4, pt, pz, py, px, 3, 3), the local extents, the box extents, the local sites'
        offset in the box): :func:`lattice.padded.pad_links` of depth :attr:`halo_depth`."""
        b = pad_links(u.geom, u.links, self.halo_depth)
        return b.links, b.dims, b.box, b.offset

    def _cuda_kernel(self, backend, which: str):
        """The compiled force or action kernel for this action's loops, built on first use."""
        kernels = self.__dict__.setdefault("_kernels", {})
        if which not in kernels:
            from .gauge_force_cuda import GaugeActionKernel, force_kernel

            kernels[which] = (force_kernel if which == "force" else GaugeActionKernel)(backend, self.shapes)
        return kernels[which]


# The kernels index the whole lattice with periodic wrap (one rank, nothing partitioned), or run on links padded by
# the loops' largest excursion (a partitioned grid of GPUs); else the array twins. lattice.placement chooses.
def _action_depth(action) -> int:
    return action.halo_depth


@implements("gauge.force", Placement.WHOLE)
def _force_whole(action, u):
    return action._cuda_kernel(u.geom.backend, "force")(u.links, action.beta, u.geom.local_dims)


@implements("gauge.force", Placement.PADDED, depth=_action_depth)
def _force_padded(action, u):
    links, dims, box, offset = action._padded_links(u)
    return action._cuda_kernel(u.geom.backend, "force")(links, action.beta, dims, box, offset)


@implements("gauge.force", Placement.ARRAY)
def _force_array(action, u):
    return action.force_reference(u)


@implements("gauge.deficit", Placement.WHOLE)
def _deficit_whole(action, u):
    return action._cuda_kernel(u.geom.backend, "action")(u.links, u.geom.local_dims)


@implements("gauge.deficit", Placement.PADDED, depth=_action_depth)
def _deficit_padded(action, u):
    return action._cuda_kernel(u.geom.backend, "action")(*action._padded_links(u))


@implements("gauge.deficit", Placement.ARRAY)
def _deficit_array(action, u):
    return action.weighted_deficit_reference(u)


@implements("gauge.plaquette", Placement.WHOLE)
def plaquette_whole(u) -> tuple[float, float]:
    """MILC's (ss, st) plaquette on one GPU (twin: :func:`lattice.gauge.plaquette_array`): per site the action
    density d(x) = sum over the class's 3 planes of (3 - ReTr P) (``force.gauge_force_cuda.plaquette_kernels``: the
    action-density kernel), one launch a class, then 3 - Geometry.sum(d) / (3 V): two launches and two exact sums
    against the twin's six planes of array products (~0.3 s a call at 32^4). The same value to rounding (the twin
    sums ReTr P plane by plane)."""
    from .gauge_force_cuda import plaquette_kernels

    kernels = plaquette_kernels(u.geom.backend)
    dims, vol = u.geom.local_dims, u.geom.volume
    ss, st = (3.0 - u.geom.sum(kernels[name](u.links, dims)) / (3 * vol) for name in ("spatial", "temporal"))
    return ss, st


class WilsonAction(GaugeAction):
    """S = beta sum_x sum_{mu<nu} (1 - ReTr P_mu,nu(x) / 3)."""

    name = "Wilson plaquette action"

    def __init__(self, beta: float):
        super().__init__(beta, {"plaquette": (1.0, _loops.generate(_loops.PLAQUETTE))})


class SymanzikAction(GaugeAction):
    """MILC's one-loop Symanzik action: plaquettes, 1x2 rectangles and 1x1x1 parallelograms ("bent chairs"),
    with the coefficients of :func:`symanzik_coefficients`."""

    def __init__(self, beta: float, u0: float, nf: int = 0, quark_loops: str = "hisq"):
        self.u0 = float(u0)
        self.nf = int(nf)
        self.quark_loops = quark_loops
        coeff = symanzik_coefficients(u0, nf, quark_loops)
        table = _loops.loop_table()
        super().__init__(beta, {k: (coeff[k], table[k]) for k in ("plaquette", "rectangle", "parallelogram")})
        loops_word = {"hisq": "HISQ quark loops", "asqtad": "asqtad sea quarks (no quark-loop terms)",
                      "asqtad_nf": "asqtad quark loops", "none": "no quark loops"}
        self.name = (f"Symanzik 1x1 + 1x2 + 1x1x1 action with {loops_word[quark_loops]} "
                     f"(u0={self.u0:g}, nf={self.nf})")
