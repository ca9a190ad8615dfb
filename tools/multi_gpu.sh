#!/usr/bin/env bash
# Issue 9 on a multi-GPU host (one rank per GPU; NVLink multicast off: NCCL_NVLS_ENABLE=0), every run in stages:
#   halo     halo latency and bandwidth per transport (mpi, event, stream_gated, + stream_gated graph replay), ring of
#            2, 4, 8 ranks: comms.cuda.bench, faces of L^3 colour vectors, L = 2 8 16 32 (latency) 64 96 (bandwidth:
#            12 and 42 MiB faces) -> halo_<n>gpu.json
#   s32      strong scaling at 32^4 over 1, 2, 4, 8 GPUs: halo, Dslash, CG; mpi, event, stream_gated, + CUDA-graph rows
#   r32      strong scaling of one short HISQ 2+1+1 RHMC trajectory at 32^4 (hmc scaling --what rhmc: 3G1F, RHMC_STEPS
#            steps of tau 0.05); event, stream_gated (RHMC_TRANSPORTS; mpi stages every face through the host: one
#            trajectory would take minutes)
#   s48      strong scaling at 48^4: Dslash, CG; mpi, event, stream_gated, + CUDA-graph rows
#   clique2  32^4 halo, Dslash, CG with HMC_P2P_FAKE_CLIQUE=2 (links between cliques of 2 ranks fall back to MPI) on
#            the rank counts above 2 (needs NGPU >= 4); event, stream_gated (no graph rows: capture needs every link
#            stream_gated)
#   clique4  the same with cliques of 4 ranks (rank counts above 4: needs NGPU >= 8)
#   mask     32^4 halo, Dslash, CG with HMC_P2P_MASK=$MASK (bits x=1 y=2 z=4 t=8; default 8: the t links on MPI,
#            COMMS.md "Study hooks"); event, stream_gated
# Every study is a results file of `hmc scaling` with its report and plots (answers checked against the 1-rank run).
# Each device call may last at most 600 s: the script stops starting stages when less than MIN_STAGE seconds of
# BUDGET are left, gives each stage min(its limit T_<STAGE>, what is left), and keeps its files in WORK; a stage cut
# off at its limit is resumed (hmc scaling --resume) by the next call on the same (warm) machine, a finished stage is
# skipped (FRESH=1 redoes the named stages; needed too after a change of a setting that changes the measurement).
# The study's progress lines (times, answers) go to stdout, everything to the log. Files into $OUT: log.txt and
# multi_gpu.tar.gz (all of WORK: *.h5, reports, plots, halo_*.json, stages.txt).
#
#   usage (repository root, on the device):  bash tools/multi_gpu.sh                (all stages, priority order)
#            STAGES="r32 s48" bash tools/multi_gpu.sh      STAGES=halo,s32 ...       (some stages)
#            DRY_RUN=1 NGPU=8 bash tools/multi_gpu.sh      (print the commands only, no GPU needed)
#   env: STAGES, NGPU (default: all visible GPUs), BUDGET (560), MIN_STAGE (45), T_HALO T_S32 T_R32 T_S48 T_CLIQUE2
#        T_CLIQUE4 T_MASK (stage limits, s; T_HALO_RUN per ring), L32 (32), L48 (48), MASK (8), REPEATS (3),
#        RHMC_REPEATS (2), RHMC_STEPS (4), RHMC_TRANSPORTS, S48_TRANSPORTS, HALO_SIZES, WORK (/tmp/mgpu), FRESH,
#        DRY_RUN, HMC_GIT_COMMIT (the commit to record where the tree has no .git)
#   CPU check (no GPU): HMC_BACKEND=numpy NGPU=2 WORK=/tmp/mg_cpu OUT=/tmp/mg_out bash tools/multi_gpu.sh (L32=4 L48=8)
#        runs every stage on NumPy ranks with the CPU transports (mpi, shm; shm stands in for the peer-to-peer ones,
#        the clique and mask hooks apply to it too), no graph rows, the halo stage through `hmc bench halo`.
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_osc=^ucx
export HMC_COMMS_TIMEOUT=${HMC_COMMS_TIMEOUT:-30}
unset HMC_P2P_MASK HMC_P2P_FAKE_CLIQUE HMC_P2P_TRANSPORT HMC_GRID    # the stages set what they study themselves

