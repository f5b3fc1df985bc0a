"""Model loading and the embedded toy model.

`load_model("toy")` loads the shipped warm start (``tokencredit/assets/toy``): a tiny
Qwen3-architecture causal LM (`transformers.Qwen3ForCausalLM`) with a character-level tokenizer
(`tokenizers` wrapped as `PreTrainedTokenizerFast`, EOS ``<|im_end|>``, pad ``<|endoftext|>`` and
a Qwen-style chat template), so generate, chat templates, LoRA and hidden states all take the code
paths real models take. `load_model(path)` loads any local Hugging Face causal LM.

The warm start is supervised fine-tuning on the synthetic arithmetic task
(`tokencredit.data.synthetic`), prompted with the "qwen-math" template exactly as the trainer
prompts it. The targets come from a *noisy teacher* that forgets the carry of an addition more
often than not (``forget_rate``), so the model samples correct chains only part of the time and
its greedy answer is wrong whenever a carry is needed: RL with the verifiable reward has a
systematic mistake to fix, and the first wrong token of a failed rollout is typically the tens
digit of a sum whose carry was dropped. Rebuild the shipped files with::

    python -m tokencredit.models build-toy [--out DIR]

The build is deterministic on CPU for a fixed thread count and CPU kind (the shipped files were
built with one thread, the command's default).

A second, harder variant ships beside it (`TOY_VARIANTS`): "toy-hard", six-step chains (solutions
of about 97 tokens) with its own warm start in ``tokencredit/assets/toy-hard``, rebuilt with
``python -m tokencredit.models build-toy --task toy-hard``; `load_model("toy-hard")` loads it and
`toy_task(name="toy-hard")` gives its task.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from tokencredit.errors import ConfigError

TOY_ASSET_DIR = Path(__file__).resolve().parent / "assets" / "toy"
TOY_HARD_ASSET_DIR = Path(__file__).resolve().parent / "assets" / "toy-hard"
REBUILD_COMMAND = "python -m tokencredit.models build-toy"
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN)
# Qwen-style chat template (no default system prompt): every message is
# <|im_start|>role\ncontent<|im_end|>\n, and the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def toy_vocabulary() -> list[str]:
    """The toy tokenizer's tokens in id order: the special tokens, newline, then printable ASCII.

    Printable ASCII (not just the task's characters) so any prompt template (qwen-math, r1-zero, a
    custom one) encodes without unknown tokens.
    """
    return [*SPECIAL_TOKENS, "\n", *(chr(c) for c in range(32, 127))]


def build_toy_tokenizer() -> Any:
    """The character-level toy tokenizer as a `PreTrainedTokenizerFast` (one token per character)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(toy_vocabulary())}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD_TOKEN))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )


TOY_MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "initializer_range": 0.02,
}


def build_toy_model(
    config_overrides: dict[str, Any] | None = None, *, seed: int = 0, tokenizer: Any = None
) -> Any:
    """A freshly initialised tiny `Qwen3ForCausalLM` (`TOY_MODEL_CONFIG` updated by `config_overrides`),
    deterministic in `seed`, with the toy tokenizer's vocabulary and special ids."""
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tok = tokenizer if tokenizer is not None else build_toy_tokenizer()
    kwargs = dict(TOY_MODEL_CONFIG)
    kwargs.update(config_overrides or {})
    kwargs.update(
        vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None
    )
    config = Qwen3Config(**kwargs)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, do_sample=False
    )
    return model


@dataclass
class WarmStartConfig:
    """Supervised warm start of the toy model on the arithmetic task (see module docstring).

    The defaults are the shipped build: about 38k noisy-teacher solutions of 3-step problems, seen
    once each. A tiny transformer learns this arithmetic only after a plateau (around step 1,600
    here), hence the step count.
    """

    difficulty: int = 3
    digits: int = 2
    operand_digits: int = 1
    forget_rate: float = 0.7  # P(the teacher drops the carry of an addition that has one)
    template: str = "qwen-math"
    steps: int = 2400
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    model: dict[str, Any] = field(default_factory=dict)  # overrides of TOY_MODEL_CONFIG


@dataclass(frozen=True)
class ToyVariant:
    """A shipped toy warm start: where its files live, how it is built, and the rollout budget its
    solutions need (`max_new_tokens`: the longest reference solution plus EOS, with room to spare)."""

    name: str
    asset_dir: Path
    config: WarmStartConfig
    max_new_tokens: int

    @property
    def rebuild_command(self) -> str:
        return REBUILD_COMMAND if self.name == "toy" else f"{REBUILD_COMMAND} --task {self.name}"


