"""hmc check: the stored references pass, a changed number fails, --update rewrites and says so."""
import json
import re
import shutil

import pytest

from hmc.cli import main
from tests.conftest import ROOT


def test_references_pass(capsys):
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out and "FAIL" not in out


def test_changed_reference_fails_and_update_rewrites(tmp_path, monkeypatch, capsys):
    src = ROOT / "hmc" / "checks"
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


def _installed_copy(dest):
    """What ``pip install .`` puts in site-packages, by pyproject.toml's rules: the packages that
    [tool.setuptools.packages.find] includes (their modules) and the files of [tool.setuptools.package-data], links
    followed (as setuptools copies them)."""
    import fnmatch
    import tomllib

    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = setup["packages"]["find"]["include"]
    data = setup.get("package-data", {})
    for init in ROOT.glob("*/**/__init__.py"):
        pkg_dir = init.parent
        name = ".".join(pkg_dir.relative_to(ROOT).parts)
        if not any(fnmatch.fnmatch(name, pat) for pat in include):
            continue
        files = list(pkg_dir.glob("*.py")) + [f for pat in data.get(name, []) for f in pkg_dir.glob(pat)]
        for f in files:
            target = dest / f.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)


def test_installed_package_checks_from_another_folder(tmp_path, cli_env):
    """After a plain install (no source tree on the path) ``hmc check`` finds every shipped reference from any
    folder, lists them, and runs them all."""
    import subprocess
    import sys

    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    _installed_copy(site)
    elsewhere.mkdir()
    env = dict(cli_env, PYTHONPATH=str(site))
    env.pop("HMC_CHECKS_DIR", None)
    shipped = sorted(p.stem for p in (ROOT / "hmc" / "checks").glob("*.toml"))
    assert shipped and not (ROOT / "runs" / "checks").exists()        # one copy: the package's

    def hmc(*args):
        return subprocess.run([sys.executable, "-m", "hmc", *args], capture_output=True, text=True, cwd=elsewhere,
                              env=env, timeout=600)

    r = hmc("check", "--list")
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == shipped
    r = hmc("check")
    assert r.returncode == 0, r.stderr
    for name in shipped:
        assert f"{name}: computed in" in r.stdout
    assert "FAIL" not in r.stdout and re.search(r"hmc check: [1-9][0-9]* values, 0 failed", r.stdout), r.stdout


@pytest.mark.parametrize("args", [["check"], ["check", "--list"]])
def test_no_references_is_a_failure(tmp_path, monkeypatch, capsys, args):
    """A check that finds nothing to run fails (exit 1, one line naming the folder), never '0 values, 0 failed'."""
    monkeypatch.setenv("HMC_CHECKS_DIR", str(tmp_path))
    assert main(args) == 1
    out = capsys.readouterr()
    assert "0 values" not in out.out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "no reference decks" in lines[0] and str(tmp_path) in lines[0], out.err
