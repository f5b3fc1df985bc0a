"""TRL plugin: `CreditGRPOTrainer`, a GRPOTrainer that trains on tokencredit's (B, T) token advantages.

    trainer = CreditGRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                                credit="ktae")   # any credit method or recipe name

The hook is the one TRL's maintainers recommend (trl issue 4525): override
`_generate_and_score_completions`, call super, replace ``output["advantages"]`` (B,) with (B, T);
`_compute_loss` accepts (B, T) advantages from TRL 1.0 on. All group-level work happens there,
before TRL shuffles and splits the generation batch:

- scores: TRL gathers every reward function's output across processes (`_calculate_rewards`,
  captured here); the score of a completion is their weighted sum, as TRL's default
  ``multi_objective_aggregation="sum_then_normalize"`` uses;
- each process computes Â for its own rows only: its completion ids, masks and per-token signals
  never leave it (DelTA's and ARCA's hidden states [B, T, H] above all). A prompt's group
  (``num_generations`` consecutive completions of the global batch) may span processes, so the batch
  is a `tokencredit.distributed.Shard` of the global one: its rows are TRL's ``process_slice`` (process
  ``i`` holds global rows ``i * B_local`` to ``(i + 1) * B_local - 1``, the order of TRL's gathered
  rewards), group ids are global (row // num_generations), and the core reduces every batch statistic
  (group baselines, DelTA's centroid sums, the 80/20 kept set's global top-k, KTAE's counts) with
  `torch.distributed` collectives over accelerate's default group. Only per-rollout scalars cross
  processes; the Â of a process equals the rows it holds of the Â computed on the gathered batch
  (a recipe whose statistics the core cannot reduce across processes raises its ConfigError, on every
  process, at the first scoring);
- TRL computes no entropy or hidden state at scoring time: when the credit method needs per-token
  signals, ONE extra no-grad pass (`tokencredit.builder.forward_signals`) computes exactly those for
  this process's rows, and the batch is assembled by the one builder (`tokencredit.builder.build_batch`).

Credit diagnostics: each scoring adds `tokencredit.diagnostics.summary` of the effective credit (what
tokencredit's own trainer logs) to TRL's metrics as ``credit/gini``, ``credit/eff_ratio``, ... (TRL averages
them over its logging window and logs them with its own, to ``trainer.state.log_history`` and every
``report_to``). They are the whole global batch's: each process's sums are all-reduced (a few scalars, and
the global top-k of the high-entropy set), so all processes hold the same values. TRL's completions table
shows each completion's mean Â (not TRL's scalar advantage, which the loss no longer sees), with A and Â's
range as extra columns (`CreditGRPOTrainer._log_trained_advantages`). `SaveRolloutsCallback`
saves a step's rollouts with the Â the loss received, for ``tokencredit explain --jsonl`` and ``probe``.

Group baseline: a recipe name brings its own (`tokencredit.recipes`); a bare credit method uses
TRL's normalisation (``scale_rewards`` group / batch / none, eps 1e-4), so ``credit="uniform"``
reproduces TRL's own advantages. TRL's loss stays TRL's (``loss_type``, clipping,
``importance_sampling_level``): recipes whose ratio kernel TRL lacks (P-/S-trace) are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tokencredit import advantages as adv_mod
from tokencredit import builder, diagnostics, objectives
from tokencredit.atomic import atomic_write_text
from tokencredit.credit.gcpo import negative_prompt
from tokencredit.distributed import Shard
from tokencredit.errors import ConfigError
from tokencredit.integrations.engines import ENGINE_KERNELS, check_supported
from tokencredit.models import special_token_ids
from tokencredit.recipes import Recipe, TokenCredit, resolve, token_credit
from tokencredit.rollout import records
from tokencredit.train.trackers import metric_name

try:
    import trl
    from accelerate.utils import gather_object
    from transformers import TrainerCallback
    from trl import GRPOTrainer
    from trl.data_utils import apply_chat_template, is_conversational
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError("tokencredit.integrations.trl needs TRL: pip install 'tokencredit[trl]'") from err

__all__ = ["SUPPORTED_VERSIONS", "CreditGRPOTrainer", "SaveRolloutsCallback", "check_version"]

SUPPORTED_VERSIONS = ">=1.0,<2"

# TRL's scale_rewards -> the core's group baseline (TRL's eps is 1e-4).
_TRL_BASELINES = {"group": "grpo", "batch": "grpo-batch", "none": "dr-grpo"}
_TRL_EPS = 1e-4


def check_version(version: str | None = None) -> str:
    """Raise ImportError unless TRL's version is in SUPPORTED_VERSIONS."""
    return check_supported(
        "tokencredit.integrations.trl",
        "TRL",
        trl.__version__ if version is None else version,
        SUPPORTED_VERSIONS,
        "1.0.0 and 1.16.0",
        "It overrides GRPOTrainer internals (_generate_and_score_completions, "
        "_calculate_rewards) whose contract differs in other major versions.",
    )


