#!/usr/bin/env bash
# Pretrain on one node with one process per GPU (the layout SLURM uses across nodes),
# started by hand; jax.distributed joins the processes through 127.0.0.1:PORT.
# usage: multiprocess_pretrain_pile.sh SIZE PREC NUM_GPUS BSIZE_PER_GPU LOGDIR MODEL_DIR [GIN_FLAG...]
#   SIZE (the MODEL of singlenode_pretrain_pile.sh: any configs/SIZE_pile_pretrain.gin) and
#   PREC as there; global batch BSIZE_PER_GPU * NUM_GPUS.
#   Environment: PORT (12355), the coordinator's port; GRACE_SECONDS (90). Process i logs
#   to LOGDIR/proc_<i>.log. When one fails, this gives the others GRACE_SECONDS to end by
#   themselves (a lost peer ends them within --peer_timeout_seconds, 30), kills what is
#   left (a stopped process never ends), names the process that failed first for a reason
#   of its own, its log and the log's last line, and exits with its status. Run the same
#   command again to resume from the last checkpoint.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
if wants_help "$@"; then usage; exit 0; fi
[ $# -ge 6 ] || exit_with_usage "expected at least 6 arguments, got $#"
source "$here/xla_flags.sh"
SIZE=$1 PREC=$2 NUM_GPUS=$3 BSIZE_PER_GPU=$4 LOGDIR=$5 MODEL_DIR=$6
check_model "$SIZE" || exit_with_usage
for n in NUM_GPUS BSIZE_PER_GPU; do check_count "$n" "${!n}" || exit_with_usage; done
make_switches "$PREC" 0 0 0 || exit_with_usage
mkdir -p "$LOGDIR"
PORT=${PORT:-12355} GRACE_SECONDS=${GRACE_SECONDS:-90}
declare -A index_of
for ((i = 0; i < NUM_GPUS; i++)); do
  CUDA_VISIBLE_DEVICES=$i python3 -m t5lite.train \
    --coordinator_address=127.0.0.1:${PORT} --process_count=${NUM_GPUS} --process_index=$i \
    --gin_file="configs/${SIZE}_pile_pretrain.gin" \
    --gin.MODEL_DIR=\"${MODEL_DIR}\" \
    --gin.BATCH_SIZE=$((BSIZE_PER_GPU * NUM_GPUS)) \
    --gin.ICI_MESH_SHAPE=[1,1,1] --gin.DCN_MESH_SHAPE=[-1,1,1] \
    ${GIN_SWITCHES} "${@:7}" > "${LOGDIR}/proc_${i}.log" 2>&1 &
  index_of[$!]=$i
done
# After a failure the others get GRACE_SECONDS to end; then the process named is the
# first to fail for a reason of its own: not status 4, which t5lite gives a process that
# stopped because another was lost, nor one whose log ends with that line ("stops because
# process N ...").
declare -A process_of status_of
for pid in "${!index_of[@]}"; do process_of[$pid]=${index_of[$pid]}; done
order=() failed=""
while [ "${#index_of[@]}" -gt 0 ]; do
  rc=0; ended=""
  wait -n -p ended "${!index_of[@]}" || rc=$?
  unset "index_of[$ended]"; status_of[$ended]=$rc; order+=("$ended")
  if [ "$rc" -ne 0 ]; then failed=1; break; fi
done
if [ -n "$failed" ]; then
  for ((t = 0; t < GRACE_SECONDS; t++)); do
    [ -n "$(jobs -rp)" ] || break
    sleep 1
  done
  kill -9 "${!index_of[@]}" 2>/dev/null || true
  for pid in "${!index_of[@]}"; do
    rc=0; wait "$pid" || rc=$?; status_of[$pid]=$rc; order+=("$pid")
  done
  culprit="" echo_only=""
  for pid in "${order[@]}"; do
    rc=${status_of[$pid]}
    [ "$rc" -ne 0 ] || continue
    if [ "$rc" -eq 4 ] || tail -n 1 "${LOGDIR}/proc_${process_of[$pid]}.log" 2>/dev/null \
        | grep -q "stops because process"; then
      echo_only=${echo_only:-$pid}
    else
      culprit=${culprit:-$pid}
    fi
  done
  culprit=${culprit:-$echo_only}
  i=${process_of[$culprit]} status=${status_of[$culprit]}
  echo "error: process $i exited with status $status (its log: ${LOGDIR}/proc_${i}.log; last line: $(tail -n 1 "${LOGDIR}/proc_${i}.log" 2>/dev/null)); the others were given up to ${GRACE_SECONDS}s to end, then killed; run the same command to resume from the last checkpoint" >&2
  exit "$status"
fi
exit 0
