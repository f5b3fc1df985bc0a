"""The `hf` rollout backend: verl's server-based rollout served by a Hugging Face model on the CPU.

verl 0.9 generates through rollout *servers* (vLLM, SGLang, TensorRT-LLM: all GPU engines): the
agent loop sends token ids to a server's ``generate`` (a Ray actor method) and reads a `TokenOutput`;
the actor workers push new weights to the server after each update. This module implements the same
three roles for the CPU:

- `HFRolloutServer`: a Ray actor holding the model (``model.path``, in ``rollout.dtype``) that
  answers ``generate`` with `tokencredit.integrations.verl.local.sampling.sample` (KV cache,
  temperature / top-k / top-p, log-probs in ``rollout.logprobs_mode``) and reports
  ``extra_fields["global_steps"]`` (the weights' version, as verl's vLLM server does), plus the
  control methods verl calls on every server (sleep / wake-up / cache / abort: no-ops on a CPU);
- `HFReplica` (verl's ``RolloutReplica``, registered as ``hf`` in ``RolloutReplicaRegistry``):
  starts one server per replica, next to its first actor worker;
- `HFServerAdapter` (verl's ``BaseRollout``, registered for ``("hf", "async")``): lives in each
  actor worker and ships the FSDP weights (full tensors, verl's ``get_per_tensor_param``) to its
  replica's server after every update, then sets the server's global step.

Limits, each refused with a clear error: hybrid (colocated) mode only, one process per replica
(``rollout.tensor_model_parallel_size`` = data / pipeline parallel = 1), text only, LoRA only as
merged weights (``actor_rollout_ref.model.lora.merge=True``). Requests are served one at a time.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any

import ray
import ray.util.scheduling_strategies
import torch
from torch import Tensor
from verl.utils.torch_dtypes import PrecisionType
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, TokenOutput

from tokencredit.errors import ConfigError, closest
from tokencredit.integrations.verl.local.sampling import LOGPROB_MODES, sample

__all__ = ["BACKEND", "HFReplica", "HFRolloutServer", "HFServerAdapter", "server_name"]

BACKEND = "hf"  # actor_rollout_ref.rollout.name
# sampling_params keys a request may carry (verl's agent loops send the first five).
_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "logprobs",
    "max_tokens",
    "max_new_tokens",
    "seed",
)


def server_name(replica_rank: int) -> str:
    """The Ray actor name of a replica's server (the adapter in the actor workers looks it up by name)."""
    return f"{BACKEND}_server_{replica_rank}"


def _get(config: Any, key: str, default: Any = None) -> Any:
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value