START=$(date +%s)
ALL="halo s32 r32 s48 clique2 clique4 mask"
STAGES=${STAGES:-$ALL}; STAGES=${STAGES//,/ }
BUDGET=${BUDGET:-560}; MIN_STAGE=${MIN_STAGE:-45}; DRY=${DRY_RUN:-0}; FRESH=${FRESH:-0}
OUT=${OUT:-/tmp/out}; WORK=${WORK:-/tmp/mgpu}; LOG=$OUT/log.txt
PY=${PYTHON:-python3}; BACKEND=${HMC_BACKEND:-cupy}
MASK=${MASK:-8}
REPEATS=${REPEATS:-3}; RHMC_REPEATS=${RHMC_REPEATS:-2}; RHMC_STEPS=${RHMC_STEPS:-4}
if [ "$BACKEND" = cupy ]; then
  NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  ALL_T="mpi event stream_gated"; P2P_T="event stream_gated"; GRAPH="--graph"
  RHMC_T=${RHMC_TRANSPORTS:-event stream_gated}; HALO_SIZES=${HALO_SIZES:-2 8 16 32 64 96}
  L32=${L32:-32}; L48=${L48:-48}
else                                              # the CPU check: NumPy ranks, CPU transports
  NGPU=${NGPU:-2}
  ALL_T="mpi shm"; P2P_T="shm"; GRAPH=""
  RHMC_T=${RHMC_TRANSPORTS:-mpi shm}; HALO_SIZES=${HALO_SIZES:-2 4 8}
  L32=${L32:-4}; L48=${L48:-8}                   # small lattices: a check of the stages, not a measurement
fi
S48_T=${S48_TRANSPORTS:-$ALL_T}
mkdir -p "$OUT" "$WORK"
say() { echo "== $* ($(date -u +%T))" | tee -a "$LOG"; }
for s in $STAGES; do
  case " $ALL " in *" $s "*) ;; *) say "unknown stage '$s': use some of: $ALL"; exit 2 ;; esac
done
if ! [ "$NGPU" -ge 2 ] 2>/dev/null; then
  say "NGPU=$NGPU: these runs need at least 2 GPUs (one rank per GPU); set NGPU or run on a multi-GPU kind"; exit 2
