"""Run verl's real trainer on a CPU: a dry run of a verl launch before the cluster, and tokencredit's CI.

Stock verl 0.9 cannot train without a GPU: it has no CPU platform (it falls back to CUDA and nccl)
and no rollout backend that runs on a CPU (vLLM, SGLang and TensorRT-LLM only). Importing this package
in every verl process, which ``VERL_USE_EXTERNAL_MODULES=tokencredit.integrations.verl.local`` does
at ``import verl`` (the variable reaches a local Ray cluster's workers through the environment),
provides both through verl's own extension points, without editing verl (`hooks.install`, run at import;
like any module under `tokencredit.integrations.verl`, it loads the verl plugin first):

- the CPU platform (`platform.PlatformCPU`), registered in verl's ``PlatformRegistry`` as
  ``tc_cpu`` and selected with ``set_platform``: device "cpu", gloo, logical Ray GPUs;
- the ``hf`` rollout backend (`rollout`): a Hugging Face model in a Ray actor serving verl's
  token-in / token-out ``generate``, registered in ``RolloutReplicaRegistry`` and in the rollout
  registry of ``verl.workers.rollout.base`` (``actor_rollout_ref.rollout.name=hf``);
- three fixes for verl 0.9.1 on this stack: gloo as the default backend of
  ``initialize_global_process_group_ray`` (its default ``cpu:gloo,<device>:<backend>`` names the CPU
  twice), ``is_trl_available`` answering whether TRL still has the value-head class verl imports
  (TRL 1.x removed it; `tokencredit.integrations.verl.compat`, which the entry-point plugin
  applies too), and ``VERL_ENGINE_DEVICE=cuda`` so that verl finds its FSDP engine, which it
  registers for CUDA only.

``python -m tokencredit.integrations.verl.local [overrides]`` (``__main__``) runs
``verl.trainer.main_ppo`` with the keys a CPU run needs (``__main__.CPU_KEYS``) and, with
``--toy DIR``, the embedded toy model on toy arithmetic data (`toy`). What it is for: checking
that a launch configuration, a reward function or a tokencredit estimator runs through verl's whole
trainer (Ray, FSDP2, agent loop, reward loop, TransferQueue) for a step or two. What it is not for:
speed or results: rollouts are served one request at a time and training is FSDP2 over gloo. See
docs/integrations.md ("Dry run on a CPU").

Modules: `hooks` (what importing this package installs), `platform` (the CPU platform), `rollout` (the
``hf`` rollout backend), `sampling` (its token sampler), `toy` (the toy model and data of ``--toy``),
`__main__` (the launcher).
"""

from tokencredit.integrations.verl.local.hooks import (
    ENGINE_DEVICE,
    SUPPORTED_VERSIONS,
    check_version,
    install,
)

__all__ = ["ENGINE_DEVICE", "SUPPORTED_VERSIONS", "check_version", "install"]
