"""Every reader fuzzed (tests/faults/fuzzing.py): mutated MILC v5 (32 and 64 bit), MILC 1996, NERSC (2-row single,
3x3 double), ILDG (32, 64 bit), SciDAC and openQCD gauge files, MILC rational-function files, TOML decks and run
files must give only the project's one-line errors: never another exception, a hang, or an allocation beyond the
file's size.

Short CI setting: fuzzing.CI_EXAMPLES cases per seed (twice that for the rationals, deck and run-file readers, which
have one seed each); the long one: HMC_FUZZ_EXAMPLES=20000 (docs/faults.md).
HMC_FUZZ_REPORT=FILE appends each reader's counts (cases, read, refused) to FILE as JSON lines.
"""
from __future__ import annotations

import json
import os
import re
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given

from hmc import deck as deckmod
from hmc import runfile
from hmc.rational import RationalsError
from hmc.rational_file import read_rationals
from lattice import su3
from lattice.io import GaugeFileError, lime, read_gauge, write_gauge
from tests.faults.fuzzing import Field, check_reader, fuzz_settings, lime_mutations, mutations
from tests.lattice.test_io import write_old_64bit_milc

ROOT = Path(__file__).resolve().parents[2]
DIMS = (2, 2, 2, 4)                 # nx ny nz nt: small seeds keep a case at a few milliseconds
WORK = Path(tempfile.mkdtemp(prefix="hmc-fuzz-"))


def _links(seed=5):
    rng = np.random.default_rng(seed)
    nx, ny, nz, nt = DIMS
    a = rng.normal(size=(nt, nz, ny, nx, 4, 3, 3)) + 1j * rng.normal(size=(nt, nz, ny, nx, 4, 3, 3))
    return su3.reunitarize(a)


def _milc_fields() -> list[Field]:
    return [Field(o, o + 4, "<i") for o in (0, 4, 8, 12, 16, 84, 88, 92)]


def _text_fields(blob: bytes, pattern: bytes) -> list[Field]:
    return [Field(m.start(1), m.end(1)) for m in re.finditer(pattern, blob)]


def _lime_fields(path: Path, blob: bytes) -> list[Field]:
    fields = []
    for r in lime.scan(path):
        head = r.offset - lime.HEADER_BYTES
        fields += [Field(head + 6, head + 8, ">H"), Field(head + 8, head + 16, ">Q")]
    return fields + _text_fields(blob, rb">([^<>]*)</")


def _seed_gauge(name: str):
    """(path, fields) of a small valid gauge file of kind ``name``."""
    p = WORK / f"seed.{name}"
    a = _links()
    if name in ("milc32", "milc64"):
        if name == "milc32":
            write_gauge(p, a.astype(np.complex64), "milc")
        else:                      # the 64-bit variant this project wrote before: no longer written, still read
            write_old_64bit_milc(p, a)
        return p, _milc_fields()
    if name == "milc1996":
        nx, ny, nz, nt = DIMS
        head = struct.pack("<5i2f", 59354, nx, ny, nz, nt, 0.0, 0.0)
        p.write_bytes(head + a.view(np.float64).astype("<f4").tobytes())
        return p, [Field(o, o + 4, "<i") for o in (0, 4, 8, 12, 16, 20, 24)]
    if name.startswith("nersc"):
        opts = {"datatype": "4D_SU3_GAUGE", "floating_point": "IEEE32LITTLE"} if name == "nersc2" else {}
        write_gauge(p, a, "nersc", **opts)
        blob = p.read_bytes()
        return p, _text_fields(blob[:blob.find(b"END_HEADER")], rb"= ([^\n]*)\n")
    if name in ("ildg32", "ildg64", "scidac"):
        write_gauge(p, a, "ildg", precision=32 if name == "ildg32" else 64)
        if name == "scidac":      # the same records with the binary one named as SciDAC's (same 128-byte field)
            p.write_bytes(p.read_bytes().replace(b"ildg-binary-data\0\0", b"scidac-binary-data"))
        return p, _lime_fields(p, p.read_bytes())
    if name == "openqcd":         # no magic: the four extents and the plaquette (as its bit pattern)
        write_gauge(p, a, "openqcd")
        return p, [Field(o, o + 4, "<i") for o in (0, 4, 8, 12)] + [Field(16, 24, "<q")]
    raise ValueError(name)


GAUGE_KINDS = ["milc32", "milc64", "milc1996", "nersc2", "nersc3", "ildg32", "ildg64", "scidac", "openqcd"]
STATS: dict = {}


