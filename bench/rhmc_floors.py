"""The floor of every phase of an RHMC trajectory (issue 19: ``hmc bench rhmc`` prints each phase's time, its floor
and the fraction of the floor reached, floor / time). A floor is the time the phase's fewest bytes take at the
measured copy bandwidth B (bytes read + written per second: ``bench.gauge.copy_bandwidth``, a device-to-device
copy on the GPU, a NumPy copy on the CPU, measured by ``hmc bench dslash`` on the same backend); the gauge force
also gets its flops per call, as the kernel walks its paths.

Notation: V sites; c bytes per complex number (16 in double, 8 in single); M = 9 x 16 = 144 bytes, one complex128
3x3 matrix; h(c) = ``solvers.staggered_cuda.hop_bytes``, the bytes of one output site of a HISQ hop (16 links, the
8 Naik ones compressed to 7 complex numbers as the GPU table holds them, 16 neighbour vectors, the output: 2864 in
double, 1432 in single; docs/perf-notes.md "Long-link compression"); n_g the Naik-epsilon groups; n_k^P the poles of
pseudofermion k in phase P (GR heat bath, FA action, MD force). The counts per trajectory come from its history
row (iterations, solves, link builds) and the integrator schedule (gauge-force calls).

* solvers, phase P: N_P x min_k [h(c_k) V + (5 + 4 n_k^P) 3 c_k V / 2] / B. N_P: the phase's multishift
  iterations (MILC's count, the initial residual included: one application of A each). A = -D_eo D_oe is two
  hops over V/2 output sites each; the fused multishift update (``solvers.multishift``) reads and writes the base
  system's s and r and reads w (5 half-lattice vectors), and reads and writes x_i and p_i of every shift (4 per
  shift), the reductions |r|^2 and <r, w> folded into the kernels that write their operands. The history holds the
  total per phase only, so the pseudofermion whose iteration costs least (fewest poles; single precision where the
  deck's cgprec_md_fa_gr asks for it) stands for all: a floor. Hybrid and mixed-precision refinements are left out
  (their iterations are not in N_P), which keeps it a floor. Where converged shifts stop (``stop_converged_shifts``)
  the MD floor counts the shift updates made instead (history ``shift_updates_md``): N_MD [h(c) + 5 x 3c/2] V +
  U x 4 x 3c/2 V, with that term's c.
* link smearing, per build: M V (16 + 8 n_g): read U (4 M a site), write the level-1 fat7 link V and its U(3)
  projection W (8 M, kept for the force), read W back (4 M: level 2 walks its neighbours), write the fat and long
  links of every epsilon group (8 M each).
* fermion force, outer products, per force evaluation: sum_k n_k^MD (h(16) / 2 + 48) V + 8 M n_g V: per MD pole
  the hop Y_l = D_oe X_l (V/2 output sites) and one read of Z_l = X_l + Y_l (a full-lattice vector, 48 B a site),
  and the fat and long outer products of every group written once (8 M a site).
* fermion force, HISQ chain rule, per force evaluation: M V (16 + 8 n_g): read the outer products (8 M per
  group), U, V and W (12 M), write the force (4 M).
* beside these two floors, the staged kernels' own byte model (each field they read or write moved once, their
  intermediates included; :data:`SMEAR_MODEL`, :data:`CHAIN_MODEL`): 2 levels x 64 M a site a build, 2 levels x
  120 M a site a force evaluation (the chain rule with the forward intermediates kept): what those kernels could
  reach at the copy bandwidth, the ``model_s`` of the rows.
* gauge force, per call: 12 M V (``bench.gauge.force_bytes``: the 4 links read and 4 momenta written, plus the
  4 momenta read, as the clock holds the update P <- P + dt F), whatever the kernel. Flops per call, as the kernel
  that runs counts them (``force.gauge_force_cuda.force_kernel``, ``force_flops_per_site``; products 198 flops, a product added into a sum
  216, a weighted sum 36, the scaled traceless anti-Hermitian part 54):
  - Wilson and Symanzik, staples shared (force/kernels/gauge_force.cu, header): the 24 plaquette staples of a site
    once, 2 products each; per link 6 weighted sums of the plaquette staples; with rectangles 12 products added
    (U_mu S S pairs along mu) and 2 products and 2 weighted sums; with rectangles or parallelograms, for each of the
    6 sides a: a product (the short-side rectangle) where c_rt != 0, 4 products added (parallelograms) where
    c_pg != 0, 2 weighted sums and the product by L(x + mu, a) added; then U_mu(x) Sigma (198) and the TA part
    (54). The production action: 56016 flops a site, against 187488 for the walk. Plaquettes alone: per link 6
    staples of 2 products and 6 weighted sums, then 198 + 54. The shared kernel also writes and reads its scratch,
    at least 48 M V more than the floor (the 24 staples a site written once and read once; the note prints it).
  - any other action, the path-table walk: 4 V sum_paths ((L - 1) x 198 + 36) over the loops through a link
    (``force.gauge_force_cuda.force_paths``, rotated to start on it), nothing shared between links.
Evaluations per trajectory: the fermion force's are the MD solves over the pseudofermions (one solve each per
evaluation), the gauge force's are the gauge kicks of the schedule (``hmc.assemble.make_schedule``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from force import hisq_staged as _staged, hisq_staged_vjp as _staged_vjp
from solvers.staggered_cuda import hop_bytes

from .gauge import force_bytes

MATRIX = 9 * 16                  # bytes of one complex128 3x3 matrix
PHASES = ("GR", "FA", "MD")


@dataclass(frozen=True)
class Model:
    """The per-run numbers of the floors (module docstring): volume, epsilon groups, pseudofermions, solver bytes
    per iteration per phase, outer-product bytes per force evaluation, gauge-force calls and flops per call."""

    volume: int
    groups: int
    pseudofermions: int
    solver_iteration_bytes: dict
    outer_bytes: int
    gauge_calls: int
    gauge_flops: int
    gauge_name: str
    gauge_scratch_bytes: int = 0
    md_iteration_bytes: int = 0      # the cheapest MD term's A and base-system update (5 vectors), per iteration
    md_shift_bytes: int = 0          # and its 4 vectors per shift update (for runs whose converged shifts stop)


def solver_iteration_bytes(volume: int, poles: int, single: bool, half: str = "off") -> int:
    """Bytes of one multishift iteration with ``poles`` shifts: A (two hops) and the fused update; ``half``: the
    links a single-precision operator keeps in 16 bits ("off", "naik", "all": solvers.half_links)."""
    dtype = np.complex64 if single else np.complex128
    c = np.dtype(dtype).itemsize
    hop = hop_bytes(dtype, half=half) if (single and half != "off") else hop_bytes(dtype, compressed=True)
    return hop * volume + (5 + 4 * poles) * 3 * c * volume // 2


def gauge_flops_per_call(action, volume: int) -> int:
    """Flops of one gauge-force call, as the kernel that serves ``action`` does them (module docstring;
    ``force.gauge_force_cuda.force_flops_per_site``)."""
    from force.gauge_force_cuda import force_flops_per_site

    return force_flops_per_site(action.shapes) * volume


def gauge_scratch_bytes(action, volume: int) -> int:
    """Bytes the staple-sharing force moves beyond the floor (``force.gauge_force_cuda.scratch_bytes_per_site``)."""
    from force.gauge_force_cuda import scratch_bytes_per_site

    return scratch_bytes_per_site(action.shapes) * volume


def model(deck: dict, files: dict, half: str = "off") -> Model:
    """The floors' numbers of a run from its validated deck and the run file's texts (its rational functions);
    ``half``: the run's ``dslash_half_links`` (the single-precision operators' 16-bit links)."""
    from hmc.assemble import make_monomials, make_schedule

    monomials = make_monomials(deck, files)
    gauge = next(m for m in monomials if m.kind == "gauge")
    fermion = next(m for m in monomials if m.kind == "fermion")
    volume = int(np.prod(deck["lattice"]["dims"]))
    def per_iteration_bytes(term, phase, poles=None):
        n = len(term.approximation(phase).poles) if poles is None else poles
        return solver_iteration_bytes(volume, n, term.single_precision(phase), half)

    per_iteration = {ph: min(per_iteration_bytes(t, ph) for t in fermion.terms) for ph in PHASES}
    cheapest = min(fermion.terms, key=lambda t: per_iteration_bytes(t, "MD"))
    md_base = per_iteration_bytes(cheapest, "MD", 0)
    md_shift = per_iteration_bytes(cheapest, "MD", 1) - md_base
    md_poles = sum(len(t.approximation("MD").poles) for t in fermion.terms)
    groups = len(fermion.groups)
    outer = md_poles * (hop_bytes(np.complex128) // 2 + 48) * volume + 8 * MATRIX * groups * volume
    calls = sum(1 for op in make_schedule(deck, monomials) if op[0] == "P" and gauge.name in op[1])
    return Model(volume, groups, len(fermion.terms), per_iteration, outer, calls,
                 gauge_flops_per_call(gauge.gauge_action, volume), gauge.name,
                 gauge_scratch_bytes(gauge.gauge_action, volume), md_base, md_shift)


@dataclass(frozen=True)
class Row:
    phase: str
    time_s: float
    floor_s: float
    note: str = ""
    model_s: float | None = None     # the time of the bytes the phase's kernels move by their own model, if any

    @property
    def fraction(self) -> float:
        return self.floor_s / self.time_s if self.time_s > 0 else float("nan")


def rows(m: Model, r: dict, bandwidth: float) -> list[Row]:
    """Time, floor and note of every phase of one trajectory (history row ``r``) at ``bandwidth`` bytes/s."""
    def t(key):
        return float(r.get(key, 0.0))

    out = []
    for ph in PHASES:
        n = int(r[f"cg_{ph.lower()}"])
        out.append(Row(f"solvers {ph}", t(f"time_fermion_solver_{ph}"), n * m.solver_iteration_bytes[ph] / bandwidth,
                       f"{n} iterations x {m.solver_iteration_bytes[ph] / m.volume:.0f} B/site"))
    made, slots = int(r.get("shift_updates_md", -1)), int(r.get("shift_slots_md", -1))
    if m.md_shift_bytes and 0 <= made < slots:      # converged shifts stopped: the updates made, not n x poles
        n = int(r["cg_md"])
        out[-1] = Row("solvers MD", t("time_fermion_solver_MD"), (n * m.md_iteration_bytes + made * m.md_shift_bytes)
                      / bandwidth, f"{n} iterations x {m.md_iteration_bytes / m.volume:.0f} B/site + {made} shift "
                      f"updates x {m.md_shift_bytes / m.volume:.0f} B/site")
    builds = int(r["fermion_link_builds"])
    smear = MATRIX * (16 + 8 * m.groups) * m.volume
    out.append(_modelled(Row("link smearing", t("time_fermion_links"), builds * smear / bandwidth,
                             f"{builds} builds x {smear / m.volume:.0f} B/site"),
                         builds * LEVELS * SMEAR_MODEL * m.volume / bandwidth, LEVELS * SMEAR_MODEL))
    forces = int(r["solves_md"]) // m.pseudofermions
    out.append(Row("fermion force: outer products", t("time_fermion_outer"), forces * m.outer_bytes / bandwidth,
                   f"{forces} evaluations x {m.outer_bytes / m.volume:.0f} B/site"))
    chain = MATRIX * (16 + 8 * m.groups) * m.volume
    out.append(_modelled(Row("fermion force: chain rule", t("time_fermion_force_chain"), forces * chain / bandwidth,
                             f"{forces} evaluations x {chain / m.volume:.0f} B/site"),
                         forces * LEVELS * CHAIN_MODEL * m.volume / bandwidth, LEVELS * CHAIN_MODEL))
    gauge_bytes = force_bytes(m.volume) + 4 * MATRIX * m.volume       # + the momenta read by the update
    tg = t(f"time_force_{m.gauge_name}")
    rate = m.gauge_calls * m.gauge_flops / tg / 1e9 if tg > 0 else float("nan")
    out.append(Row("gauge force", tg, m.gauge_calls * gauge_bytes / bandwidth,
                   f"{m.gauge_calls} calls x {gauge_bytes / m.volume:.0f} B/site "
                   f"(+{m.gauge_scratch_bytes / m.volume:.0f} B/site of staple scratch), {m.gauge_flops / 1e9:.3g} "
                   f"GFLOP a call: {rate:.3g} GFLOP/s"))
    return out


#: the HISQ smearing levels a link build and a chain rule run (fat7 + unitarization, then the level-2 smearing)
LEVELS = 2
#: bytes a site of one level of the staged kernels by their own model (each field they read or write moved once):
#: the smearing's three stages (force.hisq_staged.BYTES_PER_SITE, 64 matrices) and the chain rule with the forward
#: intermediates kept (force.hisq_staged_vjp: its stages 3-5, 120 matrices), the U(3) projection, Naik and phase
#: steps not counted
SMEAR_MODEL = _staged.BYTES_PER_SITE
CHAIN_MODEL = MATRIX * sum(n for stage, n in _staged_vjp.MATRICES_PER_STAGE.items() if stage.startswith("svjp"))


def _modelled(row: Row, model_s: float, per_site: int) -> Row:
    """``row`` with the kernels' own byte model beside the floor: its time at the copy bandwidth in ``model_s`` and
    in the note, with the fraction of it the phase reached."""
    frac = model_s / row.time_s if row.time_s > 0 else float("nan")
    return Row(row.phase, row.time_s, row.floor_s, f"{row.note}; the staged kernels' model {per_site} B/site: "
               f"{model_s:.3g} s, {100 * frac:.0f} % reached", model_s)


def table_lines(m: Model, r: dict, bandwidth: float) -> list[str]:
    """The floors of one trajectory as indented lines: phase, time, floor, floor / time, what the floor counts."""
    lines = [f"        {'phase (floors at copy bandwidth ' + format(bandwidth / 1e9, '.1f') + ' GB/s)':<52} "
             f"{'time s':>10} {'floor s':>10} {'reached':>8}  floor counts"]
    for row in rows(m, r, bandwidth):
        lines.append(f"        {row.phase:<52} {row.time_s:10.4g} {row.floor_s:10.4g} {100 * row.fraction:7.2f}%  "
                     f"{row.note}")
    return lines
