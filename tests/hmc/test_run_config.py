"""The run configuration in the run file: stored at ``hmc init`` (the command line's settings over the deck's over
the environment's), replaced by the one of each ``hmc run``, read back equal, shown by ``hmc info``."""
from __future__ import annotations

import json

import h5py

from comms.config import RunConfig
from hmc import runfile
from hmc.info import info
from hmc.run import init_run, run


def quiet(*a):
    pass


def test_the_run_file_keeps_the_configuration_of_the_run_that_wrote_it(tmp_path, monkeypatch):
    out = str(tmp_path / "t.h5")
    monkeypatch.setenv("HMC_BACKEND", "auto")             # the quick deck names no backend: the environment's counts
    monkeypatch.setenv("HMC_SOLVER_SUMS", "exact")
    monkeypatch.setenv("HMC_P2P_TRANSPORT", "mpi")
    init_run(None, out, log=quiet, settings={"backend": None, "grid": None, "transport": "shm"})
    want = RunConfig(backend="auto", transport="shm", solver_sums="exact")
    st = runfile.load(out)
    assert st.config == want
    with h5py.File(out, "r") as f:
        assert json.loads(f["config"].attrs["solver_sums"]) == "exact" and json.loads(f["config"].attrs["grid"]) is None
    text = info(out)
    assert "  run configuration: backend auto, grid chosen, transport shm; HMC_SOLVER_SUMS=exact" in text.splitlines()
    assert json.loads(info(out, as_json=True))["config"] == want.to_record()

    monkeypatch.delenv("HMC_SOLVER_SUMS")
    monkeypatch.setenv("HMC_COMMS_TIMEOUT", "9")
    run(out, 1, show_progress=False, log=quiet, settings={"backend": "numpy"})
    assert runfile.load(out).config == RunConfig(backend="numpy", transport="mpi", comms_timeout=9.0)


def test_a_run_file_without_a_stored_configuration_still_loads(tmp_path):
    out = str(tmp_path / "old.h5")
    state = init_run(None, out, log=quiet, settings={"backend": "numpy"})
    state.config = None                                   # as an hmc version that did not store it wrote the file
    runfile.save(out, state)
    assert runfile.load(out).config is None
    assert "  run configuration: not recorded" in info(out).splitlines()


def test_the_deck_states_half_links_for_the_run(monkeypatch):
    """[fermions] half_links is the run's dslash_half_links (over the environment); a wrong value is one line."""
    import pytest

    from comms.config import ConfigError
    from hmc import deck as deckmod
    from hmc.assemble import run_config

    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "runs" / "hisq211_8.toml").read_text()
    monkeypatch.setenv("HMC_DSLASH_HALF_LINKS", "all")
    assert run_config(text).dslash_half_links == "all"                   # the deck states none
    stated = text.replace("[fermions]", '[fermions]\nhalf_links = "naik"', 1)
    assert run_config(stated).dslash_half_links == "naik"
    assert deckmod.loads(stated)["fermions"]["half_links"] == "naik"
    wrong = text.replace("[fermions]", '[fermions]\nhalf_links = "yes"', 1)
    with pytest.raises(deckmod.DeckError, match="half_links = 'yes' is not allowed: use one of"):
        deckmod.loads(wrong)
    with pytest.raises(ConfigError, match=r"\[fermions\] half_links='yes': use one of off, naik, all"):
        run_config(wrong)
