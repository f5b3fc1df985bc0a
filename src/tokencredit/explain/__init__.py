"""`tokencredit explain`: per-token credit of several methods, side by side, as one self-contained HTML file.

    tokencredit explain RUN_DIR [--step N] [--methods ktae,delta,strace,arca,uniform] [--groups K] [--out F.html]
    tokencredit explain --jsonl FILE --model PATH [--methods ...] [--groups K] [--out F.html]
    tokencredit explain ... [--select credit|mixed|all-wrong|all-right|any] [--groups K]  |  [--group-index 3,7,12]

Inputs (`inputs`). A run directory holds the rollout groups the trainer saved at its evaluation
steps (rollouts/step_NNNNNN.jsonl, one group per line, read through `tokencredit.train.rundir.RunDir`),
with the old policy's entropy and log-probabilities, plus the run's config.toml / recipe.json and
the trained model in final/. A JSONL file holds one group per line: ``{"prompt" | "problem": str,
"completions": [str, ...], "rewards": [float, ...], "answer": optional}``, or a line in the
run-directory schema; its completions are tokenised with the model's tokenizer and every signal is
recomputed with the model (`signals`). prime-rl's token exports (a step_N/rank_R.jsonl directory or file) are
read too (`prime_rl`).

Methods are credit-method names (`tokencredit.credit.CREDIT_METHODS`, shown with the default
group estimator) or recipe names (`tokencredit.recipes.RECIPES`, each with its own estimator,
credit method and ratio kernel), read by `tokencredit.columns.resolve_methods`. What is
shown for every method is its effective credit (`compute`): the per-token gradient weight at
ratio 1. A method whose signals cannot be had (e.g. ARCA without a LoRA adapter) is skipped with a
note on the page; the rest of the report is still written. The pseudo-method ``saved`` ("as trained",
`tokencredit.columns.SavedSpec`) shows the input's own ``token_advantages``, the Â the engine
trained with, as saved and not recomputed; a shown completion without them is a ConfigError naming its
file:line. It is not among the defaults (a static list; files without Â exist): ``--methods saved,ktae,...``.

Which groups are shown (`selection`): by default the first K (default 4) with non-zero credit under
some method, those whose rewards differ first; or the first K of a kind (any, mixed, all-wrong,
all-right), or those at given indices. Tokens are drawn with byte tokens as <0xNN> and control characters
in a style of their own (`tokens`). On the embedded synthetic task (toy, toy-hard) the task's
checker marks each response's first wrong token and flags a right answer reached through a wrong
step (`marks`); elsewhere nothing is marked and the page says why.

Hostile input (`inputs`, `signals`, `output`, `render`, `picture`). Everything that can be refused is
refused before any model loads, as one line naming file:line and the field, the option or the path: a file
that is not UTF-8 JSON lines, JSON nested too deeply, a lone surrogate in text, a number not finite in
float32, an id outside int64 or outside the model's vocabulary, an explicit --model that cannot load, an
output path that cannot be written. Completion text is tokenised as plain text (a literal "<|im_end|>"
stays its characters). A completion longer than --max-tokens (default 8192) or than the model's positions
after its prompt is cut, marked truncated and noted; a page estimated past 20 MB is warned of. The page
shows bidirectional controls visibly and isolates problems in <bdi>; the picture draws every string
literally (no mathtext); both are written whole or not at all.

Modules: `inputs` (the groups), `prime_rl` (prime-rl's token exports as groups), `jsonl` (a --jsonl
file or directory, in either format), `options` (settings and their defaults), `selection` (which groups
are shown), `marks` (the task checker's marks), `assemble` (groups ->
the scored rollouts and saved signals the batch builder reads), `signals` (saved vs recomputed, which
model; token ids checked and cut; the batch from `tokencredit.builder.build_batch`), `compute`
(`explain_batch`: batch -> `ReportData` without a model), `views` (`ReportData`), `render`
(`build_report`, a pure function of `ReportData`), `picture` (the static PNG of ``--png``), `tokens` (a token's text as shown), `output`
(output paths checked up front, files written whole), `pipeline` (`write_report`: all of it). The page's
CSS and script are package data in ``tokencredit/assets/explain/``; the columns are read by
`tokencredit.columns`. The command line is `tokencredit.commands.explain`.
"""

from tokencredit.explain.assemble import assemble_batch
from tokencredit.explain.compute import display_tokens, explain_batch, make_groups
from tokencredit.explain.inputs import CompletionInput, GroupInput, load_run_rollouts, saved_steps
from tokencredit.explain.jsonl import load_jsonl
from tokencredit.explain.marks import mark_groups, step_check
from tokencredit.explain.options import DEFAULT_METHODS, ExplainOptions
from tokencredit.explain.pipeline import ExplainResult, write_report
from tokencredit.explain.render import build_report
from tokencredit.explain.selection import GROUP_KINDS, select_groups
from tokencredit.explain.signals import batch_with_signals
from tokencredit.explain.views import GroupView, MethodView, ReportData, ResponseView, StepCheck

__all__ = [
    "DEFAULT_METHODS",
    "GROUP_KINDS",
    "CompletionInput",
    "ExplainOptions",
    "ExplainResult",
    "GroupInput",
    "GroupView",
    "MethodView",
    "ReportData",
    "ResponseView",
    "StepCheck",
    "assemble_batch",
    "batch_with_signals",
    "build_report",
    "display_tokens",
    "explain_batch",
    "load_jsonl",
    "load_run_rollouts",
    "make_groups",
    "mark_groups",
    "saved_steps",
    "select_groups",
    "step_check",
    "write_report",
]