# The hard variant: six-step chains (about 97 tokens with EOS, at most 98; 1.4 carries per problem
# against the default's 0.66). With the default's forget rate 0.7 most greedy answers would drop a
# carry; at 0.55 the shipped build (1 thread, 2,400 steps) scored 0.407 greedy and 0.385 sampled
# (temperature 1) on 400 held-out problems (forget rate 0.5: 0.448 / 0.422), and 164 of the 165
# sampled wrong-step rollouts of 64 x 4 held-out samples first went wrong at a step with a carry.
TOY_HARD_CONFIG = WarmStartConfig(difficulty=6, forget_rate=0.55)

TOY_VARIANTS: dict[str, ToyVariant] = {
    "toy": ToyVariant("toy", TOY_ASSET_DIR, WarmStartConfig(), max_new_tokens=80),
    "toy-hard": ToyVariant("toy-hard", TOY_HARD_ASSET_DIR, TOY_HARD_CONFIG, max_new_tokens=128),
}


def toy_variant(name: str) -> ToyVariant:
    """The `ToyVariant` called `name` ("toy" or "toy-hard"); ConfigError naming the closest otherwise."""
    from tokencredit.errors import closest

    if name not in TOY_VARIANTS:
        raise ConfigError(
            f"unknown toy model {name!r}{closest(name, TOY_VARIANTS)}; known: {', '.join(TOY_VARIANTS)}"
        )
    return TOY_VARIANTS[name]


def _encode_examples(tokenizer: Any, prompts: list[str], targets: list[str]) -> tuple[torch.Tensor, ...]:
    """Right-padded (input_ids, attention_mask, labels) with the loss on target tokens only."""
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    t_ids = tokenizer([t + tokenizer.eos_token for t in targets], add_special_tokens=False)["input_ids"]
    width = max(len(a) + len(b) for a, b in zip(p_ids, t_ids))
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(prompts), width), -100, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, (a, b) in enumerate(zip(p_ids, t_ids)):
        n = len(a) + len(b)
        ids[i, :n] = torch.tensor(a + b)
        labels[i, len(a) : n] = torch.tensor(b)
        mask[i, :n] = 1
    return ids, mask, labels


