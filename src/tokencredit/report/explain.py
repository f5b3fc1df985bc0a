"""`tokencredit explain`: per-token credit of several methods, side by side, as one self-contained HTML file.

    tokencredit explain RUN_DIR [--step N] [--methods ktae,delta,strace,arca,uniform] [--groups K] [--out F.html]
    tokencredit explain --jsonl FILE --model PATH [--methods ...] [--groups K] [--out F.html]

Inputs. A run directory holds the rollout groups the trainer saved at its evaluation steps
(RUN_DIR/rollouts/step_NNNNNN.jsonl, one group per line; see `Trainer.save_rollouts`), with the
old policy's entropy and log-probabilities, plus the run's config.toml / recipe.json and the trained
model in RUN_DIR/final. A JSONL file holds one group per line: ``{"prompt" | "problem": str,
"completions": [str, ...], "rewards": [float, ...], "answer": optional}``, or a line in the
run-directory schema (completions as objects with "text" / "token_ids" and "score"); completions
are tokenised with the model's tokenizer and every signal is recomputed with the model.

Methods are credit-method names (`tokencredit.credit.CREDIT_METHODS`, shown with the default
group estimator) or recipe names (`tokencredit.recipes.RECIPES`, each with its own estimator,
credit method and ratio kernel); ``credit:NAME`` / ``recipe:NAME`` choose when a name is both
(a bare name that is both is taken as the credit method). What is shown for every method is its
effective credit (`tokencredit.objectives.effective`): the per-token gradient weight at ratio 1,
which is Â itself for per-token kernels and the kernel's on-policy credit for GSPO, P-trace and
S-trace. A method whose signals cannot be had (e.g. ARCA without a LoRA adapter) is skipped with
a note on the page; the rest of the report is still written.

The page itself is `tokencredit.report.html.build_report`, a pure function of `ReportData`;
`explain_batch` builds that structure from a `RolloutBatch` without a model.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from tokencredit.batch import RolloutBatch
from tokencredit.errors import ConfigError, closest
from tokencredit.models import resolve_device, special_token_ids
from tokencredit.report.html import GroupView, MethodView, ReportData, ResponseView, build_report
from tokencredit.report.methods import MethodSpec, method_credit, needed_signals, resolve_methods
from tokencredit.train.checkpoint import load_run_policy
from tokencredit.train.rundir import RunDir

if TYPE_CHECKING:
    from tokencredit.recipes import Recipe
    from tokencredit.train.config import TrainConfig

__all__ = [
    "DEFAULT_METHODS",
    "CompletionInput",
    "GroupInput",
    "MethodSpec",
    "add_arguments",
    "assemble_batch",
    "explain_batch",
    "load_jsonl",
    "load_run_rollouts",
    "make_groups",
    "recompute_signals",
    "resolve_methods",
    "run",
    "run_recipe",
    "saved_steps",
]

DEFAULT_METHODS = "ktae,delta,strace,arca,uniform"
_LORA_SIGNALS = ("base_hidden", "base_log_probs")
_DISPLAY_SIGNALS = ("entropy", "old_log_probs")


# ============================================================================ inputs
@dataclass
class CompletionInput:
    text: str
    score: float
    token_ids: list[int] | None = None
    correct: bool | None = None
    truncated: bool = False
    entropy: list[float] | None = None
    old_log_probs: list[float] | None = None
    tokens: list[str] | None = None  # raw token strings as saved (display fallback without a tokenizer)


@dataclass
class GroupInput:
    """One prompt and its completions; `where` names the source (file:line) for error messages."""

    group_id: int
    completions: list[CompletionInput]
    where: str
    problem: str | None = None  # the task text (a template makes the prompt from it)
    prompt: str | None = None  # the literal prompt text, when given
    answer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _data_error(where: str, msg: str) -> Exception:
    from tokencredit.data.loaders import DataError

    return DataError(f"{where}: {msg}")


def _finite(value: Any, where: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise _data_error(where, f"{what} must be a finite number, got {value!r}")
    return float(value)


def _float_list(value: Any, n: int, where: str, what: str) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n:
        got = f"{len(value)} values" if isinstance(value, list) else type(value).__name__
        raise _data_error(where, f"{what} must be a list of {n} numbers (one per token), got {got}")
    return [_finite(v, where, f"{what}[{i}]") for i, v in enumerate(value)]


def _answer_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, list):
        return " | ".join(str(v) for v in value)
    return str(value)


def _completion_object(c: Any, where: str, i: int) -> CompletionInput:
    """A completion in the run-directory schema (see `Trainer.save_rollouts`)."""
    if not isinstance(c, dict):
        raise _data_error(where, f"completions[{i}] must be an object or a string, got {type(c).__name__}")
    text = c.get("text", "")
    if not isinstance(text, str):
        raise _data_error(where, f"completions[{i}].text must be a string")
    ids = c.get("token_ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(x, int) and x >= 0 for x in ids)):
        raise _data_error(where, f"completions[{i}].token_ids must be a list of non-negative integers")
    if ids is None and "text" not in c:
        raise _data_error(where, f"completions[{i}] has neither token_ids nor text")
    score = c.get("score", c.get("reward"))
    if score is None:
        raise _data_error(where, f"completions[{i}] has no score")
    n = len(ids) if ids is not None else -1
    signals = {}
    for name in _DISPLAY_SIGNALS:
        v = c.get(name)
        if v is not None and ids is None:
            raise _data_error(where, f"completions[{i}].{name} needs token_ids (values are per token)")
        signals[name] = _float_list(v, n, where, f"completions[{i}].{name}")
    tokens = c.get("tokens")
    if tokens is not None and not (
        isinstance(tokens, list) and len(tokens) == n and all(isinstance(t, str) for t in tokens)
    ):
        raise _data_error(where, f"completions[{i}].tokens must be a list of {n} strings")
    correct = c.get("correct")
    if correct is not None and not isinstance(correct, bool):
        raise _data_error(where, f"completions[{i}].correct must be true/false")
    return CompletionInput(
        text=text,
        score=_finite(score, where, f"completions[{i}].score"),
        token_ids=ids,
        correct=correct,
        truncated=bool(c.get("truncated", False)),
        tokens=tokens,
        **signals,
    )


def _parse_group(obj: Any, where: str, default_id: int) -> GroupInput:
    if not isinstance(obj, dict):
        raise _data_error(where, f"expected a JSON object, got {type(obj).__name__}")
    comps = obj.get("completions")
    if not isinstance(comps, list) or not comps:
        raise _data_error(where, "'completions' must be a non-empty list")
    prompt, problem = obj.get("prompt"), obj.get("problem")
    if prompt is not None and not isinstance(prompt, str):
        raise _data_error(where, "'prompt' must be a string")
    if problem is not None and not isinstance(problem, str):
        raise _data_error(where, "'problem' must be a string")
    if all(isinstance(c, str) for c in comps):
        rewards = obj.get("rewards")
        if not isinstance(rewards, list) or len(rewards) != len(comps):
            got = f"{len(rewards)} values" if isinstance(rewards, list) else repr(rewards)
            raise _data_error(
                where, f"'rewards' must be a list of {len(comps)} numbers (one per completion), got {got}"
            )
        completions = [
            CompletionInput(text=c, score=_finite(r, where, f"rewards[{i}]"))
            for i, (c, r) in enumerate(zip(comps, rewards))
        ]
    elif all(isinstance(c, dict) for c in comps):
        completions = [_completion_object(c, where, i) for i, c in enumerate(comps)]
    else:
        raise _data_error(where, "'completions' must be all strings (with 'rewards') or all objects")
    gid = obj.get("group", default_id)
    if isinstance(gid, bool) or not isinstance(gid, int):
        raise _data_error(where, f"'group' must be an integer, got {gid!r}")
    return GroupInput(
        group_id=gid,
        completions=completions,
        where=where,
        problem=problem,
        prompt=prompt,
        answer=_answer_text(obj.get("answer")),
        extra={k: obj[k] for k in ("step", "recipe", "credit", "id") if k in obj},
    )


def _read_groups(path: Path) -> list[GroupInput]:
    groups: list[GroupInput] = []
    ids: dict[int, str] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise _data_error(where, f"invalid JSON ({e.msg} at column {e.colno})") from None
            g = _parse_group(obj, where, len(groups))
            if g.group_id in ids:
                raise _data_error(where, f"group id {g.group_id} repeats the one at {ids[g.group_id]}")
            ids[g.group_id] = where
            groups.append(g)
    if not groups:
        raise _data_error(str(path), "no group in the file")
    return groups


def load_jsonl(path: str | Path) -> list[GroupInput]:
    """Groups from a JSONL of prompts, completions and rewards (see the module docstring); errors name file:line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--jsonl: file not found: {p}")
    groups = _read_groups(p)
    for g in groups:
        if g.prompt is None and g.problem is None:
            raise _data_error(
                g.where, "needs a 'prompt' (the literal prompt text) or a 'problem' (templated)"
            )
    return groups


