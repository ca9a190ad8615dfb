"""The stencil: which sites each face sends, which sites need no halo, and the one pack / post / wait / unpack
path of every halo exchange (docs/architecture.md, 'Stencil').

Grid's split, kept here: who my neighbours are (the :class:`Stencil`, built once per lattice, displacement set and
depth), what goes on the wire (its packed send buffers and ghost buffers), and how it travels (the halo engine of
``comms.halo`` or ``comms.cuda``, whose links and transports it drives through ``engine.start`` /
``Exchange.finish``; no communication code of its own).

Faces. A displacement (mu, s) with s > 0 reads x + s mu_hat, which past the last local slab lies on the forward
neighbour: every rank sends its first ``depth`` slabs backward (send key (mu, 0)) and receives the forward
neighbour's on side (mu, 1); s < 0 sends the last ``depth`` slabs forward ((mu, 1)) and receives on side (mu, 0).
Only partitioned dimensions have faces (the others wrap locally). A face is a whole slab, both parities, in the C
order of the site axes (t, z, y, x) with any per-site axes behind; faces sit in one flat buffer per stage in sorted
key order (send buffer: (mu, dir); ghost buffer: (mu, side)), the layout the distributed GPU hop and the multigrid's
extended array read.

Padded stencils (``padded=True``: what :meth:`lattice.Geometry.padded` serves) surround the local sites by ``depth``
on every partitioned dimension of the displacements, edges and corners included: one stage per dimension in
increasing mu, each sending slabs of the box padded so far, so that the slabs of a later dimension carry the pads of
the earlier ones (corners arrive in two hops). ``complete`` then runs the later stages and returns the box.

Buffers are allocated once per per-site shape and dtype (through the lattice's array module), two sets of them so
that two exchanges of one stencil may be in flight (the engines' double buffering); after the first call with a
given field kind, ``begin`` and ``complete`` allocate no arrays: they copy into fixed buffers and hand fixed views to
the engine. That is what makes an exchange capturable in a CUDA graph in principle (fixed addresses, no allocation;
the GPU engine's stream-gated links are capturable, docs/halo-protocol.md 'CUDA graphs'). The ghosts returned are
those buffers: valid until the next exchange that uses the same set (copy them to keep them).
"""
from __future__ import annotations

import numpy as np

from .base import DIRS, CommsError


def device_engine(engine) -> bool:
    """Whether a halo engine exchanges device arrays (its ``device_faces``: the GPU engine's ``start`` takes CuPy
    faces and its ``finish`` returns CuPy arrays; the CPU engine takes NumPy faces)."""
    return bool(getattr(engine, "device_faces", False))


def staging(on_device: bool, engine) -> str:
    """How faces travel: "device" (device fields to a GPU engine: no host copy), "host" (device fields through a
    CPU engine: staged through host buffers) or "numpy" (host fields)."""
    if not on_device:
        return "numpy"
    return "device" if device_engine(engine) else "host"


def _axis(mu: int) -> int:
    return 3 - mu


def _flat_sites(shape, index) -> np.ndarray:
    """Flat C-order indices (in an array of site shape ``shape``) of the sites ``index`` selects, in its order."""
    return np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)[index].ravel()


class Face:
    """One face of a stage: sent on ``key`` = (mu, dir) from ``source[send]`` and received on ``recv_key`` =
    (mu, 1 - dir), landing (padded stencils) at ``box[land]``. ``shape``: its site shape; ``send_at`` /
    ``ghost_at``: its first site in the stage's flat send / ghost buffer; ``sites``: the flat indices of the sites it
    sends, in the source array (the lattice's local sites, or the box of a padded stencil)."""

    __slots__ = ("key", "recv_key", "send", "land", "shape", "size", "send_at", "ghost_at", "sites")

    def __init__(self, key, send, land, source_shape):
        self.key, self.recv_key = key, (key[0], 1 - key[1])
        self.send, self.land = send, land
        self.sites = _flat_sites(source_shape, send)
        self.shape = tuple(len(range(*s.indices(n))) for s, n in zip(send, source_shape))
        self.size = int(np.prod(self.shape))
        self.send_at = self.ghost_at = 0