def _sft_loss(model: Any, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss over the labelled tokens, running the prompt prefix that every row
    shares (the template's system turn) once instead of once per row.

    Same loss and gradients as ``model(ids, mask, labels=labels).loss`` (up to float rounding): the
    shared prefix's keys/values are computed with gradients for one row and repeated across the
    batch, which makes the warm start about twice as fast on CPU.
    """
    from transformers import DynamicCache

    same = (ids == ids[:1]).all(dim=0) & mask.bool().all(dim=0)
    first_label = int((labels != -100).any(dim=0).nonzero()[0])
    p = int(same.long().cumprod(0).sum())
    # The first labelled token is predicted from the position before it, which must not be cached.
    p = min(p, first_label - 1)
    if p <= 0:
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss
    cache = DynamicCache(config=model.config)
    model.model(input_ids=ids[:1, :p], past_key_values=cache, use_cache=True)
    cache.batch_repeat_interleave(ids.shape[0])
    positions = torch.arange(p, ids.shape[1]).expand(ids.shape[0], -1)
    out = model(
        input_ids=ids[:, p:],
        attention_mask=mask,
        past_key_values=cache,
        position_ids=positions,
        labels=labels[:, p:],
        use_cache=True,
    )
    return out.loss


def warm_start(
    model: Any, tokenizer: Any, config: WarmStartConfig | None = None, *, log_every: int = 0
) -> list[float]:
    """Supervised fine-tuning of `model` (in place) on noisy-teacher solutions; returns the losses.

    Deterministic on CPU for a fixed thread count: the data order, the teacher's slips and the
    initial weights all derive from ``config.seed``.
    """
    from tokencredit.data.synthetic import ArithmeticTask
    from tokencredit.data.templates import render

    cfg = config or WarmStartConfig()
    task = ArithmeticTask(
        difficulty=cfg.difficulty, digits=cfg.digits, operand_digits=cfg.operand_digits, seed=cfg.seed
    )
    problems = task.sample(cfg.steps * cfg.batch_size, "train")
    teacher_rng = random.Random(f"teacher|{cfg.seed}")
    torch.manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))

    model.train()
    losses: list[float] = []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        batch = problems[step * cfg.batch_size : (step + 1) * cfg.batch_size]
        prompts = [render(cfg.template, p.problem, tokenizer) for p in batch]
        targets = [task.solution(p, forget_rate=cfg.forget_rate, rng=teacher_rng) for p in batch]
        ids, mask, labels = _encode_examples(tokenizer, prompts, targets)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = _sft_loss(model, ids, mask, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if log_every and (step + 1) % log_every == 0:
            recent = sum(losses[-log_every:]) / log_every
            print(
                f"warm start step {step + 1}/{cfg.steps} loss {recent:.4f} ({time.perf_counter() - t0:.0f}s)"
            )
    model.eval()
    return losses


@torch.no_grad()
def toy_accuracy(
    model: Any,
    tokenizer: Any,
    problems: list[Any],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 96,
    template: str = "qwen-math",
    batch_size: int = 100,
    seed: int = 0,
) -> float:
    """Share of `problems` whose completion passes `synthetic.check` (greedy when temperature is 0,
    else plain sampling with top_p 1): a quick measurement for the build report, not the trainer's eval."""
    from tokencredit.data.synthetic import check
    from tokencredit.data.templates import render

    model.eval()
    correct = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for s in range(0, len(problems), batch_size):
            chunk = problems[s : s + batch_size]
            enc = tokenizer(
                [render(template, p.problem, tokenizer) for p in chunk],
                add_special_tokens=False,
                padding=True,
                padding_side="left",
                return_tensors="pt",
            )
            sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
            out = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **(sampling if temperature > 0 else {"do_sample": False}),
            )
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            correct += sum(check(p, t) for p, t in zip(chunk, texts))
    return correct / max(1, len(problems))


def build_toy(
    out_dir: str | Path | None = None, config: WarmStartConfig | None = None, *, log_every: int = 0
) -> Path:
    """Build the toy model from scratch (init + warm start) and save model + tokenizer to `out_dir`
    (default: the package's asset directory). Returns the directory."""
    cfg = config or WarmStartConfig()
    out = Path(out_dir) if out_dir is not None else TOY_ASSET_DIR
    tok = build_toy_tokenizer()
    model = build_toy_model(cfg.model, seed=cfg.seed, tokenizer=tok)
    warm_start(model, tok, cfg, log_every=log_every)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "warm_start.json").write_text(json.dumps(asdict(cfg), indent=2, sort_keys=True) + "\n")
    return out


def toy_task(seed: int = 0, path: str | Path | None = None, *, name: str = "toy") -> Any:
    """The `ArithmeticTask` the shipped toy model `name` ("toy" or "toy-hard") was warm-started on
    (difficulty, digits and operand_digits read from its ``warm_start.json``, or from the file
    `path`), with sampling seed `seed`."""
    from tokencredit.data.synthetic import ArithmeticTask

    variant = toy_variant(name)
    info = Path(path) if path is not None else variant.asset_dir / "warm_start.json"
    if not info.is_file():
        raise ConfigError(f"{info} is missing; rebuild the {name} model with `{variant.rebuild_command}`")
    cfg = json.loads(info.read_text())
    return ArithmeticTask(
        difficulty=int(cfg["difficulty"]),
        digits=int(cfg["digits"]),
        operand_digits=int(cfg["operand_digits"]),
        seed=seed,
    )


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from its name ("float32", "bfloat16", "float16") or itself."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}: use one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def resolve_device(name: str, what: str = "device") -> torch.device:
    """"auto" -> the first CUDA device if there is one, else the CPU; otherwise `name`, checked to exist
    on this machine (a ConfigError naming `what` otherwise)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{what} must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{what}={name!r} but no CUDA device is available (use 'auto' or 'cpu')")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(f"{what}={name!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    return dev


def load_model(
    name_or_path: str, *, dtype: torch.dtype | str = torch.float32, device: str | torch.device = "cpu"
) -> tuple[Any, Any]:
    """(model, tokenizer) in eval mode on `device`.

    "toy" (or "toy-hard") loads a shipped warm start; anything else is a local directory holding a Hugging Face
    causal LM and its tokenizer (loaded with ``local_files_only=True``: nothing is downloaded).
    The tokenizer must define an EOS token; a missing pad token is set to EOS, and padding is on the
    left (decoder-only generation).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = resolve_dtype(dtype)
    if name_or_path in TOY_VARIANTS:
        variant = TOY_VARIANTS[name_or_path]
        path = variant.asset_dir
        missing = [
            f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (path / f).is_file()
        ]
        if missing:
            raise ConfigError(
                f"the {variant.name} model is not installed ({', '.join(missing)} missing in {path}); "
                f"rebuild it with `{variant.rebuild_command}`"
            )
    else:
        path = Path(name_or_path).expanduser()
        if not path.exists():
            raise ConfigError(
                f"model path {name_or_path!r} does not exist (give 'toy', 'toy-hard' or a local directory with a "
                "Hugging Face causal LM; models are never downloaded)"
            )
        if not path.is_dir():
            raise ConfigError(f"model path {name_or_path!r} is not a directory")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.eos_token is None or tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer in {path} has no EOS token: generation could never stop")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch_dtype)
    model.to(device)
    model.eval()
    return model, tokenizer


