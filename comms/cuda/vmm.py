"""CUDA VMM buffers for peer access, the file-descriptor broker, and the registry of mappings (docs/halo-protocol.md).

* :class:`Allocation`: this rank's memory (cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess),
  exportable with a fabric handle (CU_MEM_HANDLE_TYPE_FABRIC) or a POSIX file descriptor.
* :func:`choose_handle_type`: tries the fabric handle first; where cuMemCreate answers NOT_PERMITTED (no IMEX
  channel) or NOT_SUPPORTED it falls back to POSIX file descriptors and says why in one line (``notices``).
* :class:`FdBroker`: passes exported descriptors between the ranks of a node over Unix sockets (SCM_RIGHTS,
  ``socket.send_fds``/``recv_fds``) that live in a directory only the user can enter (``mkdtemp``, mode 0700); both
  ends check the other's credentials (SO_PEERCRED: same user, and the process id that rank announced).
* :class:`PeerMapping`: a peer's allocation imported (cuMemImportFromShareableHandle) and mapped here.
* :func:`posix_fd_export_error`: whether a VMM allocation can be exported as a POSIX file descriptor here (the
  engine falls back to legacy CUDA IPC, comms/cuda/ipc.py, where it cannot; the decision is comms/cuda/alloc.py's).

Every allocation and mapping is entered in ``REGISTRY`` under its owner (a halo engine) and removed when freed;
:func:`leaked` lists what is left, the teardown check. The legacy CUDA IPC allocations and mappings of
comms/cuda/ipc.py and the interprocess events of the event transport are entered in the same registry.
"""
from __future__ import annotations

import os
import socket
import stat
import struct
import tempfile
import time

from cuda.bindings import driver as drv

from ..base import CommsError, CommsTimeout
from .cu import UNREACHABLE, CudaError, call, try_call

POSIX_FD = drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
FABRIC = drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC
HANDLE_NAMES = {int(POSIX_FD): "posix_fd", int(FABRIC): "fabric"}

REGISTRY: dict = {}              # key -> (owner, description)
_SEQ = [0]


def _register(owner, text) -> str:
    _SEQ[0] += 1
    key = f"vmm{_SEQ[0]}"
    REGISTRY[key] = (owner, text)
    return key


def leaked(owner=None) -> list:
    """Descriptions of the allocations, mappings and events still registered (of ``owner``, or all)."""
    return sorted(t for o, t in REGISTRY.values() if owner is None or o == owner)


def register(owner, text) -> str:
    """Enter something else that teardown must release (IPC events): returns the key for :func:`unregister`."""
    return _register(owner, text)


def unregister(key):
    REGISTRY.pop(key, None)


def _prop(ordinal: int, handle_type):
    p = drv.CUmemAllocationProp()
    p.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.location.id = int(ordinal)
    p.requestedHandleTypes = handle_type
    return p


def _access(ordinal: int):
    d = drv.CUmemAccessDesc()
    d.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    d.location.id = int(ordinal)
    d.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return d


