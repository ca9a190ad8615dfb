#!/bin/bash
# ncu_kernels NAME LAUNCHES COMMAND...: COMMAND under Nsight Compute, timing each kernel launch of the region the
# program brackets by cupy.cuda.profiler.start/stop (at most LAUNCHES of them; ncu serializes them and adds ~1 ms
# a launch), then the launches summed kernel by kernel (bench.ncu). Writes $OUT/NAME.csv and $OUT/NAME.txt.
# Regions that exist: tools/device/mg_graph_bench.py with MG_CUDA_PROFILE=1 (one multigrid solve, graphs on) and
# tools/profile_rhmc_ops.py --cuda-profile N (trajectory N of hmc run). From the repository root, e.g.
#   MG_CUDA_PROFILE=1 bash tools/device/ncu_kernels.sh mg16 20000 python3 tools/device/mg_graph_bench.py 16 double 1
#   bash tools/device/ncu_kernels.sh traj16 60000 python3 tools/profile_rhmc_ops.py 16 --trajectories 2 --cuda-profile 2
export PYTHONPATH=. PYTHONUNBUFFERED=1
name=$1 count=$2
shift 2
OUT=${OUT:-/tmp}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu_kernels: no ncu on this machine"; exit 2; }
timeout ${NCU_T:-300} "$NCU" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
    --page raw --launch-count "$count" --log-file "$OUT/$name.csv" "$@" 2>&1 | grep -v "^==PROF==" | tail -${NCU_TAIL:-20}
echo "ncu_kernels $name: rc ${PIPESTATUS[0]}"
python3 -m bench.ncu "$OUT/$name.csv" --top ${NCU_TOP:-30} | tee "$OUT/$name.txt"
