"""The run configuration (comms/config.py): precedence CLI > explicit deck value > environment > default, one-line
refusal of bad values, the child-process round trip, the settings read from the grid and geometry, and that no
package module but the configuration module touches the environment."""
from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from comms.config import SETTINGS, ConfigError, RunConfig, child_env
from tests.conftest import ROOT

DECK_SAYS = {"run": {"backend": "numpy"}, "lattice": {"grid": [1, 1, 2, 1]}}
ENV_SAYS = {"HMC_BACKEND": "cupy", "HMC_GRID": "1 1 1 2", "HMC_P2P_TRANSPORT": "mpi"}


def test_precedence_cli_then_deck_then_environment_then_default():
    cli = {"backend": "auto", "grid": (2, 1, 1, 1), "transport": "shm"}
    c = RunConfig.resolve(cli=cli, deck=DECK_SAYS, env=ENV_SAYS)
    assert (c.backend, c.grid, c.transport) == ("auto", (2, 1, 1, 1), "shm")
    c = RunConfig.resolve(cli={"backend": None, "grid": None, "transport": None}, deck=DECK_SAYS, env=ENV_SAYS)
    assert (c.backend, c.grid, c.transport) == ("numpy", (1, 1, 2, 1), "mpi")        # the deck names no transport
    c = RunConfig.resolve(deck={"run": {"seed": 3}, "lattice": {"dims": [4, 4, 4, 4]}}, env=ENV_SAYS)
    assert (c.backend, c.grid, c.transport) == ("cupy", (1, 1, 1, 2), "mpi")
    c = RunConfig.resolve(deck=DECK_SAYS, env={})
    assert (c.transport, c.comms_timeout, c.solver_sums) == (None, 60.0, "fast")
    assert RunConfig.resolve(env={}) == RunConfig()


def test_a_deck_that_does_not_name_the_backend_lets_the_environment_through():
    """``HMC_BACKEND=cupy hmc run x.h5`` ran on the CPU: the deck's schema default hid the environment."""
    from hmc.assemble import run_config

    text = '[run]\nname = "t"\n[lattice]\ndims = [4, 4, 4, 4]\n[gauge]\nbeta = 5.7\n'
    assert run_config(text, {"backend": None}).backend == RunConfig.from_environment().backend
    cfg = RunConfig.resolve(deck={"run": {"name": "t"}}, env={"HMC_BACKEND": "cupy"})
    assert cfg.backend == "cupy"
    stated = text.replace('name = "t"', 'name = "t"\nbackend = "numpy"')
    import tomllib

    assert RunConfig.resolve(deck=tomllib.loads(stated), env={"HMC_BACKEND": "cupy"}).backend == "numpy"


@pytest.mark.parametrize("var,text,allowed", [
    ("HMC_BACKEND", "bogus", "use one of numpy, cupy, auto"),
    ("HMC_P2P_TRANSPORT", "bogus", "use one of mpi, shm, event, stream_gated (or auto)"),
    ("HMC_P2P_ALLOC", "cuda_ipc", "use one of auto, vmm, legacy"),
    ("HMC_P2P_DATA", "dma", "use one of copy_engine, remote_write"),
    ("HMC_SOLVER_SUMS", "kahan", "use one of fast, exact"),
    ("HMC_SOLVER_FUSED", "some", "use 1 (on), 0 (off), all (every site) or strided"),
    ("HMC_HISQ_KERNELS", "off", "use 1 (on) or 0 (off)"),
    ("HMC_COMMS_TIMEOUT", "-3", "use a positive number of seconds"),
    ("HMC_GRID", "1 2 3", "use four positive integers PX PY PZ PT"),
    ("HMC_P2P_MASK", "16", "use an integer 0..15"),
    ("HMC_PARTITION", "q", "give the directions to partition as letters"),
    ("HMC_CUDA_DEVICE", "-1", "use a GPU ordinal >= 0"),
])
def test_bad_values_are_refused_in_one_line_naming_the_variable_and_the_values_allowed(var, text, allowed):
    with pytest.raises(ConfigError) as e:
        RunConfig.resolve(env={var: text})
    msg = str(e.value)
    assert "\n" not in msg and var in msg and repr(text) in msg and allowed in msg, msg