def granularity(ordinal: int, handle_type=POSIX_FD) -> int:
    g = call(drv.cuMemGetAllocationGranularity, _prop(ordinal, handle_type),
             drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return max(int(g), 1 << 21)


def round_up(n: int, g: int) -> int:
    return (int(n) + g - 1) // g * g


def _map(handle, size: int, ordinal: int):
    """Reserve a virtual range, map ``handle`` there and allow read/write from ``ordinal``: the address (int)."""
    ptr = call(drv.cuMemAddressReserve, size, 0, 0, 0)
    try:
        call(drv.cuMemMap, ptr, size, 0, handle, 0)
    except CudaError:
        try_call(drv.cuMemAddressFree, ptr, size)
        raise
    try:
        call(drv.cuMemSetAccess, ptr, size, [_access(ordinal)], 1)
    except CudaError:
        try_call(drv.cuMemUnmap, ptr, size)
        try_call(drv.cuMemAddressFree, ptr, size)
        raise
    return int(ptr)


class Allocation:
    """This rank's exportable device memory (``size`` rounded up to the granularity)."""

    def __init__(self, size: int, ordinal: int, handle_type=POSIX_FD, owner=None, what: str = "buffer"):
        self.ordinal = ordinal
        self.handle_type = handle_type
        self.size = round_up(size, granularity(ordinal, handle_type))
        self.handle = call(drv.cuMemCreate, self.size, _prop(ordinal, handle_type), 0)
        try:
            self.ptr = _map(self.handle, self.size, ordinal)
        except CudaError:
            try_call(drv.cuMemRelease, self.handle)
            raise
        self.key = _register(owner, f"{what}: own VMM allocation {self.size} B at {self.ptr:#x} "
                                    f"({HANDLE_NAMES.get(int(handle_type), handle_type)})")

    def export(self):
        """A new shareable handle: an int file descriptor (the caller closes it) or the fabric handle's bytes."""
        h = call(drv.cuMemExportToShareableHandle, self.handle, self.handle_type, 0)
        if int(self.handle_type) == int(FABRIC):
            return bytes(h.data)
        return int(h)

    def free(self):
        if self.handle is None:
            return
        try_call(drv.cuMemUnmap, self.ptr, self.size)
        try_call(drv.cuMemAddressFree, self.ptr, self.size)
        try_call(drv.cuMemRelease, self.handle)
        self.handle = None
        REGISTRY.pop(self.key, None)


class PeerMapping:
    """A peer's allocation, imported from its shareable handle and mapped into this process."""

    def __init__(self, shareable, handle_type, size: int, ordinal: int, owner=None, what: str = "peer buffer"):
        self.size = int(size)
        if int(handle_type) == int(FABRIC):
            fh = drv.CUmemFabricHandle()
            fh.data = bytes(shareable)
            os_handle = fh.getPtr()
            self._keep = fh
        else:
            os_handle = int(shareable)
        self.handle = call(drv.cuMemImportFromShareableHandle, os_handle, handle_type)
        try:
            self.ptr = _map(self.handle, self.size, ordinal)
        except CudaError:
            try_call(drv.cuMemRelease, self.handle)
            raise
        self.key = _register(owner, f"{what}: mapping of {self.size} B at {self.ptr:#x}")

    def free(self):
        if self.handle is None:
            return
        try_call(drv.cuMemUnmap, self.ptr, self.size)
        try_call(drv.cuMemAddressFree, self.ptr, self.size)
        try_call(drv.cuMemRelease, self.handle)
        self.handle = None
        REGISTRY.pop(self.key, None)


def try_import(shareable, handle_type, size, ordinal, owner=None, what="probe"):
    """(PeerMapping, None) or (None, reason) when the import fails with an 'unreachable' code; other errors raise."""
    try:
        return PeerMapping(shareable, handle_type, size, ordinal, owner, what), None
    except CudaError as e:
        if e.code in UNREACHABLE:
            return None, f"{e.call}: {e.name}"
        raise


_HANDLE_CHOICE: dict = {}


def choose_handle_type(ordinal: int, allow_fabric: bool = True):
    """(handle type, notice): fabric when cuMemCreate accepts it, else POSIX file descriptors with the reason."""
    if ordinal in _HANDLE_CHOICE:
        return _HANDLE_CHOICE[ordinal]
    notice = None
    if not allow_fabric:
        choice = (POSIX_FD, "comms: VMM fabric handles not tried (HMC_P2P_FABRIC=0): POSIX file descriptors")
    else:
        err, g = try_call(drv.cuMemGetAllocationGranularity, _prop(ordinal, FABRIC),
                          drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        if err is None:
            err, h = try_call(drv.cuMemCreate, max(int(g), 1 << 21), _prop(ordinal, FABRIC), 0)
            if err is None:
                try_call(drv.cuMemRelease, h)
        if err is None:
            choice = (FABRIC, "comms: VMM buffers with fabric handles (CU_MEM_HANDLE_TYPE_FABRIC)")
        else:
            why = {"CUDA_ERROR_NOT_PERMITTED": "no IMEX channel", "CUDA_ERROR_NOT_SUPPORTED": "not supported here"}
            name = getattr(err, "name", str(err))
            notice = (f"comms: fabric handle unavailable (cuMemCreate with CU_MEM_HANDLE_TYPE_FABRIC: {name}"
                      f"{', ' + why[name] if name in why else ''}); falling back to POSIX file descriptors "
                      "over a Unix socket")
            choice = (POSIX_FD, notice)
    _HANDLE_CHOICE[ordinal] = choice
    return choice


_POSIX_CHECK: dict = {}


def posix_fd_export_error(ordinal: int):
    """None when a small VMM allocation with a POSIX file-descriptor handle can be created and exported here, else
    the failing call and the driver's error in a few words (cached per device)."""
    if ordinal in _POSIX_CHECK:
        return _POSIX_CHECK[ordinal]
    why = None
    err, g = try_call(drv.cuMemGetAllocationGranularity, _prop(ordinal, POSIX_FD),
                      drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    if err is not None:
        why = f"cuMemGetAllocationGranularity: {getattr(err, 'name', err)}"
    else:
        err, h = try_call(drv.cuMemCreate, max(int(g), 1 << 21), _prop(ordinal, POSIX_FD), 0)
        if err is not None:
            why = f"cuMemCreate: {getattr(err, 'name', err)}"
        else:
            err, fd = try_call(drv.cuMemExportToShareableHandle, h, POSIX_FD, 0)
            if err is not None:
                why = f"cuMemExportToShareableHandle: {getattr(err, 'name', err)}"
            else:
                try:
                    os.close(int(fd))
                except OSError:
                    pass
            try_call(drv.cuMemRelease, h)
    _POSIX_CHECK[ordinal] = why
    return why


# --------------------------------------------------------------------------------------------------------------
# file descriptors between the ranks of a node

_CRED = struct.Struct("3i")
_HDR = struct.Struct("!iI")          # node rank, payload length


def _peer_cred(sock):
    pid, uid, gid = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return pid, uid, gid


def _recv_exact(sock, n, first=b""):
    data = bytearray(first)
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise CommsError("fd broker: peer closed the socket early")
        data += chunk
    return bytes(data)


class FdBroker:
    """Unix-socket rendezvous of the ranks of one node communicator (collective constructor and methods)."""

    def __init__(self, node, timeout: float, world_rank: int = 0):
        self.node = node
        self.timeout = timeout
        self.world_rank = world_rank
        self.dir = None
        err = None
        if node.rank == 0:
            try:
                base = tempfile.gettempdir()
                if len(base) > 60:
                    base = "/tmp"
                self.dir = tempfile.mkdtemp(prefix="hmc-fd-", dir=base)      # mode 0700, owned by us
            except OSError as e:
                err = f"fd broker: cannot create a private socket directory: {e}"
        self.dir, err = node.bcast((self.dir, err), root=0)
        if err:
            raise CommsError(err)
        st = os.stat(self.dir)
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise CommsError(f"fd broker: socket directory {self.dir} is not private to user {os.getuid()} "
                             f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
        self.pids = node.allgather(os.getpid())
        self.path = os.path.join(self.dir, f"{node.rank}.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(max(16, 4 * node.size))
        self.srv.settimeout(timeout)
        node.Barrier()

    def _check(self, sock, expect_rank=None):
        pid, uid, _ = _peer_cred(sock)
        if uid != os.getuid():
            raise CommsError(f"fd broker: rank {self.world_rank}: peer process {pid} belongs to user {uid}, not "
                             f"{os.getuid()}: refused")
        if pid not in self.pids:
            raise CommsError(f"fd broker: rank {self.world_rank}: peer process {pid} is not a rank of this node "
                             f"(pids {self.pids}): refused")
        r = self.pids.index(pid)
        if expect_rank is not None and r != expect_rank:
            raise CommsError(f"fd broker: rank {self.world_rank}: expected node rank {expect_rank} (pid "
                             f"{self.pids[expect_rank]}), connected to pid {pid}: refused")
        return r

    def exchange(self, wants: dict, provide) -> dict:
        """Collective over the node: ``wants`` maps node ranks to a request string; each of them answers with
        ``provide(requester node rank, request) -> (payload bytes, [fds])``, sent over its socket. Returns
        {node rank: (payload, [received fds])}; the caller closes the received fds. A request to this rank itself
        is answered by ``provide`` directly (its fds are returned as they are)."""
        me = self.node.rank
        everyone = self.node.allgather({int(k): str(v) for k, v in wants.items()})
        got = {}
        clients = []
        deadline = time.monotonic() + self.timeout
        for peer, req in sorted(wants.items()):
            if peer == me:
                got[peer] = provide(me, req)
                continue
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.timeout)
            while True:
                try:
                    s.connect(os.path.join(self.dir, f"{peer}.sock"))
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if time.monotonic() > deadline:
                        raise CommsTimeout(f"fd broker: rank {self.world_rank} cannot connect to node rank {peer}")
                    time.sleep(0.01)
            self._check(s, peer)
            body = req.encode()
            s.sendall(_HDR.pack(me, len(body)) + body)
            clients.append((peer, s))
        # serve every rank that asked this one
        askers = [r for r, w in enumerate(everyone) if r != me and me in w]
        try:
            for _ in askers:
                conn, _ = self.srv.accept()
                with conn:
                    conn.settimeout(self.timeout)
                    r = self._check(conn)
                    rank, n = _HDR.unpack(_recv_exact(conn, _HDR.size))
                    if rank != r:
                        raise CommsError(f"fd broker: pid {self.pids[r]} claims node rank {rank}: refused")
                    req = _recv_exact(conn, n).decode()
                    payload, fds = provide(r, req)
                    try:
                        socket.send_fds(conn, [_HDR.pack(me, len(payload)) + payload], list(fds))
                    finally:
                        for fd in fds:
                            os.close(fd)
        except socket.timeout:
            raise CommsTimeout(f"fd broker: rank {self.world_rank} waited {self.timeout:g} s for the node ranks "
                               f"{askers} to ask for their descriptors (HMC_COMMS_TIMEOUT)") from None
        for peer, s in clients:
            with s:
                try:
                    msg, fds, _, _ = socket.recv_fds(s, 1 << 16, 64)
                except socket.timeout:
                    raise CommsTimeout(f"fd broker: rank {self.world_rank}: no descriptors from node rank {peer} "
                                       f"after {self.timeout:g} s") from None
                if len(msg) < _HDR.size:
                    msg = _recv_exact(s, _HDR.size, msg)
                rank, n = _HDR.unpack(msg[:_HDR.size])
                payload = _recv_exact(s, _HDR.size + n, msg)[_HDR.size:]
                got[peer] = (payload, list(fds))
        return got

    def close(self):
        if self.srv is None:
            return
        self.srv.close()
        self.srv = None
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self.node.Barrier()
        if self.node.rank == 0:
            try:
                os.rmdir(self.dir)
            except OSError:
                pass