def saved_steps(run_dir: str | Path) -> list[int]:
    """The steps with saved rollouts in RUN_DIR/rollouts, ascending."""
    return RunDir(run_dir).rollout_steps()


def load_run_rollouts(run_dir: str | Path, step: int | None = None) -> tuple[int, list[GroupInput]]:
    """(step, groups) from a run's saved rollouts (the latest saved step by default)."""
    run = RunDir(run_dir)
    if not run.path.is_dir():
        raise ConfigError(f"run directory not found: {run.path}")
    steps = run.rollout_steps()
    if not steps:
        raise ConfigError(
            f"{run.path}: no saved rollouts (rollouts/step_NNNNNN.jsonl); the trainer writes them at evaluation steps "
            "when eval.save_groups > 0"
        )
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ConfigError(
            f"{run.path}: no rollouts saved at step {step}; saved steps: {', '.join(map(str, steps))}"
        )
    groups = _read_groups(run.rollout_path(step))
    for g in groups:
        for i, c in enumerate(g.completions):
            if c.token_ids is None:
                raise _data_error(
                    g.where, f"completions[{i}] has no token_ids (not a file written by the trainer?)"
                )
    return step, groups


# ============================================================================ batch assembly
def _padded(
    rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype, left: bool = False
) -> tuple[Tensor, Tensor]:
    """([n, width] rows padded with `value` on the right (or left), bool mask of the real entries); width >= 1."""
    seqs = [torch.as_tensor(list(r), dtype=dtype) for r in rows]
    lengths = torch.tensor([len(r) for r in seqs], dtype=torch.int64)
    width = max(1, int(lengths.max()) if len(seqs) else 1)
    seqs.append(torch.zeros(width, dtype=dtype))  # fixes the padded width at >= 1 (dropped below)
    side = "left" if left else "right"
    out = torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True, padding_value=value, padding_side=side)[:-1]
    pos = torch.arange(width)[None, :]
    mask = pos >= width - lengths[:, None] if left else pos < lengths[:, None]
    return out, mask


