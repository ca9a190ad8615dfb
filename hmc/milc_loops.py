"""MILC's gauge-loop measurement: the ``G_LOOP:`` and ``GACTION:`` lines that ks_imp_rhmc prints after each
measured trajectory (``generic/gauge_stuff.c: g_measure``, called from ``ks_imp_rhmc/control.c`` with the staggered
phases off, after PLAQ and P_LOOP).

For every loop of the gauge action's table (:mod:`force.loops`, built in MILC's ``make_loop_table`` order: shape
iloop, then its rotations and reflections ln) MILC prints

    G_LOOP:  iloop  ln  length   <TAB> (1/V) sum_x ReTr W(x) <TAB> ( d_1 d_2 ... d_length  )

with the path in MILC's direction codes (XUP..TUP = 0..3, backward 7 - d) and ``%.16e`` (``%e`` in MILC's
single-precision build). NREPS is 1 for the Wilson and one-loop Symanzik actions, so there is one average per loop.
Then

    GACTION: (1/V) sum_i c_i sum_{loops of shape i} sum_x (3 - ReTr W(x))

(``%e``), the gauge action without beta/3 (:meth:`force.gauge_action.GaugeAction.gaction`).
"""
from __future__ import annotations

from force import loops as _loops


def g_loop_lines(u, gauge_action, precision: int = 2) -> list[str]:
    """MILC's ``G_LOOP:`` lines, one per loop of ``gauge_action``'s table, then its ``GACTION:`` line, for the links
    ``u`` (a :class:`lattice.GaugeField`, staggered phases removed, as the project keeps them). ``precision`` 2 is
    MILC's double-precision format, 1 its single-precision one (``%e`` averages)."""
    if precision not in (1, 2):
        raise ValueError(f"precision {precision!r}: use 2 (MILC's double-precision format) or 1 (single)")
    value = "{:.16e}" if precision == 2 else "{:e}"
    traces = gauge_action.loop_traces(u)
    out = []
    for iloop, (name, (_, paths)) in enumerate(gauge_action.shapes.items()):
        for ln, (path, avg) in enumerate(zip(paths, traces[name])):
            dirs = "".join(f"{d} " for d in _loops.to_milc(path))
            out.append(f"G_LOOP:  {iloop}  {ln}  {len(path)}   \t{value.format(avg)}\t( {dirs} )")
    out.append(f"GACTION: {gauge_action.gaction(u):e}")
    return out
