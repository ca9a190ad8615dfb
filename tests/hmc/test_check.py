"""hmc check: the stored references pass, a changed number fails, --update rewrites and says so."""
import json
import shutil

from hmc.cli import main
from tests.conftest import ROOT


def test_references_pass(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out and "FAIL" not in out


def test_changed_reference_fails_and_update_rewrites(tmp_path, monkeypatch, capsys):
    src = ROOT / "runs" / "checks"
    for f in src.glob("wilson4_gauge.*"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.setenv("HMC_CHECKS_DIR", str(tmp_path))
    ref = tmp_path / "wilson4_gauge.json"
    values = json.loads(ref.read_text())
    values["gauge: action"] *= 1 + 1e-6
    ref.write_text(json.dumps(values))
    assert main(["check", "wilson4_gauge"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert main(["check", "wilson4_gauge", "--update"]) == 0
    assert "updated" in capsys.readouterr().out
    assert main(["check", "wilson4_gauge"]) == 0


def test_unknown_reference(capsys):
    assert main(["check", "nonesuch"]) == 2
    assert "no reference named nonesuch" in capsys.readouterr().err
