"""bench.ncu: Nsight Compute's CSV (both pages, as ncu 2025 writes them) summed kernel by kernel."""
from __future__ import annotations

import pytest

from bench import ncu

RAW = '''==PROF== Connected to process 4242 (/usr/bin/python3.12)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum"
"","","","","","","","","","","","usecond"
"0","4242","python3.12","127.0.0.1","mg_stencil_half","1","7","(128, 1, 1)","(192, 1, 1)","0","9.0","12.50"
"1","4242","python3.12","127.0.0.1","mg_small_lstsq","1","7","(32, 1, 1)","(1, 1, 1)","0","9.0","40.00"
"2","4242","python3.12","127.0.0.1","mg_stencil_half","1","7","(128, 1, 1)","(192, 1, 1)","0","9.0","13.50"
==PROF== Disconnected from process 4242
'''

DETAILS = '''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python3","h","hop_many","1","7","(128, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","1.25"
"1","1","python3","h","ms_update_single","1","7","(128, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","12,345"
"1","1","python3","h","ms_update_single","1","7","(128, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum","byte","999"
'''


def test_raw_page_with_its_units_row():
    kernels = ncu.by_kernel(ncu.launches(RAW))
    assert [(k.name, k.launches) for k in kernels] == [("mg_small_lstsq", 1), ("mg_stencil_half", 2)]
    assert kernels[1].total_s == pytest.approx(26e-6) and kernels[1].mean_us == pytest.approx(13.0)


def test_details_page_takes_the_duration_rows_only():
    got = dict(ncu.launches(DETAILS))
    assert got == pytest.approx({"hop_many": 1.25e-3, "ms_update_single": 12.345e-6})


def test_table_lists_the_top_kernels_and_sums_the_rest():
    text = ncu.table(ncu.by_kernel(ncu.launches(RAW)), top=1)
    lines = text.splitlines()
    assert lines[1].startswith("mg_small_lstsq") and "60.6%" in lines[1]
    assert lines[2].startswith("(1 other kernels)") and "39.4%" in lines[2]
    assert lines[3].startswith("all kernels") and lines[3].split()[-2:] == ["3", "0.066"]


def test_bad_input_gets_one_line(tmp_path, capsys):
    f = tmp_path / "x.csv"
    f.write_text("a,b\n1,2\n")
    assert ncu.main([str(f)]) == 2
    assert "not an ncu CSV" in capsys.readouterr().err
    f.write_text(RAW.replace("usecond", "fortnight"))
    assert ncu.main([str(f)]) == 2
    assert "unknown duration unit 'fortnight'" in capsys.readouterr().err
    f.write_text(RAW.splitlines()[1] + "\n")
    assert ncu.main([str(f)]) == 1
    assert "no kernel launches" in capsys.readouterr().err
    f.write_text(RAW)
    assert ncu.main([str(f), "--top", "5"]) == 0
    assert "mg_stencil_half" in capsys.readouterr().out
