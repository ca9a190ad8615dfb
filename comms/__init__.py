"""Process grid, global reductions and halo transports (COMMS.md). Imports nothing else of this project."""
from .grid import ProcessGrid, world, CommsError

__all__ = ["ProcessGrid", "world", "CommsError"]
