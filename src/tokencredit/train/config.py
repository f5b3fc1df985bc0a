"""Trainer configuration: dataclass sections, a TOML file, `--set section.key=value` overrides.

Every key is read somewhere in the trainer; an unknown key is an error naming the closest valid
ones (a report reading a run directory may skip them instead: `load_config(..., unknown=[])`). The
resolved configuration is written to the run directory as `config.toml`, which `--resume` reads back.
"""

from __future__ import annotations

import ast
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tokencredit import models, objectives, recipes
from tokencredit.data.synthetic import MAX_DIFFICULTY, MAX_DIGITS
from tokencredit.data.templates import check_template
from tokencredit.errors import ConfigError, closest
from tokencredit.models import resolve_device
from tokencredit.rewards.custom import check_contract, is_builtin_reward, resolve_reward_function
from tokencredit.train.trackers import parse_report_to


@dataclass
class RunConfig:
    seed: int = 0  # seeds torch, the prompt order and the rollout / evaluation sampling
    steps: int = 40  # training steps (each: prompts_per_step x group_size rollouts, then the update)
    out_dir: str = "runs"  # each run gets its own directory under this one
    name: str = ""  # run directory name under out_dir; "" = <recipe>-<seed>-<timestamp>
    label: str = ""  # its row in `tokencredit compare` ("" = the recipe's name; set by compare --arm)
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads on CPU; 0 = auto (1 for the toy model, whose ops are too small to split; else torch's default)
    progress: bool = True  # a live progress bar (false: one plain line per step)
    report_to: list[str] = field(
        default_factory=lambda: ["none"]
    )  # experiment trackers (TRL's report_to): none | all (those installed) | a list of tensorboard, wandb, mlflow


@dataclass
class ModelConfig:
    name: str = "toy"  # "toy" (the embedded warm-started tiny model) or a local HF model directory
    dtype: str = "float32"  # float32 | bfloat16 | float16 (statistics are float32 regardless)
    lora_rank: int = 0  # 0 = full fine-tuning
    lora_alpha: float = 16.0  # LoRA scale numerator (the adapter's update is scaled by alpha / rank)
    lora_dropout: float = 0.0  # dropout on the LoRA adapter's input, in [0, 1)
    lora_targets: list[str] = field(  # module names that get a LoRA adapter (those the model has)
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory, slower)


@dataclass
class DataConfig:
    train: str = "toy"  # "toy", a benchmark name (gsm8k_train), "reasoning-gym:NAME[?params]", a JSONL / Parquet / datasets path, or a cached hub dataset ORG/NAME
    eval: str = "toy"  # "toy" or comma-separated benchmark names / paths
    template: str = "qwen-math"  # qwen-math | chat (instruct models: the problem as the only user turn) | r1-zero | a custom string with {problem}
    difficulty: int = 3  # toy task: number of arithmetic steps
    digits: int = 2  # toy task: operands and running totals below 10**digits
    train_size: int = 4000  # toy task: distinct training problems
    eval_size: int = 200  # held-out problems (toy) or a limit on benchmark problems (0 = all)
    eval_split: str = "heldout"  # what data.eval scores: heldout (the test split) | validation (toy / reasoning-gym: problems disjoint from the training and held-out ones, for tuning)
    problem_field: str = ""  # field mapping for user files ("" = auto: problem/question/prompt)
    answer_field: str = ""  # "" = auto: answer/solution


@dataclass
class RolloutConfig:
    prompts_per_step: int = 8  # problems (groups) sampled per step
    group_size: int = 8  # completions per problem (G >= 2: the group baseline)
    temperature: float = 1.0  # sampling temperature of the rollouts (> 0)
    top_p: float = 1.0  # nucleus sampling of the rollouts (1.0 = off)
    max_new_tokens: int = 80  # toy solutions are ~62 characters (tokens) plus EOS
    max_resample_rounds: int = 3  # DAPO dynamic sampling: extra generation rounds to fill the batch
    generation_batch_size: int = 0  # rows per generate call; 0 = all at once


@dataclass
class OptimConfig:
    lr: float = 1e-4  # full fine-tuning of the toy model; 3e-4 and above collapse it
    weight_decay: float = 0.0  # AdamW weight decay
    beta1: float = 0.9  # AdamW beta1
    beta2: float = 0.99  # AdamW beta2
    warmup_steps: int = 0  # linear learning-rate warm-up steps (0 = none)
    schedule: str = "constant"  # constant | cosine
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    grad_clip: float = 1.0  # global gradient-norm clip (0 = no clipping)
    ppo_epochs: int = 1  # passes over each step's rollouts
    mini_batches: int = 1  # optimiser steps per epoch
    micro_batch_size: int = 0  # rows per forward/backward (gradient accumulation); 0 = whole mini-batch
    # One update per step and no pre-update signal needed: take the old log-probs (and the logged
    # entropy) from the training forward instead of a separate no-grad pass (exact; see Trainer).
    reuse_training_forward: bool = True


@dataclass
class RewardConfig:
    # auto (each problem's own checker) | math | reasoning-gym[?options] | module:function
    function: str = "auto"
    # how a module:function reward is called: auto (from its signature) | tokencredit f(completions, golds)
    # | trl f(prompts, completions, completion_ids, **columns)
    contract: str = "auto"
    # wall-clock seconds per answer (a timed-out answer scores 0 and is counted: verify_timeouts)
    timeout: float = 5.0
    retry_timeouts: bool = True  # judge a timed-out answer once more with 4x the limit before it scores 0
    format_weight: float = 0.0  # optional format reward added to the score


@dataclass
class OracleConfig:
    """Monte-Carlo values of the `oracle` and `vineppo` recipes (tokencredit.oracle): continuations per state."""

    k: int = 16  # continuations per state of the token-level oracle
    delta: float = 1e-3  # tokens with pi_old(y_t) >= 1 - delta get A* = 0 unsampled (|A*| <= 1 - pi, docs)
    vine_k: int = 9  # VinePPO's K (its paper's main configs)
    vine_max_steps: int = 20  # step boundaries valued (VinePPO's max_step_for_value_estimation)
    delimiter: str = "\n"  # a step ends after each token whose text contains it
    batch_size: int = 64  # sequences per generate call while sampling continuations


@dataclass
class CriticConfig:
    """The learned critic of a recipe whose advantage estimator reads the critic's values (ppo, bpco; none else
    builds one). Its discount, lambda, regression target and value bounds are the estimator's parameters
    (algo.advantage_params: gamma, lam, target, value_min, value_max), so A and the critic never disagree."""

    lr: float = 1e-4  # critic AdamW learning rate (verl's default 1e-5 is for billion-parameter critics; the toy critic learns at 1e-4)
    weight_decay: float = 0.01  # critic AdamW weight decay (verl's)
    grad_clip: float = 1.0  # critic gradient-norm clip (0 = no clipping)
    epochs: int = 1  # passes of the critic over each step's rollouts
    mini_batches: int = 1  # critic optimiser steps per epoch (must divide the rollouts per step)
    warmup_steps: int = 0  # first steps that update only the critic (the policy starts after them)
    cliprange_value: float = 0.5  # c of the clipped value loss: V is held within V_old +- c (verl's 0.5)
    loss_agg_mode: str = "token-mean"  # how the per-token value losses become one scalar (verl's names)


@dataclass
class EvalConfig:
    every: int = 20  # steps between held-out evaluations (0 = only at start and end)
    samples: int = 2  # sampled completions per problem for avg@k / pass@k (0 = greedy only)
    temperature: float = 1.0  # sampling temperature of the eval samples (0: each repeats the greedy answer)
    top_p: float = 1.0  # nucleus sampling of the eval samples (1.0 = off)
    at_start: bool = True  # evaluate the starting model before step 1
    save_groups: int = 8  # rollout groups (with per-token credit) saved at each eval step
    # sequences per generate call (greedy and sampled); lower it if evaluation runs out of memory
    batch_size: int = 256


@dataclass
class CheckpointConfig:
    every: int = 20  # steps between checkpoints (0 = only at the end)
    keep: int = 2  # checkpoints kept on disk (0 = all)


@dataclass
class AlgoConfig:
    # The token-level recipe that ended highest at these defaults (README: 3 seeds x 40 steps; `tokencredit
    # compare --recipes grpo,strace,delta,dapo+ktae,dapo --seeds 0,1,2`).

    # a recipe (`tokencredit recipes`) or credit method; recipe:NAME / credit:NAME to choose
    recipe: str = "dapo+ktae"
    # Overrides of the recipe's fields (see tokencredit.recipes.Recipe), e.g. {"eps_high": 0.3,
    # "kernel_params": {"lam": 0.9}}; dict values are merged into the recipe's dicts.
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    oracle: OracleConfig = field(default_factory=OracleConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _coerce(value: Any, current: Any, where: str) -> Any:
    """Convert a TOML or --set value to the type of the default (bool/int/float/str/list/dict)."""
    if isinstance(current, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if isinstance(current, int) and not isinstance(current, bool):
        try:  # true / false are not numbers (TOML's `steps = true` is a mistake, not 1)
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            number = int(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
        if not -(2**63) <= number < 2**63:
            raise ConfigError(f"{where}: {number} is out of range (a 64-bit integer is expected)")
        return number
    if isinstance(current, float):
        try:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if isinstance(current, list):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return value
    if isinstance(current, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return value
    return str(value)


def _parse_scalar(text: str) -> Any:
    """A --set value: a TOML value (true, 3, 0.1, [..], {a = 1}, "x"), else a Python literal ({'a': 1}),
    else the raw string. Whether that string may stand for the key is `_coerce`'s to say: a table key
    given "{eps_high=0.3" is an error there, a template "{problem} ..." is a string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return text


def apply_dict(cfg: TrainConfig, data: dict[str, Any], source: str, unknown: list[str] | None = None) -> None:
    """Merge a nested dict (from TOML) into cfg. An unknown section or key is an error naming `source`;
    with `unknown` a list it is skipped instead and its name ("section" or "section.key") appended there
    (a report reading a run written by another version: `RunDir.read_config(skipped=...)`)."""
    sections = {f.name: f for f in fields(cfg)}
    for sec, values in data.items():
        if sec not in sections:
            if unknown is not None:
                unknown.append(sec)
                continue
            raise ConfigError(f"{source}: unknown section [{sec}]{closest(sec, sections)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: [{sec}] must be a table")
        obj = getattr(cfg, sec)
        keys = {f.name for f in fields(obj)}
        for key, value in values.items():
            if key not in keys:
                if unknown is not None:
                    unknown.append(f"{sec}.{key}")
                    continue
                raise ConfigError(
                    f"{source}: unknown key {sec}.{key}{closest(key, keys)}; valid: {', '.join(sorted(keys))}"
                )
            if sec == "algo" and key == "overrides":
                if not isinstance(value, dict):
                    raise ConfigError(
                        f"{source}: algo.overrides: expected a table such as {{eps_high = 0.3}}, got {value!r}"
                    )
                obj.overrides = _merge(obj.overrides, value)
                continue
            setattr(obj, key, _coerce(value, getattr(obj, key), f"{source}: {sec}.{key}"))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def apply_set(cfg: TrainConfig, assignment: str) -> None:
    """Apply one `section.key=value` override. `algo.<recipe field>[.<param>]=v` overrides the recipe."""
    if "=" not in assignment:
        raise ConfigError(f"--set expects section.key=value, got {assignment!r}")
    path, raw = assignment.split("=", 1)
    parts = path.strip().split(".")
    value = _parse_scalar(raw)
    if len(parts) >= 2 and parts[0] == "algo" and parts[1] not in ("recipe", "overrides"):
        nested: Any = value
        for p in reversed(parts[2:]):
            nested = {p: nested}
        cfg.algo.overrides = _merge(cfg.algo.overrides, {parts[1]: nested})
        return
    if len(parts) != 2:
        raise ConfigError(f"--set {assignment!r}: expected section.key=value (e.g. optim.lr=3e-4)")
    apply_dict(cfg, {parts[0]: {parts[1]: value}}, "--set")


SHIPPED_CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def shipped_configs() -> list[str]:
    """Names of the configs shipped with the package (`--config NAME`)."""
    return sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.toml"))


def load_config(
    path: str | Path | None = None,
    sets: list[str] | None = None,
    recipe: str | None = None,
    *,
    unknown: list[str] | None = None,
) -> TrainConfig:
    """TrainConfig from defaults <- TOML file <- --recipe <- --set overrides (later wins).

    `path` is a TOML file, or the name of a shipped config (`SHIPPED_CONFIGS`, e.g. "toy-hard"). An
    unknown section or key in the file is an error (a typo in `tokencredit train --config` stops the
    run before it starts); with `unknown` a list, the file's unknown names are skipped and appended
    there (see `apply_dict`). --set overrides are always strict.
    """
    cfg = TrainConfig()
    if path is not None:
        p = Path(path)
        if not p.is_file() and str(path) in shipped_configs():
            p = SHIPPED_CONFIGS / f"{path}.toml"
        if p.is_dir():
            raise ConfigError(f"--config {p} is a directory, not a TOML file")
        if p.exists() and not p.is_file():
            raise ConfigError(f"--config {p} is not a regular file (a device or a pipe?); give a TOML file")
        if not p.is_file():
            known = ", ".join(shipped_configs())
            raise ConfigError(f"config file not found: {p} (shipped configs: {known})")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: invalid TOML: {e}") from None
        except UnicodeDecodeError as e:
            line = p.read_bytes()[: e.start].count(b"\n") + 1
            raise ConfigError(
                f"{p}:{line}: not a UTF-8 text file (byte {e.start}); a config is a TOML text file"
            ) from None
        except RecursionError:
            raise ConfigError(f"{p}: invalid TOML: nested too deeply") from None
        apply_dict(cfg, data, str(p), unknown)
    if recipe:
        cfg.algo.recipe = recipe
    for s in sets or []:
        apply_set(cfg, s)
    cfg.reward.function = resolve_reward_function(
        cfg.reward.function, [cfg.data.train, cfg.data.eval]
    )  # "auto" -> named
    return cfg


def _check_mini_batches(r: RolloutConfig, o: OptimConfig) -> None:
    # Rows per step are P x G by construction; the mini-batch split is what a configuration can get wrong.
    n_rows = r.prompts_per_step * r.group_size
    if n_rows % o.mini_batches:
        raise ConfigError(
            f"optim.mini_batches={o.mini_batches} must divide the rollouts per step "
            f"(rollout.prompts_per_step x rollout.group_size = {r.prompts_per_step} x {r.group_size} = {n_rows})"
        )


def validate_config(cfg: TrainConfig) -> None:
    """Check value ranges that the types cannot express; a bad value is a one-line ConfigError
    naming the key (not a torch or generate error several calls later)."""

    def need(ok: bool, key: str, rule: str) -> None:
        if not ok:
            section, name = key.split(".")
            raise ConfigError(f"{key} {rule}, got {getattr(getattr(cfg, section), name)!r}")

    r, o, e = cfg.rollout, cfg.optim, cfg.eval
    need(cfg.run.steps >= 0, "run.steps", "must be >= 0")
    name = Path(cfg.run.name)
    need(
        not name.is_absolute() and ".." not in name.parts and (bool(name.parts) or not cfg.run.name),
        "run.name",
        "must be a directory name inside run.out_dir (no absolute path, no '..'; give --out for another place)",
    )
    need(cfg.run.threads >= 0, "run.threads", "must be >= 0 (0 = auto)")
    _check_device(cfg.run.device)
    parse_report_to(cfg.run.report_to)  # an unknown tracker name is an error naming the closest
    need(
        cfg.model.dtype in ("float32", "bfloat16", "float16"),
        "model.dtype",
        "must be float32, bfloat16 or float16",
    )
    need(cfg.model.lora_rank >= 0, "model.lora_rank", "must be >= 0 (0 = full fine-tuning)")
    need(0.0 <= cfg.model.lora_dropout < 1.0, "model.lora_dropout", "must be in [0, 1)")
    _check_data(cfg.data)
    need(r.prompts_per_step >= 1, "rollout.prompts_per_step", "must be >= 1")
    # >= 2 for a group baseline: `check_recipe` says so, knowing whether the recipe has a critic instead
    need(r.group_size >= 1, "rollout.group_size", "must be >= 1")
    # Sampling, not greedy: G identical greedy completions would give every group zero advantage.
    need(
        math.isfinite(r.temperature) and r.temperature > 0,
        "rollout.temperature",
        "must be > 0 (rollouts are sampled)",
    )
    need(0.0 < r.top_p <= 1.0, "rollout.top_p", "must be in (0, 1]")
    need(r.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
    need(r.max_resample_rounds >= 0, "rollout.max_resample_rounds", "must be >= 0")
    need(r.generation_batch_size >= 0, "rollout.generation_batch_size", "must be >= 0 (0 = all rows at once)")
    need(math.isfinite(o.lr) and o.lr > 0, "optim.lr", "must be a finite number > 0")
    need(math.isfinite(o.weight_decay) and o.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
    need(0.0 <= o.beta1 < 1.0, "optim.beta1", "must be in [0, 1)")
    need(0.0 <= o.beta2 < 1.0, "optim.beta2", "must be in [0, 1)")
    need(o.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
    need(o.schedule in ("constant", "cosine"), "optim.schedule", "must be 'constant' or 'cosine'")
    need(0.0 <= o.min_lr_ratio <= 1.0, "optim.min_lr_ratio", "must be in [0, 1]")
    need(math.isfinite(o.grad_clip) and o.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 = no clipping)")
    need(o.ppo_epochs >= 1, "optim.ppo_epochs", "must be >= 1")
    need(o.mini_batches >= 1, "optim.mini_batches", "must be >= 1")
    need(o.micro_batch_size >= 0, "optim.micro_batch_size", "must be >= 0 (0 = the whole mini-batch)")
    _check_mini_batches(r, o)
    need(
        math.isfinite(cfg.reward.timeout) and cfg.reward.timeout > 0, "reward.timeout", "must be > 0 seconds"
    )
    need(isinstance(cfg.reward.retry_timeouts, bool), "reward.retry_timeouts", "must be true or false")
    check_contract(cfg.reward.contract)  # an unknown value names the closest
    need(
        cfg.reward.contract == "auto" or not is_builtin_reward(cfg.reward.function),
        "reward.contract",
        f"applies to a module:function reward, not to the built-in {cfg.reward.function!r}: leave it 'auto'",
    )
    need(math.isfinite(cfg.reward.format_weight), "reward.format_weight", "must be finite")
    need(e.every >= 0, "eval.every", "must be >= 0 (0 = only at the start and the end)")
    need(e.samples >= 0, "eval.samples", "must be >= 0 (0 = greedy only)")
    need(math.isfinite(e.temperature) and e.temperature >= 0, "eval.temperature", "must be >= 0")
    need(0.0 < e.top_p <= 1.0, "eval.top_p", "must be in (0, 1]")
    need(e.save_groups >= 0, "eval.save_groups", "must be >= 0")
    need(e.batch_size >= 1, "eval.batch_size", "must be >= 1")
    need(cfg.checkpoint.every >= 0, "checkpoint.every", "must be >= 0 (0 = only at the end)")
    need(cfg.checkpoint.keep >= 0, "checkpoint.keep", "must be >= 0 (0 = keep all)")
    q = cfg.oracle
    need(
        q.k >= 2 and q.vine_k >= 2,
        "oracle.k",
        "and oracle.vine_k must be >= 2 (a standard error needs two samples)",
    )
    need(0.0 <= q.delta < 1.0, "oracle.delta", "must be in [0, 1)")
    need(q.vine_max_steps >= 1, "oracle.vine_max_steps", "must be >= 1")
    need(bool(q.delimiter), "oracle.delimiter", "must be a non-empty string")
    need(q.batch_size >= 1, "oracle.batch_size", "must be >= 1")
    _check_critic(cfg.critic, r)


def _check_critic(c: CriticConfig, r: RolloutConfig) -> None:
    """The [critic] values (checked with or without a critic: a typo'd value is named either way)."""

    def need(ok: bool, key: str, rule: str) -> None:
        if not ok:
            raise ConfigError(f"critic.{key} {rule}, got {getattr(c, key)!r}")

    need(math.isfinite(c.lr) and c.lr > 0, "lr", "must be a finite number > 0")
    need(math.isfinite(c.weight_decay) and c.weight_decay >= 0, "weight_decay", "must be >= 0")
    need(math.isfinite(c.grad_clip) and c.grad_clip >= 0, "grad_clip", "must be >= 0 (0 = no clipping)")
    need(c.epochs >= 1, "epochs", "must be >= 1")
    need(c.mini_batches >= 1, "mini_batches", "must be >= 1")
    need(c.warmup_steps >= 0, "warmup_steps", "must be >= 0")
    need(math.isfinite(c.cliprange_value) and c.cliprange_value > 0, "cliprange_value", "must be > 0")
    modes = objectives.AGG_MODES
    need(
        c.loss_agg_mode in modes,
        "loss_agg_mode",
        f"must be one of {', '.join(modes)}{closest(c.loss_agg_mode, modes)}",
    )
    n_rows = r.prompts_per_step * r.group_size
    need(
        n_rows % c.mini_batches == 0,
        "mini_batches",
        f"must divide the rollouts per step (rollout.prompts_per_step x rollout.group_size = {n_rows})",
    )


def _check_data(d: DataConfig) -> None:
    """The [data] values: sizes and the toy task's range, the template (before the first evaluation
    renders a prompt with it), the eval split. Files and specs are checked where they are read."""

    def need(ok: bool, key: str, rule: str) -> None:
        if not ok:
            raise ConfigError(f"data.{key} {rule}, got {getattr(d, key)!r}")

    need(d.train_size >= 1, "train_size", "must be >= 1")
    need(
        1 <= d.difficulty <= MAX_DIFFICULTY,
        "difficulty",
        f"must be in 1..{MAX_DIFFICULTY} (arithmetic steps of the toy task)",
    )
    need(
        1 <= d.digits <= MAX_DIGITS,
        "digits",
        f"must be in 1..{MAX_DIGITS} (digits of the toy task's numbers)",
    )
    try:
        check_template(d.template)
    except ConfigError as e:
        raise ConfigError(f"data.template: {e}") from None
    need(d.eval_size >= 0, "eval_size", "must be >= 0")
    _check_eval_split(d.eval_split)


EVAL_SPLITS = ("heldout", "validation")


def _check_eval_split(split: str) -> None:
    """data.eval_split: one of `EVAL_SPLITS` (an unknown one names the closest)."""
    if split not in EVAL_SPLITS:
        raise ConfigError(
            f"data.eval_split must be heldout or validation, got {split!r}{closest(split, EVAL_SPLITS)}"
        )


def _check_device(device: str) -> None:
    """run.device: "auto", or a torch device string whose backend is present on this machine."""
    resolve_device(device, "run.device")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if v is None:
        raise ConfigError("None cannot be written to TOML")
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(x)}' for k, x in v.items() if x is not None) + " }"
    raise ConfigError(f"cannot write {type(v).__name__} to TOML")


def dump_toml(cfg: TrainConfig) -> str:
    lines = []
    for sec, values in cfg.to_dict().items():
        lines.append(f"[{sec}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


def check_recipe(r: recipes.Recipe, c: TrainConfig) -> None:
    """ConfigError when recipe `r` does not fit config `c` (overlong buffer, a toy task's budget or warm start, LoRA)."""
    budget = c.rollout.max_new_tokens
    if r.overlong_buffer and not 0 < r.overlong_buffer < budget:
        raise ConfigError(
            f"recipe {r.name!r}: overlong_buffer={r.overlong_buffer} must be below "
            f"rollout.max_new_tokens={budget} (set algo.overlong_buffer)"
        )
    for spec in {c.data.train, c.data.eval} & set(models.TOY_VARIANTS):
        need = models.TOY_VARIANTS[spec].max_new_tokens
        if spec != "toy" and budget < need:
            raise ConfigError(
                f"data {spec!r}: its solutions need rollout.max_new_tokens >= {need}, got "
                f"{budget} (use --config {spec}, which sets it)"
            )
    if c.model.name in models.TOY_VARIANTS and c.model.name != "toy" and c.data.train == "toy":
        raise ConfigError(
            f"model {c.model.name!r} was warm-started on the {c.model.name!r} task, not "
            f"data.train='toy' (use --config {c.model.name})"
        )
    if c.rollout.group_size < 2 and "values" not in recipes.batch_fields(r):
        raise ConfigError(
            f"rollout.group_size must be >= 2 for recipe {r.name!r}'s group baseline (only a recipe with a "
            f"learned critic, such as ppo or bpco, runs one rollout per prompt), got {c.rollout.group_size}"
        )
    if recipes.requires_lora(r) and c.model.lora_rank <= 0:
        raise ConfigError(
            f"recipe {r.name!r} (credit {r.credit!r}) needs a LoRA adapter: "
            "set model.lora_rank > 0 (e.g. --set model.lora_rank=8)"
        )