def _bos_aware_ids(tokenizer: Any, text: str) -> list[int]:
    """Prompt ids as `tokencredit.rollout.generate` tokenises them (special tokens unless the text starts with BOS)."""
    bos = getattr(tokenizer, "bos_token", None)
    add = not (bos and text.startswith(bos))
    return list(tokenizer(text, add_special_tokens=add)["input_ids"])


def assemble_batch(
    groups: Sequence[GroupInput], tokenizer: Any = None, *, use_saved_signals: bool = True
) -> RolloutBatch:
    """A right-padded RolloutBatch of every completion of `groups` (rows in order, group ids from the groups).

    Completions without token_ids are tokenised with `tokenizer` (no special tokens added; the ids
    are stored on the completion). The saved entropy / old_log_probs become batch signals when
    every completion carries them.
    """
    rows: list[list[int]] = []
    for g in groups:
        for i, c in enumerate(g.completions):
            if c.token_ids is None:
                if tokenizer is None:
                    raise ConfigError(
                        f"{g.where}: completions[{i}] has no token_ids and no tokenizer was given"
                    )
                c.token_ids = list(tokenizer(c.text, add_special_tokens=False)["input_ids"])
            rows.append(c.token_ids)
    comps = [c for g in groups for c in g.completions]
    pad = 0 if tokenizer is None or tokenizer.pad_token_id is None else int(tokenizer.pad_token_id)
    ids, mask = _padded(rows, pad, torch.int64)
    signals: dict[str, Tensor] = {}
    if use_saved_signals:
        for name in _DISPLAY_SIGNALS:
            if all(getattr(c, name) is not None for c in comps):
                signals[name] = _padded([getattr(c, name) for c in comps], 0.0, torch.float32)[0]
    return RolloutBatch(
        token_ids=ids,
        mask=mask,
        group_ids=torch.tensor([g.group_id for g in groups for _ in g.completions], dtype=torch.int64),
        scores=torch.tensor([c.score for c in comps], dtype=torch.float32),
        truncated=torch.tensor([c.truncated for c in comps], dtype=torch.bool),
        **signals,
    )