def main(argv: list[str] | None = None) -> int:
    """``python -m tokencredit.models build-toy [--task toy|toy-hard] [--out DIR] [--steps N] [--threads T] [--eval N]``."""
    parser = argparse.ArgumentParser(prog="python -m tokencredit.models", description="Toy model tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-toy", help="rebuild a shipped toy warm start deterministically")
    b.add_argument(
        "--task", default="toy", choices=sorted(TOY_VARIANTS), help="which toy model (default: toy)"
    )
    b.add_argument("--out", default=None, help="output directory (default: the variant's asset directory)")
    b.add_argument("--steps", type=int, default=None, help="SFT steps (default: the variant's)")
    b.add_argument("--seed", type=int, default=WarmStartConfig.seed)
    b.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (the shipped build used 1; the weights depend on it)",
    )
    b.add_argument(
        "--eval", type=int, default=200, help="held-out problems to score after the build (0 = skip)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    variant = TOY_VARIANTS[args.task]
    cfg = replace(variant.config, steps=args.steps or variant.config.steps, seed=args.seed)
    t0 = time.perf_counter()
    out = build_toy(args.out or variant.asset_dir, cfg, log_every=max(1, cfg.steps // 20))
    print(f"built the toy model in {time.perf_counter() - t0:.0f}s -> {out}")
    if args.eval:
        from tokencredit.data.synthetic import ArithmeticTask

        model, tok = load_model(str(out))
        task = ArithmeticTask(difficulty=cfg.difficulty, digits=cfg.digits, operand_digits=cfg.operand_digits)
        heldout = task.sample(args.eval, "heldout")
        budget = max(96, variant.max_new_tokens)  # 96: the budget of the toy's build reports so far
        greedy = toy_accuracy(model, tok, heldout, temperature=0.0, max_new_tokens=budget)
        sampled = toy_accuracy(model, tok, heldout, temperature=1.0, max_new_tokens=budget)
        print(f"held-out accuracy on {args.eval} problems: greedy {greedy:.3f}, sampled (T=1) {sampled:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def special_token_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's special token ids (EOS, pad, chat markers...), sorted; () without a tokenizer.

    Every engine passes these to the credit pipeline (KTAE gives them no key value), so they are
    read the same way everywhere.
    """
    if tokenizer is None:
        return ()
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    ids |= {i for i in (getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "pad_token_id", None)) if i is not None}
    return tuple(sorted(int(i) for i in ids))


def add_lora(
    model: torch.nn.Module,
    *,
    rank: int,
    alpha: float,
    dropout: float = 0.0,
    targets: list[str] | tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    name: str = "the model",
) -> torch.nn.Module:
    """`model` wrapped in a peft LoRA adapter of `rank` on the modules named in `targets` (those present)."""
    from peft import LoraConfig, get_peft_model

    names = {n.split(".")[-1] for n, _ in model.named_modules()}
    present = [t for t in targets if t in names]
    if not present:
        raise ConfigError(
            f"model.lora_targets {list(targets)} match no module of {name} "
            f"(module names include: {', '.join(sorted(names)[:12])})"
        )
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=present, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def restore_parameters(model: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Copy a checkpoint's parameters (the trainable ones, by name) into `model`; a name the model
    lacks is a ConfigError naming `where` (a checkpoint of another model or adapter layout)."""
    params = dict(model.named_parameters())
    unknown = [n for n in state if n not in params]
    if unknown:
        raise ConfigError(f"{where}: parameters do not match the rebuilt model (e.g. {unknown[0]})")
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t.to(params[n].device, params[n].dtype))
