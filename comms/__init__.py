"""Process grid, split grid, global reductions and halo transports (docs/halo-protocol.md). Imports nothing else of this project."""
from .grid import CommsError, CommsTimeout, ProcessGrid, choose_grid, launched_size, world

__all__ = ["ProcessGrid", "world", "CommsError", "CommsTimeout", "choose_grid", "launched_size"]