def _with_signals(batch: RolloutBatch, signals: Mapping[str, Tensor]) -> RolloutBatch:
    kwargs = {name: getattr(batch, name) for name in batch.__dataclass_fields__}
    kwargs.update({k: v.to(batch.mask.device) for k, v in signals.items()})
    return RolloutBatch(**kwargs)


# ============================================================================ report structure
def _display_tokens(groups: Sequence[GroupInput], tokenizer: Any) -> tuple[list[list[str]], list[list[bool]]]:
    """Per completion, the text of each token (decoded one id at a time) and whether it is a special token."""
    special = set(getattr(tokenizer, "all_special_ids", []) or []) if tokenizer is not None else set()
    texts, flags = [], []
    for g in groups:
        for c in g.completions:
            ids = c.token_ids or []
            if tokenizer is not None:
                texts.append([tokenizer.decode([i], skip_special_tokens=False) for i in ids])
            elif c.tokens is not None:
                # byte-level BPE / sentencepiece markers for space and newline, without a tokenizer to decode
                texts.append([t.replace("Ġ", " ").replace("Ċ", "\n").replace("▁", " ") for t in c.tokens])
            else:
                texts.append([f"⟨{i}⟩" for i in ids])
            flags.append([i in special for i in ids])
    return texts, flags


def make_groups(
    batch: RolloutBatch,
    tokens: Sequence[Sequence[str]],
    seq_advantages: Tensor,
    *,
    problems: Mapping[int, str] | None = None,
    answers: Mapping[int, str | None] | None = None,
    correct: Sequence[bool | None] | None = None,
    special: Sequence[Sequence[bool]] | None = None,
    groups: int | None = None,
) -> list[GroupView]:
    """GroupViews of the first `groups` groups of `batch` (in order of first appearance), one ResponseView per row.

    tokens[i]: display text of row i's valid tokens; entropy and probability come from the
    batch's entropy / old_log_probs (exp) when present; seq_advantages A [N] is shown per response.
    """
    mask = batch.mask.cpu()
    order: list[int] = []
    for g in batch.group_ids.tolist():
        if g not in order:
            order.append(g)
    if groups is not None:
        order = order[:groups]
    ent = batch.entropy.detach().float().cpu() if batch.entropy is not None else None
    lp = batch.old_log_probs.detach().double().cpu() if batch.old_log_probs is not None else None
    out = []
    gids = batch.group_ids.tolist()
    for gid in order:
        views = []
        for i in (i for i, g in enumerate(gids) if g == gid):
            n = int(mask[i].sum())
            if len(tokens[i]) != n:
                raise ValueError(
                    f"make_groups: row {i} has {n} valid tokens but {len(tokens[i])} display tokens"
                )
            views.append(
                ResponseView(
                    row=i,
                    tokens=list(tokens[i]),
                    reward=float(batch.scores[i]),
                    advantage=float(seq_advantages[i]),
                    correct=None if correct is None else correct[i],
                    truncated=bool(batch.truncated[i]) if batch.truncated is not None else False,
                    entropy=None if ent is None else ent[i, :n].tolist(),
                    prob=None if lp is None else lp[i, :n].exp().tolist(),
                    special=None if special is None else list(special[i]),
                )
            )
        out.append(GroupView(gid, (problems or {}).get(gid, ""), views, (answers or {}).get(gid)))
    return out


