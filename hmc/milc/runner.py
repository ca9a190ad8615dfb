"""``hmc milc`` (run a MILC ks_imp_rhmc deck through the run file), ``hmc init --milc`` and ``hmc check --milc``
(MILC's regression suite: every case of a test folder's checklist run and compared, :mod:`hmc.milc.compare`).

``hmc milc DECK -o RUN.h5`` translates the deck (:mod:`hmc.milc.deck`), writes the run file (the translated deck, the
rational functions and the MILC deck's text inside it) and runs it with ``hmc run``'s loop, which prints MILC's
lines for a deck with a ``[milc]`` section (:func:`hmc.run.milc_lines`, :func:`hmc.run.gauge_measurement_lines`,
:mod:`hmc.measure`'s PBP lines). An existing RUN.h5 made from the same MILC deck is resumed.
"""
from __future__ import annotations

import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import runfile
from . import compare
from .deck import MilcDeckError, read, read_text

RUN_FILE_KEY = "milc_deck"       # the MILC deck's text in the run file's /params/files


def default_output(deck: str) -> str:
    """RUN.h5 beside the working directory: the deck's name without ``.sample-in`` / its extension."""
    if deck == "-":
        return "milc.h5"
    name = os.path.basename(deck)
    name = name[: -len(".sample-in")] if name.endswith(".sample-in") else os.path.splitext(name)[0]
    return name + ".h5"


def init_milc(deck: str, out: str, build: str | None = None, search=(), force: bool = False,
              backend: str | None = None, ignore_checksum: bool = False, log=print, text: str | None = None,
              precision: int = 2, settings: dict | None = None):
    """Translate the MILC deck (``text``: its text, already read) and write the run file ``out``
    (``hmc init --milc``)."""
    from ..run import init_run

    d, toml, text = read(deck, build, search, text, precision)
    return init_run(None if deck == "-" else deck, out, force=force, backend=backend, log=log,
                    ignore_checksum=ignore_checksum, deck_text=toml, files={RUN_FILE_KEY: text}, settings=settings)


def run_milc(deck: str, out: str | None, build: str | None = None, search=(), force: bool = False,
             backend: str | None = None, show_progress: bool = True, log=print, precision: int = 2,
             settings: dict | None = None):
    """``hmc milc``: init (or resume, when ``out`` holds a run of the same MILC deck) and run."""
    from ..run import run

    from comms import world

    out = out or default_output(deck)
    text = read_text(deck)
    w = world()
    exists = w.bcast(os.path.exists(out) if w.rank == 0 else None)      # one decision for every rank
    if exists and not force:
        state = runfile.load(out)
        if state.files.get(RUN_FILE_KEY) != text:
            raise runfile.RunFileError(f"{out} exists and was not made from this MILC deck: pass --force to start "
                                       "over, or -o another file")
        log(f"hmc milc: resuming {out} after trajectory {state.trajectory}")
    else:
        init_milc(deck, out, build, search, force=True, backend=backend, log=log, text=text, precision=precision,
                  settings=settings)
        w.bcast(None)                 # rank 0 has written the run file when the others read it
    return run(out, None, backend, show_progress=show_progress, log=log, settings=settings)


def select_cases(cases, names) -> list:
    """Cases named by MILC prefix (``su3_rhmc_hisq.f211.2``) or without the precision (both precisions)."""
    if not names:
        return list(cases)
    out = []
    for n in names:
        hit = [c for c in cases if n in (c.prefix, c.prefix.rsplit(".", 1)[0], c.executable)]
        if not hit:
            raise compare.MilcCheckError(f"case {n!r} is not in the checklist: use one of "
                                         f"{', '.join(c.prefix for c in cases)}")
        out += [c for c in hit if c not in out]
    return out


