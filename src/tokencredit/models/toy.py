"""The embedded toy models: a tiny Qwen3-architecture causal LM with a character tokenizer.

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

    tokencredit build-toy [--out DIR]

The build is deterministic on CPU for a fixed thread count and CPU kind (the shipped files were
built with one thread, the command's default).

A second, harder variant ships beside it (`TOY_VARIANTS`): "toy-hard", six-step chains (solutions
of about 97 tokens) with its own warm start in ``tokencredit/assets/toy-hard``, rebuilt with
``tokencredit build-toy --task toy-hard``; `load_model("toy-hard")` loads it and
`toy_task(name="toy-hard")` gives its task. A third, "toy-free" (``--task toy-free``), is the
default task with free phrasings around every step (`ArithmeticTask(phrasings=k)`): words the
reward does not depend on, which a warm start samples with high entropy. The "toy-tail" family
(``--task toy-tail-32``, ``--task toy-tail-128``) is the default task with m reward-irrelevant letters
after the answer line (`ArithmeticTask(tail=m)`), whose exact credit, zero on the tail, is known without
sampling; m = 0 is the default toy itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tokencredit.data.synthetic import ArithmeticTask
from tokencredit.errors import ConfigError, closest

TOY_ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "toy"
TOY_HARD_ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "toy-hard"
TOY_FREE_ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "toy-free"
ASSETS = Path(__file__).resolve().parent.parent / "assets"
REBUILD_COMMAND = "tokencredit build-toy"
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
    phrasings: int = 0  # free connectives / endings per step line (`ArithmeticTask`'s headroom knob)
    tail: int = 0  # reward-irrelevant letters after the answer line (`ArithmeticTask(tail=m)`)
    init: str = ""  # "" = a fresh model; else the shipped warm start (e.g. "toy") to continue from
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

# The free-phrasing variant (issue 32's headroom knob): the default task's three-step chains, each
# step opened and closed by one of PHRASINGS equivalent words the teacher draws uniformly
# (`synthetic.CONNECTIVES` / `ENDINGS`; solutions up to 108 characters plus EOS). The reward never
# depends on them, so they are high-entropy tokens with zero exact advantage. Chosen among the
# variants screened by the headroom index
# (docs/experiments/toy-free.md#screening-by-the-headroom-index-before-training-anything).
TOY_FREE_CONFIG = WarmStartConfig(phrasings=4)

# The reward-irrelevant tails (the testbed whose exact credit is known for free): the default task with m letters after the answer
# line (`synthetic.TAIL_ALPHABET`, drawn uniformly by the teacher), so A* = 0 exactly on the tail. Each warm
# start continues the shipped toy's (same model, same arithmetic teacher) for TAIL_STEPS steps, so the
# tails differ from m = 0 (the toy itself) in the tail and little else. The budget is the toy's (the longest
# solution plus EOS is 62 tokens: 80 leaves room) plus the tail's line break and letters.
TOY_TAIL_LENGTHS = (32, 128)
TAIL_STEPS = 400


def toy_tail_config(m: int) -> WarmStartConfig:
    """The warm start of ``toy-tail-{m}``: the shipped toy's, continued on solutions with an m-letter tail."""
    return WarmStartConfig(tail=m, init="toy", steps=TAIL_STEPS, lr=1e-3, warmup_steps=10)


TOY_VARIANTS: dict[str, ToyVariant] = {
    "toy": ToyVariant("toy", TOY_ASSET_DIR, WarmStartConfig(), max_new_tokens=80),
    "toy-hard": ToyVariant("toy-hard", TOY_HARD_ASSET_DIR, TOY_HARD_CONFIG, max_new_tokens=128),
    "toy-free": ToyVariant("toy-free", TOY_FREE_ASSET_DIR, TOY_FREE_CONFIG, max_new_tokens=128),
    **{
        f"toy-tail-{m}": ToyVariant(
            f"toy-tail-{m}", ASSETS / f"toy-tail-{m}", toy_tail_config(m), max_new_tokens=80 + 1 + m
        )
        for m in TOY_TAIL_LENGTHS
    },
}


def toy_variant(name: str) -> ToyVariant:
    """The `ToyVariant` called `name` (a key of `TOY_VARIANTS`); ConfigError naming the closest otherwise."""

    if name not in TOY_VARIANTS:
        raise ConfigError(
            f"unknown toy model {name!r}{closest(name, TOY_VARIANTS)}; known: {', '.join(TOY_VARIANTS)}"
        )
    return TOY_VARIANTS[name]


def toy_task(seed: int = 0, path: str | Path | None = None, *, name: str = "toy") -> Any:
    """The `ArithmeticTask` the shipped toy model `name` (a key of `TOY_VARIANTS`) was warm-started on
    (difficulty, digits, operand_digits, phrasings and tail read from its ``warm_start.json``, or from the
    file `path`), with sampling seed `seed`."""
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
        phrasings=int(cfg.get("phrasings", 0)),
        tail=int(cfg.get("tail", 0)),
    )