fi
RANKS=""; n=1; while [ "$n" -le "$NGPU" ]; do RANKS="$RANKS $n"; n=$((n * 2)); done
RANKS=${RANKS# }
above() { local k=$1 out="" r; for r in $RANKS; do [ "$r" -gt "$k" ] && out="$out $r"; done; echo "${out# }"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
NOT_RUN=""; AGAIN=""; SKIPPED=""

# the limit a stage may run under now: min(T_<STAGE> or its default, what is left of BUDGET less 15 s for the tar);
# empty (the stage is not started) when that is under MIN_STAGE
limit_for() {
  local var="T_${1^^}" def=$2 l
  l=${!var:-$def}
  local rest=$(($(left) - 15))
  [ "$rest" -lt "$l" ] && l=$rest
  [ "$l" -lt "$MIN_STAGE" ] && return 1
  echo "$l"
}

# run a command under a time limit (SIGINT first: hmc scaling then records what it has and stops), output to the log
run_limited() {
  local limit=$1; shift
  if [ "$DRY" = 1 ]; then
    echo "[dry run, limit ${limit}s] $(printf '%q ' "$@")" | tee -a "$LOG"
    return 0
  fi
  timeout --signal=INT --kill-after=20 "$limit" "$@" >>"$LOG" 2>&1
}

record() {     # stage rc seconds [note]: stages.txt; a finished stage is marked done (hmc scaling 0: all ok, 1: some
  local name=$1 rc=$2 t0=$3 note=${4:-}        # configuration failed, recorded in the file)
  echo "$name rc=$rc $(($(date +%s) - t0))s $note" >>"$WORK/stages.txt"
  if [ "$DRY" = 1 ]; then
    :
  elif [ "$rc" = 0 ] || [ "$rc" = 1 ]; then
    : >"$WORK/$name.done"
  else
    AGAIN="$AGAIN $name"
  fi
  say "$name: rc=$rc $note"
}

# one hmc scaling study: scaling NAME LIMIT CONFIG_TIMEOUT [VAR=VALUE ...] -- ARGS (resumed if its file exists)
scaling() {
  local name=$1 limit=$2 cfg_t=$3; shift 3
  local envs=() t0; t0=$(date +%s)
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local h5=$WORK/$name.h5 rep=$WORK/$name flag=() from
  [ -f "$h5" ] && flag=(--resume)
  from=$(($(wc -l <"$LOG") + 1))
  run_limited "$limit" env "${envs[@]}" "$PY" -m hmc --backend "$BACKEND" scaling "$@" --timeout "$cfg_t" \
    -o "$h5" --report-dir "$rep" "${flag[@]}"
  local rc=$?
  tail -n +"$from" "$LOG" | grep -E '^\[ *[0-9]+/[0-9]+\]'          # the study's progress lines: times, answers
  if [ "$DRY" != 1 ] && [ -f "$h5" ]; then
    "$PY" -m hmc scaling report "$h5" -o "$rep" >>"$LOG" 2>&1
  fi
  local note=""
  case $rc in 124|130|137) note="(cut off at ${limit}s: run the stage again to resume)" ;; esac
  record "$name" "$rc" "$t0" "$note"
}

stage_halo() {
  local limit=$1 t0 n rc=0 end; t0=$(date +%s); end=$((t0 + limit))
  for n in $(above 1); do
    local json=$WORK/halo_${n}gpu.json
    [ -s "$json" ] && { say "halo, $n ranks: $json exists"; continue; }
    local l=$((end - $(date +%s))); [ "$l" -gt "${T_HALO_RUN:-120}" ] && l=${T_HALO_RUN:-120}
    [ "$l" -lt 20 ] && { rc=124; say "halo, $n ranks: not run (stage limit)"; continue; }
    say "halo latency and bandwidth, ring of $n ranks (faces L = $HALO_SIZES)"
    if [ "$BACKEND" = cupy ]; then
      # shellcheck disable=SC2086
      run_limited "$l" mpiexec --oversubscribe -n "$n" "$PY" -m comms.cuda.bench --transport mpi,event,stream_gated \
        --sizes $HALO_SIZES --reps 100 --repeats 3 --graph --graph-reps 200 --json "$json" \
        --label "$n ranks, one GPU each"
    else
      # shellcheck disable=SC2086
      run_limited "$l" sh -c "mpiexec --oversubscribe -n $n $PY -m hmc bench halo --transport mpi,shm \
        --sizes $HALO_SIZES --element vector --min-time 0.05 --json > $json.tmp && mv $json.tmp $json"
    fi
    local r=$?; [ "$r" != 0 ] && rc=$r
  done
  record halo "$rc" "$t0"
}

stage_clique() {
  local k=$1 limit=$2 ns; ns=$(above "$k")
  if [ -z "$ns" ]; then
    SKIPPED="$SKIPPED clique$k"; say "clique$k: skipped, needs more than $k GPUs (NGPU=$NGPU)"; return
  fi
  # shellcheck disable=SC2086
  scaling "clique$k" "$limit" 120 HMC_P2P_FAKE_CLIQUE="$k" -- --lattice "${L32}^4" --ranks 1 $ns \
    --transports $P2P_T --what halo,dslash,cg --repeats "$REPEATS" --min-time 0.1
}

say "multi_gpu.sh: stages '$STAGES', $NGPU GPU(s) (ranks $RANKS), backend $BACKEND, budget ${BUDGET}s, work $WORK"
[ "$BACKEND" = cupy ] && [ "$DRY" != 1 ] && { nvidia-smi -L >>"$LOG" 2>&1; nvidia-smi topo -m >>"$LOG" 2>&1; }
for s in $STAGES; do
  if [ "$FRESH" = 1 ] && [ "$DRY" != 1 ]; then
    rm -rf "${WORK:?}/$s" "$WORK/$s.h5" "$WORK/$s.done"
    [ "$s" = halo ] && rm -f "$WORK"/halo_*gpu.json
  fi
  [ -f "$WORK/$s.done" ] && { say "$s: done in an earlier call (FRESH=1 redoes it)"; continue; }
  case $s in halo) def=240 ;; s32) def=330 ;; r32) def=480 ;; s48) def=300 ;; mask) def=200 ;; *) def=180 ;; esac
  if ! lim=$(limit_for "$s" "$def"); then
    NOT_RUN="$NOT_RUN $s"; say "$s: not started ($(left)s of the budget left)"; continue
  fi
  say "stage $s (limit ${lim}s)"
  # shellcheck disable=SC2086
  case $s in
    halo) stage_halo "$lim" ;;
    s32) scaling s32 "$lim" 120 -- --lattice "${L32}^4" --ranks $RANKS --transports $ALL_T $GRAPH \
           --what halo,dslash,cg --repeats "$REPEATS" --min-time 0.1 ;;
    r32) scaling r32 "$lim" 300 -- --lattice "${L32}^4" --ranks $RANKS --transports $RHMC_T --what rhmc \
           --repeats "$RHMC_REPEATS" --traj-steps "$RHMC_STEPS" --halo-sizes ;;
    s48) scaling s48 "$lim" 150 -- --lattice "${L48}^4" --ranks $RANKS --transports $S48_T $GRAPH \
           --what dslash,cg --repeats "$REPEATS" --min-time 0.1 ;;
    clique2) stage_clique 2 "$lim" ;;
    clique4) stage_clique 4 "$lim" ;;
    mask) scaling mask "$lim" 120 HMC_P2P_MASK="$MASK" -- --lattice "${L32}^4" --ranks $RANKS --transports $P2P_T \
            --what halo,dslash,cg --repeats "$REPEATS" --min-time 0.1 ;;
  esac
done

if [ "$DRY" != 1 ]; then
  tar -C "$WORK" --exclude='*.tmp*' -czf "$OUT/multi_gpu.tar.gz" . 2>>"$LOG"
fi
rest=$(echo "$AGAIN $NOT_RUN" | xargs)
[ -n "$SKIPPED" ] && say "skipped (too few GPUs):$SKIPPED"
[ -n "$rest" ] && say "not finished in this call: $rest; next call: STAGES=\"$rest\" bash tools/multi_gpu.sh"
say "done in $(($(date +%s) - START))s: $OUT/log.txt$([ "$DRY" = 1 ] || echo ", $OUT/multi_gpu.tar.gz")"