check_version()

NegativePromptFn = Callable[[Mapping[str, Any]], Any]


# Recipe losses TRL has as a `loss_type`, and the GRPOConfig settings that make TRL's loss the recipe's
# (tokencredit.objectives.losses_trl documents the correspondence; tests/objectives/test_vs_verl.py checks it).
def _trl_cispo(p: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """TRL's cispo clips the weight at epsilon_high (tokencredit's at 1 + eps_high) and has no lower bound."""
    if p["eps_low"] < 1.0:
        raise ConfigError(
            f"TRL's cispo has no lower clip bound; the recipe's eps_low={p['eps_low']} (< 1) sets one: use eps_low=1"
        )
    return "cispo", {"epsilon_high": 1.0 + p["eps_high"]}


_TRL_LOSS_TYPES: dict[str, Callable[[dict[str, Any]], tuple[str, dict[str, float]]]] = {
    "cispo": _trl_cispo,
    "sapo": lambda p: ("sapo", {"sapo_temperature_pos": p["tau_pos"], "sapo_temperature_neg": p["tau_neg"]}),
    "vespo": lambda p: (
        "vespo",
        {f"vespo_{k}": p[k] for k in ("k_pos", "lambda_pos", "k_neg", "lambda_neg")},
    ),
}


def _same(a: Any, b: float) -> bool:
    return a is not None and abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))


class CreditGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose loss sees per-token advantages Â (B, T) from a tokencredit method or recipe.

    credit: a registered credit method (tokencredit.credit.CREDIT_METHODS, e.g. "ktae",
        "entropy-80-20", "delta") or a recipe (tokencredit.recipes.RECIPES, e.g. "dapo+ktae").
    credit_params: overrides of the credit method's hyperparameters. For KTAE the tokenizer's special
        ids are ignored (`ignore_token_ids`) unless given here.
    negative_prompt: GCPO only: example -> the negative prompt (string or messages). By default the
        dataset's "problem" text inside the prompt is replaced by tokencredit.credit.gcpo.negative_prompt.
    After each scoring, `last_credit` holds this process's rows: completion ids, mask, scores, global group
    ids and row indices, the sequence advantages A and the token advantages Â handed to the loss, the
    recipe's kept set of loss tokens (None without one) and the signals used; for `SaveRolloutsCallback`
    also the prompt ids and mask, TRL's completion (attention) mask, whether each completion was
    truncated, and the examples.
    """

    def __init__(
        self,
        *args: Any,
        credit: str = "uniform",
        credit_params: Mapping[str, Any] | None = None,
        negative_prompt: NegativePromptFn | None = None,
        **kwargs: Any,
    ) -> None:
        self.recipe: Recipe = resolve(
            credit, {"credit_params": dict(credit_params)} if credit_params else None
        )
        self._negative_prompt_fn = negative_prompt
        self._tc_rewards: Tensor | None = None
        self.last_credit: dict[str, Any] | None = None
        self._last_train_credit: dict[str, Any] | None = None  # what SaveRolloutsCallback saves
        super().__init__(*args, **kwargs)
        self._check_compatible()
        self._bind_callbacks()

    def add_callback(self, callback: type[TrainerCallback] | TrainerCallback) -> None:
        super().add_callback(callback)
        self._bind_callbacks()

    def _bind_callbacks(self) -> None:
        """Tell each SaveRolloutsCallback which trainer's rollouts it saves (TRL passes callbacks no trainer)."""
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, SaveRolloutsCallback):
                callback.trainer = self

    # ------------------------------------------------------------------ configuration
    def _check_compatible(self) -> None:
        spec, args = self.recipe, self.args
        # TRL's loss is PPO-clip; with one update per generation (TRL's default) it is on-policy, where
        # its gradient equals REINFORCE's, so REINFORCE recipes (ARCA's family) train correctly too.
        if builder.needs_of(spec).sampled:
            raise ConfigError(
                f"recipe {spec.name!r} reads Monte-Carlo values of the policy's prefixes, which TRL does not sample; "
                "use tokencredit's own trainer"
            )
        if "values" in builder.needs_of(spec).fields:
            raise ConfigError(
                f"recipe {spec.name!r} reads a learned critic's values (advantage estimator {spec.advantage!r}), and "
                "TRL's GRPO trainer has no critic (no value model); use tokencredit's own trainer "
                f"(tokencredit train --recipe {spec.name}) or verl's PPO (algorithm.adv_estimator=gae)"
            )
        if spec.loss in _TRL_LOSS_TYPES:
            self._check_loss_type()
        elif spec.loss not in ("ppo-clip", "reinforce"):
            raise ConfigError(
                f"recipe {spec.name!r} uses the {spec.loss!r} policy loss, which TRL's GRPO loss does not have; "
                "use tokencredit's own trainer or the verl plugin"
            )
        if spec.uses_ratio and spec.kernel not in ENGINE_KERNELS:
            raise ConfigError(
                f"recipe {spec.name!r} uses the {spec.kernel!r} ratio kernel, which TRL's GRPO loss does not have; "
                "use the verl plugin (loss_mode tc_" + spec.kernel + ") or tokencredit's own trainer"
            )
        if (
            spec.uses_ratio
            and spec.kernel in ("gspo", "gspo-token")
            and getattr(args, "importance_sampling_level", "token") != "sequence"
        ):
            raise ConfigError(
                f"recipe {spec.name!r} uses GSPO's sequence ratio: set GRPOConfig(importance_sampling_level='sequence')"
            )
        if getattr(args, "multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize":
            raise ConfigError(
                "CreditGRPOTrainer scores a completion by the weighted sum of its rewards; "
                "multi_objective_aggregation='normalize_then_sum' has no single score per completion"
            )
        if getattr(args, "use_liger_loss", False):
            raise ConfigError(
                "the Liger fused GRPO loss takes (B,) advantages only; set use_liger_loss=False"
            )
        if spec.kind == "method" and getattr(args, "scale_rewards", "group") not in _TRL_BASELINES:
            raise ConfigError(
                f"unknown scale_rewards {args.scale_rewards!r}; expected one of {list(_TRL_BASELINES)}"
            )

    def _check_loss_type(self) -> None:
        """A recipe whose loss TRL has (cispo, sapo, vespo) trains with that `loss_type`, set by the user with
        the recipe's parameters in TRL's names: a mismatch is a ConfigError spelling out the settings."""
        spec, args = self.recipe, self.args
        params = {**objectives.get_loss(spec.loss).defaults, **spec.loss_arguments()}
        loss_type, settings = _TRL_LOSS_TYPES[spec.loss](params)
        wrong = [k for k, v in settings.items() if not _same(getattr(args, k, None), v)]
        if args.loss_type != loss_type or wrong:
            shown = ", ".join(f"{k}={v!r}" for k, v in {"loss_type": loss_type, **settings}.items())
            raise ConfigError(
                f"recipe {spec.name!r} uses TRL's {loss_type!r} loss: set GRPOConfig({shown}) "
                f"(got loss_type={args.loss_type!r}{''.join(f', {k}={getattr(args, k, None)!r}' for k in wrong)})"
            )

    @property
    def _text_tokenizer(self) -> Any:
        """The text tokenizer (TRL 1.x keeps it as `_tokenizer`; a processor wraps it as `.tokenizer`)."""
        tok = getattr(self, "_tokenizer", None)
        return tok if tok is not None else getattr(self.processing_class, "tokenizer", self.processing_class)

    def _engine_recipe(self) -> Recipe:
        """The recipe with TRL's group normalisation when it is a credit method on its own."""
        if self.recipe.kind != "method":
            return self.recipe
        return self.recipe.with_method_baseline(_TRL_BASELINES[self.args.scale_rewards], {"eps": _TRL_EPS})

    # ------------------------------------------------------------------ TRL hooks
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[no-untyped-def]
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._tc_rewards = rewards  # [B_global, n_funcs], gathered across processes by TRL
        return rewards

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        output["advantages"] = self._token_advantages(inputs, output)
        self._log_trained_advantages()
        return output

    def _log_trained_advantages(self) -> None:
        """Make TRL's completions table show what the loss received: TRL has just appended the global batch's
        scalar advantages to ``_logs["advantages"]`` (its ``advantage`` column); they are replaced by each
        completion's mean Â over its loss tokens (0 for a completion without any), and the columns
        ``sequence_advantage`` (A, which the credit method distributed) and ``token_advantage_min`` /
        ``token_advantage_max`` are added. Collective: the rows of every process are gathered, in TRL's order."""
        scored = self.last_credit
        assert scored is not None
        adv, mask = scored["advantages"], scored["mask"]
        n_tokens = mask.sum(1)
        masked = adv.masked_fill(~mask, 0.0)
        big = torch.finfo(adv.dtype).max
        has = n_tokens > 0
        summary = torch.stack(
            [
                masked.sum(1) / n_tokens.clamp(min=1),
                scored["sequence_advantages"].to(adv),
                torch.where(
                    has, adv.masked_fill(~mask, big).amin(1), torch.zeros_like(n_tokens, dtype=adv.dtype)
                ),
                torch.where(
                    has, adv.masked_fill(~mask, -big).amax(1), torch.zeros_like(n_tokens, dtype=adv.dtype)
                ),
            ],
            dim=1,
        )
        rows = self.accelerator.gather(summary.contiguous()).cpu().tolist()  # [B_global, 4]
        logged = self._logs["advantages"]
        for _ in range(min(len(rows), len(logged))):
            logged.pop()
        logged.extend(r[0] for r in rows)
        for j, column in enumerate(("sequence_advantage", "token_advantage_min", "token_advantage_max"), 1):
            self._logs["extra"][column].extend(r[j] for r in rows)

    # ------------------------------------------------------------------ credit
    def _token_advantages(self, inputs: list[dict[str, Any]], output: dict[str, Any]) -> Tensor:
        """Â (B_local, T_local) for this process's rows, computed on those rows alone (`_shard` for the layout).

        Every process must call it (TRL's scoring does): with several processes the core's batch statistics
        are collectives."""
        if self._tc_rewards is None:
            raise RuntimeError("CreditGRPOTrainer: no rewards were captured for this batch")
        if "pixel_values" in output:
            raise ConfigError(
                "CreditGRPOTrainer supports text-only models (the signals pass takes no images)"
            )
        rewards, self._tc_rewards = self._tc_rewards, None
        unscorable = torch.isnan(rewards).all(dim=1)
        if bool(unscorable.any()):
            i = int(unscorable.nonzero()[0])
            raise ValueError(
                f"every reward function returned None for completion {i} of the global batch; token credit needs "
                "a score for every completion"
            )
        scores = (rewards * self.reward_weights.to(rewards.device).unsqueeze(0)).nansum(dim=1)  # [B_global]

        ids = output["completion_ids"]
        mask = output["completion_mask"].bool()
        if "tool_mask" in output:
            mask = mask & output["tool_mask"].bool()
        recipe = self._engine_recipe()
        needs = builder.needs_of(recipe)
        rows, group_ids, shard = self._shard(ids.shape[0], scores.numel(), ids.device)
        signals = self._signals(inputs, output, mask, needs)
        rollouts = builder.ScoredRollouts(
            response_ids=ids,
            response_mask=mask,
            group_ids=group_ids,
            scores=scores.to(ids.device)[rows].float(),
        )
        batch = builder.build_batch(rollouts, needs, given=signals, who="CreditGRPOTrainer", shard=shard)
        tc = token_credit(recipe, batch, special_ids=special_token_ids(self._text_tokenizer))
        local = tc.token_advantages.to(device=ids.device, dtype=torch.float32).contiguous()
        mode = "train" if self.model.training else "eval"
        self._log_diagnostics(tc, batch.mask, batch.entropy, shard, mode)
        self.last_credit = {
            "completion_ids": ids.detach().clone(),
            "mask": mask.detach().clone(),
            "scores": batch.scores.detach().clone(),
            "group_ids": group_ids.detach().clone(),
            "rows": rows.detach().clone(),
            "sequence_advantages": tc.seq_advantages.detach().clone(),
            "advantages": local.detach().clone(),
            "keep": None if tc.keep is None else tc.keep.detach().clone(),
            "signals": {k: v.detach().clone() for k, v in signals.items()},
            "prompt_ids": output["prompt_ids"].detach().clone(),
            "prompt_mask": output["prompt_mask"].detach().clone(),
            "completion_mask": output["completion_mask"].detach().clone(),
            "truncated": self._truncated(ids, output["completion_mask"]),
            "examples": list(inputs),
        }
        if mode == "train":
            self._last_train_credit = self.last_credit
        return local

    def _log_diagnostics(
        self, tc: TokenCredit, mask: Tensor, entropy: Tensor | None, shard: Shard | None, mode: str
    ) -> None:
        """`tokencredit.diagnostics.summary` of the effective credit (as tokencredit's trainer logs it) into TRL's
        metrics as ``credit/<name>``; of the whole batch (collective with several processes). The entropy
        shares appear when the credit method reads the entropy (no pass is added for the diagnostics)."""
        values = diagnostics.summary(
            tc.effective().detach().cpu(),
            mask.cpu(),
            tc.seq_advantages.detach().cpu(),
            None if entropy is None else entropy.detach().cpu(),
            shard=shard,
        )
        for key, value in values.items():
            self._metrics[mode][metric_name(key)].append(value)

    def _truncated(self, ids: Tensor, completion_mask: Tensor) -> Tensor:
        """bool [B_local]: completions that do not end with EOS (TRL's rule: last token not an EOS / pad id)."""
        tok = self._text_tokenizer
        stop = [*(getattr(self, "eos_token_ids", None) or [tok.eos_token_id]), tok.pad_token_id]
        lengths = self._lengths(ids, completion_mask)
        last = ids.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
        stops = torch.tensor([i for i in stop if i is not None], device=ids.device, dtype=ids.dtype)
        return ~torch.isin(last, stops)

    @staticmethod
    def _lengths(ids: Tensor, completion_mask: Tensor) -> Tensor:
        """[B_local] completion lengths: TRL's completion mask, or the whole width for a row it masked out
        (``mask_truncated_completions``: a truncated completion fills the width)."""
        n = completion_mask.sum(1)
        return torch.where(n > 0, n, torch.full_like(n, ids.shape[1]))

    def _rollout_rows(self) -> list[dict[str, Any]]:
        """This process's rows of the last training scoring in the saved-rollouts format
        (`tokencredit.rollout.records`): per row its global index, group id, group fields and completion record."""
        scored = self._last_train_credit
        if scored is None:
            raise RuntimeError(
                "CreditGRPOTrainer: no training batch was scored yet, so there are no rollouts to save"
            )
        tok = self._text_tokenizer
        ids = scored["completion_ids"].cpu()
        lengths = self._lengths(ids, scored["completion_mask"].cpu())
        mask = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
        texts = [
            tok.decode(ids[i, :n].tolist(), skip_special_tokens=True) for i, n in enumerate(lengths.tolist())
        ]
        signals = {k: scored["signals"].get(k) for k in ("entropy", "old_log_probs")}
        completions = records.completion_records(
            ids,
            mask,
            scored["scores"].cpu(),
            scored["sequence_advantages"].cpu(),
            scored["advantages"].cpu(),
            texts=texts,
            tokens=[tok.convert_ids_to_tokens(ids[i, :n].tolist()) for i, n in enumerate(lengths.tolist())],
            truncated=scored["truncated"].cpu(),
            signals={k: None if v is None else v.cpu() for k, v in signals.items()},
        )
        rows = []
        for i, completion in enumerate(completions):
            example = scored["examples"][i]
            prompt = example.get("prompt")
            if not isinstance(prompt, str):
                # a conversation: its rendered ids, decoded (explain tokenises this text again)
                ids_i = scored["prompt_ids"][i][scored["prompt_mask"][i].bool()].tolist()
                prompt = tok.decode(ids_i, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            fields = {"prompt": prompt, **records.problem_fields(example)}
            rows.append(
                {
                    "row": int(scored["rows"][i]),
                    "group": int(scored["group_ids"][i]),
                    "fields": fields,
                    "completion": completion,
                }
            )
        return rows

    def _shard(
        self, n_local: int, n_global: int, device: torch.device
    ) -> tuple[Tensor, Tensor, Shard | None]:
        """(rows, group_ids, shard) of this process's completions within TRL's global batch.

        rows [B_local]: their indices in the global batch, TRL's ``process_slice`` (process i holds rows
        i * B_local .. (i + 1) * B_local - 1, the order in which TRL gathers the rewards); group_ids [B_local]:
        global prompt ids (TRL's RepeatSampler puts a prompt's num_generations completions consecutively);
        shard: the `Shard` the core reduces its batch statistics over (accelerate's default process group),
        None on one process."""
        acc = self.accelerator
        if n_global != n_local * acc.num_processes:
            raise RuntimeError(
                f"CreditGRPOTrainer: {n_global} scores for {acc.num_processes} process(es) of {n_local} completions"
            )
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        start = acc.process_index * n_local
        rows = torch.arange(start, start + n_local, device=device)
        group_ids = adv_mod.consecutive_group_ids(n_global, group_size, device)[rows]
        shard = Shard(rows=rows, num_rows=n_global) if acc.num_processes > 1 else None
        return rows, group_ids, shard

    def _signals(
        self, inputs: list[dict[str, Any]], output: dict[str, Any], mask: Tensor, needs: builder.Needs
    ) -> dict[str, Tensor]:
        """The forward signals of `needs` for this process's rows, in one no-grad pass (`builder.forward_signals`);
        TRL's own old log-probs when they are all the method reads."""
        if not needs.forward:
            return {}
        if needs.forward == {"old_log_probs"} and output.get("old_per_token_logps") is not None:
            lp = output["old_per_token_logps"].float()
            return {"old_log_probs": torch.where(mask, lp, torch.zeros((), dtype=lp.dtype, device=lp.device))}
        # tool-call tokens (TRL's tool_mask) are attended to but carry no credit: attention from completion_mask
        rows = builder.Responses(
            response_ids=output["completion_ids"],
            response_mask=mask,
            prompt_ids=output["prompt_ids"],
            prompt_mask=output["prompt_mask"],
            response_attention=output["completion_mask"],
        )
        passes = builder.Passes(
            temperature=float(self.temperature),
            batch_size=self.args.per_device_train_batch_size,
            negative_prompts=lambda: self._negative_prompts(inputs),
            tokenizer=self._text_tokenizer,
            add_special_tokens=False,
        )
        model = self.accelerator.unwrap_model(self.model)
        return builder.forward_signals(model, rows, needs.forward, passes, who="CreditGRPOTrainer")

    def _negative_prompts(self, inputs: list[dict[str, Any]]) -> list[str]:
        """GCPO: each example's negative prompt (a prompt that asks for a wrong answer), rendered as TRL renders."""
        prompts = []
        for i, example in enumerate(inputs):
            if self._negative_prompt_fn is not None:
                prompts.append(self._negative_prompt_fn(example))
                continue
            problem = example.get("problem")
            if not isinstance(problem, str) or not problem.strip():
                raise ConfigError(
                    f"GCPO needs the problem text of example {i} to build its negative prompt: add a 'problem' "
                    "column to the dataset, or pass CreditGRPOTrainer(negative_prompt=fn)"
                )
            prompts.append(_replace_problem(example["prompt"], problem, negative_prompt(problem), i))
        return [
            apply_chat_template({"prompt": p}, self.processing_class, **self.chat_template_kwargs)["prompt"]
            if is_conversational({"prompt": p})
            else p
            for p in prompts
        ]


def _replace_problem(prompt: Any, problem: str, replacement: str, index: int) -> Any:
    """The prompt (string or messages) with the problem text replaced (in the last message that holds it)."""
    if isinstance(prompt, str):
        if problem not in prompt:
            raise ConfigError(f"example {index}: the 'problem' text does not occur in the prompt")
        return prompt.replace(problem, replacement, 1)
    messages = [dict(m) for m in prompt]
    for message in reversed(messages):
        content = message.get("content")
        if isinstance(content, str) and problem in content:
            message["content"] = content.replace(problem, replacement, 1)
            return messages
    raise ConfigError(f"example {index}: the 'problem' text does not occur in any message of the prompt")


class SaveRolloutsCallback(TrainerCallback):
    """Every `every` optimizer steps, the rollouts the step trained on with the Â TRL's loss received, as
    PATH/step_NNNNNN.jsonl in the saved-rollouts format (`tokencredit.rollout.records`, docs/integrations.md)
    that ``tokencredit explain --jsonl FILE --model M`` and ``tokencredit probe --data FILE`` read.

        trainer = CreditGRPOTrainer(..., callbacks=[SaveRolloutsCallback("runs/x/rollouts", every=50)])

    (or ``trainer.add_callback(...)``; a CreditGRPOTrainer binds it to itself, any other trainer is refused at
    the start of training). The rollouts are TRL's latest generation batch, which a step trains on (all of it,
    or a part when ``steps_per_generation`` spreads it over several steps), one line per prompt. With several
    processes every process runs the callback and sends its rows to process 0, which writes the file: the
    strings and per-token ids and values of the saved step's rollouts, nothing on other steps.
    """

    def __init__(self, path: str | Path, every: int = 10) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(
                f"SaveRolloutsCallback: every must be a positive integer (steps), got {every!r}"
            )
        self.path = Path(path)
        self.every = every
        self.trainer: CreditGRPOTrainer | None = None  # set by the CreditGRPOTrainer it is given to

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer is None:
            raise ConfigError(
                "SaveRolloutsCallback saves the rollouts of a CreditGRPOTrainer (tokencredit.integrations.trl): "
                "pass it in CreditGRPOTrainer(callbacks=[...]) or to that trainer's add_callback"
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.every == 0:
            self.save(state.global_step)

    def save(self, step: int) -> Path | None:
        """Gather the rows of every process and, on process 0, write PATH/step_<step>.jsonl (returned; None
        on the other processes). Collective: every process must call it."""
        trainer = self.trainer
        if trainer is None:
            raise ConfigError("SaveRolloutsCallback: not attached to a CreditGRPOTrainer")
        rows = sorted(gather_object(trainer._rollout_rows()), key=lambda r: r["row"])
        if not trainer.accelerator.is_main_process:
            return None
        fields: dict[int, dict[str, Any]] = {}
        for r in rows:
            fields.setdefault(r["group"], r["fields"])
        lines = records.group_records(
            step=step,
            recipe=trainer.recipe.name,
            credit=trainer.recipe.credit,
            group_ids=[r["group"] for r in rows],
            completions=[r["completion"] for r in rows],
            fields=fields,
        )
        self.path.mkdir(parents=True, exist_ok=True)
        out = self.path / f"step_{step:06d}.jsonl"
        atomic_write_text(out, records.jsonl_text(lines))
        return out