class _Buffers:
    """One set of fixed buffers of a stencil for one per-site shape and dtype: per stage the flat send and ghost
    buffers and their face views (host mirrors for "host" staging made on first need), the box of a padded
    stencil, and the exchange in flight."""

    def __init__(self, stencil, rest, dtype):
        xp, per = stencil.xp, int(np.prod(rest, dtype=np.int64))
        self.rest, self.dtype, self.per = rest, dtype, per
        self.send, self.ghost, self.send_views, self.ghost_views = [], [], [], []
        for faces in stencil.stages:
            n = sum(f.size for f in faces) * per
            send, ghost = xp.zeros(max(n, 1), dtype), xp.zeros(max(n, 1), dtype)
            self.send.append(send)
            self.ghost.append(ghost)
            self.send_views.append(_views(send, faces, "send_at", rest, per, key="key"))
            self.ghost_views.append(_views(ghost, faces, "ghost_at", rest, per, key="recv_key"))
        self.host = None
        self.own_box = None                  # a padded stencil's box when the caller gives none (made once)
        self.box = None                      # the box of the exchange in flight
        self.exchange = None
        self.busy = False

    def host_mirrors(self, stencil):
        """(send, ghost, send views, ghost views) host buffers per stage, for "host" staging (made once)."""
        if self.host is None:
            self.host = []
            for faces, send, ghost in zip(stencil.stages, self.send, self.ghost):
                hs, hg = np.zeros(send.shape, self.dtype), np.zeros(ghost.shape, self.dtype)
                self.host.append((hs, hg, _views(hs, faces, "send_at", self.rest, self.per, key="key"),
                                  _views(hg, faces, "ghost_at", self.rest, self.per, key="recv_key")))
        return self.host


def _views(buf, faces, at, rest, per, key):
    """{face key: the face's view of the flat buffer ``buf``} (offsets ``at``: "send_at" or "ghost_at")."""
    return {getattr(f, key): buf[getattr(f, at) * per:(getattr(f, at) + f.size) * per].reshape(f.shape + rest)
            for f in faces}