def _varying(x: Tensor, mask: Tensor) -> Tensor:
    """bool[N]: rows with >= 2 valid tokens whose values are not all equal (up to float rounding)."""
    m = mask.bool()
    xd = x.double()
    hi = torch.where(m, xd, torch.full_like(xd, -math.inf)).amax(-1)
    lo = torch.where(m, xd, torch.full_like(xd, math.inf)).amin(-1)
    tol = 1e-6 * torch.maximum(hi.abs(), lo.abs()).clamp(min=1.0)
    return (m.sum(-1) >= 2) & ((hi - lo) > tol)


def explain_batch(
    batch: RolloutBatch,
    methods: Sequence[MethodSpec],
    groups: Sequence[GroupView],
    *,
    title: str = "tokencredit explain",
    subtitle: str = "",
    notes: Sequence[str] = (),
    unavailable: Mapping[str, str] | None = None,
    special_ids: Sequence[int] | None = None,
    credits: dict[str, Any] | None = None,
) -> ReportData:
    """The report structure: every method's effective credit on `batch`, diagnostics and correlations on the shown rows.

    Credit is computed on the whole batch (batch-level statistics as in training) by the one
    pipeline, `tokencredit.recipes.token_credit`, with the tokenizer's `special_ids`; the
    diagnostics (`tokencredit.diagnostics.summary`, per-response Gini) and the rank correlations
    use the rows of `groups`. `unavailable` maps a signal name to why it could not be had; a
    method needing it (or failing with a configuration/data error) is skipped with that note.
    `credits`, when given, receives each computed method's `TokenCredit` by name.
    """
    from tokencredit import diagnostics as dg

    rows = [r.row for g in groups for r in g.responses]
    idx = torch.tensor(rows, dtype=torch.int64, device=batch.mask.device)
    mask = batch.mask[idx]
    entropy = batch.entropy[idx] if batch.entropy is not None else None
    views: list[MethodView] = []
    shown: dict[str, Tensor] = {}
    for spec in methods:
        view = MethodView(spec.name, spec.label, spec.description)
        views.append(view)
        got = method_credit(spec, batch, special_ids=special_ids, unavailable=unavailable)
        if got.credit is None:
            view.note = got.reason
            continue
        try:
            effective = got.credit.effective()
        except (ConfigError, ValueError, FloatingPointError) as e:
            view.note = f"{type(e).__name__}: {e}"
            continue
        if credits is not None:
            credits[spec.name] = got.credit
        eff = effective[idx].cpu()
        seq = got.credit.seq_advantages[idx].cpu()
        m_cpu = mask.cpu()
        shown[spec.name] = eff
        view.credit = {r: eff[k, : int(m_cpu[k].sum())].tolist() for k, r in enumerate(rows)}
        view.seq_advantages = {r: float(seq[k]) for k, r in enumerate(rows)}
        w = dg.credit_weights(eff, m_cpu)
        g = dg.gini(w, m_cpu)
        defined = dg.defined_rows(w, m_cpu)
        view.row_gini = {r: (float(g[k]) if bool(defined[k]) else None) for k, r in enumerate(rows)}
        summ = dg.summary(eff, m_cpu, seq, None if entropy is None else entropy.cpu())
        view.diagnostics = dict(summ)
        peak = float(eff[m_cpu].abs().max()) if bool(m_cpu.any()) else 0.0
        view.scale = peak if peak > 0 else 1.0

    correlations: dict[tuple[str, str], tuple[float | None, int]] = {}
    names = list(shown)
    m_cpu = mask.cpu()
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            rho = dg.rank_correlation(shown[a], shown[b], m_cpu)
            ok = _varying(shown[a], m_cpu) & _varying(shown[b], m_cpu)
            value = float(rho[ok].mean()) if bool(ok.any()) else None
            correlations[(a, b)] = correlations[(b, a)] = (value, int(ok.sum()))
    return ReportData(
        title=title,
        groups=list(groups),
        methods=views,
        correlations=correlations,
        subtitle=subtitle,
        notes=list(notes),
    )


# ============================================================================ model and signals
def _load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    from tokencredit.models import TOY_ASSET_DIR

    p = TOY_ASSET_DIR if str(path) == "toy" else Path(path)
    tok = AutoTokenizer.from_pretrained(p, local_files_only=True)
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def _prompt_texts(groups: Sequence[GroupInput], tokenizer: Any, template: str) -> list[str]:
    from tokencredit.data.templates import render

    return [g.prompt if g.prompt is not None else render(template, g.problem, tokenizer) for g in groups]  # type: ignore[arg-type]


