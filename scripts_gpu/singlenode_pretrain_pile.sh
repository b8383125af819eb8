#!/usr/bin/env bash
# Pretrain T5 v1.1 on Pile-style text on one node (one process, all local GPUs).
# usage: singlenode_pretrain_pile.sh SIZE PREC NUM_GPUS BSIZE_PER_GPU LOGDIR MODEL_DIR \
#          [GRAD_ACCUM=1] [ENABLE_FP8=0] [TRANSPOSE_BS=0] [FUSE_QKV=0] [PACK=0]
# e.g.   singlenode_pretrain_pile.sh large bf16 8 32 /logs/large /ckpt/large 1 1 0 1
# Data: T5LITE_PILE_DIR (jsonl / jsonl.zst) and VOCABULARY_PATH, see docs/data.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"; source "$here/xla_flags.sh"
if [ $# -lt 6 ]; then sed -n 2,6p "$0" >&2; exit 2; fi
SIZE=$1 PREC=$2 NUM_GPUS=$3 BSIZE_PER_GPU=$4 LOGDIR=$5 MODEL_DIR=$6
GRAD_ACCUM=${7:-1} ENABLE_FP8=${8:-0} TRANSPOSE_BS=${9:-0} FUSE_QKV=${10:-0} PACK=${11:-0}
check_size "$SIZE"
make_switches "$PREC" "$ENABLE_FP8" "$TRANSPOSE_BS" "$FUSE_QKV"
mkdir -p "$LOGDIR"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $((NUM_GPUS - 1)))}
BATCH_SIZE=$((BSIZE_PER_GPU * NUM_GPUS * GRAD_ACCUM))
python3 -m t5lite.train \
  --gin_file="configs/${SIZE}_pile_pretrain.gin" \
  --gin.MODEL_DIR=\"${MODEL_DIR}\" \
  --gin.BATCH_SIZE=${BATCH_SIZE} \
  --gin.NUM_MICROBATCHES=${GRAD_ACCUM} \
  --gin.ICI_MESH_SHAPE=[-1,1,1] \
  --gin.PACK=$([ "$PACK" = 1 ] && echo True || echo False) \
  ${GIN_SWITCHES} "${@:12}" 2>&1 | tee "${LOGDIR}/${SIZE}_${PREC}_gpu${NUM_GPUS}_bs${BSIZE_PER_GPU}.log"