def _run_case(case, folder: Path, work: Path, search, backend, launch=None) -> tuple[str, tuple]:
    """Run one case's sample-in with ``hmc milc`` in a fresh process; (its standard output, (wall seconds, CPU
    seconds of the process)."""
    deck = folder / f"{case.prefix}.sample-in"
    cmd = shlex.split(launch or "") + [sys.executable, "-m", "hmc"] + (["--backend", backend] if backend else []) + [
        "milc", str(deck), "--build", case.executable, "--precision", case.precision, "-o",
        str(work / f"{case.prefix}.h5"), "--force", "--no-progress"]
    for s in search:
        cmd += ["--search", str(s)]
    from comms.config import child_env

    env = child_env()
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    secs = (time.perf_counter() - t0, c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
    (work / f"{case.prefix}.test-out").write_text(p.stdout)
    if p.returncode:
        err = p.stderr.strip().splitlines()
        ours = [s for s in err if s.startswith("hmc milc: error:")]      # a launcher's banner may follow it
        raise compare.MilcCheckError(f"{case.prefix}: hmc milc failed (exit {p.returncode}): "
                                     f"{(ours or err or ['no message'])[-1]}")
    return p.stdout, secs


def _case_outputs(cases, folder, work, search, backend, launch, test_out, jobs: int):
    """(case, output text, seconds, error) in checklist order: each case run in a fresh process, up to ``jobs``
    at once (the runs are independent; CPU seconds are each child's own only when they run one at a time)."""
    if test_out is not None:
        yield cases[0], Path(test_out).read_text(), None, None
        return

    def one(case):
        try:
            text, secs = _run_case(case, folder, work, search, backend, launch)
            return case, text, (secs if jobs == 1 else (secs[0], float("nan"))), None
        except compare.MilcCheckError as e:
            return case, None, None, e

    if jobs <= 1:
        yield from map(one, cases)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(one, cases)


def check_milc(folder, names=(), search=(), out_dir=None, backend=None, test_out=None, log=print,
               launch: str | None = None, show_progress: bool = True, jobs: int = 1) -> int:
    """``hmc check --milc DIR [CASE ...]``: run (or, with ``test_out``, take that output of one case), compare with
    MILC's sample output under its errtol file, print the table and what failed; the number of failed cases.
    ``launch``: the command that starts each run, as MILC's LAUNCH (e.g. ``mpiexec -n 2``; --grid and --transport
    reach the runs through the environment). Progress (one step per case) goes to stderr on rank 0 unless
    ``show_progress`` is off (hmc.progress). ``jobs``: cases run at once (``--jobs``; outputs compared in checklist
    order)."""
    from ..progress import command_progress

    folder = Path(folder)
    cases = select_cases(compare.read_checklist(folder), names)
    if test_out is not None and len(cases) != 1:
        raise compare.MilcCheckError(f"--test-out compares one case's output: name one case (got {len(cases)})")
    search = [folder, folder.parent] + [Path(s) for s in search]
    tmp = None
    if out_dir is None and test_out is None:
        tmp = tempfile.TemporaryDirectory(prefix="hmc-milc-check-")
        work = Path(tmp.name)
    else:
        work = Path(out_dir or ".")
        work.mkdir(parents=True, exist_ok=True)
    rows, failed = [], 0
    bar = command_progress(len(cases), "hmc check --milc", show_progress)
    try:
        for case, text, secs, error in _case_outputs(cases, folder, work, search, backend, launch, test_out, jobs):
            bar.update(len(rows), case.prefix)
            sample, errtol = (folder / f"{case.prefix}.{ext}" for ext in ("sample-out", "errtol"))
            if error is not None:
                log(str(error))
                rows.append((case.prefix, compare.Comparison(error=str(error)), None))
                failed += 1
                continue
            c = compare.compare_outputs(text, sample.read_text(), errtol.read_text(), case)
            rows.append((case.prefix, c, secs))
            failed += not c.ok
            log(f"{case.prefix}: {'ok' if c.ok else 'NOT OK'} ({c.lines} lines, {c.fields} fields, worst diff/tol "
                f"{c.worst:.3g}{', ' + c.worst_at if c.worst_at else ''})"
                + (f", {secs[0]:.1f} s wall, {secs[1]:.1f} s CPU" if secs else ""))
            for line in compare.failure_report(case.prefix, c):
                log("  " + line)
        bar.update(len(rows), "compared")
    finally:
        bar.close()
        if tmp is not None:
            tmp.cleanup()
    log(compare.format_table(rows))
    log(f"hmc check --milc: {len(rows)} cases, {failed} failed" + ("" if tmp is not None or test_out is not None
                                                                     else f" (outputs in {work})"))
    return failed


__all__ = ["MilcDeckError", "check_milc", "init_milc", "run_milc", "select_cases"]
