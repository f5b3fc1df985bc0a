#!/usr/bin/env bash
# tokencredit inside verl 0.9: Qwen2.5-Math-1.5B on GSM8K (validation on MATH-500), G = 8, one node of 8 GPUs.
#
#   bash examples/verl/run_qwen_math.sh tc_ktae              # KTAE on stock verl (v1 trainer)
#   bash examples/verl/run_qwen_math.sh tc_delta             # DelTA: needs the actor extension
#   bash examples/verl/run_qwen_math.sh tc_arca              # ARCA: actor extension + LoRA
#   bash examples/verl/run_qwen_math.sh tc_delta trainer.total_epochs=2   # extra verl overrides
#
# Data: python examples/verl_make_parquet.py --out ~/data/tokencredit (tokencredit's shipped GSM8K
# train split and MATH-500 as verl parquet; nothing is downloaded). See docs/integrations.md.
set -euo pipefail
ESTIMATOR=${1:-tc_ktae}
shift || true
DATA=${DATA:-$HOME/data/tokencredit}
MODEL=${MODEL:-Qwen/Qwen2.5-Math-1.5B}
HERE=$(cd "$(dirname "$0")/../.." && pwd)

# Nothing to load by hand: installing tokencredit registers its estimators and losses in verl's
# `verl.plugins` entry-point group, which every process (driver and Ray workers) loads at `import verl`.
EXTRA=()
LR=1e-6
case "$ESTIMATOR" in
  tc_delta | tc_arca | tc_policy_divergence | tc_gcpo)
    # Signals verl's actor does not compute (hidden states, adapter-free pass, negative prompt):
    # tokencredit's actor extension, in the driver and the workers, on the legacy trainer.
    export TOKENCREDIT_VERL_ACTOR_SIGNALS=1
    EXTRA+=(+ray_kwargs.ray_init.runtime_env.env_vars.TOKENCREDIT_VERL_ACTOR_SIGNALS=1 trainer.use_v1=False)
    ;;
esac
case "$ESTIMATOR" in
  tc_arca | tc_policy_divergence)  # compare the policy with and without its LoRA adapter
    EXTRA+=(actor_rollout_ref.model.lora_rank=32 actor_rollout_ref.model.lora_alpha=64)
    LR=1e-5
    ;;
esac

python -m verl.trainer.main_ppo \
    algorithm.adv_estimator="$ESTIMATOR" \
    algorithm.use_kl_in_reward=False \
    data.train_files="$DATA/gsm8k_train.parquet" \
    data.val_files="$DATA/math500.parquet" \
    data.train_batch_size=128 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=$LR \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    reward.custom_reward_function.path="$HERE/examples/verl_math_reward.py" \
    reward.custom_reward_function.name=compute_score \
    trainer.logger='["console"]' \
    trainer.project_name=tokencredit \
    trainer.experiment_name="qwen2.5-math-1.5b-gsm8k-$ESTIMATOR" \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.test_freq=10 \
    trainer.save_freq=-1 \
    trainer.total_epochs=1 \
    "${EXTRA[@]}" "$@"
