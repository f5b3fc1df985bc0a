"""The one-device trainer: rollout -> reward -> group advantage -> signals -> credit -> PPO update.

Read top to bottom: `Trainer.__init__` builds everything from the config, `Trainer.step` is one
RL step, `Trainer.fit` is the loop with evaluation, checkpoints, the progress bar and the final
report. Every algorithmic choice comes from the recipe (a row of `tokencredit.recipes.RECIPES`);
the trainer only gathers inputs and calls the core's pure functions.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tokencredit import diagnostics, objectives, recipes
from tokencredit.batch import BatchValidationError, RolloutBatch
from tokencredit.errors import ConfigError, TrainingError  # TrainingError: also imported from here
from tokencredit.recipes import Recipe, TokenCredit, recipe_needs, requires_lora
from tokencredit.rewards.custom import RewardError
from tokencredit.rollout import PromptResponseLayout
from tokencredit.train import checkpoint as ckpt
from tokencredit.train.config import TrainConfig, dump_toml, validate_config


def resolve_recipe(cfg: TrainConfig) -> Recipe:
    """The configured recipe with `algo.overrides` applied (dict fields are merged, not replaced), validated."""
    return recipes.resolve(cfg.algo.recipe, cfg.algo.overrides)


def add_lora(model: torch.nn.Module, mcfg: Any) -> torch.nn.Module:
    """Wrap `model` in a peft LoRA adapter from a `ModelConfig` (rank, alpha, dropout, target modules)."""
    from peft import LoraConfig, get_peft_model

    names = {n.split(".")[-1] for n, _ in model.named_modules()}
    targets = [t for t in mcfg.lora_targets if t in names]
    if not targets:
        raise ConfigError(
            f"model.lora_targets {mcfg.lora_targets} match no module of {mcfg.name!r} "
            f"(module names include: {', '.join(sorted(names)[:12])})"
        )
    lcfg = LoraConfig(
        r=mcfg.lora_rank, lora_alpha=mcfg.lora_alpha, lora_dropout=mcfg.lora_dropout,
        target_modules=targets, task_type="CAUSAL_LM",
    )  # fmt: skip
    return get_peft_model(model, lcfg)


def seed_for(*parts: int) -> int:
    """A deterministic 31-bit seed from integers (run seed, step, round...); FNV-1a mixing."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 64)
    return h % (2**31 - 1)


class PromptSampler:
    """Deterministic, resumable stream of training problems: shuffled epochs, cursor in the checkpoint."""

    def __init__(self, problems: list[Any], seed: int) -> None:
        if not problems:
            raise ConfigError("data.train: no training problems")
        self.problems, self.seed, self.cursor = problems, seed, 0

    def take(self, n: int) -> list[Any]:
        out = []
        for _ in range(n):
            epoch, pos = divmod(self.cursor, len(self.problems))
            g = torch.Generator().manual_seed(seed_for(self.seed, 7, epoch))
            out.append(self.problems[int(torch.randperm(len(self.problems), generator=g)[pos])])
            self.cursor += 1
        return out


def _pad_cat(tensors: list[Tensor], value: int | bool, left: bool) -> Tensor:
    """Concatenate [n_i, L_i] tensors along rows, padding columns to the widest (left or right)."""
    width = max(t.shape[1] for t in tensors)
    padded = []
    for t in tensors:
        pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype, device=t.device)
        padded.append(torch.cat([pad, t] if left else [t, pad], dim=1))
    return torch.cat(padded)


@dataclass
class StepRollouts(PromptResponseLayout):
    """One step's rollouts, merged over generation rounds (prompt left-padded, response right-padded)."""

    problems: list[Any]  # one per row
    prompt_ids: Tensor
    prompt_mask: Tensor
    response_ids: Tensor
    response_mask: Tensor
    truncated: Tensor
    texts: list[str]
    group_ids: Tensor
    scores: Tensor
    correct: Tensor
    rounds: int


class Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: Path, *, resume: bool = False, console: Any = None) -> None:
        from rich.console import Console

        from tokencredit import models
        from tokencredit.rewards import Reward

        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.console = console or Console()
        validate_config(cfg)  # value ranges first: every bad value is named before any model loads
        self.recipe = resolve_recipe(cfg)
        if self.recipe.overlong_buffer and not 0 < self.recipe.overlong_buffer < cfg.rollout.max_new_tokens:
            raise ConfigError(
                f"recipe {self.recipe.name!r}: overlong_buffer={self.recipe.overlong_buffer} must be below "
                f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} (set algo.overlong_buffer)"
            )
        if requires_lora(self.recipe) and cfg.model.lora_rank <= 0:
            raise ConfigError(
                f"recipe {self.recipe.name!r} (credit {self.recipe.credit!r}) needs a LoRA adapter: "
                "set model.lora_rank > 0 (e.g. --set model.lora_rank=8)"
            )
        # Data and reward function before the model: a malformed file or a bad reward name is
        # reported in a second, not after loading a large checkpoint.
        self.train_problems = load_problems_for(cfg.data.train, cfg, split="train")
        self.eval_problems = load_problems_for(cfg.data.eval, cfg, split="heldout")
        self.sampler = PromptSampler(self.train_problems, cfg.run.seed)
        # correctness only; the format reward and DAPO's overlong shaping are added to the score separately
        self.reward_fn = Reward(cfg.reward.function, timeout=cfg.reward.timeout)
        if cfg.run.threads > 0 or cfg.model.name == "toy":
            torch.set_num_threads(cfg.run.threads or 1)
        dev = cfg.run.device
        self.device = torch.device("cuda" if dev == "auto" and torch.cuda.is_available() else ("cpu" if dev == "auto" else dev))
        torch.manual_seed(cfg.run.seed)

        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(cfg.model.dtype)
        if dtype is None:
            raise ConfigError(f"model.dtype must be float32, bfloat16 or float16, got {cfg.model.dtype!r}")
        self.model, self.tokenizer = models.load_model(cfg.model.name, dtype=dtype, device=self.device)
        if cfg.model.lora_rank > 0:
            self.model = add_lora(self.model, cfg.model)
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.needs = set(recipe_needs(self.recipe)) | {"entropy"}  # entropy is logged every step (same pass)
        self.special_ids = models.special_token_ids(self.tokenizer)
        self.fused_old = self._can_fuse_old_pass()
        self.ref_model = None
        if "ref_log_probs" in self.needs and cfg.model.lora_rank <= 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)

        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2), weight_decay=cfg.optim.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step_done = 0
        self.metrics = ckpt.MetricsLog(self.run_dir / "metrics.jsonl")
        self.history: list[dict[str, Any]] = []
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            state = ckpt.load_latest_checkpoint(self.run_dir, log=lambda m: self.console.print(f"[yellow]{m}"))
            if state is None:
                self.console.print("[yellow]no usable checkpoint; starting from step 0")
                self.metrics.truncate_after(-1)
            else:
                self.step_done = ckpt.restore(self.model, self.optimizer, self.scheduler, state)
                self.sampler.cursor = int(state["extra"]["sampler_cursor"])
                self.metrics.truncate_after(self.step_done)
                self.console.print(f"resumed {self.run_dir} at step {self.step_done}")
            self.history = self.metrics.read()
        else:
            self.metrics.truncate_after(-1)
        self._t_session, self._time_offset = time.perf_counter(), 0.0
        ckpt.atomic_write_text(self.run_dir / "config.toml", dump_toml(cfg))
        ckpt.atomic_write_text(self.run_dir / "recipe.json", json.dumps(self.recipe.to_dict(), indent=2))

    # ------------------------------------------------------------------ setup helpers
    def _can_fuse_old_pass(self) -> bool:
        """True when the old-policy log-probs can come from the training forward itself.

        With one epoch and one mini-batch the parameters do not move between the old-policy pass
        and the training forward, so pi_old = pi_theta token for token and the separate no-grad
        pass only repeats work (TRL skips it the same way when num_iterations == 1). It stays when
        the credit method or the ratio kernel needs a policy signal *before* the update (S-trace's
        kept set, DelTA's hidden states, ARCA's surprisal) or when dropout makes the train-mode
        forward differ from the eval-mode one.
        """
        o, r = self.cfg.optim, self.recipe
        if not (o.reuse_training_forward and o.ppo_epochs == 1 and o.mini_batches == 1) or not r.uses_ratio:
            return False
        if recipes.credit_needs(r) & {"old_log_probs", "entropy", "hidden"}:
            return False
        dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.model.modules())
        return not (dropout or getattr(getattr(self.model, "config", None), "attention_dropout", 0.0))

    def _lr_factor(self, step: int) -> float:
        o = self.cfg.optim
        if o.warmup_steps > 0 and step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "constant":
            return 1.0
        if o.schedule == "cosine":
            span = max(1, self.cfg.run.steps - o.warmup_steps)
            progress = min(1.0, (step - o.warmup_steps) / span)
            return o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
        raise ConfigError(f"optim.schedule must be 'constant' or 'cosine', got {o.schedule!r}")

    def _prompts(self, problems: list[Any]) -> list[str]:
        return [self._prompt_text(p.problem) for p in problems]

    def _prompt_text(self, problem: str) -> str:
        from tokencredit.data.templates import render

        return render(self.cfg.data.template, problem, self.tokenizer)

    # ------------------------------------------------------------------ one step
    def _generate_round(self, step: int, rnd: int) -> StepRollouts:
        from tokencredit.rollout import generate

        c = self.cfg.rollout
        problems = self.sampler.take(c.prompts_per_step)
        try:
            ro = generate(
                self.model,
                self.tokenizer,
                self._prompts(problems),
                c.group_size,
                temperature=c.temperature,
                top_p=c.top_p,
                max_new_tokens=c.max_new_tokens,
                seed=seed_for(self.cfg.run.seed, step, rnd),
                batch_size=c.generation_batch_size or None,
            )
        except RuntimeError as e:
            # torch.multinomial refuses a NaN/inf sampling distribution: the model's logits are not finite
            if "inf" in str(e) and "nan" in str(e):
                raise TrainingError(f"step {step + 1}: non-finite logits while sampling rollouts ({e})") from e
            raise
        rows = [problems[int(i)] for i in ro.prompt_index]
        try:
            raw = torch.tensor(self.reward_fn(ro.texts, [p.answer for p in rows]), dtype=torch.float32)
        except RewardError as e:  # the reward function's output names the bad rollout
            raise TrainingError(f"step {step + 1}: {e}") from e
        correct = raw > 0
        scores = raw
        if self.cfg.reward.format_weight:
            from tokencredit.rewards import format_reward

            scores = scores + self.cfg.reward.format_weight * torch.tensor(format_reward(ro.texts), dtype=torch.float32)
        if self.recipe.overlong_buffer > 0:
            from tokencredit.rewards import overlong_penalty

            lengths = ro.response_mask.sum(-1)
            scores = scores + overlong_penalty(lengths, c.max_new_tokens, self.recipe.overlong_buffer).float()
        group_ids = ro.prompt_index.long() + rnd * c.prompts_per_step
        return StepRollouts(
            rows, ro.prompt_ids, ro.prompt_mask.bool(), ro.response_ids, ro.response_mask.bool(), ro.truncated.bool(),
            list(ro.texts), group_ids, scores, correct, 1,
        )  # fmt: skip

    def collect(self, step: int) -> StepRollouts:
        """Generate and score; with dynamic sampling keep only informative groups, resampling up to the limit."""
        c = self.cfg.rollout
        first = self._generate_round(step, 0)
        if not self.recipe.dynamic_sampling:
            return first
        parts, n_groups, rnd = [], 0, 0
        cur = first
        while True:
            informative = self._informative_rows(cur)
            if bool(informative.any()):
                parts.append(_select(cur, informative))
                n_groups += int(torch.unique(cur.group_ids[informative]).numel())
            rnd += 1
            if n_groups >= c.prompts_per_step or rnd > c.max_resample_rounds:
                break
            cur = self._generate_round(step, rnd)
        if not parts:
            empty = _select(first, torch.zeros(len(first.texts), dtype=torch.bool))
            empty.rounds = rnd
            return empty
        merged = _merge(parts, self.tokenizer.pad_token_id)
        keep_groups = torch.unique(merged.group_ids, sorted=False)[: c.prompts_per_step]
        merged = _select(merged, torch.isin(merged.group_ids, keep_groups))
        merged.rounds = rnd
        return merged

    @staticmethod
    def _informative_rows(ro: StepRollouts) -> Tensor:
        _, inv = torch.unique(ro.group_ids, return_inverse=True)
        n = int(inv.max()) + 1
        lo = torch.full((n,), float("inf")).scatter_reduce(0, inv, ro.scores, "amin")
        hi = torch.full((n,), float("-inf")).scatter_reduce(0, inv, ro.scores, "amax")
        return (hi > lo)[inv]

    def step(self, step: int) -> tuple[dict[str, Any], StepRollouts, RolloutBatch, TokenCredit]:
        from tokencredit.signals import compute_signals, token_log_probs

        t0 = time.perf_counter()
        ro = self.collect(step)
        t_gen = time.perf_counter() - t0
        n = len(ro.texts)
        rec: dict[str, Any] = {"step": step + 1, "rollouts": n, "gen_rounds": ro.rounds}
        if n == 0:
            rec.update(skipped="no informative group after dynamic sampling")
            return rec, ro, None, None  # type: ignore[return-value]

        r, P, dev = self.recipe, ro.prompt_ids.shape[1], self.device
        seq, attn = ro.sequences.to(dev), ro.attention_mask.to(dev)
        mask = ro.response_mask.to(dev)
        neg = self._negative_prompts(ro) if "neg_log_probs" in self.needs else {}
        fused = self.fused_old  # old_log_probs + entropy come from the training forward below
        sig = compute_signals(
            self.model, seq, attn, P, mask, self.needs - {"old_log_probs", "entropy"} if fused else self.needs,
            temperature=self.cfg.rollout.temperature,
            ref_model=self.ref_model, batch_size=self.cfg.optim.micro_batch_size or None, **neg,
        )  # fmt: skip
        batch = RolloutBatch(
            token_ids=ro.response_ids.to(dev), mask=mask, group_ids=ro.group_ids.to(dev), scores=ro.scores.to(dev),
            truncated=ro.truncated.to(dev), **sig,
        )  # fmt: skip
        tc = self.credit(batch)
        t_sig = time.perf_counter() - t0 - t_gen

        # ---- PPO updates: epochs x mini-batches, each an optimizer step over micro-batches
        self.model.train()
        o = self.cfg.optim
        g = torch.Generator().manual_seed(seed_for(self.cfg.run.seed, step, 99))
        mets: list[dict[str, float]] = []
        grad_norms = []
        if fused:
            batch.old_log_probs = torch.zeros(mask.shape, dtype=torch.float32, device=dev)
            batch.entropy = torch.zeros(mask.shape, dtype=torch.float32, device=dev)
        for _epoch in range(o.ppo_epochs):
            order = torch.randperm(n, generator=g) if o.mini_batches > 1 else torch.arange(n)
            for mb in order.tensor_split(o.mini_batches):
                mb = mb.to(dev)
                n_tok = float(tc.loss_mask[mb].sum())
                n_seq = float((tc.loss_mask[mb].sum(-1) > 0).sum())
                self.optimizer.zero_grad(set_to_none=True)
                for micro in mb.split(o.micro_batch_size or len(mb)):
                    out = token_log_probs(
                        self.model, seq[micro], attn[micro], P, temperature=self.cfg.rollout.temperature,
                        response_mask=mask[micro], with_entropy=fused,
                    )  # fmt: skip
                    logp = out[0] if fused else out
                    if not bool(torch.isfinite(logp[mask[micro]]).all()):
                        raise TrainingError(f"step {step + 1}: non-finite log-probs in the training forward")
                    if fused:
                        batch.old_log_probs[micro] = logp.detach()
                        batch.entropy[micro] = out[1].detach()
                    loss, met = objectives.policy_loss(
                        logp,
                        batch.old_log_probs[micro] if r.uses_ratio else None,
                        tc.token_advantages[micro],
                        tc.mask[micro],
                        ref_log_prob=None if batch.ref_log_probs is None else batch.ref_log_probs[micro],
                        global_tokens=n_tok, global_seqs=n_seq, **tc.policy_kwargs(micro),
                    )  # fmt: skip
                    if not bool(torch.isfinite(loss)):
                        raise TrainingError(f"step {step + 1}: non-finite loss ({loss.item()})")
                    loss.backward()
                    mets.append(met)
                gn = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.model.parameters() if p.requires_grad], o.grad_clip if o.grad_clip > 0 else float("inf")
                )
                if not bool(torch.isfinite(gn)):
                    raise TrainingError(f"step {step + 1}: non-finite gradient norm")
                grad_norms.append(float(gn))
                self.optimizer.step()
        self.scheduler.step()
        t_upd = time.perf_counter() - t0 - t_gen - t_sig

        lengths = mask.sum(-1).float()
        n_tokens = int(lengths.sum())
        ent = batch.entropy[mask].mean() if batch.entropy is not None and bool(mask.any()) else torch.tensor(0.0)
        effective = tc.effective()
        rec.update(
            reward=float(ro.scores.mean()),
            accuracy=float(ro.correct.float().mean()),
            response_length=float(lengths.mean()),
            truncated=float(ro.truncated.float().mean()),
            entropy=float(ent),
            lr=float(self.scheduler.get_last_lr()[0]),
            grad_norm=sum(grad_norms) / len(grad_norms),
            time_generate=t_gen,
            time_signals=t_sig,
            time_update=t_upd,
            tokens=n_tokens,
            tokens_per_s=n_tokens / max(1e-9, t_gen + t_sig + t_upd),
            **{k: sum(m[k] for m in mets if k in m) / max(1, sum(k in m for m in mets)) for k in _avg_keys(mets)},
            **diagnostics.summary(effective, mask, tc.seq_advantages, batch.entropy),
        )
        return rec, ro, batch, tc

    def credit(self, batch: RolloutBatch) -> TokenCredit:
        """The step's credit: the one pipeline with this run's recipe, tokenizer special ids and length limit."""
        return recipes.token_credit(
            self.recipe, batch, special_ids=self.special_ids, max_response_length=self.cfg.rollout.max_new_tokens
        )

    def _negative_prompts(self, ro: StepRollouts) -> dict[str, Any]:
        """GCPO: the same responses after a prompt that asks for a wrong answer."""
        from tokencredit.credit.gcpo import negative_prompt
        from tokencredit.signals import negative_prompt_inputs

        texts = [self._prompt_text(negative_prompt(p.problem)) for p in ro.problems]
        dev = self.device
        return negative_prompt_inputs(self.tokenizer, texts, ro.response_ids.to(dev), ro.response_mask.to(dev))

    # ------------------------------------------------------------------ evaluation and saving
    def evaluate(self, step: int) -> dict[str, Any]:
        from tokencredit.evaluation import evaluate

        e = self.cfg.eval
        res = evaluate(
            self.model, self.tokenizer, self.eval_problems, samples=e.samples, temperature=e.temperature,
            top_p=e.top_p, max_new_tokens=self.cfg.rollout.max_new_tokens, template=self.cfg.data.template,
            seed=seed_for(self.cfg.run.seed, 31337), verifier=self.reward_fn.verifier, progress=False,
        )  # fmt: skip
        rec: dict[str, Any] = {"step": step, "type": "eval"}
        rec.update({f"eval_{k}": float(v) for k, v in res.items()})
        if "greedy_acc" in res:
            rec["eval_greedy_accuracy"] = float(res["greedy_acc"])
        if e.samples and f"avg@{e.samples}" in res:
            rec["eval_avg_at_k"] = float(res[f"avg@{e.samples}"])
        rec["eval_mean_length"] = float(res.get("mean_response_length", 0.0))
        return rec

    def save_rollouts(self, step: int, ro: StepRollouts, batch: RolloutBatch, adv_hat: Tensor, seq_adv: Tensor) -> None:
        """Saved groups with per-token Â and signals (input of `tokencredit explain`)."""
        out = self.run_dir / "rollouts"
        out.mkdir(exist_ok=True)
        groups = torch.unique(ro.group_ids, sorted=True)[: self.cfg.eval.save_groups]
        lines = []
        for gid in groups.tolist():
            rows = (ro.group_ids == gid).nonzero().flatten().tolist()
            p = ro.problems[rows[0]]
            comps = []
            for i in rows:
                L = int(batch.mask[i].sum())
                ids = batch.token_ids[i, :L].tolist()
                comps.append({
                    "text": ro.texts[i],
                    "token_ids": ids,
                    "tokens": self.tokenizer.convert_ids_to_tokens(ids),
                    "score": float(ro.scores[i]),
                    "correct": bool(ro.correct[i]),
                    "advantage": float(seq_adv[i]),
                    "token_advantages": [round(float(x), 6) for x in adv_hat[i, :L]],
                    "entropy": None if batch.entropy is None else [round(float(x), 5) for x in batch.entropy[i, :L]],
                    "old_log_probs": None if batch.old_log_probs is None else [
                        round(float(x), 5) for x in batch.old_log_probs[i, :L]
                    ],
                    "truncated": bool(ro.truncated[i]),
                })  # fmt: skip
            lines.append(json.dumps({
                "step": step, "recipe": self.recipe.name, "credit": self.recipe.credit, "group": gid,
                "id": str(getattr(p, "id", "")), "problem": p.problem, "answer": p.answer, "completions": comps,
            }))  # fmt: skip
        ckpt.atomic_write_text(out / f"step_{step:06d}.jsonl", "\n".join(lines) + "\n")

    def save_checkpoint(self, step: int) -> None:
        ckpt.save_checkpoint(
            self.run_dir, step, self.model, self.optimizer, self.scheduler,
            extra={"sampler_cursor": self.sampler.cursor}, keep=self.cfg.checkpoint.keep,
        )  # fmt: skip

    def export_final(self) -> Path:
        """The trained model as a plain Hugging Face directory (LoRA merged), loadable by `tokencredit eval`."""
        out = self.run_dir / "final"
        model = self.model
        if hasattr(model, "merge_and_unload"):
            model = copy.deepcopy(model).merge_and_unload()
        tmp = self.run_dir / ".final.tmp"
        model.save_pretrained(tmp)
        self.tokenizer.save_pretrained(tmp)
        if out.exists():
            import shutil

            shutil.rmtree(out)
        os.replace(tmp, out)
        return out

    def log(self, rec: dict[str, Any]) -> None:
        """Append one record; `wall_time` is seconds since the run started, summed over resumed sessions."""
        rec["wall_time"] = self._time_offset + time.perf_counter() - self._t_session
        self.metrics.append(rec)
        self.history.append(rec)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, Any]:
        cfg = self.cfg
        self._t_session = time.perf_counter()
        self._time_offset = float(self.history[-1].get("wall_time", 0.0)) if self.history else 0.0
        if self.step_done == 0 and cfg.eval.at_start and not any(h.get("type") == "eval" for h in self.history):
            self.console.print("evaluating the starting model on held-out problems ...")
            self.log(self.evaluate(0))
        try:
            self._loop()
        finally:
            # also on an error: no verifier worker processes outlive a failed run
            self.reward_fn.close()
        summary = self.summarize(self._time_offset + time.perf_counter() - self._t_session)
        return summary

    def _loop(self) -> None:
        """Steps `step_done`..`run.steps` with logging, evaluation and checkpoints. A step that fails
        on bad numbers raises TrainingError before anything of it is logged or saved, so the metrics
        and checkpoints of earlier steps are the last good state."""
        from tokencredit.train.progress import StepProgress

        cfg = self.cfg
        with StepProgress(cfg.run.steps, self.step_done, enabled=cfg.run.progress, console=self.console) as bar:
            for step in range(self.step_done, cfg.run.steps):
                try:
                    rec, ro, batch, tc = self.step(step)
                except BatchValidationError as e:  # a non-finite signal or score, caught by the batch checks
                    raise TrainingError(f"step {step + 1}: {e}{self._last_good_note()}") from e
                except TrainingError as e:
                    raise TrainingError(f"{e}{self._last_good_note()}") from e
                self.log(rec)
                bar.update(rec)
                done = step + 1
                is_eval = (cfg.eval.every and done % cfg.eval.every == 0) or done == cfg.run.steps
                if is_eval:
                    if batch is not None:
                        self.save_rollouts(done, ro, batch, tc.token_advantages, tc.seq_advantages)
                    ev = self.evaluate(done)
                    self.log(ev)
                    bar.note(ev)
                if (cfg.checkpoint.every and done % cfg.checkpoint.every == 0) or done == cfg.run.steps:
                    self.save_checkpoint(done)
                self.step_done = done

    def _last_good_note(self) -> str:
        """'; last good checkpoint: step N in DIR (continue with --resume)' for a TrainingError."""
        ck = sorted((self.run_dir / "checkpoints").glob("step_*.json"))
        if not ck:
            return f"; no checkpoint yet in {self.run_dir} (metrics of finished steps are in metrics.jsonl)"
        return f"; last good checkpoint: step {int(ck[-1].stem.split('_')[1])} in {self.run_dir} (continue with --resume)"

    def summarize(self, seconds: float) -> dict[str, Any]:
        from tokencredit.report.curves import plot_curves, summary_table

        evals = [h for h in self.history if h.get("type") == "eval"]
        steps = [h for h in self.history if h.get("type") != "eval" and "reward" in h]
        final_dir = self.export_final()
        summary = {
            "run_dir": str(self.run_dir),
            "recipe": self.recipe.name,
            "steps": self.step_done,
            "seconds": seconds,
            "base": evals[0] if evals else None,
            "final": evals[-1] if evals else None,
            "tokens_per_s": sum(s["tokens"] for s in steps) / max(1e-9, sum(
                s["time_generate"] + s["time_signals"] + s["time_update"] for s in steps)) if steps else 0.0,
            "mean_response_length": steps[-1]["response_length"] if steps else 0.0,
            "final_model": str(final_dir),
        }  # fmt: skip
        ckpt.atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        plot_curves(self.history, self.run_dir / "curves.png", title=f"{self.recipe.name} on {self.cfg.data.train}")
        self.console.print(summary_table(summary, steps))
        self.console.print(f"curves: {self.run_dir / 'curves.png'}   metrics: {self.metrics.path}   model: {final_dir}")
        return summary


