"""Flipped bytes in real run files (hmc.runfile_open): a run file written by 'hmc init' + 'hmc run', and the same
state written in the layout of the older writer (variable-length strings, HDF5's default 1.6 layout), get 1-3
bytes XORed with random values -- mostly outside the links' raw data, where HDF5's metadata lives. Each case must
end in a clean load or the run file's one-line RunFileError naming the file, never another exception and never a
hang: the cases run in a worker process that reports each one, and a case that takes longer than CASE_LIMIT_S
fails the test (the worker is killed; libhdf5 can loop inside C, where no signal handler runs).

Cases per seed: HMC_RUNFILE_FLIPS="NEW,OLD" (CI: 300 of the current layout, 8 of the old one, whose every case
runs the probe process); by hand e.g. HMC_RUNFILE_FLIPS=20000,500 (docs/faults.md). HMC_FUZZ_SEED=N draws other
cases.
"""
from __future__ import annotations

import json
import os
import random
import selectors
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hmc import runfile
from hmc.runfile_open import PROBE_TIMEOUT_S
from tests.conftest import ROOT

FLIPS = tuple(int(n) for n in os.environ.get("HMC_RUNFILE_FLIPS", "300,8").split(","))
SEED = int(os.environ.get("HMC_FUZZ_SEED", "21"))
CASE_LIMIT_S = PROBE_TIMEOUT_S + 30        # a legacy file's probe may take its whole timeout, then refuses


def _write_seeds(folder: Path) -> dict:
    """'new': a run file of the quick deck after 2 trajectories; 'old': the same state as the old writer wrote it."""
    from hmc.run import init_run, run

    new = folder / "new.h5"
    init_run(None, str(new), log=lambda *a: None)
    state = run(str(new), 2, show_progress=False, log=lambda *a: None)
    old = folder / "old.h5"
    saved = runfile.LIBVER, runfile._fixed
    runfile.LIBVER, runfile._fixed = ("earliest", "latest"), str     # the writer before fixed-length strings
    try:
        runfile.save(old, state)
    finally:
        runfile.LIBVER, runfile._fixed = saved
    return {"new": new, "old": old}


def _links_span(path: Path) -> tuple[int, int]:
    import h5py

    with h5py.File(path, "r") as f:
        ds = f["gauge/links"]
        return ds.id.get_offset(), ds.id.get_storage_size()


def mutate(blob: bytes, span: tuple[int, int], rng: random.Random) -> bytes:
    """1-3 bytes XORed with a random non-zero value; 4 in 5 of them outside the links' raw data."""
    data = bytearray(blob)
    lo, n = span
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.8:
            pos = rng.randrange(len(data) - n)
            pos = pos if pos < lo else pos + n
        else:
            pos = lo + rng.randrange(n)
        data[pos] ^= rng.randint(1, 255)
    return bytes(data)


def worker(seed_path: str, case_path: str, first: int, count: int, seed: int) -> None:
    """Load ``count`` mutations of the seed from case ``first`` on; print one JSON line per case."""
    blob = Path(seed_path).read_bytes()
    span = _links_span(Path(seed_path))
    for i in range(first, first + count):
        Path(case_path).write_bytes(mutate(blob, span, random.Random(seed * 1_000_003 + i)))
        outcome = "ok"
        try:
            runfile.load(case_path)
        except runfile.RunFileError as e:
            msg = str(e)
            outcome = "refused" if msg and "\n" not in msg and case_path in msg else f"bad message: {msg!r}"
        except Exception as e:  # noqa: BLE001 -- the finding: reported to the test
            outcome = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        print(json.dumps({"case": i, "outcome": outcome}), flush=True)


def _run_cases(seed_path: Path, case_path: Path, count: int) -> dict:
    """The worker over every case; returns the outcome counts. A case past CASE_LIMIT_S fails the test."""
    code = ("import sys; from tests.faults.test_runfile_flips import worker; "
            "worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))")
    p = subprocess.Popen([sys.executable, "-c", code, str(seed_path), str(case_path), "0", str(count), str(SEED)],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    counts, findings, done = {}, [], 0
    try:
        while done < count:
            if not sel.select(timeout=CASE_LIMIT_S):
                keep = case_path.with_suffix(".hang.h5")
                shutil.copy(case_path, keep)
                pytest.fail(f"case {done} of {seed_path.name} (HMC_FUZZ_SEED={SEED}) did not finish within "
                            f"{CASE_LIMIT_S:g} s: a hang; the file is kept as {keep}")
            line = p.stdout.readline()
            if not line:
                pytest.fail(f"the worker died at case {done} of {seed_path.name}: {p.stderr.read()[-2000:]}")
            r = json.loads(line)
            done += 1
            key = r["outcome"] if r["outcome"] in ("ok", "refused") else "finding"
            counts[key] = counts.get(key, 0) + 1
            if key == "finding":
                findings.append((r["case"], r["outcome"]))
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()
    assert not findings, f"{len(findings)} cases of {seed_path.name} ended otherwise: {findings[:5]}"
    return counts


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return _write_seeds(tmp_path_factory.mktemp("flips"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout,count", [("new", FLIPS[0]), ("old", FLIPS[1])])
def test_flipped_bytes_give_a_clean_load_or_one_line(seeds, layout, count, tmp_path):
    seed = seeds[layout]
    assert runfile.load(seed).trajectory == 2               # the undamaged file reads, in either layout
    t0 = time.monotonic()
    counts = _run_cases(seed, tmp_path / f"case.{layout}.h5", count)
    took = time.monotonic() - t0
    print(f"run file ({layout} layout): {count} cases in {took:.1f} s: {counts}")
    assert counts.get("refused", 0) > 0                      # the flips do reach the checks


def test_the_writer_checksums_its_metadata(seeds):
    """The current writer's files take the in-process path (version-2 superblock and headers, fixed-length
    strings); the old layout is probed in a child process first."""
    import h5py

    from hmc.runfile_open import _all_checksummed, lookup3, superblock

    assert lookup3(b"Four score and seven years ago") == 0x17770551           # Jenkins' own test vectors
    assert lookup3(b"Four score and seven years ago", 1) == 0xCD628161
    for layout, want in (("new", True), ("old", False)):
        with open(seeds[layout], "rb") as raw:
            sb = superblock(raw.read(4096))
            if sb is None:
                assert not want
                continue
            with h5py.File(seeds[layout], "r") as f:
                assert _all_checksummed(f, raw, sb) is want