def test_bad_values_from_the_command_line_and_the_deck_name_their_source():
    with pytest.raises(ConfigError, match=r"^unknown transport 'carrier-pigeon' \(--transport\): use one of"):
        RunConfig.resolve(cli={"transport": "carrier-pigeon"}, env={})
    with pytest.raises(ConfigError, match=r"^\[lattice\] grid='\[1, 2\]': use four positive integers"):
        RunConfig.resolve(deck={"lattice": {"grid": [1, 2]}}, env={})
    with pytest.raises(ConfigError, match=r"^solver_sums='kahan'"):
        RunConfig(solver_sums="kahan")


def test_the_cli_refuses_a_bad_environment_value_in_one_line(tmp_path):
    from tests.conftest import launch_env

    r = subprocess.run([sys.executable, "-m", "hmc", "info", str(tmp_path / "none.h5")], capture_output=True,
                       text=True, cwd=tmp_path, timeout=120, env=launch_env({"HMC_BACKEND": "bogus"}))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["hmc info: error: HMC_BACKEND='bogus': use one of numpy, cupy, auto"]


def test_a_child_rebuilds_the_same_configuration_from_to_env():
    cfg = RunConfig.resolve(cli={"grid": (1, 1, 1, 2), "transport": "shm"},
                            env={"HMC_SOLVER_SUMS": "exact", "HMC_COMMS_TIMEOUT": "7.5", "HMC_P2P_MASK": "0x8",
                                 "HMC_HISQ_KERNELS": "0", "HMC_PARTITION": "tz"})
    assert RunConfig.resolve(env=cfg.to_env()) == cfg
    code = ("import json; from comms.config import RunConfig; "
            "print(json.dumps(RunConfig.from_environment().to_record()))")
    env = child_env(dict(cfg.to_env(), PYTHONPATH=str(ROOT)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, check=True)
    assert RunConfig.from_record(json.loads(out.stdout)) == cfg
    assert cfg.changed() == {"HMC_GRID": "1 1 1 2", "HMC_PARTITION": "zt", "HMC_P2P_TRANSPORT": "shm",
                             "HMC_P2P_MASK": "8", "HMC_COMMS_TIMEOUT": "7.5", "HMC_HISQ_KERNELS": "0",
                             "HMC_SOLVER_SUMS": "exact"}


def test_the_record_round_trip_keeps_every_setting():
    cfg = RunConfig(backend="auto", grid=(1, 2, 1, 2), transport="stream_gated", cuda_device=1, solver_fused="all",
                    p2p_parallel_recv=False, checks_dir="/x", fault_inject="kill_during_checkpoint:2")
    rec = json.loads(json.dumps(cfg.to_record()))
    assert set(rec) == set(SETTINGS) and RunConfig.from_record(rec) == cfg


def test_grid_and_geometry_take_their_settings_from_the_configuration():
    from comms import ProcessGrid
    from lattice import Geometry, get_backend
    from solvers.multigrid import cuda as mgcuda
    from solvers.operator import reductions, set_reductions
    from force import hisq_cuda

    cfg = RunConfig(partition="t", transport="mpi", solver_sums="exact", mg_kernels=False, hisq_kernels=False,
                    comms_timeout=5.0)
    g = ProcessGrid((1, 1, 1, 1), config=cfg)
    assert g.partitioned == (False, False, False, True) and g.transport_request == "mpi"
    assert g.halo.timeout == 5.0 and g.halo.transport(3, 0) == "mpi"
    assert ProcessGrid((1, 1, 1, 1), config=cfg, transport="shm").transport_request == "shm"
    geom = Geometry((4, 4, 4, 4), get_backend("numpy"), config=cfg)
    assert geom.config is geom.grid.config and geom.grid.config.partition == "t"
    assert reductions(geom) == "exact" and reductions(Geometry((4, 4, 4, 4), config=RunConfig())) == "fast"
    old = set_reductions("fast")
    try:
        assert reductions(geom) == "fast"
    finally:
        set_reductions(old)
    assert reductions(geom) == "exact"
    old = mgcuda.set_emulation(True)
    try:
        assert not mgcuda.applies(geom, geom.xp.zeros(3, complex))
        plain = Geometry((4, 4, 4, 4), get_backend("numpy"), config=RunConfig())
        assert mgcuda.applies(plain, geom.xp.zeros(3, complex))
    finally:
        mgcuda.set_emulation(old)
    assert not hisq_cuda.enabled(cfg) and hisq_cuda.enabled(RunConfig())
    g.close()


def test_from_environment_sees_every_change_and_is_kept_while_nothing_changes(monkeypatch):
    """Library callers that pass no configuration call from_environment() per call: it is rebuilt only when the
    environment (a setting or a launch fact) or the registered transports changed since the last call."""
    from comms.transport import Capabilities, register, unregister

    first = RunConfig.from_environment()
    assert RunConfig.from_environment() is first and first == RunConfig.resolve()
    other = "exact" if first.solver_sums == "fast" else "fast"
    monkeypatch.setenv("HMC_SOLVER_SUMS", other)
    assert RunConfig.from_environment().solver_sums == other
    monkeypatch.setenv("HMC_SOLVER_SUMS", "kahan")
    with pytest.raises(ConfigError, match="HMC_SOLVER_SUMS='kahan'"):
        RunConfig.from_environment()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    monkeypatch.delenv("PMI_RANK", raising=False)
    monkeypatch.setenv("HMC_SOLVER_SUMS", first.solver_sums)
    assert RunConfig.from_environment().launch.rank == 5
    monkeypatch.setenv("HMC_P2P_TRANSPORT", "cfg_cache_test")
    with pytest.raises(ConfigError, match="unknown transport 'cfg_cache_test'"):
        RunConfig.from_environment()
    register("cfg_cache_test", Capabilities(), "tests.no_such_module")
    try:
        assert RunConfig.from_environment().transport == "cfg_cache_test"
    finally:
        unregister("cfg_cache_test")
    with pytest.raises(ConfigError, match="unknown transport 'cfg_cache_test'"):
        RunConfig.from_environment()


def test_the_gpu_ordinal_follows_the_configuration_then_the_node_local_rank():
    assert RunConfig.resolve(env={"HMC_CUDA_DEVICE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}).gpu_ordinal(8) == 3
    assert RunConfig.resolve(env={"OMPI_COMM_WORLD_LOCAL_RANK": "5"}).gpu_ordinal(4) == 1
    assert RunConfig.resolve(env={}).gpu_ordinal(4) == 0


def test_the_launch_facts_and_the_settings_stated():
    """The world rank and the MPS client's pipe folder are facts of the launch (a worker's error report, the halo
    benchmark's MPS label); ``stated`` names the settings that did not come from the defaults."""
    c = RunConfig.resolve(env={"OMPI_COMM_WORLD_RANK": "3", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps",
                               "HMC_BACKEND": "numpy"})
    assert (c.launch.rank, c.launch.mps_pipe_directory) == (3, "/tmp/mps")
    assert c == RunConfig() and c.stated == {"backend"} and RunConfig().stated == frozenset()
    assert RunConfig.resolve(env={"PMI_RANK": "2"}).launch.rank == 2
    assert RunConfig.resolve(env={}).launch == RunConfig().launch
    c = RunConfig.resolve(cli={"grid": (1, 1, 1, 2), "backend": None}, deck={"run": {"backend": "cupy"}},
                          env={"HMC_P2P_MASK": "0"})
    assert c.stated == {"grid", "backend", "p2p_mask"}


# every bench module too: the suite runner and the scaling launcher build their children's environment with
# comms.config.child_env (this process's, plus the configuration's to_env()), reading nothing themselves
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def _environment_uses(tree) -> list:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENV_NAMES:
            found.append((node.lineno, f"os.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [(node.lineno, f"from os import {a.name}") for a in node.names if a.name in ENV_NAMES]
        elif isinstance(node, ast.Name) and node.id in ENV_NAMES:
            found.append((node.lineno, node.id))
    return sorted(found)


def test_no_package_module_but_the_configuration_reads_or_writes_the_environment():
    assert _environment_uses(ast.parse("import os\nx = os.environ.get('A')\nos.putenv('B', '1')")) == [
        (2, "os.environ"), (3, "os.putenv")]                              # the check sees what it looks for
    bad = []
    for pkg in ("comms", "lattice", "solvers", "force", "hmc", "bench"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "comms/config.py":
                continue
            bad += [f"{rel}:{line}: {what}" for line, what in _environment_uses(ast.parse(path.read_text()))]
    assert bad == [], "read the setting from the run configuration (comms.config) instead:\n" + "\n".join(bad)