def recompute_signals(
    model: Any,
    tokenizer: Any,
    groups: Sequence[GroupInput],
    batch: RolloutBatch,
    needs: set[str],
    *,
    template: str,
    temperature: float,
    batch_size: int,
) -> dict[str, Tensor]:
    """The signals `needs` for the batch's rows with `model` (prompts rebuilt from the groups), on the model's device."""
    from tokencredit.signals import compute_signals

    device = next(model.parameters()).device
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    prompts = _prompt_texts(groups, tokenizer, template)
    p_rows = [_bos_aware_ids(tokenizer, p) for g, p in zip(groups, prompts) for _ in g.completions]
    p_ids, p_att = _padded(p_rows, pad, torch.int64, left=True)
    resp = torch.where(batch.mask, batch.token_ids, torch.full_like(batch.token_ids, pad))
    seq = torch.cat([p_ids, resp.cpu()], 1).to(device)
    att = torch.cat([p_att.long(), batch.mask.long().cpu()], 1).to(device)
    neg: dict[str, Any] = {}
    if "neg_log_probs" in needs:
        from tokencredit.credit.gcpo import negative_prompt
        from tokencredit.data.templates import render
        from tokencredit.signals import negative_prompt_inputs

        texts = [render(template, negative_prompt(g.problem), tokenizer) for g in groups for _ in g.completions]  # type: ignore[arg-type]
        neg = negative_prompt_inputs(tokenizer, texts, resp.to(device), batch.mask.to(device))
    return compute_signals(
        model,
        seq,
        att,
        int(p_ids.shape[1]),
        batch.mask.to(device),
        needs,
        temperature=temperature,
        batch_size=batch_size,
        **neg,
    )


