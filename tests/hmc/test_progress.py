"""Progress of long commands (hmc.progress): one line on stderr, rank 0, what runs, n/N, elapsed and remaining;
redrawn in place on a terminal, only the final line off it; a command's progress shows only once its work has run
for hmc.progress.AFTER seconds; --no-progress turns it off; stdout keeps the result."""
import io
import json
import re
import time

import pytest

from hmc import progress
from hmc.cli import main
from hmc.progress import Progress
from tests.conftest import fixture_path

LINE = re.compile(r"(?P<label>.+) \[[#.]{24}\] (?P<n>\d+)/(?P<N>\d+) +(?P<el>[\d.]+)s eta +(?P<eta>[\d.]+)s "
                  r"(?P<note>.*)")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def lines(text):
    return [m for m in (LINE.fullmatch(s) for s in re.split(r"[\r\n]", text) if s) if m]


def test_terminal_redraws_in_place_with_steps_elapsed_and_remaining():
    out = Terminal()
    bar = Progress(4, "hmc solve", stream=out)
    bar.update(1, "solve 1 of 3")
    time.sleep(0.05)
    bar.step("solve 2 of 3")
    text = out.getvalue()
    assert text.startswith("\r") and "\n" not in text                      # redrawn in place until done
    drawn = lines(text)
    assert [(m["n"], m["N"], m["note"].strip()) for m in drawn] == [("1", "4", "solve 1 of 3"), ("2", "4", "solve 2 of 3")]
    last = drawn[-1]
    assert float(last["el"]) >= 0.0 and abs(float(last["eta"]) - float(last["el"])) < 0.2    # 2 of 4: eta = elapsed
    bar.update(4, "done")
    assert out.getvalue().endswith("\n") and lines(out.getvalue())[-1]["n"] == "4"


def test_off_a_terminal_only_the_final_line():
    out = io.StringIO()
    bar = Progress(3, "hmc check", stream=out)
    bar.update(1)
    bar.update(2)
    assert out.getvalue() == ""
    bar.update(3, "done")
    assert len(out.getvalue().splitlines()) == 1 and lines(out.getvalue())[0]["n"] == "3"


def test_short_work_prints_nothing_and_long_work_keeps_its_clock_moving():
    quick = Terminal()
    with Progress(2, "hmc measure", stream=quick, after=60.0) as bar:
        bar.update(1, "plaquette")
        bar.update(2, "done")
    assert quick.getvalue() == ""
    slow = Terminal()
    with Progress(2, "hmc solve", stream=slow, after=0.2) as bar:
        bar.update(0, "reading")
        time.sleep(progress.REDRAW * 3 + 0.3)          # one long step: redrawn with a growing elapsed time
        drawn = lines(slow.getvalue())
        assert len(drawn) >= 2 and float(drawn[-1]["el"]) > float(drawn[0]["el"])
        assert all(m["n"] == "0" and m["note"].strip() == "reading" for m in drawn)
    closed = slow.getvalue()
    assert closed.endswith("reading\n")                 # leaving the block ends the partial line
    time.sleep(progress.REDRAW * 2)
    assert slow.getvalue() == closed                    # and no more redraws


def test_disabled_draws_nothing():
    out = Terminal()
    bar = Progress(2, "x", enabled=False, stream=out, after=0.0)
    bar.update(1)
    bar.update(2)
    assert out.getvalue() == ""


L4444 = ["--action", "hisq", "--mass", "0.2"]


@pytest.mark.parametrize("argv,label,total", [
    (["solve", "LAT", *L4444], "hmc solve", 3),
    (["solve", "LAT", *L4444, "--ksprop", "--out", "OUT"], "hmc solve", 6),
    (["spectrum", "LAT", *L4444], "hmc spectrum", 5),
    (["measure", "LAT", "--beta", "6.0"], "hmc measure", 4),
])
def test_commands_report_progress_on_stderr(tmp_path, capsys, monkeypatch, argv, label, total):
    """With the threshold at 0 s every command draws its final line on stderr; stdout keeps the JSON result;
    --no-progress is silent."""
    lat = str(fixture_path("lat.sample.l4444"))
    argv = [lat if a == "LAT" else str(tmp_path / "out.ksprop") if a == "OUT" else a for a in argv]
    monkeypatch.setattr(progress, "AFTER", 0.0)
    assert main(argv + ["--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)
    drawn = lines(captured.err)
    assert len(drawn) == 1 and drawn[0]["label"] == label and drawn[0]["n"] == drawn[0]["N"] == str(total)
    assert main(argv + ["--json", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_export_and_check_report_progress(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(progress, "AFTER", 0.0)
    run = str(tmp_path / "t.h5")
    assert main(["init", "-o", run]) == 0
    capsys.readouterr()
    assert main(["export", run, "-o", str(tmp_path / "c.scidac"), "--format", "scidac"]) == 0
    drawn = lines(capsys.readouterr().err)
    assert len(drawn) == 1 and drawn[0]["label"] == "hmc export" and drawn[0]["n"] == "2"
    assert main(["export", run, "-o", str(tmp_path / "c.nersc"), "--format", "nersc", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_check_reports_progress(capsys, monkeypatch):
    from hmc import check

    names = check.available()
    if not names:
        pytest.skip("no shipped references found")
    monkeypatch.setattr(progress, "AFTER", 0.0)
    smallest = min(names, key=lambda n: (check.checks_dir() / f"{n}.toml").stat().st_size)
    main(["check", smallest])
    drawn = lines(capsys.readouterr().err)
    assert len(drawn) == 1 and drawn[0]["label"] == "hmc check" and drawn[0]["n"] == drawn[0]["N"] == "1"


def test_check_milc_reports_progress(capsys, monkeypatch):
    """hmc check --milc: one step per case (here a case compared with its own sample output: --test-out)."""
    folder = fixture_path("ks_imp_rhmc")
    case = "su3_leapfrog.1"
    argv = ["check", "--milc", str(folder), case, "--test-out", str(folder / f"{case}.sample-out")]
    monkeypatch.setattr(progress, "AFTER", 0.0)
    assert main(argv) == 0
    drawn = lines(capsys.readouterr().err)
    assert len(drawn) == 1 and drawn[0]["label"] == "hmc check --milc" and drawn[0]["n"] == drawn[0]["N"] == "1"
    assert main(argv + ["--no-progress"]) == 0
    assert capsys.readouterr().err == ""
