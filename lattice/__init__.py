"""Lattice core: backend, geometry, fields, SU(3) algebra, counter-based RNG, gauge-file formats."""
from .backend import Backend, get_backend
from .geometry import Geometry
from .gauge import GaugeField, plaquette, polyakov_loop, link_trace
from .rng import CounterRNG

__all__ = ["Backend", "get_backend", "Geometry", "GaugeField", "plaquette", "polyakov_loop", "link_trace",
           "CounterRNG"]