def _report(reader: str, stats: dict) -> None:
    out = os.environ.get("HMC_FUZZ_REPORT")
    if out:
        with open(out, "a") as fh:
            fh.write(json.dumps({"reader": reader, "cases": sum(stats.values()), **stats}) + "\n")


def _fuzz(reader: str, seed: Path, fields, read, errors, scale: int = 1):
    """Run the hypothesis loop over mutations of ``seed`` (LIME files: :func:`lime_mutations`); ``read(path)``
    under :func:`check_reader`."""
    blob = seed.read_bytes()
    target = WORK / f"case.{reader}"
    stats = STATS.setdefault(reader, {})
    assert check_reader(read, seed, errors) == "ok"          # the seed itself reads
    if lime.sniff(blob):
        strategy = (lime_mutations([(r.type, lime.read_data(seed, r), r.mb, r.me) for r in lime.scan(seed)])
                    | mutations(blob, fields))
    else:
        strategy = mutations(blob, fields)

    @given(strategy)
    def case(data):
        target.write_bytes(data)
        check_reader(read, target, errors, stats)

    fuzz_settings(case, scale)()
    _report(reader, stats)
    assert stats.get("refused", 0) > 0                        # the mutations do reach the checks


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", GAUGE_KINDS)
def test_gauge_readers(kind):
    seed, fields = _seed_gauge(kind)
    _fuzz(f"gauge:{kind}", seed, fields, lambda p: read_gauge(p), (GaugeFileError,))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["milc32", "nersc2", "ildg64"])
def test_gauge_reader_checksums_ignored_links_checked(kind):
    """With --ignore-checksum the damaged data reach the decoding and the link check of hmc init/measure/solve."""
    seed, fields = _seed_gauge(kind)
    _fuzz(f"gauge:{kind}+ignore-checksum+check-links", seed, fields,
          lambda p: read_gauge(p, ignore_checksum=True, check_links=True), (GaugeFileError,))


@pytest.mark.timeout(300)
def test_rationals_reader():
    seed = ROOT / "runs" / "rationals" / "rationals.su3_rhmc_hisq"
    blob = seed.read_bytes()
    fields = _text_fields(blob, rb"(?m)^\s*\S+\s+([^#\n]*?)\s*$")
    _fuzz("rationals", seed, fields, lambda p: read_rationals(p), (RationalsError,), scale=2)


DECK = """\
[run]
name = "fuzz"
seed = 7
trajectories = 4
start = "cold"
rng = "philox"
checkpoint_every = 2
warmups = 1

[lattice]
dims = [8, 8, 8, 8]
grid = [1, 1, 1, 2]

[gauge]
action = "symanzik"
beta = 7.4
u0 = 0.89
quark_loops = "hisq"
nf = 3

[fermions]
action = "hisq"
rationals = "rationals/rationals.su3_rhmc_hisq"
dyn_mass = [0.0018, 0.018]
dyn_flavors = [2, 1]
cgresid_md_fa_gr = [[5e-4, 1e-4, 1e-4], [5e-6, 1e-6, 1e-6]]
pbp_masses = [0.0018]

[integrator]
scheme = "3g1f"
steps = 10
tau = 0.2
reunitarize = "cycle"

[multigrid]
levels = 3
blocks = [[4, 4, 4, 4]]
nv = 8
smoother_steps = [0, 4]
light_shifts = 1
"""


@pytest.mark.timeout(300)
def test_deck_reader():
    seed = WORK / "seed.toml"
    seed.write_text(DECK)
    blob = seed.read_bytes()
    fields = _text_fields(blob, rb"= ([^\n]*)\n") + _text_fields(blob, rb"([-0-9.e]+)[,\]]")
    _fuzz("deck", seed, fields, lambda p: deckmod.load(p), (deckmod.DeckError,), scale=2)


@pytest.mark.timeout(300)
def test_run_file_reader():
    seed = WORK / "seed.h5"
    text = deckmod.default_deck_text().replace("[4, 4, 4, 4]", "[2, 2, 2, 2]")
    d = deckmod.loads(text)
    nx, ny, nz, nt = d["lattice"]["dims"]
    links = _links()[:nt, :nz, :ny, :nx]
    rows = [{"traj": 1, "accepted": 1, "dH": 0.25}]
    runfile.save(seed, runfile.RunState(d, text, links, 1, {"seed": 1, "counters": {"md": 3}}, rows, [],
                                        "cold start", {"rationals": "n_pseudo 1\n"}, plaquette=(3.0, 3.0)))
    _fuzz("runfile", seed, [], lambda p: runfile.load(p), (runfile.RunFileError,), scale=2)
