"""The one-device trainer: sample -> reward -> advantage -> signals -> credit -> update.

Read top to bottom: `Trainer.__init__` builds everything from the config, `Trainer.step` is one
RL step as the papers write it, `Trainer.fit` is the loop with evaluation, checkpoints, the
progress bar, the experiment trackers (`run.report_to`) and the final report. SIGINT / SIGTERM
stop the loop after the step in progress (`tokencredit.train.stop`); a full disk stops it naming
the file, with the last good state kept.
Every algorithmic choice comes from the recipe (a row of `tokencredit.recipes.RECIPES`); the
trainer only gathers inputs and calls the core's pure functions: `recipes.token_credit` for A and
Â, `objectives.policy_loss` inside `update.policy_update`.
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import Tensor

from tokencredit import models, recipes
from tokencredit.atomic import write_error
from tokencredit.batch import BatchValidationError, RolloutBatch
from tokencredit.builder import Passes, build_batch, needs_of, rendered_negative_prompts
from tokencredit.credit.tail import tail_metrics
from tokencredit.data.templates import chat_template_warning, render
from tokencredit.data.token_labels import tail_token_mask
from tokencredit.errors import ConfigError, DiskFullError, Interrupted, TrainingError, WriteFailedError
from tokencredit.evaluation import evaluate
from tokencredit.oracle import MCSettings, mc_signals
from tokencredit.recipes import Recipe, TokenCredit
from tokencredit.rewards import Reward
from tokencredit.rewards.custom import RewardError
from tokencredit.rollout import SamplingSettings
from tokencredit.tasks import load_problems_for, tail_task
from tokencredit.train import checkpoint as ckpt
from tokencredit.train.config import TrainConfig, check_recipe, validate_config
from tokencredit.train.critic import Critic, needs_critic
from tokencredit.train.progress import StepProgress
from tokencredit.train.rundir import RunDir, check_replaceable, replace_run, rollout_records
from tokencredit.train.sampling import (
    PromptSampler,
    StepRollouts,
    collect,
    rollout_sampling,
    run_eval_settings,
    sample_round,
    seed_for,
    with_greedy_baselines,
    with_mc_signals,
)
from tokencredit.train.stop import StopNow, StopSignals, signal_name, stopped_message
from tokencredit.train.summary import plot_curves, run_summary, step_record, summary_table
from tokencredit.train.trackers import Trackers, require
from tokencredit.train.update import UpdateStats, can_fuse_old_pass, lr_factor, policy_update

__all__ = ["StepResult", "Trainer", "resolve_recipe"]


def resolve_recipe(cfg: TrainConfig) -> Recipe:
    """The configured recipe with `algo.overrides` applied (dict fields are merged, not replaced), validated."""
    return recipes.resolve(cfg.algo.recipe, cfg.algo.overrides)


@dataclass(frozen=True)
class StepResult:
    """One step: its metrics.jsonl record, the rollouts, and (when it trained) the batch and its credit.

    `batch` / `credit` are None when DAPO's dynamic sampling found no informative group: the step
    logs its rollouts and skips the update.
    """

    record: dict[str, Any]
    rollouts: StepRollouts
    batch: RolloutBatch | None = None
    credit: TokenCredit | None = None


class Trainer:
    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        *,
        resume: bool = False,
        overwrite: bool = False,
        console: Any = None,
    ) -> None:
        """`overwrite`: a run already in `run_dir` is replaced whole (`rundir.replace_run`); without it a
        new run stops on a directory that holds one. The directory is locked for this object's life."""
        self.cfg, self.run = cfg, RunDir(run_dir)
        self.run_dir = self.run.path
        self.console = console or Console()
        validate_config(cfg)  # value ranges first: every bad value is named before any model loads
        if not resume:  # and never a new run over another one (only reads: nothing is written yet)
            check_replaceable(self.run_dir) if overwrite else self.run.check_fresh()
        self.report_to = require(cfg.run.report_to)  # a tracker's missing library too
        self.trackers = Trackers()  # opened by fit()
        self.recipe = resolve_recipe(cfg)
        check_recipe(self.recipe, cfg)
        models.resolve_model(cfg.model.name)  # the model's files checked before any data is built
        # Data and reward function before the model: a malformed file or a bad reward name is
        # reported in a second, not after loading a large checkpoint.
        self.train_problems = load_problems_for(cfg.data.train, cfg.data, split="train")
        self.eval_problems = load_problems_for(cfg.data.eval, cfg.data, split=cfg.data.eval_split)
        # a task with a reward-irrelevant tail: each batch carries its tail mask (zero_tail, tail/* metrics)
        self.tail_task = tail_task(cfg.data.train, cfg.data)
        if self.recipe.zero_tail and self.tail_task is None:
            raise ConfigError(
                f"algo.zero_tail: data.train = {cfg.data.train!r} has no reward-irrelevant tail to zero; "
                "use a toy-tail task (--config toy-tail-32 or toy-tail-128)"
            )
        self.sampler = PromptSampler(self.train_problems, cfg.run.seed)
        # correctness only; the format reward and DAPO's overlong shaping are added to the score separately
        self.reward_fn = Reward(
            cfg.reward.function,
            timeout=cfg.reward.timeout,
            retry_timeouts=cfg.reward.retry_timeouts,
            contract=cfg.reward.contract,
            max_steps=cfg.run.steps,
        )
        self.reward_fn.check(self.train_problems[0])  # a wrong user reward stops here, before the model loads
        if cfg.run.threads > 0 or cfg.model.name in models.TOY_VARIANTS:
            torch.set_num_threads(cfg.run.threads or 1)
        self.device = models.resolve_device(cfg.run.device, "run.device")
        torch.manual_seed(cfg.run.seed)
        self.model, self.tokenizer = ckpt.build_policy(cfg, self.device)
        if warning := chat_template_warning(
            cfg.data.template, self.tokenizer, cfg.model.name, option="data.template"
        ):
            self.console.print(f"[yellow]warning: {warning}", highlight=False)
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.special_ids = models.special_token_ids(self.tokenizer)
        self._special_texts = tuple(
            t for t in getattr(self.tokenizer, "all_special_tokens", []) if len(t) > 1
        )
        self.fused_old = can_fuse_old_pass(self.model, cfg.optim, self.recipe, needs_of(self.recipe).forward)
        # entropy is logged every step (same pass); ReMax's greedy baseline and the oracle's values are sampled
        self.needs = needs_of(self.recipe, objective=True, extra={"entropy"}, fused_old=self.fused_old)
        self.ref_model = None
        if "ref_log_probs" in self.needs.forward and cfg.model.lora_rank <= 0:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        params = [p for p in self.model.parameters() if p.requires_grad]
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            params, lr=o.lr, betas=(o.beta1, o.beta2), weight_decay=o.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, partial(lr_factor, o, cfg.run.steps)
        )
        # PPO's value model, when the recipe's estimator reads critic values (declared data, not the recipe's name)
        self.critic = Critic.build(cfg, self.recipe, self.device) if needs_critic(self.recipe) else None
        self.step_done = 0
        self.resumed = resume
        self.stopped_by: int | None = None  # the stop signal fit() received, if any
        self.metrics = self.run.metrics
        self.history: list[dict[str, Any]] = []
        if overwrite and not resume:
            replace_run(self.run_dir)
        # one writer: a second trainer on this directory stops here
        self.lock = self.run.claim(fresh=not resume, option="--resume" if resume else "--out")
        if resume:
            self._restore()
        else:
            self.metrics.truncate_after(-1)
        self._t_session, self._time_offset = time.perf_counter(), 0.0
        self.run.write_config(cfg)
        self.run.write_recipe(self.recipe)

    # ------------------------------------------------------------------ setup helpers
    def _restore(self) -> None:
        state = ckpt.load_latest_checkpoint(self.run, log=lambda m: self.console.print(f"[yellow]{m}"))
        if state is None:
            saved = sorted({*self.run.checkpoint_steps(), *self.run.digest_steps()})
            if saved:  # every checkpoint failed: restarting at step 0 would throw the run away unasked
                names = ", ".join(self.run.checkpoint_path(s).name for s in saved[-3:])
                raise ConfigError(
                    f"--resume {self.run_dir}: no checkpoint is usable ({len(saved)} failed their digest or "
                    f"could not be read: {names}); copy them again, or start anew with --overwrite"
                )
            self.console.print("[yellow]no checkpoint yet; starting from step 0")
            self.metrics.truncate_after(-1)
        else:
            self.step_done = ckpt.restore(self.model, self.optimizer, self.scheduler, state)
            if self.critic is not None:
                if "critic" not in state["extra"]:
                    raise ConfigError(
                        f"--resume {self.run_dir}: checkpoint step {self.step_done} holds no critic, which recipe "
                        f"{self.recipe.name!r} trains (was it written by a run of another recipe?)"
                    )
                self.critic.load_state_dict(state["extra"]["critic"], f"checkpoint step {self.step_done}")
            self.sampler.cursor = int(state["extra"]["sampler_cursor"])
            self.metrics.truncate_after(self.step_done)
            self.console.print(f"resumed {self.run_dir} at step {self.step_done}")
        self.history = self.metrics.read()

    def _prompt_text(self, problem: str) -> str:
        if self._special_texts and (hit := next((t for t in self._special_texts if t in problem), None)):
            # The rendered prompt is tokenised whole (its chat template's own special tokens must be read
            # as such), so special-token text inside a problem is read as that token too, as TRL and verl
            # read it: said once, not silently.
            self._special_texts = ()
            self.console.print(
                f"warning: a training problem's text contains {hit!r}, which the tokenizer reads as its "
                "special token (as TRL and verl do), so the prompt may end or change turns there; remove "
                "it from the data if it is not meant so",
                style="yellow",
                highlight=False,
                markup=False,
            )
        return render(self.cfg.data.template, problem, self.tokenizer)

    # ------------------------------------------------------------------ one step
    def step(self, step: int) -> StepResult:
        """One RL step: sample -> reward -> advantage -> signals -> credit -> update."""
        t0 = time.perf_counter()
        ro = self.sample(step)  # G completions per prompt, scored (DAPO: resampled until informative)
        t_gen = time.perf_counter() - t0
        if len(ro) == 0:
            record = {
                "step": step + 1,
                "rollouts": 0,
                "gen_rounds": ro.rounds,
                "verify_timeouts": ro.verify_timeouts,
                "generated_tokens": ro.generated_tokens,
                "skipped": "no informative group after dynamic sampling",
            }
            return StepResult(record, ro)
        batch = self.old_policy_batch(ro)  # signals: one no-grad pass of the old policy
        seq, attn = ro.sequences.to(self.device), ro.attention_mask.to(self.device)
        prompt_len = ro.prompt_ids.shape[1]
        if self.critic is not None:  # V_old: one no-grad pass of the critic, read by the estimator (GAE)
            batch = replace(batch, values=self.critic.values(seq, attn, prompt_len, batch.mask))
        credit = self.credit(batch)  # advantage A, then the credit method's token advantages Â
        t_sig = time.perf_counter() - t0 - t_gen
        if self.critic is not None and step < self.cfg.critic.warmup_steps:
            upd = UpdateStats({}, 0.0)  # critic warm-up: the policy (and its schedule) waits
        else:
            upd = policy_update(
                self.model,
                self.optimizer,
                batch,
                credit,
                seq,
                attn,
                prompt_len,
                self.cfg.optim,
                temperature=self.cfg.rollout.temperature,
                fuse_old=self.fused_old,
                seed=self.cfg.run.seed,
                step=step,
            )
            self.scheduler.step()
        critic_metrics = {} if self.critic is None else self.critic.update(batch, seq, attn, prompt_len, step)
        times = {"generate": t_gen, "signals": t_sig, "update": time.perf_counter() - t0 - t_gen - t_sig}
        lr = float(self.scheduler.get_last_lr()[0])
        # the fused pass's old log-probs and entropy join a copy: the batch credit read stays as it was
        logged = batch.with_signals(upd.old_signals) if upd.old_signals else batch
        record = step_record(step + 1, ro, logged, credit, upd, times, lr) | critic_metrics
        record |= self.policy_work(int(attn.sum()), updated=bool(upd.metrics))
        if batch.tail_mask is not None:  # the tail's entropy: noise-driven drift the reward never sees
            record |= tail_metrics(batch.tail_mask, logged.entropy, logged.mask)
        return StepResult(record, ro, logged, credit)

    def policy_work(self, tokens: int, *, updated: bool) -> dict[str, int]:
        """The policy's passes over the step's sequences (`tokens`: prompt + response tokens), for the compute
        axis (`compare`'s work column): no-grad forwards of the old policy (none when the fused pass reads its
        signals from the training forward) and of the reference model, and ppo_epochs training passes
        (a forward and a backward each). Generation is counted separately (`generated_tokens`)."""
        fwd_models = int(bool(self.needs.forward) and not self.fused_old) + int(
            "ref_log_probs" in self.needs.forward
        )
        epochs = self.cfg.optim.ppo_epochs if updated else 0
        return {
            "policy/forward_tokens": tokens * (fwd_models + epochs),
            "policy/backward_tokens": tokens * epochs,
        }

    def sample(self, step: int) -> StepRollouts:
        """The step's scored rollouts; with dynamic sampling only groups whose rewards differ; for ReMax
        also the score of one greedy rollout per prompt (its baseline)."""
        c = self.cfg.rollout
        sampling = rollout_sampling(c)

        def scored(
            problems: list[Any], group_size: int, how: SamplingSettings, seed: int, offset: int
        ) -> StepRollouts:
            return sample_round(
                self.model,
                self.tokenizer,
                problems,
                [self._prompt_text(p.problem) for p in problems],
                group_size=group_size,
                reward=self.reward_fn,
                format_weight=self.cfg.reward.format_weight,
                overlong_buffer=self.recipe.overlong_buffer,
                sampling=how,
                seed=seed,
                group_offset=offset,
                step=step,
            )

        ro = collect(
            lambda rnd: scored(
                self.sampler.take(c.prompts_per_step),
                c.group_size,
                sampling,
                seed_for(self.cfg.run.seed, step, rnd),
                rnd * c.prompts_per_step,
            ),
            groups=c.prompts_per_step,
            dynamic=self.recipe.dynamic_sampling,
            max_rounds=c.max_resample_rounds,
            pad_id=self.tokenizer.pad_token_id,
        )
        if "baseline_scores" in self.needs.fields and len(ro):
            ro = with_greedy_baselines(
                ro, lambda problems: scored(problems, 1, replace(sampling, temperature=0.0), 0, 0)
            )
        if self.needs.sampled and len(ro):
            try:
                ro = with_mc_signals(ro, lambda r: self._mc_signals(r, seed_for(self.cfg.run.seed, step, 17)))
            except RewardError as e:  # the reward of a continuation names the function and what came back
                raise TrainingError(f"step {step + 1}: {e}") from e
        return ro

    def _mc_signals(self, ro: StepRollouts, seed: int) -> tuple[dict[str, Tensor], Any]:
        """The Monte-Carlo values the recipe reads (oracle, VinePPO), with the rollouts' sampling settings and
        the verifier's correctness as the reward (in [0, 1]; format and overlong shaping are not values)."""
        q = self.cfg.oracle
        settings = MCSettings(q.k, q.delta, q.vine_k, q.vine_max_steps, q.delimiter, q.batch_size)
        return mc_signals(
            self.model,
            self.tokenizer,
            ro,
            [p.answer for p in ro.problems],
            self.reward_fn,
            self.needs.sampled,
            sampling=rollout_sampling(self.cfg.rollout),
            settings=settings,
            seed=seed,
            known_zero=self._tail_mask(ro),
        )

    def _tail_mask(self, ro: StepRollouts) -> Tensor | None:
        """[N,T] bool: the tokens of the task's reward-irrelevant tail, from its labels (credit.tail); None
        on a task without one. Their exact credit is 0: the tail-mask arm zeroes them, the oracle skips them."""
        if self.tail_task is None:
            return None
        labels = self.tail_task.label_chars
        return tail_token_mask(self.tokenizer, ro.response_ids, ro.response_mask, ro.problems, labels)

    def old_policy_batch(self, ro: StepRollouts) -> RolloutBatch:
        """The RolloutBatch of the step's rollouts with the recipe's signals, on the device (`builder.build_batch`).

        The signals come from one no-grad pass of the old policy (plus the reference / negative-
        prompt passes a recipe asks for); with the fused pass the old log-probs and entropy come
        from the training forward instead (`update.policy_update`); the Monte-Carlo values were
        sampled with the rollouts (`sample`).
        """
        passes = Passes(
            temperature=self.cfg.rollout.temperature,
            batch_size=self.cfg.optim.micro_batch_size or None,
            ref_model=self.ref_model,
            tokenizer=self.tokenizer,
            negative_prompts=rendered_negative_prompts(
                [p.problem for p in ro.problems], self.cfg.data.template, self.tokenizer
            ),
        )
        return build_batch(
            ro,
            self.needs,
            model=self.model,
            given=ro.mc_signals,
            passes=passes,
            device=self.device,
            tail_mask=self._tail_mask(ro),
        )

    def credit(self, batch: RolloutBatch) -> TokenCredit:
        """The step's credit: the one pipeline with this run's recipe, tokenizer special ids and length limit."""
        return recipes.token_credit(
            self.recipe,
            batch,
            special_ids=self.special_ids,
            max_response_length=self.cfg.rollout.max_new_tokens,
        )

    # ------------------------------------------------------------------ evaluation and saving
    def evaluate(self, step: int) -> dict[str, Any]:
        e = self.cfg.eval
        settings = run_eval_settings(self.cfg)
        res = evaluate(
            self.model,
            self.tokenizer,
            self.eval_problems,
            settings,
            verifier=self.reward_fn.verifier,
            progress=False,
        )
        # One name per quantity (the tracker tags come from these keys): the evaluation's greedy_acc,
        # avg@{samples} and mean_response_length are logged under the names every reader of
        # metrics.jsonl uses; files written before this kept both, which those readers still read.
        renamed = {"greedy_acc": "greedy_accuracy", f"avg@{e.samples}": "avg_at_k"}
        renamed["mean_response_length"] = "mean_length"
        rec: dict[str, Any] = {"step": step, "type": "eval"}
        rec.update({f"eval_{renamed.get(k, k)}": float(v) for k, v in res.items()})
        return rec

    def save_rollouts(self, step: int, result: StepResult) -> None:
        """Saved groups with per-token Â and signals (input of `tokencredit explain`)."""
        records = rollout_records(
            step,
            self.recipe,
            result.rollouts,
            result.batch,
            result.credit,
            self.tokenizer,
            self.cfg.eval.save_groups,
        )
        self.run.write_rollouts(step, records)

    def save_checkpoint(self, step: int) -> None:
        ckpt.save_checkpoint(
            self.run,
            step,
            self.model,
            self.optimizer,
            self.scheduler,
            extra={"sampler_cursor": self.sampler.cursor}
            | ({} if self.critic is None else {"critic": self.critic.state_dict()}),
            keep=self.cfg.checkpoint.keep,
        )

    def export_final(self) -> Path:
        """The trained model as a plain Hugging Face directory (LoRA merged), loadable by `tokencredit eval`;
        with a critic also its final weights (`RunDir.final_critic_path`), which explain and probe read."""
        out = self.run.final_dir
        model = self.model
        if hasattr(model, "merge_and_unload"):
            model = copy.deepcopy(model).merge_and_unload()
        tmp = self.run_dir / ".final.tmp"
        try:
            model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            if self.critic is not None:  # weights only: the optimiser stays in the checkpoints (for --resume)
                state = self.critic.state_dict()
                torch.save(
                    {"step": self.step_done, "model": state["model"]}, tmp / self.run.final_critic_path.name
                )
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)  # a half-written export is never left behind
            if (err := write_error(out, e)) is not None:
                raise err from e
            raise
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        return out

    def log(self, rec: dict[str, Any]) -> None:
        """Append one record; `wall_time` is seconds since the run started, summed over resumed sessions."""
        rec["wall_time"] = self._time_offset + time.perf_counter() - self._t_session
        self.metrics.append(rec)
        self.history.append(rec)
        self.trackers.log(rec)  # after metrics.jsonl: a tracker's failure warns, never loses the record

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, Any]:
        """Evaluation at start, the steps, the summary. The first SIGINT / SIGTERM ends the run after
        the step in progress with a checkpoint of it and `Interrupted`; a second one abandons that
        step. A full disk raises DiskFullError (a read-only file system WriteFailedError) naming the file
        and the last good checkpoint."""
        self._t_session = time.perf_counter()
        self._time_offset = float(self.history[-1].get("wall_time", 0.0)) if self.history else 0.0
        self.trackers = Trackers.start(
            self.report_to,
            self.run,
            self.cfg.to_dict(),
            first_step=self.step_done + 1 if self.step_done else 0,
            resume=self.resumed,
            warn=lambda m: self.console.print(f"[yellow]{m}"),
        )
        # the trackers' end: 0 once the run returns, 128 + signal number when a signal stopped it
        exit_code = 1
        try:
            self.reward_fn.start()  # the verifier's workers warm up while the first rollouts are sampled
            with StopSignals(self._on_signal) as stop:
                summary = self._run(stop)
            exit_code = 0
            return summary
        except Interrupted as e:
            exit_code = e.exit_code
            raise
        except StopNow as e:
            exit_code = 128 + e.signum
            checkpoints = self.run.checkpoint_steps()
            msg = stopped_message(
                e.signum,
                self.run_dir,
                self.step_done,
                abandoned=True,
                checkpoint=checkpoints[-1] if checkpoints else None,
            )
            raise Interrupted(msg, e.signum) from None
        except (
            WriteFailedError
        ) as e:  # a full disk, a file system turned read-only: the finished steps are kept
            fix = "free some space" if isinstance(e, DiskFullError) else "make the directory writable again"
            raise type(e)(f"{e}{self._last_good_note(fix)}", e.path) from e
        finally:
            # also on an error or a signal: no verifier worker processes outlive a stopped run
            self.reward_fn.close()
            self.trackers.close(exit_code)
            self.lock.release()

    def _run(self, stop: StopSignals) -> dict[str, Any]:
        cfg = self.cfg
        if (
            self.step_done == 0
            and cfg.eval.at_start
            and not any(h.get("type") == "eval" for h in self.history)
        ):
            self.console.print("evaluating the starting model on held-out problems ...")
            self.log(self.evaluate(0))
        self._loop(stop)
        if stop.signum is not None:
            if self.step_done and self.step_done not in self.run.checkpoint_steps():
                self.save_checkpoint(self.step_done)
            msg = stopped_message(
                stop.signum, self.run_dir, self.step_done, abandoned=False, checkpoint=self.step_done
            )
            raise Interrupted(msg, stop.signum)
        return self.summarize(self._time_offset + time.perf_counter() - self._t_session)

    def _on_signal(self, signum: int) -> None:
        # set also when it lands after the last step, so a caller running several runs stops
        self.stopped_by = signum
        name = signal_name(signum)
        self.console.print(
            f"[yellow]{name}: stopping after the step in progress ({name} again stops at once)"
        )

    def _loop(self, stop: StopSignals) -> None:
        """Steps `step_done`..`run.steps` with logging, evaluation and checkpoints, until `stop` is
        requested. A step that fails on bad numbers raises TrainingError before anything of it is
        logged or saved, so the metrics and checkpoints of earlier steps are the last good state."""
        cfg = self.cfg
        with StepProgress(
            cfg.run.steps, self.step_done, enabled=cfg.run.progress, console=self.console
        ) as bar:
            for step in range(self.step_done, cfg.run.steps):
                if stop.requested:
                    break
                try:
                    result = self.step(step)
                except BatchValidationError as e:  # a non-finite signal or score, caught by the batch checks
                    raise TrainingError(f"step {step + 1}: {e}{self._last_good_note()}") from e
                except TrainingError as e:
                    raise TrainingError(f"{e}{self._last_good_note()}") from e
                self.log(result.record)
                bar.update(result.record)
                done = step + 1
                if (cfg.eval.every and done % cfg.eval.every == 0) or done == cfg.run.steps:
                    if result.batch is not None:
                        self.save_rollouts(done, result)
                    ev = self.evaluate(done)
                    self.log(ev)
                    bar.note(ev)
                if (cfg.checkpoint.every and done % cfg.checkpoint.every == 0) or done == cfg.run.steps:
                    self.save_checkpoint(done)
                self.step_done = done

    def _last_good_note(self, fix: str = "") -> str:
        """'; last good checkpoint: step N in DIR (continue with --resume)' for a TrainingError; `fix` is
        what to do first when the machine, not the run, failed ("free some space")."""
        steps = self.run.checkpoint_steps()
        then = f"{fix}, then continue" if fix else "continue"
        if not steps:
            restart = f" ({then} with --resume, which starts again at step 0)" if fix else ""
            return f"; no checkpoint yet in {self.run_dir} (metrics of finished steps are in metrics.jsonl){restart}"
        return f"; last good checkpoint: step {steps[-1]} in {self.run_dir} ({then} with --resume)"

    def summarize(self, seconds: float) -> dict[str, Any]:
        final_dir = self.export_final()
        summary = run_summary(
            self.history,
            run_dir=self.run_dir,
            recipe=self.recipe.name,
            steps_done=self.step_done,
            seconds=seconds,
            final_model=final_dir,
            eval_split=self.cfg.data.eval_split,
        )
        self.run.write_summary(summary)
        title = f"{self.cfg.run.label or self.recipe.name} on {self.cfg.data.train}"
        plot_curves(self.history, self.run.curves_path, title=title)
        steps = [h for h in self.history if h.get("type") != "eval" and "reward" in h]
        self.console.print(summary_table(summary, steps))
        # soft_wrap: a path is never broken across lines, whatever the console's width
        for label, path in (
            ("curves", self.run.curves_path),
            ("metrics", self.metrics.path),
            ("model", final_dir),
        ):
            self.console.print(f"{label + ':':<9}{path}", soft_wrap=True, highlight=False)
        return summary
