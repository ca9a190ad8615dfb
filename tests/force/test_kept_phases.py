"""The staggered phases and eps(x) are made once per backend and local box (lattice.geometry ``Geometry.kept``):
the same array on every call, the same numbers as built afresh, read-only on NumPy, and per box (the key holds the
global extents, the local shape and the block's offset): another lattice gets its own. No GPU."""
from __future__ import annotations

import numpy as np
import pytest

from force import phases
from lattice import Geometry
from solvers.staggered import epsilon


def test_made_once_with_the_numbers_of_a_fresh_build():
    geom = Geometry((4, 4, 4, 6))
    for make, fresh in ((phases.staggered_phases, phases._staggered_phases), (phases.naik_phases, phases._naik_phases)):
        for bc in phases.TIME_BCS:
            a = make(geom, bc)
            assert make(geom, bc) is a and np.array_equal(a, fresh(geom, bc))
            with pytest.raises(ValueError):
                a[0, 0, 0, 0, 0] = 2.0                 # read-only: nobody writes into the kept field
    assert phases.staggered_phases(geom, "periodic") is not phases.staggered_phases(geom, "antiperiodic")
    eps = epsilon(geom)
    assert epsilon(geom) is eps and np.array_equal(eps, (1 - 2 * geom.parity()).astype(np.float64)[..., None])
    assert epsilon(geom, np.float32).dtype == np.float32


def test_another_box_gets_its_own():
    a, b = Geometry((4, 4, 4, 6)), Geometry((4, 4, 6, 4))
    assert phases.naik_phases(b).shape == (4,) + b.shape
    assert np.array_equal(phases.naik_phases(b), phases._naik_phases(b, "antiperiodic"))
    assert phases.naik_phases(Geometry((4, 4, 4, 6))) is phases.naik_phases(a)   # the same box: shared
