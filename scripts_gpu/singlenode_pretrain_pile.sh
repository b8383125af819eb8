#!/usr/bin/env bash
# Pretrain on Pile-style text on one node (one process, all local GPUs).
# usage: singlenode_pretrain_pile.sh MODEL PREC NUM_GPUS BSIZE_PER_GPU LOGDIR MODEL_DIR
#          [GRAD_ACCUM=1] [ENABLE_FP8=0] [TRANSPOSE_BS=0] [FUSE_QKV=0] [PACK=0] [GIN_FLAG...]
#   MODEL: a recipe configs/MODEL_pile_pretrain.gin: a T5 v1.1 size tiny|small|base|large|xl|xxl
#   (tiny: a toy for a CPU), or gpt126m, gpt175b, llama2_7b, llama2_70b, glam126m_64e,
#   glam64b_64e, mixtral8x7b, switch_base8; PREC bf16|fp32, switches 0|1; the global batch is
#   BSIZE_PER_GPU * NUM_GPUS * GRAD_ACCUM; GIN_FLAGs (--gin.X=Y) go last.
# e.g.   singlenode_pretrain_pile.sh large bf16 8 32 /logs/large /ckpt/large   # the recipe as shipped
#        singlenode_pretrain_pile.sh llama2_7b bf16 8 4 /logs/l7 /ckpt/l7 8     # 8 microbatches
# Data: PILE_DIR / VOCABULARY_PATH as --gin flags or T5LITE_PILE_DIR /
# T5LITE_VOCABULARY_PATH in the environment (docs/data.md). Run from the repository root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"
if wants_help "$@"; then usage; exit 0; fi
[ $# -ge 6 ] || exit_with_usage "expected at least 6 arguments, got $#"
source "$here/xla_flags.sh"
SIZE=$1 PREC=$2 NUM_GPUS=$3 BSIZE_PER_GPU=$4 LOGDIR=$5 MODEL_DIR=$6
GRAD_ACCUM=${7:-1} ENABLE_FP8=${8:-0} TRANSPOSE_BS=${9:-0} FUSE_QKV=${10:-0} PACK=${11:-0}
check_model "$SIZE" || exit_with_usage
for n in NUM_GPUS BSIZE_PER_GPU GRAD_ACCUM; do check_count "$n" "${!n}" || exit_with_usage; done
make_switches "$PREC" "$ENABLE_FP8" "$TRANSPOSE_BS" "$FUSE_QKV" || exit_with_usage
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
