"""Fixtures of the solver tests; the helpers live in solver_testlib.py."""
import pytest

from lattice import Geometry


@pytest.fixture
def geom4():
    return Geometry((4, 4, 4, 4))


@pytest.fixture
def geom6():
    return Geometry((6, 6, 6, 6))
