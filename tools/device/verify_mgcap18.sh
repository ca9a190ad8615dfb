#!/bin/bash
# mgcap18 (issues 17/18): device-resident coarse levels. Budget 200 s. Run from the repository root.
export PYTHONPATH=. 
echo "== GPU multigrid tests (graph tests included)"
timeout 55 python3 -m pytest -q -x -m gpu tests/solvers/test_multigrid_graph.py tests/solvers/test_multigrid_kernels.py tests/solvers/test_multigrid_precision.py tests/solvers/test_multigrid_half.py 2>&1 | tail -15
echo "PYTEST rc=${PIPESTATUS[0]}"
echo "== 16^4 double: graph off/on"
timeout 35 python3 tools/device/mg_graph_bench.py 16 double 2 2>&1 | grep -v "^\s*$" | tail -34
echo "== 32^4 half: graph off/on (the issue's measurement: level 3 was 2.35 s)"
timeout 105 python3 tools/device/mg_graph_bench.py 32 half 2 2>&1 | grep -E "SETUP|SOLVE|level|GRAPH|PASS|FAIL|RESULT|Error|error|Warning" | tail -34
echo "DONE"
