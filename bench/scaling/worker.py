"""One configuration of a strong-scaling study (``hmc scaling``), run on every rank by the launcher.

    mpiexec -n N python -m bench.scaling.worker --spec '{"lattice": [8, 8, 8, 8], ...}' --out result.json

The driver (:mod:`bench.scaling.run`) starts one of these per (lattice, rank count, transport); rank 0 writes one JSON
file with everything measured (or the error), which the driver stores in the study's HDF5 file.

Measured per operation (``spec["what"]``):

* ``halo``: one full halo exchange of a colour-vector field (complex128 3-vectors, 48 B a site), depth 3 (the HISQ
  Naik term; less where the local extent is smaller), over every partitioned dimension, both directions, as
  ``Geometry.halo`` does it; the received slabs are checked against the global field. Plus, with
  ``halo_sizes``, the latency sweep of ``bench.halo.bench_halo`` (ring of the ranks along t, faces of L^3 sites):
  one-way and round-trip time and host time against the message size.
* ``dslash``: one parity of the HISQ dslash (16 hops, ``StaggeredDslash.hop``), as ``hmc bench dslash``.
* ``cg``: CG on the even-odd normal operator A = 4m^2 - D_eo D_oe with a fixed iteration count (tol 1e-30): the
  time per iteration, the solve's set-up amortized over the iterations.
* ``trajectory``: one pure-gauge HMC trajectory (one-loop Symanzik, Omelyan, ``traj_steps`` steps), the cost of
  the gauge part of an HMC update.
* ``rhmc``: one short HISQ 2+1+1 RHMC trajectory (:func:`rhmc_deck`: the production masses 0.013 / 0.065 / 0.838
  with the project's rational functions runs/rationals/rationals.hisq211_b580, Symanzik beta 5.8 u0 0.85535 with
  the HISQ quark loops, 3G1F with ``traj_steps`` steps of a short ``RHMC_TAU``), built by the deck machinery
  (hmc.deck.loads, hmc.assemble.make_monomials / make_schedule, as ``hmc run``) from a random near-unit start,
  Metropolis off. One trajectory per timed loop (``reps`` 1: a trajectory is long); its phase split is the
  trajectory's own timers (``RHMC_PHASES``), not the halo wrappers below.

Times: ``repeats`` loops of ``reps`` operations (``reps`` chosen on rank 0 so that a loop lasts about ``min_time``
seconds), each loop's time being the slowest rank's; the driver reports the median and the spread over loops.

Where the time goes: one more loop runs with timers around the halo engine and the reductions (the classes are
wrapped in this process only, nothing else changes):

* ``halo_start``: ``HaloEngine.start``: faces copied into the send buffers (mpi) or straight into the peer's
  shared receive buffer (shm: this copy *is* the transfer), MPI requests posted, signals stored;
* ``halo_wait``: waiting for a peer (its signal or the MPI completion; also the shm credit before a send);
* ``halo_finish``: the exchanges' ``finish`` without their waits: faces copied out, credits returned (and, for
  mpi, the first completion tests);
* ``local_shift``: the rest of ``Geometry.shift``/``Geometry.halo`` (the local roll and slab views) on every
  dimension, partitioned or not;
* ``reductions``: ``Geometry.sum`` (the local part and the collective);
* ``compute``: everything else (the matrix-vector arithmetic, gathers, linear algebra).

They are exclusive times per operation on each rank (per rank in the results); their sum is the instrumented
loop's time. On the CPU there is no overlap of interior and exterior work (shifts are blocking), so the interior /
exterior split of a GPU dslash has no counterpart here.

On the GPU (cupy backend, the hop a CUDA kernel: :func:`gpu_device_path`) the operations go through
:mod:`solvers.staggered_dist_cuda` instead: ``dslash`` is ``DslashRunner`` (the full D, two hops, on its own stream;
time per hop), ``cg`` is the production CG (device-resident iterations from CUDA graphs where every link is
stream_gated, solvers/krylov_graph.py; time per iteration of whole solves of ``cg_iters`` iterations from x = 0), ``halo`` is the distributed hop's face exchange (pack,
transport, ghost buffer), each timed with device events around the loop (host wall beside it). With
``spec["graph"]`` the dslash and CG iteration are captured in CUDA graphs and replayed (stream_gated). The phase
split (``GPU_PHASES``, :meth:`Context.phases_device`): device events of ``PhaseProfile`` around the hop's phases
(pack, post, interior, wait, exterior; the 1-rank kernel is all interior), the CG's device time outside the hops
(reductions), the graph replay's device time (graph rows), and host overhead: the rest of the wall time.

Answers (compared by the driver with the 1-rank run): SHA-256 of the gathered dslash output (bitwise), of the CG
solution after the fixed iteration count with exact reductions (bitwise for any decomposition), the norm of the
fast-reduction CG residual (to rounding), the halo check, and for the trajectory the final H and plaquette (to
rounding: the link updates are not bitwise across decompositions) with the gathered links' hash for information;
for the RHMC trajectory dH, the final H and the plaquette (to rounding) and the multishift CG iteration count
(equal; on the GPU to a few iterations, as tests/hmc/test_gpu_hmc_dist.py allows).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

from .ops import _links, gpu_device_path, op_cg, op_cg_gpu, op_dslash, op_dslash_gpu, op_halo, op_halo_gpu, \
    op_rhmc, op_trajectory
from .worker_context import Context, InjectedFault


# ------------------------------------------------------------------------------------------------------------

def _gpu_info(backend) -> dict:
    if not backend.is_gpu:
        return {}
    cp = backend.xp
    try:
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return {"gpu": name, "gpu_count": cp.cuda.runtime.getDeviceCount(),
                "driver": cp.cuda.runtime.driverGetVersion(), "runtime": cp.cuda.runtime.runtimeGetVersion()}
    except Exception as e:  # noqa: BLE001 - metadata only
        return {"gpu": f"unknown ({e})"}


def _mpi_library() -> str:
    from comms.grid import launched_size

    if launched_size() <= 1:
        return ""
    from comms.grid import mpi

    return mpi().Get_library_version().strip().splitlines()[0]


def _fault(spec, config):
    """Testing hook: HMC_FAULT_INJECT=scaling_fail:KEY or scaling_hang:KEY (the configuration's ``fault_inject``)
    fails or hangs the configuration whose key contains KEY."""
    text = config.fault_inject
    kind, _, key = text.partition(":")
    if kind in ("scaling_fail", "scaling_hang") and key and key in spec["key"]:
        if kind == "scaling_hang":
            time.sleep(3600)
        raise InjectedFault(f"injected fault (HMC_FAULT_INJECT={text})")


def run(spec, config=None) -> dict:
    """Every operation of ``spec["what"]`` on the configuration's lattice and grid, with the driver's run
    configuration ``config`` (rebuilt in this process from its ``RunConfig.to_env()``; default: from the
    environment now)."""
    from comms import ProcessGrid, world
    from comms.config import RunConfig
    from lattice import Geometry, get_backend

    config = config if config is not None else RunConfig.from_environment()
    t_start = time.perf_counter()
    comm = world()
    _fault(spec, config)
    backend = get_backend(spec.get("backend") or "numpy", config)
    n = comm.size
    if n != spec["ranks"]:
        raise RuntimeError(f"launched on {n} rank(s), the configuration wants {spec['ranks']}: check the launcher "
                           "(--launcher / HMC_MPIEXEC) passes the rank count")
    transport = None if spec["transport"] == "serial" else spec["transport"]
    grid = ProcessGrid(tuple(spec["grid"]), transport=transport, config=config)
    geom = Geometry(tuple(spec["lattice"]), backend, grid=grid)
    ctx = Context(spec, geom)
    res = _metadata(ctx, backend, grid, config)
    what = spec["what"]
    graph = bool(spec.get("graph"))
    d, why = _gpu_dslash(ctx, res, backend, what)
    if graph and why is not None and {"dslash", "cg"} & set(what):
        raise RuntimeError(f"--graph: {why}")
    if "halo" in what:
        if graph:
            res["ops"]["halo"] = {"status": "n/a", "note": "graph rows time the dslash and CG (the halo is the "
                                  "uncaptured row's)"}
        elif why is None:
            op_halo_gpu(ctx, res, d)
        else:
            op_halo(ctx, res)
    if "dslash" in what or "cg" in what:
        _dslash_and_cg(ctx, res, d, why, what, graph)
    if "trajectory" in what:
        op_trajectory(ctx, res)
    if "rhmc" in what:
        if graph:
            res["ops"]["rhmc"] = {"status": "n/a", "note": "graph rows time the dslash and CG (the RHMC trajectory "
                                  "is the uncaptured row's)"}
        else:
            op_rhmc(ctx, res)
    grid.close()
    res["wall_s"] = time.perf_counter() - t_start
    return res


def _metadata(ctx, backend, grid, config) -> dict:
    """The result's head: backend, grid, host, MPI library, MPS client, GPU, and (rank 0) the transport table."""
    from comms.halo import format_table

    geom = ctx.geom
    res = {"status": "ok", "ops": {}, "answers": {}, "backend": backend.name, "grid": list(grid.dims),
           "local_dims": list(geom.local_dims), "hostname": platform.node(), "mpi_library": _mpi_library(),
           "mps_client": config.launch.mps_pipe_directory}
    res.update(_gpu_info(backend))
    table = grid.transport_table()
    if ctx.rank == 0:
        res["transport_table"] = table
        res["transport_table_text"] = format_table(table, grid.describe()) if table else ""
        res["links"] = "+".join(sorted({r["transport"] for r in table})) or "none"
    return res


def _gpu_dslash(ctx, res, backend, what):
    """(the dslash, None) when the GPU device path serves the halo, dslash or CG operations, else (None or the
    dslash, why not); records the hop implementation and the phase clock."""
    d, why = None, "not a GPU run"
    if backend.is_gpu and {"halo", "dslash", "cg"} & set(what):
        from solvers import StaggeredDslash

        fat, long = _links(ctx)
        d = StaggeredDslash(ctx.geom, fat, long)
        why = gpu_device_path(d)
        res["dslash_impl"] = type(d._hop_impl).__name__ if why is None else f"array body ({why})"
        res["phase_clock"] = "device events" if why is None else "host perf_counter"
    else:
        res["phase_clock"] = "host perf_counter"
    return d, why


def _dslash_and_cg(ctx, res, d, why, what, graph):
    """The dslash and CG operations: on the GPU device path (falling back to the host-driven one after an error
    when not graph-captured), else host-driven."""
    from solvers import StaggeredDslash

    geom = ctx.geom
    if d is None:
        fat, long = _links(ctx)
        d = StaggeredDslash(geom, fat, long)
    for op, on_gpu, on_host in (("dslash", op_dslash_gpu, op_dslash), ("cg", op_cg_gpu, op_cg)):
        if op not in what:
            continue
        if why is not None:
            on_host(ctx, res, d)
            continue
        try:
            on_gpu(ctx, res, d)
        except Exception as e:  # noqa: BLE001 - an uncaptured row falls back to the host-driven path, noted
            # (a rank that fails alone leaves its peers waiting in an exchange until HMC_COMMS_TIMEOUT, then
            # they fail and fall back too; wrong halos after that would show in the answers check)
            if graph:
                raise
            res.setdefault("gpu_path_error", {})[op] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            res["dslash_impl"] = f"{res.get('dslash_impl', '')}; {op}: host-driven path after an error"
            on_host(ctx, res, d)
    if why is None:
        from bench.dslash_dist_cuda import close_graph_mode

        close_graph_mode(geom)


def _write(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scaling.worker")
    ap.add_argument("--spec", required=True, help="the configuration, JSON")
    ap.add_argument("--out", required=True, help="result file (JSON), written by rank 0")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec)
    from comms import launched_size
    from comms.config import RunConfig, launcher

    config = None
    try:
        config = RunConfig.from_environment()       # the driver's configuration (bench.scaling.launch.worker_env)
        res = run(spec, config)
    except BaseException as e:  # noqa: BLE001 - report any failure, then leave without MPI_Finalize
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        rank = launcher().rank                      # not MPI's: MPI may be what failed
        print(f"hmc scaling worker: rank {rank}: {type(e).__name__}: {msg}", file=sys.stderr, flush=True)
        if config is not None and config.scaling_traceback:
            traceback.print_exc()
        if rank == 0:
            _write(args.out, {"status": "failed", "error": f"{type(e).__name__}: {msg}"})
        sys.stdout.flush()
        os._exit(3)
    if res is not None and (launched_size() <= 1 or _rank0()):
        _write(args.out, res)
    return 0


def _rank0() -> bool:
    from comms import world

    return world().rank == 0


if __name__ == "__main__":
    sys.exit(main())
