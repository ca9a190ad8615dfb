"""The helpers of the suite ``mg_gpu_dist`` (bench/mg_dist.py) on the CPU: the made field is a MILC file that reads
back with a plaquette below 1 after one trajectory, and the per-level summary lands in the split file and the JSON
list of solves."""
from __future__ import annotations

import json


def test_field_is_a_milc_file(tmp_path, capsys):
    from bench.mg_dist import make_field
    from lattice.gauge import plaquette
    from lattice.io import read_gauge

    path = tmp_path / "f.milc"
    make_field(str(path), 4, 1, "numpy")
    out = capsys.readouterr().out
    assert out.startswith("trajectory 1: plaquette ") and f"wrote {path}" in out
    u, info = read_gauge(str(path), backend="numpy")
    ps, pt = plaquette(u)
    assert info["dims"] == (4, 4, 4, 4) and info["checksums"]["ok"]
    assert 0.3 < (ps + pt) / 6 < 1.0


def test_summaries_append(tmp_path, capsys):
    from bench.mg_dist import summarize

    solve = tmp_path / "solve.json"
    split, solves = tmp_path / "split.txt", tmp_path / "solves.json"
    for label, it in (("1 rank", 7), ("2 rank(s), shm", 8)):
        solve.write_text(json.dumps({"true_residual": 3e-9, "mg": {"outer_iters": it, "setup_time_s": 1.5,
                                                                   "solve_time_s": 0.25, "level_lines": ["L0 x"]}}))
        summarize(str(solve), label, str(split), str(solves))
    assert split.read_text().splitlines() == [
        "1 rank: 7 outer iterations, true residual 3.00e-09, set-up 1.50 s, solve 0.250 s", "  L0 x",
        "2 rank(s), shm: 8 outer iterations, true residual 3.00e-09, set-up 1.50 s, solve 0.250 s", "  L0 x"]
    rows = json.loads(solves.read_text())
    assert [r["label"] for r in rows] == ["1 rank", "2 rank(s), shm"] and rows[1]["mg"]["outer_iters"] == 8
    assert "1 rank: 7 outer iterations" in capsys.readouterr().out