class Stencil:
    """The halo of ``lattice`` (any object with ``shape`` (nt, nz, ny, nx), ``grid`` and ``xp``: a Geometry or a
    multigrid coarse lattice) for the displacements ``displacements`` ((mu, step) pairs) at slab ``depth`` (default:
    the largest |step|). See the module docstring for the layout. Capturable in principle: after the first exchange
    of a field kind, :meth:`begin` / :meth:`complete` only copy between fixed buffers and hand the engine fixed views
    (no allocation), so one exchange can be recorded in a CUDA graph where the engine's links allow it.

    ``faces`` / ``stages``: the :class:`Face` objects (one stage unless ``padded``); ``face_sites[(mu, dir)]``: the
    flat local sites each face sends; ``interior`` / ``exterior``: flat local sites whose displacements all stay in
    the local block / do not (NumPy int64, sorted). ``staging``: a callable giving the :func:`staging` of each
    exchange (default: from the lattice's array module and the grid's engine)."""

    def __init__(self, lattice, displacements, depth: int | None = None, *, padded: bool = False, staging=None):
        self.shape = tuple(int(n) for n in lattice.shape)
        self.grid, self.xp = lattice.grid, lattice.xp
        disp = sorted({(int(mu), int(s)) for mu, s in displacements})
        if any(not 0 <= mu < 4 or s == 0 for mu, s in disp):
            raise CommsError(f"stencil displacements {disp} must be (mu, step) with mu in 0..3 and step != 0")
        self.displacements = tuple(disp)
        self.depth = int(depth) if depth is not None else max((abs(s) for _, s in disp), default=1)
        part = self.grid.partitioned
        self.partitioned = tuple(part)
        self.dims = sorted({mu for mu, _ in disp if part[mu]})
        for mu in self.dims:
            n = self.shape[_axis(mu)]
            if not 1 <= self.depth <= n:
                raise CommsError(f"stencil depth {self.depth} is not in 1..{n}, the local extent in direction "
                                 f"{DIRS[mu]}")
        self.padded = bool(padded)
        pad = [self.depth if mu in self.dims else 0 for mu in range(4)]
        self.pad = tuple(pad)                                        # x first
        self.box = tuple(n + 2 * pad[_axis(a)] for a, n in enumerate(self.shape))
        self.stages = self._padded_stages() if self.padded else [self._faces()]
        self.faces = [f for st in self.stages for f in st]
        self.face_sites = {f.key: f.sites for f in self.stages[0]} if not self.padded else {}
        self.interior, self.exterior = self._site_lists()
        self._staging = staging if staging is not None else self._default_staging
        self._sets = {}
        self._in_flight = []

    # --- tables ---------------------------------------------------------------------------------------------
    def _wanted(self, mu):
        """The send keys of dimension mu: (mu, 0) when a displacement reads forward, (mu, 1) when one reads back."""
        steps = [s for m, s in self.displacements if m == mu]
        return ([(mu, 0)] if any(s > 0 for s in steps) else []) + ([(mu, 1)] if any(s < 0 for s in steps) else [])

    def _faces(self):
        faces = []
        for mu in self.dims:
            a, n, d = _axis(mu), self.shape[_axis(mu)], self.depth
            for key in self._wanted(mu):
                idx = [slice(None)] * 4
                idx[a] = slice(0, d) if key[1] == 0 else slice(n - d, n)
                faces.append(Face(key, tuple(idx), None, self.shape))
        return self._place(faces)

    def _padded_stages(self):
        """One stage per dimension: slabs of the box with the earlier dimensions' pads, the later ones' interior."""
        stages, done = [], set()
        for mu in self.dims:
            d = self.depth
            idx = []
            for a, n in enumerate(self.shape):
                p = self.pad[3 - a]
                idx.append(slice(0, n + 2 * p) if (3 - a) in done else slice(p, p + n))
            a, n = _axis(mu), self.shape[_axis(mu)]
            faces = []
            for key in ((mu, 0), (mu, 1)):
                send, land = list(idx), list(idx)
                send[a] = slice(d, 2 * d) if key[1] == 0 else slice(n, n + d)
                land[a] = slice(n + d, n + 2 * d) if key[1] == 0 else slice(0, d)   # lands on side 1 - dir
                faces.append(Face(key, tuple(send), tuple(land), self.box))
            stages.append(self._place(faces))
            done.add(mu)
        return stages or [[]]

    @staticmethod
    def _place(faces):
        """Offsets in the flat buffers: send buffer in (mu, dir) order, ghost buffer in (mu, side) order."""
        at = 0
        for f in sorted(faces, key=lambda f: f.key):
            f.send_at, at = at, at + f.size
        at = 0
        for f in sorted(faces, key=lambda f: f.recv_key):
            f.ghost_at, at = at, at + f.size
        return sorted(faces, key=lambda f: f.key)

    def _site_lists(self):
        t, z, y, x = np.meshgrid(*[np.arange(n) for n in self.shape], indexing="ij")
        coord = (x, y, z, t)
        out = np.zeros(self.shape, dtype=bool)
        for mu, s in self.displacements:
            if self.partitioned[mu]:
                m = coord[mu] + s
                out |= (m < 0) | (m >= self.shape[_axis(mu)])
        flat = out.ravel()
        return np.flatnonzero(~flat).astype(np.int64), np.flatnonzero(flat).astype(np.int64)

    def ghost_rows(self, stage: int = 0) -> list:
        """((mu, side), first site in the ghost buffer, face site shape) in ghost-buffer order."""
        return [(f.recv_key, f.ghost_at, f.shape) for f in sorted(self.stages[stage], key=lambda f: f.recv_key)]

    # --- buffers ----------------------------------------------------------------------------------------------
    def _default_staging(self):
        return staging(self.xp is not np, self.grid.halo)

    def buffers(self, rest=(), dtype=np.complex128, which: int = 0) -> _Buffers:
        """Buffer set ``which`` (0 or 1) for fields with per-site shape ``rest`` and ``dtype`` (allocated once):
        for a client that packs the send buffer itself (a kernel) and reads the ghost buffer directly."""
        key = (tuple(int(n) for n in rest), np.dtype(dtype))
        sets = self._sets.get(key)
        if sets is None:
            sets = self._sets[key] = [_Buffers(self, key[0], key[1]), _Buffers(self, key[0], key[1])]
        return sets[which]

    def _free_set(self, field) -> _Buffers:
        sets = self._sets.get((field.shape[4:], field.dtype))
        if sets is None:
            self.buffers(field.shape[4:], field.dtype)
            sets = self._sets[(field.shape[4:], field.dtype)]
        for b in sets:
            if not b.busy:
                return b
        raise CommsError("two exchanges of this stencil are in flight: complete the older before a third begin "
                         "(double buffering)")

    # --- the exchange -----------------------------------------------------------------------------------------
    def begin(self, field, box=None) -> _Buffers:
        """Pack the faces of ``field`` (site axes first, the lattice's local shape) into the send buffer and post
        the exchange of the first stage; returns the buffer set in flight, for :meth:`complete`. ``field`` may be
        written as soon as this returns (the faces are copies). A padded stencil fills ``box`` (an array of
        ``self.box`` + the per-site shape: the caller's result), else a box of its own. Collective over the grid."""
        if tuple(field.shape[:4]) != self.shape:
            raise CommsError(f"stencil: site axes {tuple(field.shape[:4])} are not the local shape {self.shape}")
        bufs = self._free_set(field)
        if self.padded:
            if box is None:
                if bufs.own_box is None:
                    bufs.own_box = self.xp.empty(self.box + bufs.rest, bufs.dtype)
                box = bufs.own_box
            bufs.box = box
        self.pack(field, bufs)
        return self.post(bufs)

    def pack(self, field, bufs: _Buffers):
        """Copy the first stage's faces of ``field`` into the send buffer of ``bufs`` (a padded stencil: ``field``
        into its box first); a client with a pack kernel fills the send buffer itself and calls :meth:`post`."""
        if self.padded:
            inner = tuple(slice(self.pad[3 - a], self.pad[3 - a] + n) for a, n in enumerate(self.shape))
            bufs.box[inner] = field
            field = bufs.box
        for f in self.stages[0]:
            bufs.send_views[0][f.key][...] = field[f.send]

    def post(self, bufs: _Buffers, stage: int = 0) -> _Buffers:
        """Post the exchange of ``stage`` from the (already packed) send buffer of ``bufs``. Collective."""
        if not self.stages[stage]:
            bufs.exchange, bufs.busy = None, True
            self._in_flight.append(bufs)
            return bufs
        how = self._staging()
        engine = self.grid.halo
        if how == "host":
            host_send, _, host_views, _ = bufs.host_mirrors(self)[stage]
            bufs.send[stage].get(out=host_send)
            bufs.exchange = (how, engine.start(host_views))
        else:
            bufs.exchange = (how, engine.start(bufs.send_views[stage]))
        if not bufs.busy:
            bufs.busy = True
            self._in_flight.append(bufs)
        return bufs

    def wait(self, bufs: _Buffers, stage: int = 0) -> dict:
        """Wait for the exchange of ``stage`` and land its faces in the ghost buffer; returns the ghost views."""
        if bufs.exchange is not None:
            how, ex = bufs.exchange
            bufs.exchange = None
            if how == "host":
                _, host_ghost, _, host_views = bufs.host_mirrors(self)[stage]
                ex.finish(host_views)
                bufs.ghost[stage].set(host_ghost)
            else:
                ex.finish(bufs.ghost_views[stage])
        return bufs.ghost_views[stage]

    def receive_in_place(self, bufs: _Buffers):
        """Finish the exchange of ``bufs`` in place (a device engine whose ``receives_in_place()`` holds, one stage):
        the device waits are enqueued, nothing is copied into the ghost buffer; returns (the engine's exchange, whose
        ``release()`` the caller enqueues after the last kernel that reads the faces, {(mu, side): device address of
        the face in the engine's receive buffer}) (docs/halo-protocol.md "In-place receive")."""
        if not bufs.busy or bufs.exchange is None or bufs.exchange[0] != "device" or self.padded:
            raise CommsError("stencil: receive_in_place() needs a device exchange of an unpadded stencil in flight")
        ex = bufs.exchange[1]
        bufs.exchange = None
        try:
            where = ex.finish_in_place()
        finally:
            bufs.busy = False
            self._in_flight.remove(bufs)
        return ex, where

    def complete(self, bufs: _Buffers | None = None):
        """Finish the exchange of ``bufs`` (default: the oldest in flight): the ghosts {(mu, side): face} (side 0
        from the backward neighbour, 1 from the forward one), or for a padded stencil the box with every stage's
        ghosts in place (the later stages exchanged here). Collective."""
        if bufs is None:
            if not self._in_flight:
                raise CommsError("stencil: complete() without a begin() in flight")
            bufs = self._in_flight[0]
        if not bufs.busy:
            raise CommsError("stencil: complete() of an exchange that is not in flight")
        try:
            ghosts = self.wait(bufs, 0)
            if not self.padded:
                return ghosts
            for stage, faces in enumerate(self.stages):
                if stage:
                    for f in faces:
                        bufs.send_views[stage][f.key][...] = bufs.box[f.send]
                    self.post(bufs, stage)
                    ghosts = self.wait(bufs, stage)
                for f in faces:
                    bufs.box[f.land] = ghosts[f.recv_key]
            return bufs.box
        finally:
            bufs.box = None
            bufs.busy = False
            self._in_flight.remove(bufs)