class HFRolloutServer:
    """Ray actor: token-in, token-out generation with a Hugging Face causal LM on the CPU."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.config = config
        path = _get(model_config, "local_path") or _get(model_config, "path")
        dtype = PrecisionType.to_dtype(_get(config, "dtype", "float32"))
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=bool(_get(model_config, "trust_remote_code", False))
        ).eval()
        eos: set[int] = set()
        for source in (self.model.config, GenerationConfig.from_model_config(self.model.config)):
            ids = getattr(source, "eos_token_id", None)
            eos.update([ids] if isinstance(ids, int) else ids or [])
        try:  # the checkpoint's own generation_config.json (EOS ids of chat models live there)
            ids = GenerationConfig.from_pretrained(path).eos_token_id
            eos.update([ids] if isinstance(ids, int) else ids or [])
        except OSError:
            pass
        self.stop_ids = frozenset(eos)
        self.logprobs_mode = str(_get(config, "logprobs_mode", "processed_logprobs"))
        if self.logprobs_mode not in LOGPROB_MODES:
            raise ConfigError(
                f"actor_rollout_ref.rollout.logprobs_mode: the hf backend supports {LOGPROB_MODES}"
            )
        prompt_len, response_len = int(_get(config, "prompt_length")), int(_get(config, "response_length"))
        self.prompt_length, self.response_length = prompt_len, response_len
        self.max_model_len = int(_get(config, "max_model_len", prompt_len + response_len))
        self.generator = torch.Generator().manual_seed(int(_get(config, "seed", 0)) + replica_rank)
        self.global_steps: int | None = None
        self.lock = asyncio.Lock()  # one request (or weight update) at a time

    def ready(self) -> bool:
        return True

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        **_: Any,
    ) -> TokenOutput:
        """One continuation of `prompt_ids` (verl's vLLM server contract; `request_id` is unused)."""
        if image_data is not None or video_data is not None or audio_data is not None:
            raise ConfigError(
                "the hf rollout backend is text-only (the request carries image / video / audio data)"
            )
        params = dict(sampling_params)
        unknown = sorted(set(params) - set(_SAMPLING_KEYS))
        if unknown:
            raise ConfigError(
                f"hf rollout: unknown sampling parameter {unknown[0]!r}{closest(unknown[0], _SAMPLING_KEYS)}"
            )
        if float(params.get("repetition_penalty", 1.0)) != 1.0:
            raise ConfigError("hf rollout: repetition_penalty != 1 is not supported")
        prompt_ids = [int(i) for i in prompt_ids]
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ConfigError(
                f"hf rollout: a prompt of {len(prompt_ids)} tokens leaves no room in max_model_len {self.max_model_len}"
            )
        default = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        max_tokens = int(params.get("max_tokens", params.get("max_new_tokens", default)))
        max_tokens = max(1, min(max_tokens, room))
        ignore_eos = bool(_get(self.config, "ignore_eos", False))
        generator = self.generator
        if params.get("seed") is not None:
            generator = torch.Generator().manual_seed(int(params["seed"]))
        async with self.lock:
            tokens, log_probs, _ = await asyncio.to_thread(
                sample,
                self.model,
                prompt_ids,
                max_tokens,
                temperature=float(params.get("temperature", 1.0)),
                top_k=int(params.get("top_k", -1)),
                top_p=float(params.get("top_p", 1.0)),
                stop_ids=() if ignore_eos else self.stop_ids,
                generator=generator,
                logprobs_mode=self.logprobs_mode,
            )
            steps = self.global_steps
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs if params.get("logprobs") else None,
            stop_reason="completed",
            extra_fields={"global_steps": steps},
        )

    async def update_weights(self, named: dict[str, Tensor], global_steps: int | None = None) -> None:
        """Load the actor's full weights (HF names); raises on a name the model does not have."""
        async with self.lock:
            state = self.model.state_dict()
            unknown = sorted(set(named) - set(state))
            if unknown:
                raise ConfigError(
                    f"hf rollout: the actor sent weights the rollout model lacks, e.g. {unknown[:3]} "
                    "(a LoRA actor must send merged weights: actor_rollout_ref.model.lora.merge=True)"
                )
            with torch.no_grad():
                for name, value in named.items():
                    state[name].copy_(value.to(state[name].dtype))
            if global_steps is not None:
                self.global_steps = global_steps

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    # Control methods verl calls on every rollout server; a CPU model has nothing to free or resume.
    async def wake_up(self, tags: list[str] | None = None) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None  # the KV cache lives only inside one request

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def wait_for_requests_to_drain(self) -> None:
        async with self.lock:
            return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        return {"aborted_count": 0, "request_ids": []}

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **_: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class HFReplica(RolloutReplica):
    """verl rollout replica ``hf``: one `HFRolloutServer` beside the replica's first actor worker."""

    async def launch_servers(self) -> None:
        if self.rollout_mode != RolloutMode.HYBRID or self.is_reward_model or self.is_teacher_model:
            raise ConfigError(
                "the hf rollout backend runs only as the actor's own (hybrid) rollout, not as a standalone, "
                "colocated, reward-model or teacher server"
            )
        if self.world_size != 1:
            raise ConfigError(
                "the hf rollout backend runs one model per process: set actor_rollout_ref.rollout."
                "tensor_model_parallel_size, data_parallel_size and pipeline_model_parallel_size to 1"
            )
        node = await self.workers[0].__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())
        name = server_name(self.replica_rank)
        server = (
            ray.remote(HFRolloutServer)
            .options(
                name=name,
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node, soft=False
                ),
                max_concurrency=self.max_concurrency,
            )
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{BACKEND}://{name}"  # a unique key for verl's load balancer; no HTTP


class HFServerAdapter(BaseRollout):
    """The actor worker's side of the `hf` backend: sends the trained weights to the replica's server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // size if replica_rank == -1 else replica_rank
        self.sends = rank % size == 0  # every rank gathers the full weights; one sends them
        self._server: Any = None

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(
        self,
        weights: Iterable[tuple[str, Tensor]],
        wire_format: str = "named_tensors",
        global_steps: int | None = None,
        peft_config: Any = None,
        **_: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise ConfigError(
                f"the hf rollout backend takes full weights (wire_format 'named_tensors'), not {wire_format!r}"
            )
        if peft_config is not None:
            raise ConfigError(
                "the hf rollout backend takes merged LoRA weights: set actor_rollout_ref.model.lora.merge=True"
            )
        named: dict[str, Tensor] = {}
        # Every rank walks the generator (its full tensors are gathered collectively); one keeps them.
        if hasattr(weights, "__aiter__"):
            async for name, tensor in weights:  # type: ignore[union-attr]
                if self.sends:
                    named[name] = tensor.detach().to("cpu", copy=True)
        else:
            for name, tensor in weights:
                if self.sends:
                    named[name] = tensor.detach().to("cpu", copy=True)
        if not self.sends:
            return
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        await self._server.update_weights.remote(named, global_steps)
