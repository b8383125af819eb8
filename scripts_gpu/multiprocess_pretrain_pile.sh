#!/usr/bin/env bash
# One process per GPU on one node (the layout SLURM uses across nodes), started by hand:
# usage: multiprocess_pretrain_pile.sh SIZE PREC NUM_GPUS BSIZE_PER_GPU LOGDIR MODEL_DIR [extra gin flags]
# Each process sees one GPU; jax.distributed joins them through 127.0.0.1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"; source "$here/xla_flags.sh"
if [ $# -lt 6 ]; then sed -n 2,4p "$0" >&2; exit 2; fi
SIZE=$1 PREC=$2 NUM_GPUS=$3 BSIZE_PER_GPU=$4 LOGDIR=$5 MODEL_DIR=$6
check_size "$SIZE"; make_switches "$PREC" 0 0 0
mkdir -p "$LOGDIR"
PORT=${PORT:-12355}
for ((i = 0; i < NUM_GPUS; i++)); do
  CUDA_VISIBLE_DEVICES=$i python3 -m t5lite.train \
    --coordinator_address=127.0.0.1:${PORT} --process_count=${NUM_GPUS} --process_index=$i \
    --gin_file="configs/${SIZE}_pile_pretrain.gin" \
    --gin.MODEL_DIR=\"${MODEL_DIR}\" \
    --gin.BATCH_SIZE=$((BSIZE_PER_GPU * NUM_GPUS)) \
    --gin.ICI_MESH_SHAPE=[1,1,1] --gin.DCN_MESH_SHAPE=[-1,1,1] \
    ${GIN_SWITCHES} "${@:7}" > "${LOGDIR}/proc_${i}.log" 2>&1 &
done
wait
