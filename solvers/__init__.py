"""Staggered (HISQ) Dirac operators and Krylov solvers, composed as in gpt: an inverter factory takes an operator and
returns its inverse as an operator (docs/architecture.md, 'Inverters and field spaces').

    from solvers import StaggeredDslash, cg, even_odd, mixed_precision, multishift_cg
    D = StaggeredDslash(geom, fat, long)               # D, phases folded into the links (docs/conventions.md 1.6)
    M_eo = D.even_odd(mass)                            # M = 2m + D in even-odd form
    x = even_odd(mixed_precision(cg(1e-10)))(M_eo)(b)  # M^-1 b, full lattice
    xs = multishift_cg([4 * m**2 for m in masses], 1e-10)(D.even_odd(0.0).normal)(phi)
"""
from .operator import (COLOUR_VECTOR, FieldSpace, Operator, FunctionOperator, ProductOperator, ShiftedOperator,
                       inner, norm2, norm2_and_redot, set_reductions, reductions)
from .staggered import (StaggeredDslash, StaggeredMatrix, StaggeredNormal, StaggeredEvenOdd, EvenOddNormal,
                        ParityHop, epsilon, project, parity_sites, hop_table, register_hop_kernel)
from . import staggered_cuda, staggered_dist_cuda  # noqa: F401  (register the CUDA hop kernels)
from .cg import (SolverStats, SolverConvergenceError, SolverBreakdownError, InverseOperator, CGInverse, cg,
                 mixed_cg, mixed_precision)
from .multishift import (ShiftInverse, MultishiftInverse, ShiftByShift, RefinedShiftInverse, multishift_cg,
                         multi_shift, refined, hybrid_multishift_cg, mixed_multishift_cg)
from .even_odd import EvenOddInverse, even_odd, even_odd_inverse

__all__ = ["COLOUR_VECTOR", "FieldSpace", "Operator", "FunctionOperator", "ProductOperator", "ShiftedOperator",
           "inner", "norm2", "norm2_and_redot", "set_reductions", "reductions", "StaggeredDslash", "StaggeredMatrix",
           "StaggeredNormal", "StaggeredEvenOdd", "EvenOddNormal", "ParityHop", "epsilon", "project", "parity_sites",
           "hop_table", "register_hop_kernel", "SolverStats", "SolverConvergenceError", "SolverBreakdownError",
           "InverseOperator", "CGInverse", "ShiftInverse", "MultishiftInverse", "ShiftByShift",
           "RefinedShiftInverse", "EvenOddInverse", "cg", "mixed_cg", "mixed_precision", "multishift_cg",
           "multi_shift", "refined", "hybrid_multishift_cg", "mixed_multishift_cg", "even_odd", "even_odd_inverse"]
