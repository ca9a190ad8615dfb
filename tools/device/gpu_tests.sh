# Sourced by the device scripts: gpu_tests STEP SECONDS TAIL FILE...: the GPU tests of FILE... (pytest -m gpu, stop at
# the first failure) under a timeout of SECONDS, the last TAIL lines of their output, then one line
# "PASS|TIMEOUT|FAIL STEP gpu tests".
gpu_tests() {
    local step=$1 seconds=$2 lines=$3
    shift 3
    timeout "$seconds" python3 -m pytest -q -x -m gpu -p no:cacheprovider "$@" 2>&1 | tail -"$lines"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" = 0 ]; then echo "PASS $step gpu tests"; elif [ "$rc" = 124 ]; then
        echo "TIMEOUT $step gpu tests ($seconds s)"; else echo "FAIL $step gpu tests (rc $rc)"; fi
}
