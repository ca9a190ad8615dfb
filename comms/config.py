"""The run configuration: every setting that used to be read from ``HMC_*`` environment variables, in one frozen
object built once by the entry point and passed down (docs/configuration.md).

Precedence, per setting, in :meth:`RunConfig.resolve` (the one constructor):

1. an explicit command-line value (``--backend``, ``--grid``, ``--transport``), then
2. an explicit deck value (a key the deck's TOML text states: ``[run] backend``, ``[lattice] grid``; a key the
   deck leaves out does not count, so its schema default never hides the environment), then
3. the environment (``HMC_BACKEND``, ``HMC_GRID``, ``HMC_P2P_TRANSPORT``, ... : the table :data:`SETTINGS`), then
4. the built-in default.

A bad value is refused with one line naming where it came from (the variable, the option or the deck key) and the
values allowed. The object is immutable; ``ProcessGrid(config=...)``, ``Geometry(config=...)`` and
``get_backend(name, config)`` take it, and everything below reads it from the grid or the geometry
(``geom.config``). Library callers and tests that pass none get ``RunConfig.from_environment()``: the environment as
it is at the call (built again only when the environment or the registered transports changed since the last call).

Why here: ``comms`` is the lowest package (lattice, solvers, force and hmc all import it, it imports none of
them), and the process grid and the halo engines are the first consumers; this module imports nothing of the
project but the transport registry (comms/transport/registry.py, which imports nothing), so every layer can import it.

This module is the only package module that touches ``os.environ``: :meth:`RunConfig.resolve` reads the settings,
:func:`launcher` reads what the MPI launcher announced (rank count, node-local rank; not settings), :func:`child_env`
copies the environment for a child process and :func:`set_mpi_defaults` sets an Open MPI default before MPI starts.
A child that must run with this configuration (an mpiexec worker) gets ``config.to_env()`` in its environment and
rebuilds the same configuration with the same constructor.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

from .transport import registry as _transports


class ConfigError(ValueError):
    """A setting with a value that is not allowed (one line: where it came from and the values allowed)."""


# --- parsers: text (environment) or a typed value (command line, deck, run file) -> value, or ValueError(allowed)

def _choice(*names):
    def parse(v):
        s = str(v).strip().lower()
        if s not in names:
            raise ValueError(f"use one of {', '.join(names)}")
        return s
    return parse


def _optional(parse):
    def opt(v):
        return None if v is None or (isinstance(v, str) and not v.strip()) else parse(v)
    return opt


def _int_in(lo, hi, allowed):
    def parse(v):
        try:
            n = int(str(v).strip(), 0) if isinstance(v, str) else int(v)
        except ValueError:
            raise ValueError(allowed) from None
        if isinstance(v, float) or n < lo or (hi is not None and n > hi):
            raise ValueError(allowed)
        return n
    return parse


def _flag(off_only: bool):
    """A switch: the old rule of each variable is kept: ``off_only`` (default on): only "0" turns it off; else
    (default off) only "1" turns it on. Typed values: bools."""
    def parse(v):
        if isinstance(v, bool):
            return v
        s = str(v).strip()
        if s not in ("0", "1"):
            raise ValueError("use 1 (on) or 0 (off)")
        return s == "1"
    return parse


def _positive_seconds(v):
    try:
        t = float(v)
    except (TypeError, ValueError):
        raise ValueError("use a positive number of seconds") from None
    if not t > 0:
        raise ValueError("use a positive number of seconds")
    return t


def _grid(v):
    allowed = "use four positive integers PX PY PZ PT"
    try:
        vals = tuple(int(p) for p in (v.replace(",", " ").replace("x", " ").split() if isinstance(v, str) else v))
    except (TypeError, ValueError):
        raise ValueError(allowed) from None
    if len(vals) != 4 or any(p < 1 for p in vals):
        raise ValueError(allowed)
    return vals


def _partition(v):
    s = str(v).strip().lower()
    if s in ("", "none", "0"):
        return ""
    if not set(s) <= set("xyzt, "):
        raise ValueError("give the directions to partition as letters, e.g. 't' or 'zt'")
    return "".join(d for d in "xyzt" if d in s)


def _transport(v):
    s = str(v).strip().lower()
    if s in ("", "auto"):
        return None
    if s not in _transports.names():              # the registered transports (comms/transport/registry.py)
        raise ValueError(f"use one of {', '.join(_transports.names())} (or auto)")
    return s


def _fused(v):
    s = str(v).strip().lower()
    if s in ("0", "no", "off", "false"):
        return "off"
    if s in ("all", "strided"):
        return s
    if s in ("1", "yes", "on", "true", "parity", ""):
        return "on"
    raise ValueError("use 1 (on), 0 (off), all (every site) or strided (no parity-compact vectors)")


def _text(v):
    return str(v)


@dataclass(frozen=True)
class Setting:
    env: str                 # the environment variable
    parse: object            # text or typed value -> value; ValueError(the values allowed)
    default: object
    help: str
    deck: tuple = ()         # (section, key) of the deck that may state it
    cli: str = ""            # the command-line option that may state it


#: field name -> Setting, in the order of the RunConfig fields
SETTINGS = {
    "backend": Setting("HMC_BACKEND", _choice("numpy", "cupy", "auto"), "numpy", "array backend",
                       ("run", "backend"), "--backend"),
    "grid": Setting("HMC_GRID", _optional(_grid), None, "process grid PX PY PZ PT (None: from the rank count)",
                    ("lattice", "grid"), "--grid"),
    "partition": Setting("HMC_PARTITION", _partition, "", "one-rank dimensions forced onto the halo path"),
    "transport": Setting("HMC_P2P_TRANSPORT", _transport, None, "halo transport (None: the best every rank can use)",
                         (), "--transport"),
    "p2p_mask": Setting("HMC_P2P_MASK", _int_in(0, 15, "use an integer 0..15 (bits x=1, y=2, z=4, t=8)"), 0,
                        "dimensions kept off peer-to-peer links"),
    "p2p_fake_clique": Setting("HMC_P2P_FAKE_CLIQUE", _int_in(0, None, "use a non-negative integer (ranks per "
                                                                        "clique)"), 0,
                               "testing: ranks per pretended node (0: off)"),
    "comms_timeout": Setting("HMC_COMMS_TIMEOUT", _positive_seconds, 60.0, "seconds a halo wait may take"),
    "p2p_data": Setting("HMC_P2P_DATA", _choice("copy_engine", "remote_write"), "copy_engine",
                        "GPU data policy"),
    "p2p_force_flush": Setting("HMC_P2P_FORCE_FLUSH", _flag(False), False, "ask for FLUSH waits anyway"),
    "p2p_parallel_recv": Setting("HMC_P2P_PARALLEL_RECV", _flag(True), True,
                                 "stream_gated receive chains on their own streams"),
    "p2p_in_place": Setting("HMC_P2P_IN_PLACE", _flag(True), True,
                            "stream_gated: exterior kernels read received faces in the receive buffer"),
    "p2p_peer_sums": Setting("HMC_P2P_PEER_SUMS", _flag(True), True,
                             "device-resident solver rank sums in one step over all node peers"),
    "p2p_credit_free": Setting("HMC_P2P_CREDIT_FREE", _flag(True), True,
                               "stream_gated graph mode: senders skip the credit waits (implied by the order)"),
    "p2p_batch_signals": Setting("HMC_P2P_BATCH_SIGNALS", _flag(True), True,
                                 "stream_gated: every link's signal in one batch after every link's copy"),
    "p2p_alloc": Setting("HMC_P2P_ALLOC", _choice("auto", "vmm", "legacy"), "auto", "GPU halo segment allocation"),
    "p2p_fabric": Setting("HMC_P2P_FABRIC", _flag(True), True, "try fabric handles"),
    "cuda_device": Setting("HMC_CUDA_DEVICE", _optional(_int_in(0, None, "use a GPU ordinal >= 0")), None,
                           "this rank's GPU (None: node-local rank modulo the GPUs)"),
    "hisq_kernels": Setting("HMC_HISQ_KERNELS", _flag(True), True, "HISQ link and force CUDA kernels"),
    "hisq_staged": Setting("HMC_HISQ_STAGED", _flag(True), True,
                           "staged HISQ fat-link kernels (whole lattice on one GPU; needs hisq_kernels)"),
    "hisq_staged_vjp": Setting("HMC_HISQ_STAGED_VJP", _flag(True), True,
                               "staged all-direction HISQ fat-link chain rule (one GPU, whole lattice)"),
    "dslash_compress_long": Setting("HMC_DSLASH_COMPRESS_LONG", _flag(True), True,
                                    "GPU hop: Naik links stored as two rows and a factor where they are a multiple "
                                    "of U(3) (the third row rebuilt)"),
    "dslash_half_links": Setting("HMC_DSLASH_HALF_LINKS", _choice("off", "naik", "all"), "naik",
                                 "single-precision operators' links (naik: the Naik links only) rounded to 16 bits "
                                 "with a scale per link (the GPU hop stores them so)", ("fermions", "half_links")),
    "mg_kernels": Setting("HMC_MG_KERNELS", _flag(True), True, "multigrid CUDA kernels"),
    "mg_timing_sync": Setting("HMC_MG_TIMING_SYNC", _flag(True), True, "multigrid clocks synchronize the device"),
    "mg_graph": Setting("HMC_MG_GRAPH", _flag(True), True,
                        "multigrid: the deepest K-cycle GCR's steps as CUDA-graph replays (one GPU)"),
    "solver_fused": Setting("HMC_SOLVER_FUSED", _fused, "on", "fused solver linear algebra: on, off, all or strided"),
    "solver_sums": Setting("HMC_SOLVER_SUMS", _choice("fast", "exact"), "fast", "solver reductions"),
    "solver_graph": Setting("HMC_SOLVER_GRAPH", _int_in(0, None, "use a non-negative integer (0: host-driven)"), 8,
                            "GPU solver iterations per CUDA-graph replay (0: every iteration driven by the host)"),
    "solver_graph_capture": Setting("HMC_SOLVER_GRAPH_CAPTURE", _int_in(0, None, "use a non-negative integer (0: "
                                                                           "all of HMC_SOLVER_GRAPH)"), 0,
                                    "iterations a solver graph holds; each host check launches it HMC_SOLVER_GRAPH / "
                                    "this times (0, or not an even divisor: one graph of HMC_SOLVER_GRAPH)"),
    "solver_graph_while": Setting("HMC_SOLVER_GRAPH_WHILE", _int_in(0, None, "use a non-negative integer (0: "
                                                                       "host checks)"), 0,
                                  "one-rank GPU solves: the whole solve as one CUDA-graph launch, a while node whose "
                                  "body holds this many iterations (0: a host check every HMC_SOLVER_GRAPH)"),
    "solver_graph_log": Setting("HMC_SOLVER_GRAPH_LOG", _flag(False), False,
                                "one stderr line per solver CUDA-graph capture: the loop and what changed in its key"),
    "batched_hops": Setting("HMC_BATCHED_HOPS", _flag(True), True,
                            "batched hops over several fields (one pass over the links for up to 4 on one GPU): the "
                            "refinement's starting true residuals, the fermion force's outer-product hops"),
    "multishift_reliable": Setting("HMC_MULTISHIFT_RELIABLE", _flag(False), False,
                                   "mixed-precision multishift: x_i in double, reliable updates of the base system"),
    "checks_dir": Setting("HMC_CHECKS_DIR", _optional(_text), None, "hmc check references (None: the package's hmc/checks)"),
    "fault_inject": Setting("HMC_FAULT_INJECT", _text, "", "testing: a fault to inject, e.g. "
                                                            "kill_during_checkpoint:3"),
    # read by the benchmark and scaling harness (bench/)
    "mpiexec": Setting("HMC_MPIEXEC", _optional(_text), None, "the launcher command of hmc scaling"),
    "git_commit": Setting("HMC_GIT_COMMIT", _optional(_text), None, "the commit a copied tree was made from"),
    "scaling_traceback": Setting("HMC_SCALING_TRACEBACK", _flag(False), False, "scaling worker tracebacks"),
}

_LAUNCHER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")
# launchers' node-local rank variables (Open MPI, MPICH/Intel MPI, Slurm, MVAPICH)
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "MV2_COMM_WORLD_LOCAL_RANK")
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK")       # the world rank before MPI starts (Open MPI, MPICH/Hydra)


@dataclass(frozen=True)
class Launcher:
    """What the MPI launcher announced in the environment: rank count (1 without one), node-local rank (None),
    HMC_FORCE_MPI=1 (MPI even for one process), the world rank (0 without a launcher; readable where MPI may be
    broken, e.g. in an error report) and CUDA_MPS_PIPE_DIRECTORY (set when this process is a client of a CUDA MPS
    daemon; "" otherwise). Facts of the launch, not settings: never stored or passed on."""

    size: int = 1
    local_rank: int | None = None
    force_mpi: bool = False
    rank: int = 0
    mps_pipe_directory: str = ""


def launcher(env=None) -> Launcher:
    env = os.environ if env is None else env
    size = next((int(env[v]) for v in _LAUNCHER_SIZE_VARS if v in env), 1)
    local = next((int(env[v]) for v in _LOCAL_RANK_VARS if v in env), None)
    rank = next((int(env[v]) for v in _RANK_VARS if v in env), 0)
    return Launcher(size, local, env.get("HMC_FORCE_MPI") == "1", rank, env.get("CUDA_MPS_PIPE_DIRECTORY", ""))


@dataclass(frozen=True)
class RunConfig:
    """The settings of one run (the table :data:`SETTINGS`: variable, values, meaning). Build it with
    :meth:`resolve`; ``dataclasses.replace`` gives a variant."""

    backend: str = "numpy"
    grid: tuple | None = None
    partition: str = ""
    transport: str | None = None
    p2p_mask: int = 0
    p2p_fake_clique: int = 0
    comms_timeout: float = 60.0
    p2p_data: str = "copy_engine"
    p2p_force_flush: bool = False
    p2p_parallel_recv: bool = True
    p2p_in_place: bool = True
    p2p_peer_sums: bool = True
    p2p_credit_free: bool = True
    p2p_batch_signals: bool = True
    p2p_alloc: str = "auto"
    p2p_fabric: bool = True
    cuda_device: int | None = None
    hisq_kernels: bool = True
    hisq_staged: bool = True
    hisq_staged_vjp: bool = True
    dslash_compress_long: bool = True
    dslash_half_links: str = "naik"
    mg_kernels: bool = True
    mg_timing_sync: bool = True
    mg_graph: bool = True
    solver_fused: str = "on"
    solver_sums: str = "fast"
    solver_graph: int = 8
    solver_graph_capture: int = 0
    solver_graph_log: bool = False
    solver_graph_while: int = 0
    multishift_reliable: bool = False
    batched_hops: bool = True
    checks_dir: str | None = None
    fault_inject: str = ""
    mpiexec: str | None = None
    git_commit: str | None = None
    scaling_traceback: bool = False
    launch: Launcher = dataclasses.field(default=Launcher(), compare=False)
    #: the settings :meth:`resolve` took from the command line, the deck or the environment (not defaults): a
    #: command whose own default differs (a benchmark's backend "auto") applies it only to the others
    stated: frozenset = dataclasses.field(default=frozenset(), compare=False)

    @classmethod
    def resolve(cls, cli=None, deck=None, env=None) -> "RunConfig":
        """The configuration from, per setting, an explicit command-line value (``cli``: field name -> value,
        None meaning not given), else an explicit deck value (``deck``: the deck's TOML as parsed, before defaults
        are filled in), else the environment (``env``, default ``os.environ``), else the default. A value that is not
        allowed raises one ConfigError line naming its source and the values allowed."""
        env = os.environ if env is None else env
        cli = dict(cli or {})
        unknown = set(cli) - set(SETTINGS)
        if unknown:
            raise ConfigError(f"unknown setting(s) {sorted(unknown)}: known ones are {', '.join(SETTINGS)}")
        values, stated = {}, set()
        for name, s in SETTINGS.items():
            section = (deck or {}).get(s.deck[0], {}) if s.deck else {}
            if cli.get(name) is not None:
                raw, where = cli[name], s.cli or name
            elif s.deck and isinstance(section, dict) and section.get(s.deck[1]) is not None:
                raw, where = section[s.deck[1]], f"[{s.deck[0]}] {s.deck[1]}"
            elif env.get(s.env, "").strip():      # set and not empty (empty: as if unset)
                raw, where = env[s.env], s.env
            else:
                values[name] = s.default
                continue
            values[name] = _parsed(name, s, raw, where)
            stated.add(name)
        return cls(**values, launch=launcher(env), stated=frozenset(stated))

    @classmethod
    def from_environment(cls) -> "RunConfig":
        """``resolve()`` with neither command line nor deck: what library callers and tests get by default. The
        result is kept with the snapshot of the environment (and the registered transports) it came from and
        returned again while both are unchanged, so a change is seen at the next call (the object is frozen)."""
        global _FROM_ENVIRONMENT
        key = (_environment_snapshot(), _transports.names())
        kept = _FROM_ENVIRONMENT
        if kept is None or kept[0] != key:
            kept = _FROM_ENVIRONMENT = (key, cls.resolve())
        return kept[1]

    def to_env(self) -> dict:
        """The environment variables that give a child process (an mpiexec worker) this configuration through
        :meth:`resolve`: every setting, "" for None."""
        out = {}
        for name, s in SETTINGS.items():
            v = getattr(self, name)
            out[s.env] = ("" if v is None else " ".join(map(str, v)) if name == "grid" else
                          ("1" if v else "0") if isinstance(v, bool) else str(v))
        return out

    def to_record(self) -> dict:
        """The settings as JSON-able values (field name -> value), for the run file; :meth:`from_record` inverts it."""
        return {name: (list(v) if isinstance(v, tuple) else v) for name in SETTINGS for v in (getattr(self, name),)}

    @classmethod
    def from_record(cls, record: dict) -> "RunConfig":
        """The configuration a run file stored: its values as explicit ones, nothing from the environment."""
        return cls.resolve(cli={k: v for k, v in record.items() if k in SETTINGS}, env={})

    def changed(self) -> dict:
        """Environment variable -> value of the settings that differ from the defaults."""
        env = self.to_env()
        return {SETTINGS[n].env: env[SETTINGS[n].env] for n in SETTINGS if getattr(self, n) != SETTINGS[n].default}

    def describe(self) -> str:
        """One line: backend, grid and transport, and every other setting that is not its default."""
        head = (f"backend {self.backend}, grid {'x'.join(map(str, self.grid)) if self.grid else 'chosen'}, "
                f"transport {self.transport or 'auto'}")
        rest = {k: v for k, v in self.changed().items()
                if k not in ("HMC_BACKEND", "HMC_GRID", "HMC_P2P_TRANSPORT")}
        return head + ("; " + ", ".join(f"{k}={v}" for k, v in rest.items()) if rest else "")

    def gpu_ordinal(self, count: int) -> int:
        """The GPU this process uses: ``cuda_device`` if set, else the node-local rank modulo the ``count`` visible
        GPUs (one rank per GPU on a multi-GPU host; every rank on GPU 0 where there is one)."""
        if self.cuda_device is not None:
            return self.cuda_device
        if self.launch.local_rank is not None and count > 0:
            return self.launch.local_rank % count
        return 0

    def __post_init__(self):
        for name, s in SETTINGS.items():        # typed values through the same parsers (defaults pass unchanged)
            v = getattr(self, name)
            if v != s.default:
                object.__setattr__(self, name, _parsed(name, s, v, name))


_FROM_ENVIRONMENT = None          # (snapshot key, RunConfig) of the last RunConfig.from_environment()


def _environment_snapshot() -> dict:
    """A copy of the process environment to compare with the last one: CPython's backing dict of os.environ
    (``_data``, kept in step by every os.environ write) copies in under a microsecond, where decoding every entry
    through the mapping costs about as much as resolving the configuration; other interpreters get that copy."""
    data = getattr(os.environ, "_data", None)
    return dict(data) if isinstance(data, dict) else dict(os.environ)


def _parsed(name, s: Setting, raw, where: str):
    try:
        return s.parse(raw)
    except ValueError as e:
        shown = raw if isinstance(raw, str) else json.dumps(list(raw) if isinstance(raw, tuple) else raw)
        if name == "transport":
            raise ConfigError(f"unknown transport {shown!r} ({where}): {e}") from None
        raise ConfigError(f"{where}={shown!r}: {e}") from None


def child_env(extra=None) -> dict:
    """The environment of a child process: this process's, then ``extra`` (e.g. ``config.to_env()``, MPS's)."""
    env = dict(os.environ)
    env.update(extra or {})
    return env


def set_mpi_defaults() -> None:
    """Before MPI starts: exclude Open MPI's UCX one-sided component unless the user chose components (only
    shared-memory windows are used, and its probe prints errors on hosts without UCX devices)."""
    os.environ.setdefault("OMPI_MCA_osc", "^ucx")
