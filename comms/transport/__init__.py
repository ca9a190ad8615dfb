"""Halo transports: one module per transport behind one link interface, registered by name with its capabilities.

``registry`` holds the names (the one list that ``--transport``, HMC_P2P_TRANSPORT and the run configuration's
``transport`` are checked against) and loads a transport's module on first use; ``host`` is the interface of the
host engine's transports (comms/halo.py), ``mpi`` and ``shm`` implement it; ``event`` and ``stream_gated`` implement
the GPU engine's (comms/cuda/transports.py) and import CUDA, so only the GPU engine loads them.
"""
from .registry import Capabilities, lookup, names, register, unregister  # noqa: F401
