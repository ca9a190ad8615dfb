"""Which kind of memory the GPU halo segments are allocated with: the collective decision (pure functions).

Kinds, best first (docs/halo-protocol.md "Choosing a transport"; issue 6):

* ``fabric``: a VMM allocation (cuMemCreate) exported with CU_MEM_HANDLE_TYPE_FABRIC (multi-node NVLink; needs an
  IMEX channel, else cuMemCreate answers CUDA_ERROR_NOT_PERMITTED);
* ``posix_fd``: a VMM allocation exported as a POSIX file descriptor, passed to the ranks of the node over a Unix
  socket (SCM_RIGHTS; comms/cuda/vmm.py FdBroker);
* ``legacy``: legacy CUDA IPC, cuMemAlloc + cuIpcGetMemHandle / cuIpcOpenMemHandle (comms/cuda/ipc.py), used where
  VMM is missing (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 0), where a POSIX file descriptor cannot
  be exported, or when asked for with ``HMC_P2P_ALLOC=legacy``.

``HMC_P2P_ALLOC`` = ``auto`` (default: the best kind every rank of the node can use), ``vmm`` (VMM or a one-line
error saying why not: an explicit request is never silently substituted) or ``legacy``. Every rank must ask for the
same; the kind is the same on all ranks of a node (each rank states its facts, all ranks of the node gather them and
apply :func:`resolve` to the same list). Nothing here touches CUDA: the CPU tests (tests/comms/test_alloc_policy.py)
cover every branch. The engine's use of it (GpuHaloEngine._choose_alloc, comms/cuda/transports.py) has run on the CPU
against a stand-in driver only, not yet on a GPU (written in a session without device time).
"""
from __future__ import annotations

from ..base import CommsError

REQUESTS = ("auto", "vmm", "legacy")
KINDS = ("fabric", "posix_fd", "legacy")
VMM_ATTRIBUTE = "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED"
LEGACY_TEXT = "legacy CUDA IPC buffers (cuMemAlloc + cuIpcGetMemHandle / cuIpcOpenMemHandle)"


def read_request(text) -> str:
    """The allocation request from ``HMC_P2P_ALLOC`` (None or empty: ``auto``); a one-line CommsError otherwise."""
    req = (text or "").strip().lower() or "auto"
    if req not in REQUESTS:
        raise CommsError(f"HMC_P2P_ALLOC={text!r}: use auto, vmm or legacy")
    return req


def agree(texts: list) -> str:
    """The common request of all ranks from their ``HMC_P2P_ALLOC`` texts (one per rank, in rank order: every rank
    passes the same gathered list, so every rank returns the same or raises the same one-line CommsError)."""
    reqs = []
    for rank, text in enumerate(texts):
        try:
            reqs.append(read_request(text))
        except CommsError as e:
            raise CommsError(f"rank {rank}: {e}") from None
    kinds = sorted(set(reqs))
    if len(kinds) > 1:
        first = {k: reqs.index(k) for k in kinds}
        raise CommsError("ranks disagree on HMC_P2P_ALLOC (" + ", ".join(f"{k} on rank {first[k]}" for k in kinds)
                         + "): every rank must ask for the same")
    return kinds[0] if kinds else "auto"


def rank_facts(vmm: int, fabric: bool = False, fabric_note: str | None = None, posix_error: str | None = None) -> dict:
    """One rank's facts for :func:`resolve`: ``vmm`` the device attribute VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
    ``fabric`` whether cuMemCreate accepted a fabric handle, ``fabric_note`` the line saying so (or why not);
    ``posix_error`` None when a VMM allocation could be exported as a POSIX file descriptor, else the failing call and
    its error (``"untested"`` where the rank did not try)."""
    return {"vmm": int(vmm), "fabric": bool(fabric), "fabric_note": fabric_note, "posix_error": posix_error}


def _ranks(idx: list) -> str:
    return f"node rank{'s' if len(idx) > 1 else ''} {', '.join(str(i) for i in idx)}"


def resolve(request: str, facts: list) -> tuple:
    """(kind, notices) for the ranks of one node: ``facts`` holds every node rank's :func:`rank_facts`, in node-rank
    order, identical on every rank, so every rank reaches the same kind. Raises a one-line CommsError when
    ``request`` is ``vmm`` and some rank cannot provide VMM buffers.

    Rules: ``legacy`` is taken as asked. Otherwise VMM needs the attribute on every rank, else ``legacy`` (``auto``)
    or an error (``vmm``). With VMM: ``fabric`` when every rank could create a fabric allocation, else ``posix_fd``
    when every rank could export a file descriptor, else ``legacy`` (``auto``) or an error (``vmm``)."""
    if request not in REQUESTS:
        raise CommsError(f"allocation request {request!r}: use auto, vmm or legacy")
    if request == "legacy":
        return "legacy", [f"comms: {LEGACY_TEXT}, as asked (HMC_P2P_ALLOC=legacy)"]
    if not facts:
        raise CommsError("no node ranks to decide the allocation kind for")
    no_vmm = [i for i, f in enumerate(facts) if not f["vmm"]]
    if no_vmm:
        why = f"{VMM_ATTRIBUTE} is 0 on {_ranks(no_vmm)}"
        if request == "vmm":
            raise CommsError(f"HMC_P2P_ALLOC=vmm, but {why}: use HMC_P2P_ALLOC=auto or legacy")
        return "legacy", [f"comms: no VMM ({why}): {LEGACY_TEXT}"]
    if all(f["fabric"] for f in facts):
        return "fabric", [n for n in (facts[0]["fabric_note"],) if n]
    if any(f["fabric"] for f in facts):
        notes = ["comms: ranks disagree on fabric handles: POSIX file descriptors for all"]
    else:
        notes = [n for n in (facts[0]["fabric_note"],) if n]
    bad = [i for i, f in enumerate(facts) if f["posix_error"]]
    if not bad:
        return "posix_fd", notes
    why = f"POSIX file-descriptor export failed on {_ranks(bad)} ({facts[bad[0]]['posix_error']})"
    if request == "vmm":
        raise CommsError(f"HMC_P2P_ALLOC=vmm, but {why} and fabric handles are unavailable: use "
                         "HMC_P2P_ALLOC=auto or legacy")
    return "legacy", notes + [f"comms: {why}: {LEGACY_TEXT}"]


def after_fabric_import_failure(facts: list) -> tuple:
    """(kind, notice) when fabric handles were created but a peer could not import one (no shared IMEX channel):
    ``posix_fd`` if every node rank could export a file descriptor, else ``legacy``."""
    bad = [i for i, f in enumerate(facts) if f["posix_error"]]
    if not bad:
        return "posix_fd", "falling back to POSIX file descriptors over a Unix socket"
    return "legacy", (f"POSIX file-descriptor export failed on {_ranks(bad)} ({facts[bad[0]]['posix_error']}): "
                      f"falling back to {LEGACY_TEXT}")