# ============================================================================ command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", nargs="?", help="a training run directory (reads RUN_DIR/rollouts/step_NNNNNN.jsonl)"
    )
    parser.add_argument(
        "--jsonl", help="JSONL of prompts, completions and rewards instead of a run directory"
    )
    parser.add_argument(
        "--model", help="model directory (or 'toy'); required with --jsonl; default RUN_DIR/final"
    )
    parser.add_argument("--step", type=int, help="which saved step of the run (default: the latest saved)")
    parser.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"comma-separated credit methods and/or recipes (default: {DEFAULT_METHODS})",
    )
    parser.add_argument("--groups", type=int, default=4, help="how many groups to show (default 4)")
    parser.add_argument(
        "--out", help="output HTML file (default: RUN_DIR/explain_step_NNNNNN.html or FILE.explain.html)"
    )
    parser.add_argument(
        "--advantage",
        help="group estimator for plain credit methods (grpo, dr-grpo, rloo, grpo-batch; default: the run's, else grpo)",
    )
    parser.add_argument(
        "--template", help="prompt template for 'problem' fields (default: the run's, else qwen-math)"
    )
    parser.add_argument(
        "--temperature", type=float, help="temperature of the signals (default: the run's, else 1.0)"
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (for recomputing signals)")
    parser.add_argument(
        "--batch-size", type=int, default=16, help="rows per forward when recomputing signals"
    )


@dataclass
class _Inputs:
    """Everything `run` reads from the command line and the input files."""

    groups: list[GroupInput]
    template: str
    temperature: float
    advantage: str
    advantage_params: dict[str, Any]
    model_path: str
    out: Path
    source: str
    run_dir: Path | None = None
    cfg: Any = None  # the run's TrainConfig
    recipe: Any = None  # the run's resolved recipe
    notes: list[str] = field(default_factory=list)


def run_recipe(run_dir: Path, cfg: TrainConfig) -> Recipe:
    """The recipe a run trained with: its recipe.json, else the one `cfg` resolves to."""
    return RunDir(run_dir).read_recipe(cfg)


def _read_inputs(args: argparse.Namespace) -> _Inputs:
    from tokencredit.train.config import TrainConfig, load_config

    if args.jsonl is not None:
        return _Inputs(
            groups=load_jsonl(args.jsonl),
            template=args.template or "qwen-math",
            temperature=args.temperature if args.temperature is not None else 1.0,
            advantage=args.advantage or "grpo",
            advantage_params={},
            model_path=args.model,
            out=Path(args.out) if args.out else Path(args.jsonl).with_suffix(".explain.html"),
            source=f"{args.jsonl} · model {args.model}",
        )
    run_dir = Path(args.run_dir)
    step, groups = load_run_rollouts(run_dir, args.step)
    notes = []
    cfg_path = run_dir / "config.toml"
    if cfg_path.is_file():
        cfg = load_config(cfg_path)
    else:
        cfg = TrainConfig()
        notes.append(f"{cfg_path} not found: trainer defaults assumed (template, temperature, LoRA)")
    recipe = run_recipe(run_dir, cfg)
    return _Inputs(
        groups=groups,
        template=args.template or cfg.data.template,
        temperature=args.temperature if args.temperature is not None else cfg.rollout.temperature,
        advantage=args.advantage or recipe.advantage,
        advantage_params=dict(recipe.advantage_params) if args.advantage is None else {},
        model_path=args.model or str(run_dir / "final"),
        out=Path(args.out) if args.out else run_dir / f"explain_step_{step:06d}.html",
        source=f"run {run_dir} · step {step} · trained with recipe {recipe.name!r} on model {cfg.model.name!r}",
        run_dir=run_dir,
        cfg=cfg,
        recipe=recipe,
        notes=notes,
    )


def _batch_with_signals(
    args: argparse.Namespace, inp: _Inputs, needs: set[str], notes: list[str]
) -> tuple[RolloutBatch, Any, dict[str, str]]:
    """(batch with every obtainable signal, tokenizer or None, {signal: why unavailable}).

    From a run directory the saved entropy / old_log_probs are used and a model is loaded only
    for signals they lack (hidden states...): RUN_DIR/final, or, for the LoRA signals of a LoRA
    run, the base model with the adapter from the newest checkpoint. From a JSONL every signal is
    recomputed with --model.
    """
    from tokencredit.models import load_model
    from tokencredit.signals import has_lora_adapter

    device = resolve_device(args.device, "--device")
    recompute_all = inp.run_dir is None
    model = tokenizer = None
    model_desc = f"model {inp.model_path}"
    unavailable: dict[str, str] = {}
    if recompute_all:
        model, tokenizer = load_model(inp.model_path, device=device)
    else:
        try:
            tokenizer = _load_tokenizer(inp.model_path)
        except (OSError, ValueError) as e:
            notes.append(f"no tokenizer in {inp.model_path} ({type(e).__name__}); tokens shown as saved")
    batch = assemble_batch(inp.groups, tokenizer, use_saved_signals=not recompute_all)
    saved = batch.available_signals()
    wanted = (needs | set(_DISPLAY_SIGNALS)) - saved
    if "neg_log_probs" in wanted and any(g.problem is None for g in inp.groups):
        wanted.discard("neg_log_probs")
        unavailable["neg_log_probs"] = "GCPO's negative prompt needs each group's 'problem' text"
    if model is None and needs - saved:
        lora_run = args.model is None and inp.cfg is not None and inp.cfg.model.lora_rank > 0
        if wanted & set(_LORA_SIGNALS) and lora_run:
            try:
                model, tokenizer, model_desc = load_run_policy(inp.run_dir, None, device, log=notes.append)
            except (ConfigError, OSError, RuntimeError) as e:
                notes.append(f"could not restore the run's LoRA adapter ({e}); using {inp.model_path}")
        if model is None:
            try:
                model, tokenizer = load_model(inp.model_path, device=device)
            except (ConfigError, OSError, ValueError) as e:
                unavailable.update({s: f"no model to recompute it ({e})" for s in wanted})
                notes.append(f"no model loaded: {e}")
    if model is None:
        wanted = set()
    elif wanted & set(_LORA_SIGNALS) and not has_lora_adapter(model):
        if inp.cfg is not None and args.model is None and inp.cfg.model.lora_rank <= 0:
            why = "the run trained without LoRA (model.lora_rank = 0)"
        else:
            merged = (
                " (RUN_DIR/final is the merged model)" if not recompute_all and args.model is None else ""
            )
            why = f"{model_desc} has no LoRA adapter{merged}"
        for s in wanted & set(_LORA_SIGNALS):
            unavailable[s] = f"{why}; ARCA / policy-divergence read the adapter's effect"
        wanted -= set(_LORA_SIGNALS)
    if wanted:
        sig = recompute_signals(
            model, tokenizer, inp.groups, batch, wanted, template=inp.template, temperature=inp.temperature,
            batch_size=args.batch_size,
        )  # fmt: skip
        batch = _with_signals(batch, {k: v.cpu() for k, v in sig.items()})
        origin = "recomputed" if recompute_all else "recomputed (the saved rollouts lack them)"
        notes.append(f"signals {origin} with {model_desc}: {', '.join(sorted(sig))}")
    if saved:
        notes.append(f"from the saved rollouts (the policy that sampled them): {', '.join(sorted(saved))}")
    for s in sorted(set(unavailable) & needs):
        notes.append(f"signal {s} unavailable: {unavailable[s]}")
    return batch, tokenizer, unavailable


def run(args: argparse.Namespace) -> int:
    from tokencredit import advantages

    if (args.run_dir is None) == (args.jsonl is None):
        raise ConfigError("give either a RUN_DIR or --jsonl FILE (with --model PATH)")
    if args.jsonl is not None and args.step is not None:
        raise ConfigError("--step selects a saved step of a run directory; it has no meaning with --jsonl")
    if args.jsonl is not None and not args.model:
        raise ConfigError("--jsonl needs --model PATH (its tokenizer and signals explain the completions)")
    if args.groups < 1:
        raise ConfigError(f"--groups must be >= 1, got {args.groups}")
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    inp = _read_inputs(args)
    if inp.advantage not in advantages.ESTIMATORS:
        raise ConfigError(
            f"--advantage: unknown estimator {inp.advantage!r}{closest(inp.advantage, advantages.ESTIMATORS)}; "
            f"one of {', '.join(advantages.ESTIMATORS)}"
        )
    specs = resolve_methods(
        args.methods.split(","),
        advantage=inp.advantage,
        advantage_params=inp.advantage_params,
        run_recipe=inp.recipe,
    )
    needs = needed_signals(specs)
    notes = list(inp.notes)
    batch, tokenizer, unavailable = _batch_with_signals(args, inp, needs, notes)

    seq_adv = advantages.compute(inp.advantage, batch.scores, batch.group_ids, **inp.advantage_params)
    texts, special = _display_tokens(inp.groups, tokenizer)
    shown = make_groups(
        batch,
        texts,
        seq_adv,
        problems={g.group_id: (g.problem if g.problem is not None else g.prompt or "") for g in inp.groups},
        answers={g.group_id: g.answer for g in inp.groups},
        correct=[c.correct for g in inp.groups for c in g.completions],
        special=special,
        groups=args.groups,
    )
    if any(not s.recipe.per_token for s in specs):
        notes.append(
            "recipes with a sequence or trace ratio kernel (gspo, ptrace, strace) show their on-policy credit "
            "Â_eff = −n·∂L/∂log π at ratio 1, token-mean (P-/S-trace: a reconstruction from the paper's abstract)"
        )
    n_shown = sum(len(g.responses) for g in shown)
    notes.append(
        f"credit computed on all {len(inp.groups)} groups ({batch.num_rollouts} responses) as one batch; "
        f"{len(shown)} groups ({n_shown} responses) shown and summarised; sequence advantage A: {inp.advantage}"
    )
    data = explain_batch(
        batch,
        specs,
        shown,
        title="tokencredit explain: where does the credit go?",
        subtitle=inp.source,
        notes=notes,
        unavailable=unavailable,
        special_ids=special_token_ids(tokenizer),
    )
    inp.out.parent.mkdir(parents=True, exist_ok=True)
    inp.out.write_text(build_report(data), encoding="utf-8")
    skipped = [m.name for m in data.methods if m.skipped]
    print(f"wrote {inp.out}" + (f" (skipped: {', '.join(skipped)}; reasons on the page)" if skipped else ""))
    return 0
