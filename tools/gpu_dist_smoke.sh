#!/usr/bin/env bash
# Device check of the distributed GPU hop in one call: the single-rank GPU staggered tests (the hop kernel source is
# shared), then tools/gpu_transports.sh distall (distributed tests on 2 and 4 ranks under MPS, then the benchmark).
set -uo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
timeout ${SINGLE_BUDGET:-90} python3 -m pytest tests/solvers/test_gpu_staggered.py -q -x -p no:cacheprovider 2>&1 \
  | tail -5 | tee "$OUT/single.txt"
if [ -n "${ENGINE_TESTS:-}" ]; then   # the GPU transport tests touched by the engine (receive chains)
  MODE=tests TEST_BUDGET=${ENGINE_BUDGET:-150} bash tools/gpu_transports.sh tests -k "$ENGINE_TESTS"
  mv "$OUT/log.txt" "$OUT/log_engine.txt"; mv "$OUT/reports.tgz" "$OUT/reports_engine.tgz" 2>/dev/null
fi
bash tools/gpu_transports.sh ${MODE:-distall} "$@"