def load_problems_for(spec: str, cfg: TrainConfig, split: str) -> list[Any]:
    """Problems for `data.train` / `data.eval`: "toy" (the synthetic task's train or held-out split),
    comma-separated shipped benchmark names, or files / `datasets` directories."""
    from tokencredit.data import benchmarks, load_problems
    from tokencredit.data.synthetic import ArithmeticTask

    d = cfg.data
    limit = d.eval_size if split == "heldout" and d.eval_size > 0 else None
    if spec == "toy":
        task = ArithmeticTask(difficulty=d.difficulty, digits=d.digits)
        return task.sample(d.eval_size if split == "heldout" else d.train_size, split)
    out: list[Any] = []
    for part in (x.strip() for x in spec.split(",") if x.strip()):
        if part in benchmarks.NAMES:
            out += benchmarks.load(part, limit=limit)
        else:
            out += load_problems(
                part, problem_field=d.problem_field or None, answer_field=d.answer_field or None, limit=limit
            )
    if not out:
        raise ConfigError(f"data.{'eval' if split == 'heldout' else 'train'} = {spec!r} gave no problems")
    return out


def _avg_keys(mets: list[dict[str, float]]) -> list[str]:
    keys: list[str] = []
    for m in mets:
        keys += [k for k in m if k not in keys]
    return keys


def _select(ro: StepRollouts, rows: Tensor) -> StepRollouts:
    idx = rows.nonzero().flatten()
    return StepRollouts(
        [ro.problems[i] for i in idx.tolist()], ro.prompt_ids[idx], ro.prompt_mask[idx], ro.response_ids[idx],
        ro.response_mask[idx], ro.truncated[idx], [ro.texts[i] for i in idx.tolist()], ro.group_ids[idx],
        ro.scores[idx], ro.correct[idx], ro.rounds,
    )  # fmt: skip


def _merge(parts: list[StepRollouts], pad_id: int) -> StepRollouts:
    return StepRollouts(
        [p for r in parts for p in r.problems],
        _pad_cat([r.prompt_ids for r in parts], pad_id, left=True),
        _pad_cat([r.prompt_mask for r in parts], False, left=True),
        _pad_cat([r.response_ids for r in parts], pad_id, left=False),
        _pad_cat([r.response_mask for r in parts], False, left=False),
        torch.cat([r.truncated for r in parts]),
        [t for r in parts for t in r.texts],
        torch.cat([r.group_ids for r in parts]),
        torch.cat([r.scores for r in parts]),
        torch.cat([r.correct for r in parts]),
        parts[-1].rounds,
    )
