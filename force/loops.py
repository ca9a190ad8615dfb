"""Closed Wilson-loop shapes for gauge actions, as paths of signed directions (docs/conventions.md 2).

Encoding of a path step: ``+(mu+1)`` is a step forward in direction mu, ``-(mu+1)`` a step backward, with
mu = 0, 1, 2, 3 for x, y, z, t. So ``(1, 2, -1, -2)`` is the xy plaquette U_x(x) U_y(x+x) U_x(x+y)^dag U_y(x)^dag.
The constants ``X, Y, Z, T`` (= 1, 2, 3, 4) make paths readable: ``(X, Y, -X, -Y)``. :func:`to_milc` and
:func:`from_milc` convert to and from MILC's direction codes (XUP..TUP = 0..3, backward OPP_DIR(d) = 7 - d).

A loop shape is generated from one representative by all permutations and reflections of the four axes; a
geometric loop is kept once: paths that differ by a cyclic shift of the starting point (a translation, since
actions sum over all sites) or by reversal (same ReTr) are identified. The generation order is MILC's
(``generic/gauge_stuff.c: make_loop_table``: permutations in lexicographic order, then the 16 reflections), so
the loops come out in the order of MILC's ``G_LOOP`` lines. Per site this gives 6 plaquettes, 12 rectangles
and 16 parallelograms.
"""
from __future__ import annotations

from functools import lru_cache
from itertools import permutations, product

X, Y, Z, T = 1, 2, 3, 4

#: Representatives of MILC's loop shapes (``generic/imp_actions/symanzik_1loop_*.h: loop_ind``).
PLAQUETTE = (X, Y, -X, -Y)
RECTANGLE = (X, X, Y, -X, -X, -Y)
PARALLELOGRAM = (X, Y, Z, -X, -Y, -Z)

SHAPES = {"plaquette": PLAQUETTE, "rectangle": RECTANGLE, "parallelogram": PARALLELOGRAM}


def step(mu: int, forward: bool = True) -> int:
    """The encoded step in direction ``mu`` (0..3), forward or backward."""
    if not 0 <= mu < 4:
        raise ValueError(f"direction {mu} out of range 0..3")
    return (mu + 1) if forward else -(mu + 1)


def direction(s: int) -> int:
    """The direction mu (0..3) of an encoded step."""
    return abs(s) - 1


def is_forward(s: int) -> bool:
    return s > 0


def to_milc(path) -> tuple:
    """MILC direction codes: forward mu -> mu, backward mu -> 7 - mu."""
    return tuple(direction(s) if s > 0 else 7 - direction(s) for s in path)


def from_milc(dirs) -> tuple:
    return tuple(d + 1 if d < 4 else -(7 - d + 1) for d in dirs)


def reverse(path) -> tuple:
    """The same loop traversed the other way (its trace is the complex conjugate)."""
    return tuple(-s for s in reversed(path))


def displacement(path) -> tuple:
    """The end point minus the start point, as (dx, dy, dz, dt)."""
    d = [0, 0, 0, 0]
    for s in path:
        d[direction(s)] += 1 if s > 0 else -1
    return tuple(d)


def is_closed(path) -> bool:
    return displacement(path) == (0, 0, 0, 0)


def rotations(path) -> list:
    p = tuple(path)
    return [p[k:] + p[:k] for k in range(len(p))]


def canonical(path) -> tuple:
    """A key equal for all paths that are the same geometric loop: the minimum over cyclic shifts of the path
    and of its reversal."""
    return min(rotations(path) + rotations(reverse(path)))


def transform(path, perm, refl) -> tuple:
    """Map axis mu to axis perm[mu], reversed where refl[mu] is set (MILC's ``pp`` table)."""
    out = []
    for s in path:
        mu = direction(s)
        forward = (s > 0) != bool(refl[mu])
        out.append(step(perm[mu], forward))
    return tuple(out)


@lru_cache(maxsize=None)
def generate(representative: tuple) -> tuple:
    """All distinct geometric loops of this shape, in MILC's order."""
    representative = tuple(representative)
    if not is_closed(representative):
        raise ValueError(f"path {representative} is not closed")
    seen = set()
    loops = []
    for perm in permutations(range(4)):
        for refl in product((0, 1), repeat=4):
            p = transform(representative, perm, refl)
            key = canonical(p)
            if key not in seen:
                seen.add(key)
                loops.append(p)
    return tuple(loops)


def loop_table(names=("plaquette", "rectangle", "parallelogram")) -> dict:
    """{shape name: tuple of paths} for the named shapes of :data:`SHAPES`."""
    return {name: generate(SHAPES[name]) for name in names}


def format_path(path) -> str:
    """Readable form, for example ``+x+y-x-y``."""
    return "".join(("+" if s > 0 else "-") + "xyzt"[direction(s)] for s in path)
