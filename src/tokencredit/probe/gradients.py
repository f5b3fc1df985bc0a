"""Gradient fidelity: how close the policy gradient of a method's credit Â is to the oracle's (and GRPO's).

ρ and blame@k compare credits token by token; training feels only the gradient they add up to. For
a credit Â [M,T] on M rollouts the on-policy (ratio 1) policy gradient is

    g(Â) = ∇_θ Σ_{i,t} Â_{i,t} log π_θ(y_{i,t} | prompt_i, y_{i,<t})        (valid response tokens)

the direction of the first mini-batch step of any per-token objective whose effective credit is Â
(`tokencredit.objectives.effective`), before the optimiser's preconditioning (AdamW rescales each
coordinate, which no cosine of raw gradients sees). θ are the parameters the trainer trains: a LoRA
adapter when the model has one, else every parameter (a full model, or a run's merged export).

The probe reports cos(g(Â), g(A*)) and cos(g(Â), g(Â_GRPO)) per batch of whole problems, their
mean and its standard error over the batches, and the headroom index 1 - cos(g_GRPO, g*): how far
uniform credit's gradient points from the exact credit's. Cosines are scale-free, so the size of Â
(A* is small and sparse) does not enter. log π is taken as the trainer takes it
(`tokencredit.signals.token_log_probs`: chunked LM head, no [N,T,V] float32 tensor, logits /
temperature) in eval mode; memory holds the references' flattened gradients plus one more.

Noise ceiling. A* is a Monte-Carlo estimate from K continuations per state: g* = g(A*) = g_true + n,
g_true the gradient of the exact A* on the same rollouts (same states, same delta skips) and n the
sampling noise, which lowers every cosine with g* (the headroom index is an upper bound at finite K).
With K even the oracle also keeps A*_a and A*_b from the first and the last K/2 continuations of each
state (no extra sampling; A* is linear in the value means, so A* = (A*_a + A*_b) / 2), and per batch

    r_half = cos(g(A*_a), g(A*_b))                      split-half reliability
    r_K    = 2 r_half / (1 + r_half)                    Spearman-Brown: the reliability of g*
    cos(g(Â), g_true) ≈ cos(g(Â), g*) / sqrt(r_K)       disattenuated, capped to [-1, 1]
    corrected headroom = 1 - cos(g_GRPO, g*) / sqrt(r_K)   (from the capped cosine)

reported per batch and as mean ± SE over batches. Model: g(A*_x) = g_true + n_x (x = a, b) with
n_a, n_b independent, of equal expected squared norm s^2 and uncorrelated with g_true and with g(Â)
(the continuations are independent of the rollouts' credit). Then r_half ≈ |g_true|^2 / (|g_true|^2
+ s^2), the full K's noise (n_a + n_b) / 2 has s^2 / 2, so cos(g*, g_true)^2 ≈ r_K and cos(g(Â), g*) ≈
cos(g(Â), g_true) sqrt(r_K); the approximations are the high-dimensional ones (cross terms small next
to the norms). A batch's estimate is noisy, so the ratio can pass 1: it is capped, and each summary
counts its capped batches. Where r_half <= 0 (or a half's gradient is 0) the halves share no
direction, the correction is undefined and is null (never divided). The halves' two gradients are
computed and freed before the references', so the memory peak is unchanged.

Bias or noise. Each batch's gradients are also kept (up to `EXPECTED_MAX_BYTES`) and the dot products
of *different* batches' gradients give the expected gradients' cosines and each credit's signal share
(`tokencredit.probe.expected`): what of the per-batch headroom is a bias every step repeats,
and what is noise that averages out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from tokencredit.columns import MethodCredit
from tokencredit.probe.config import ProbeConfig
from tokencredit.probe.expected import expected_gradients
from tokencredit.probe.fidelity import ProbeOracle
from tokencredit.probe.noise import conditional_cosine, decomposition, paired_difference
from tokencredit.probe.precondition import AdamMoments, Preconditioner, from_moments, standin_moments
from tokencredit.rollout import PromptResponseLayout
from tokencredit.signals import eval_mode, has_lora_adapter, token_log_probs

__all__ = [
    "REFERENCES",
    "cosine",
    "disattenuated",
    "gradient_cosines",
    "gradient_fidelity",
    "group_batches",
    "mean_and_stderr",
    "noise_ceiling",
    "policy_gradient",
    "problem_blocks",
    "problem_sums",
    "spearman_brown",
    "trainable_names",
    "trainable_parameters",
    "with_gradient_columns",
]

REFERENCES = ("oracle", "grpo")
"""The reference gradients every credit is compared with: the oracle's A* and GRPO's uniform credit."""

_DOT_CHUNK = 1 << 24  # elements per float64 piece of a dot product: exact enough, no [P] float64 copy
EXPECTED_MAX_BYTES = 2 << 30
"""The most memory the cross-batch analysis (`expected`) may hold in kept gradients; above it, n/a with
the reason (a full model of 100 M+ parameters: use a LoRA adapter or fewer --grad-batches)."""


def trainable_parameters(model: nn.Module) -> tuple[list[nn.Parameter], str]:
    """(θ, its description): the parameters that require grad when the model holds a LoRA adapter
    (the adapter, what the trainer's optimiser steps), else every parameter of the model."""
    if has_lora_adapter(model):
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:  # an adapter loaded frozen: its weights are still the trained ones
            params = [p for n, p in model.named_parameters() if "lora_" in n]
        return params, f"the LoRA adapter's {sum(p.numel() for p in params):,} parameters"
    params = list(model.parameters())
    return params, (
        f"all {sum(p.numel() for p in params):,} parameters (no LoRA adapter: a full model, or a merged LoRA export)"
    )


@contextmanager
def _requiring_grad(params: Sequence[nn.Parameter]) -> Iterator[None]:
    """Every parameter of θ requires grad inside (those outside θ keep their flags), flags restored after."""
    saved = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(True)
        yield
    finally:
        for p, flag in zip(params, saved):
            p.requires_grad_(flag)


class _BatchGradients:
    """g(Â) of one batch of rows for any number of credits: micro-batches of `micro_batch_size` rows
    through `token_log_probs`; when the batch is one micro-batch its forward (and graph) is kept and
    every credit is one backward of it."""

    def __init__(
        self,
        model: nn.Module,
        layout: PromptResponseLayout,
        params: Sequence[nn.Parameter],
        temperature: float,
        micro_batch_size: int,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.model, self.params, self.temperature = model, list(params), temperature
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.sequences, self.attention = layout.sequences, layout.attention_mask
        self.mask = layout.response_mask.bool()
        self.prompt_len = int(layout.prompt_ids.shape[1])
        self.parts = torch.arange(self.mask.shape[0]).split(micro_batch_size)
        self.size = sum(p.numel() for p in self.params)
        self._kept: Tensor | None = None
        self.backward_passes = 0

    def _log_probs(self, rows: Tensor) -> Tensor:
        if self._kept is not None:
            return self._kept
        out = token_log_probs(
            self.model,
            self.sequences[rows].to(self.device),
            self.attention[rows].to(self.device),
            self.prompt_len,
            temperature=self.temperature,
            response_mask=self.mask[rows].to(self.device),
        )
        if len(self.parts) == 1:
            self._kept = out
        return out  # type: ignore[return-value]

    def of(self, credit: Tensor) -> Tensor:
        """g(credit) [P] float32, θ flattened in order; credit [M,T] on the batch's rows."""
        if tuple(credit.shape) != tuple(self.mask.shape):
            raise ValueError(
                f"credit shape {tuple(credit.shape)} differs from the rows' {tuple(self.mask.shape)}"
            )
        out = torch.zeros(self.size, dtype=torch.float32, device=self.device)
        for rows in self.parts:
            c = torch.where(self.mask[rows], credit[rows].float(), 0.0).to(self.device)
            if not bool(c.any()):
                continue  # zero credit: zero gradient, no pass needed
            objective = (self._log_probs(rows) * c).sum()
            grads = torch.autograd.grad(
                objective, self.params, retain_graph=self._kept is not None, allow_unused=True
            )
            self.backward_passes += 1
            offset = 0
            for p, g in zip(self.params, grads):
                if g is not None:
                    out[offset : offset + p.numel()] += g.reshape(-1).float()
                offset += p.numel()
        return out

    def release(self) -> None:
        self._kept = None


def _rows(layout: PromptResponseLayout, rows: Tensor) -> PromptResponseLayout:
    idx = rows.long().cpu()
    return PromptResponseLayout(
        layout.prompt_ids[idx], layout.prompt_mask[idx], layout.response_ids[idx], layout.response_mask[idx]
    )


def policy_gradient(
    model: nn.Module,
    layout: PromptResponseLayout,
    credit: Tensor,
    params: Sequence[nn.Parameter],
    *,
    temperature: float = 1.0,
    micro_batch_size: int = 64,
) -> Tensor:
    """g(Â) [P] float32 = ∇_θ Σ_{i,t} Â_{i,t} log π_θ(y_{i,t} | prompt_i, y_{i,<t}), θ = `params` flattened in order.

    layout: M rows of left-padded prompts and right-padded responses (their response_mask the valid
    tokens); credit [M,T], read on the valid tokens only. log π at `temperature` as the trainer takes it,
    in eval mode, `micro_batch_size` rows per forward. Linear in Â: g(a Â1 + b Â2) = a g(Â1) + b g(Â2).
    """
    with torch.enable_grad(), eval_mode(model), _requiring_grad(params):
        return _BatchGradients(model, layout, params, temperature, micro_batch_size).of(credit)


def _dot(a: Tensor, b: Tensor, weight: Tensor | None = None) -> float:
    """a·b of two flat vectors, accumulated in float64 piece by piece; with `weight` [P] Σ_i a_i b_i w_i
    (the preconditioned metric: w = s^2, `precondition`)."""
    if weight is None:
        return sum(float(x.double() @ y.double()) for x, y in zip(a.split(_DOT_CHUNK), b.split(_DOT_CHUNK)))
    pieces = zip(a.split(_DOT_CHUNK), b.split(_DOT_CHUNK), weight.to(a.device).split(_DOT_CHUNK))
    return sum(float((x.double() * w.double()) @ y.double()) for x, y, w in pieces)


def cosine(a: Tensor, b: Tensor) -> float | None:
    """a·b / (|a| |b|) of two flat vectors, accumulated in float64; None when either is 0."""
    dot = aa = bb = 0.0
    for x, y in zip(a.split(_DOT_CHUNK), b.split(_DOT_CHUNK)):  # one pass: each piece made float64 once
        x, y = x.double(), y.double()
        dot, aa, bb = dot + float(x @ y), aa + float(x @ x), bb + float(y @ y)
    if aa == 0.0 or bb == 0.0:
        return None
    return max(-1.0, min(1.0, dot / math.sqrt(aa * bb)))


def _grams(
    kept: Mapping[str, list[Tensor]], refs: Mapping[str, list[Tensor]], weight: Tensor | None = None
) -> dict[str, Any]:
    """{name: {"self": [B, B] g_b·g_b', ref: [B, B] g_b·ref_b'}} of the kept per-batch gradients (with
    `weight`, in the preconditioned metric); a gradient kept under several names (a credit equal to a
    reference) is one tensor, its products taken once."""
    done: dict[tuple[int, int], float] = {}

    def dot(v: Tensor, w: Tensor) -> float:
        key = (id(v), id(w)) if id(v) <= id(w) else (id(w), id(v))
        if key not in done:
            done[key] = _dot(v, w, weight)
        return done[key]

    return {
        name: {
            "self": [[dot(v, w) for w in vs] for v in vs],
            **{r: [[dot(v, w) for w in ws] for v in vs] for r, ws in refs.items()},
        }
        for name, vs in kept.items()
    }


def group_batches(groups: Tensor, n_batches: int) -> list[Tensor]:
    """Row indices (int64) of min(n_batches, #groups) batches of whole groups: the distinct groups of
    groups [M] (sorted by id) split into contiguous runs as equal as possible (sizes differ by at most one)."""
    if n_batches < 1:
        raise ValueError(f"n_batches must be >= 1, got {n_batches}")
    _, inv = torch.unique(groups.cpu(), return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    if not n_groups:
        return []
    return [
        torch.isin(inv, part).nonzero().squeeze(1)
        for part in torch.arange(n_groups).tensor_split(min(n_batches, n_groups))
    ]


def _split_half(grads: _BatchGradients, halves: tuple[Tensor, Tensor], b: Tensor) -> float | None:
    """cos(g(A*_a), g(A*_b)) on batch b; both gradients freed before the references' are computed."""
    g_a = grads.of(halves[0][b].float())
    g_b = grads.of(halves[1][b].float())
    return cosine(g_a, g_b)


def gradient_cosines(
    model: nn.Module,
    layout: PromptResponseLayout,
    credits: Mapping[str, Tensor],
    references: Mapping[str, Tensor],
    batches: Sequence[Tensor],
    params: Sequence[nn.Parameter],
    *,
    temperature: float = 1.0,
    micro_batch_size: int = 64,
    halves: tuple[Tensor, Tensor] | None = None,
    grams: bool = False,
    preconditioner: Callable[[Tensor, int], Preconditioner] | None = None,
) -> tuple[dict[str, Any], int]:
    """({"credits": {name: {ref: [B] cos}}, "references": {ref: {ref: [B] cos}}}, backward passes).

    cos = cos(g_b(credit), g_b(reference)) on each batch b of rows; credits / references: {name: [M,T]}
    on the rows of `layout`; batches: row indices (e.g. `group_batches`). The references are also
    compared with each other (and themselves: 1). Memory: the references' gradients of the batch plus
    one credit's at a time; a credit equal to a reference on a batch (GSPO's on-policy credit is GRPO's)
    reuses its gradient. None where a gradient is 0. halves: (A*_a, A*_b) [M,T] each, the oracle from
    each half of its continuations: adds "split_half": [B] cos(g_b(A*_a), g_b(A*_b)) (two more passes).
    grams: keeps every batch's gradients on the CPU ((credits + references) x B x |θ| floats) and adds "grams":
    {"references" / "credits": {name: {"self": [B, B], ref: [B, B]}}}, read by `expected.expected_gradients`.
    preconditioner (with grams and a "grpo" reference): called after the last batch with Σ_b (g_b(GRPO) /
    n_b)^2 [P] (n_b the batch's valid tokens; a stand-in's input) and B, it gives the AdamW metric
    (`precondition`): adds "grams_preconditioned" (the same Gram matrices in it) and "preconditioner".
    """
    by_credit: dict[str, dict[str, list[float | None]]] = {n: {r: [] for r in references} for n in credits}
    by_ref: dict[str, dict[str, list[float | None]]] = {n: {r: [] for r in references} for n in references}
    split: list[float | None] = []
    kept: dict[str, dict[str, list[Tensor]]] = {"references": {r: [] for r in references}}
    kept["credits"] = {n: [] for n in credits}
    passes = 0
    sum_sq: Tensor | None = None
    with torch.enable_grad(), eval_mode(model), _requiring_grad(params):
        for b in batches:
            grads = _BatchGradients(model, _rows(layout, b), params, temperature, micro_batch_size)
            if halves is not None:
                split.append(_split_half(grads, halves, b))
            ref_g = {r: grads.of(c[b]) for r, c in references.items()}
            if grams and preconditioner is not None and "grpo" in ref_g:
                sq = (ref_g["grpo"] / max(1, int(grads.mask.sum()))).double().square()
                sum_sq = sq if sum_sq is None else sum_sq + sq
            ref_kept = {r: g.cpu() for r, g in ref_g.items()} if grams else {}
            for r, g in ref_g.items():
                for s, h in ref_g.items():
                    by_ref[r][s].append(cosine(g, h))
                if grams:
                    kept["references"][r].append(ref_kept[r])
            for name, credit in credits.items():
                c = credit[b].float()
                same = next((r for r, rc in references.items() if torch.equal(rc[b].float(), c)), None)
                g = ref_g[same] if same is not None else grads.of(c)
                for r, h in ref_g.items():
                    by_credit[name][r].append(cosine(g, h))
                if grams:  # a reference's gradient is kept once, under both names
                    kept["credits"][name].append(ref_kept[same] if same is not None else g.cpu())
                del g
            passes += grads.backward_passes
            grads.release()
            del ref_g
    out: dict[str, Any] = {"credits": by_credit, "references": by_ref}
    if halves is not None:
        out["split_half"] = split
    if grams:
        out["grams"] = {part: _grams(vs, kept["references"]) for part, vs in kept.items()}
        if preconditioner is not None and sum_sq is not None:
            pre = preconditioner(sum_sq.cpu(), len(batches))
            w = pre.scale.cpu().square()
            out["grams_preconditioned"] = {
                part: _grams(vs, kept["references"], w) for part, vs in kept.items()
            }
            out["preconditioner"] = pre
    return out, passes


def _pair_sums(
    ga: Tensor, gb: Tensor, refs: Mapping[str, tuple[Tensor, Tensor]], weight: Tensor | None
) -> dict[str, float]:
    """One problem's terms of `noise.BLOCK_KEYS` from its two groups' gradients g_a, g_b (and the
    references' pairs, for cross_<ref>), in the metric of `weight`."""
    h = (ga + gb) / 2
    out = {
        "n": 1.0,
        "d": (_dot(ga, ga, weight) + _dot(gb, gb, weight)) / 2,
        "w": _dot(ga, gb, weight),
        "hh": _dot(h, h, weight),
    }
    for r, (ra, rb) in refs.items():
        out[f"cross_{r}"] = (_dot(ga, rb, weight) + _dot(gb, ra, weight)) / 2
    return out


def _add(into: dict[str, float], terms: Mapping[str, float]) -> None:
    for k, v in terms.items():
        into[k] = into.get(k, 0.0) + v


def problem_sums(
    model: nn.Module,
    layout: PromptResponseLayout,
    credits: Mapping[str, Tensor],
    references: Mapping[str, Tensor],
    problems: Tensor,
    copies: Tensor,
    blocks: Sequence[Sequence[int]],
    params: Sequence[nn.Parameter],
    *,
    weights: Mapping[str, Tensor | None],
    temperature: float = 1.0,
    micro_batch_size: int = 64,
    halves: tuple[Tensor, Tensor] | None = None,
) -> tuple[dict[str, Any], int]:
    """({metric: {"references" / "credits": {name: [B] block sums}}}, backward passes): the per-problem
    terms of the noise decomposition (`noise`, its `BLOCK_KEYS`) summed over each block's problems.

    problems [M] / copies [M] (0 or 1): each row's problem and which of its two independent groups it is in;
    blocks: the problem ids of each block (every probed problem in one block: a problem without rows adds
    n = 1 and zeros); weights: {metric: None (raw) or s^2 [P] (`precondition`)}. g_xc(Â) is the gradient of
    Â on the rows of group c of problem x (one forward per problem, two backward passes per credit); halves
    (A*_1, A*_2) add the oracle's "mc" (|g(A*_1 - A*_2)_xc|^2 / 4, averaged over c)."""
    row_of: dict[int, Tensor] = {}
    for x in torch.unique(problems.cpu()).tolist():
        row_of[int(x)] = (problems.cpu() == x).nonzero().squeeze(1)
    names = {"references": list(references), "credits": list(credits)}
    sums: dict[str, Any] = {
        m: {part: {n: [{} for _ in blocks] for n in ns} for part, ns in names.items()} for m in weights
    }
    passes = 0
    with torch.enable_grad(), eval_mode(model), _requiring_grad(params):
        for k, block in enumerate(blocks):
            for x in block:
                rows = row_of.get(int(x))
                if rows is None:  # no row of this problem carries credit: zero gradients
                    for m in weights:
                        for part, ns in names.items():
                            for n in ns:
                                _add(sums[m][part][n][k], {"n": 1.0, "d": 0.0, "w": 0.0, "hh": 0.0})
                    continue
                grads = _BatchGradients(model, _rows(layout, rows), params, temperature, micro_batch_size)
                in_a = (copies.cpu()[rows] == 0)[:, None]

                def pair(c: Tensor, g: _BatchGradients = grads, a: Tensor = in_a) -> tuple[Tensor, Tensor]:
                    return g.of(torch.where(a, c, 0.0)), g.of(torch.where(a, 0.0, c))

                ref_pairs = {r: pair(c[rows].float()) for r, c in references.items()}
                mc = pair((halves[0][rows] - halves[1][rows]).float()) if halves is not None else None
                for m, w in weights.items():
                    for r, (ga, gb) in ref_pairs.items():
                        terms = _pair_sums(ga, gb, ref_pairs, w)
                        if r == "oracle" and mc is not None:
                            terms["mc"] = (_dot(mc[0], mc[0], w) + _dot(mc[1], mc[1], w)) / 8
                        _add(sums[m]["references"][r][k], terms)
                for name, credit in credits.items():
                    c = credit[rows].float()
                    same = next((r for r, rc in references.items() if torch.equal(rc[rows].float(), c)), None)
                    ga, gb = ref_pairs[same] if same is not None else pair(c)
                    for m, w in weights.items():
                        _add(sums[m]["credits"][name][k], _pair_sums(ga, gb, ref_pairs, w))
                    del ga, gb
                passes += grads.backward_passes
                grads.release()
                del ref_pairs, mc
    for m in weights:  # the oracle's "mc" in every block (zero where no problem had rows)
        for blk in sums[m]["references"].get("oracle", []):
            if halves is not None:
                blk.setdefault("mc", 0.0)
    return sums, passes


def mean_and_stderr(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """(mean, standard error of the mean) over the defined values; SE None below 2 of them."""
    v = [x for x in values if x is not None]
    if not v:
        return None, None
    mean = sum(v) / len(v)
    if len(v) < 2:
        return mean, None
    return mean, math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1) / len(v))


def _summary(per_batch: list[float | None]) -> dict[str, Any]:
    mean, se = mean_and_stderr(per_batch)
    return {"mean": mean, "se": se, "per_batch": per_batch}


def spearman_brown(r_half: float | None) -> float | None:
    """r_K = 2 r_half / (1 + r_half): the reliability of the mean of two halves whose cosine is r_half
    (module docstring: g* = (g_a + g_b) / 2 carries half the noise of either); None when r_half is None
    or <= 0 (no shared direction: the correction is undefined)."""
    if r_half is None or r_half <= 0:
        return None
    return 2.0 * r_half / (1.0 + r_half)


def disattenuated(cos: float | None, reliability: float | None) -> tuple[float | None, bool]:
    """(cos / sqrt(reliability) clamped to [-1, 1], whether it was clamped): cos(g, g_true) from cos(g, g*)
    and r_K, for a g whose noise is independent of g*'s (not g* itself); (None, False) when either is
    None or reliability <= 0."""
    if cos is None or reliability is None or reliability <= 0:
        return None, False
    x = cos / math.sqrt(reliability)
    return max(-1.0, min(1.0, x)), abs(x) > 1.0


def _corrected(cos: Sequence[float | None], r_k: Sequence[float | None]) -> dict[str, Any]:
    """{mean, se, per_batch, capped}: `disattenuated` per batch, capped the batches clamped to ±1."""
    pairs = [disattenuated(c, r) for c, r in zip(cos, r_k, strict=True)]
    return {**_summary([c for c, _ in pairs]), "capped": sum(hit for _, hit in pairs)}


def noise_ceiling(
    split_half: Sequence[float | None],
    cos_oracle: Mapping[str, Sequence[float | None]],
    grpo_oracle: Sequence[float | None],
) -> dict[str, Any]:
    """The split-half noise ceiling of the gradient cosines with g* (module docstring), per batch b.

    split_half [B]: r_half = cos(g(A*_a), g(A*_b)); cos_oracle {name: [B] cos(g(Â), g*)}; grpo_oracle
    [B]: cos(g_GRPO, g*). Returns {"reliability": {"status", "split_half", "full_k" (r_K, Spearman-
    Brown), "undefined_batches" (r_half <= 0 or None: null there)}, "headroom_corrected": 1 - capped
    cos(g_GRPO, g*) / sqrt(r_K), "credits": {name: capped cos(g(Â), g*) / sqrt(r_K)}}, each a summary
    {mean, se, per_batch} (mean ± SE over the defined batches), the corrected ones with "capped"."""
    r_k = [spearman_brown(r) for r in split_half]
    head = _corrected(grpo_oracle, r_k)
    head["per_batch"] = [None if c is None else 1.0 - c for c in head["per_batch"]]
    head.update(zip(("mean", "se"), mean_and_stderr(head["per_batch"])))
    undefined = [i for i, r in enumerate(split_half) if r is None or r <= 0]
    reliability = {
        "status": "ok" if len(undefined) < len(split_half) else "undefined",
        "split_half": _summary(list(split_half)),
        "full_k": _summary(r_k),
        "undefined_batches": undefined,
    }
    if undefined:
        reliability["reason"] = (
            f"batch(es) {', '.join(map(str, undefined))}: split-half cosine <= 0 or undefined (the halves' "
            "gradients share no direction, noise swamps the signal): the correction 1/sqrt(r_K) is "
            "undefined there"
        )
    credits = {n: _corrected(v, r_k) for n, v in cos_oracle.items()}
    return {"reliability": reliability, "headroom_corrected": head, "credits": credits}


def _oracle_halves(oracle: ProbeOracle, k: int) -> tuple[tuple[Tensor, Tensor] | None, str | None]:
    """((A*_a, A*_b) [M,T] float32, 0 off the mask, None) for the noise ceiling, or (None, why not)."""
    if k % 2:
        return None, f"K = {k} is odd: no two equal halves of the continuations (use an even --oracle)"
    half = oracle.credit.half_advantages
    if half is None:
        return None, "the oracle kept no A* of each half of its continuations"
    mask = oracle.credit.mask.bool().cpu()
    a, b = (torch.where(mask, h.float().cpu(), 0.0) for h in half)
    return (a, b), None


def _ceiling(cos: Mapping[str, Any], k: int, why_not: str | None) -> dict[str, Any]:
    """ "reliability" and "headroom_corrected" (`noise_ceiling`) and {name: corrected summary} under
    "credits"; without the halves, "reliability": {"status": "n/a", "reason"} only."""
    if why_not is not None:
        return {"reliability": {"status": "n/a", "reason": why_not}}
    by_credit = {n: v["oracle"] for n, v in cos["credits"].items()}
    out = noise_ceiling(cos["split_half"], by_credit, cos["references"]["grpo"]["oracle"])
    out["reliability"] = {"k_half": k // 2, **out["reliability"]}
    return out


def _summaries(cos: Mapping[str, Any], corrected: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """ "references" and "credits": {name: {"cos_<ref>": summary}}, the credits' with `corrected` as
    "cos_oracle_corrected"."""
    out = {
        part: {n: {f"cos_{r}": _summary(v) for r, v in per_ref.items()} for n, per_ref in cos[part].items()}
        for part in ("references", "credits")
    }
    for n, summary in corrected.items():
        out["credits"][n]["cos_oracle_corrected"] = summary
    return out


def _expected(cos: Mapping[str, Any], kept_bytes: int) -> dict[str, Any]:
    """The "expected" section: `expected_gradients` of the kept Gram matrices, or n/a with the memory it
    would have taken."""
    if "grams" in cos:
        return {"status": "ok", **expected_gradients(cos["grams"]["references"], cos["grams"]["credits"])}
    return {
        "status": "n/a",
        "reason": f"keeping every batch's gradients would take {kept_bytes / 2**30:.1f} GiB, over "
        f"{EXPECTED_MAX_BYTES / 2**30:.0f} GiB: use a LoRA adapter or fewer --grad-batches",
    }


def trainable_names(model: nn.Module, params: Sequence[nn.Parameter]) -> list[str]:
    """The names of θ's parameters in the model (`#i` for one the model does not name)."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id.get(id(p), f"#{i}") for i, p in enumerate(params)]


def _preconditioner_of(
    model: nn.Module, params: Sequence[nn.Parameter], moments: AdamMoments | str | None
) -> Callable[[Tensor, int], Preconditioner]:
    """The AdamW metric's source for `gradient_cosines`: the run's moments on θ when they fit it, else a
    stand-in from the probe's own GRPO gradients, saying why (`precondition`)."""
    why = moments if isinstance(moments, str) else "the probed model is not a training run's checkpoint"
    if isinstance(moments, AdamMoments):
        got = from_moments(moments, trainable_names(model, params), [p.shape for p in params])
        if isinstance(got, Preconditioner):
            return lambda _sum_sq, _batches: got
        why = got
    return lambda sum_sq, batches: standin_moments(sum_sq, batches, why)


def _diagonal_cosines(grams: Mapping[str, Any]) -> dict[str, Any]:
    """The per-batch cosines {"references" / "credits": {name: {ref: [B]}}} from the diagonals of Gram
    matrices (`_grams`); None where a gradient is 0."""
    refs = grams["references"]

    def cos(g: Mapping[str, Any], r: str, b: int) -> float | None:
        xx, yy = g["self"][b][b], refs[r]["self"][b][b]
        if xx <= 0.0 or yy <= 0.0:
            return None
        return max(-1.0, min(1.0, g[r][b][b] / math.sqrt(xx * yy)))

    return {
        part: {
            n: {r: [cos(g, r, b) for b in range(len(g["self"]))] for r in refs}
            for n, g in grams[part].items()
        }
        for part in ("references", "credits")
    }


def _preconditioned(cos: Mapping[str, Any], kept_bytes: int) -> dict[str, Any]:
    """The "preconditioned" section: per-batch cosines, headroom and expected gradients in AdamW's metric."""
    if "grams_preconditioned" not in cos:
        return {
            "status": "n/a",
            "reason": f"needs every batch's gradients kept ({kept_bytes / 2**30:.1f} GiB, over "
            f"{EXPECTED_MAX_BYTES / 2**30:.0f} GiB) and a GRPO reference",
        }
    grams = cos["grams_preconditioned"]
    per = _diagonal_cosines(grams)
    headroom = [None if c is None else 1.0 - c for c in per["references"]["grpo"]["oracle"]]
    return {
        "status": "ok",
        "preconditioner": cos["preconditioner"].record(),
        "headroom": _summary(headroom),
        **_summaries(per, {}),
        "expected": {"status": "ok", **expected_gradients(grams["references"], grams["credits"])},
    }


def problem_blocks(problems: Tensor, batches: Sequence[Tensor], n_problems: int) -> list[list[int]]:
    """The problem ids of each gradient batch (rows `batches` of the rows' `problems` [M]), every problem
    0..n_problems-1 placed: one without rows joins the batch of the next problem that has rows (the last
    batch after the last), so that the blocks' sums are the batches' gradients."""
    block_of: dict[int, int] = {}
    for k, b in enumerate(batches):
        for x in torch.unique(problems.cpu()[b]).tolist():
            block_of[int(x)] = k
    blocks: list[list[int]] = [[] for _ in batches]
    k = len(batches) - 1
    for x in reversed(range(n_problems)):
        k = block_of.get(x, k)
        blocks[k].insert(0, x)
    return blocks


def _noise(
    model: nn.Module,
    layout: PromptResponseLayout,
    oracle: ProbeOracle,
    credits: Mapping[str, Tensor],
    references: Mapping[str, Tensor],
    batches: Sequence[Tensor],
    params: Sequence[nn.Parameter],
    cfg: ProbeConfig,
    cos: Mapping[str, Any],
    halves: tuple[Tensor, Tensor] | None,
    n_problems: int,
) -> dict[str, Any]:
    """The "noise" section (`noise.decomposition` of every credit, raw and in AdamW's metric)."""
    if "grams" not in cos:
        return {"status": "n/a", "reason": "needs every batch's gradients kept (see the expected gradients)"}
    assert oracle.groups is not None and oracle.copies is not None
    blocks = problem_blocks(oracle.groups, batches, n_problems)
    weights: dict[str, Tensor | None] = {"raw": None}
    if "preconditioner" in cos:
        weights["adamw"] = cos["preconditioner"].scale.square()
    start = time.perf_counter()
    sums, passes = problem_sums(
        model,
        layout,
        credits,
        references,
        oracle.groups,
        oracle.copies,
        blocks,
        params,
        weights=weights,
        temperature=cfg.sampling.temperature,
        micro_batch_size=cfg.sampling.batch_size,
        halves=halves,
    )
    gram_of = {"raw": cos["grams"], "adamw": cos.get("grams_preconditioned")}
    per_step = cfg.prompts_per_step or None
    metrics: dict[str, Any] = {}
    for m in weights:
        refs = sums[m]["references"]

        def quarter(part: str, name: str, metric: str = m) -> list[list[float]]:
            # the batch gradient is Σ_x (g_xa + g_xb) = 2 H_b: H_b·H_b' is a quarter of its Gram
            return [[v / 4 for v in row] for row in gram_of[metric][part][name]["self"]]

        metrics[m] = {
            part: {
                n: {
                    **decomposition(blk, quarter(part, n), batch_problems=per_step),
                    "cos_given_x": {r: conditional_cosine(blk, refs[r], r) for r in refs},
                    "vs_grpo": paired_difference(
                        blk,
                        quarter(part, n),
                        refs["grpo"],
                        quarter("references", "grpo"),
                        batch_problems=per_step,
                    ),
                }
                for n, blk in sums[m][part].items()
            }
            for part in ("references", "credits")
        }
    return {
        "status": "ok",
        "problems": n_problems,
        "blocks": len(blocks),
        "batch_problems": per_step,
        "k_half": cfg.oracle_k // 2 if halves is not None else None,
        "backward_passes": passes,
        "seconds": time.perf_counter() - start,
        "metrics": metrics,
    }


def gradient_fidelity(
    model: nn.Module,
    layout: PromptResponseLayout,
    oracle: ProbeOracle,
    got: Mapping[str, MethodCredit],
    grpo: MethodCredit,
    cfg: ProbeConfig,
    *,
    moments: AdamMoments | str | None = None,
    problems: int | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The "gradients" result of a point: the oracle's rows of `layout` in `cfg.grad_batches` batches of
    whole problems (`group_batches`); under "credits" (each method of `got` with credit) and "references"
    (A*, GRPO's Â `grpo`) the cosines with g(A*) and g(Â_GRPO) as {"cos_oracle": {mean, se, per_batch},
    ...}; the headroom index 1 - cos(g_GRPO, g*); the noise ceiling when the oracle kept A* of each half of
    its continuations (`noise_ceiling`); "expected" (`_expected`); θ, the batches and the cost. Also
    "preconditioned": the same figures in AdamW's metric (`precondition`; `moments`: the run's second
    moments, or why there are none: then a stand-in), and with two groups per problem (`oracle.copies`)
    "noise": the noise decomposition of every credit (`noise`) over the `problems` probed (ids 0..problems-1,
    those without a row of the oracle's included as zeros)."""
    say = log or (lambda _msg: None)
    params, described = trainable_parameters(model)
    head: dict[str, Any] = {"parameters": described, "parameter_count": sum(p.numel() for p in params)}
    if grpo.credit is None:
        return {**head, "status": "n/a", "reason": f"no GRPO credit on this batch ({grpo.reason})"}
    rows = oracle.rows
    mask = oracle.credit.mask.bool().cpu()
    references = {
        "oracle": torch.where(mask, oracle.credit.advantages.float().cpu(), 0.0),
        "grpo": grpo.credit.effective().detach().float().cpu()[rows],
    }
    credits = {
        n: g.credit.effective().detach().float().cpu()[rows] for n, g in got.items() if g.credit is not None
    }
    halves, why_not = _oracle_halves(oracle, cfg.oracle_k)
    groups = oracle.groups if oracle.groups is not None else torch.arange(rows.numel())
    batches = group_batches(groups, cfg.grad_batches)
    say(f"gradient fidelity: {len(batches)} batches x {len(credits) + 2} credits, θ = {described} ...")
    kept_bytes = 4 * head["parameter_count"] * len(batches) * (len(credits) + len(references))
    start = time.perf_counter()
    cos, passes = gradient_cosines(
        model,
        _rows(layout, rows),
        credits,
        references,
        batches,
        params,
        temperature=cfg.sampling.temperature,
        micro_batch_size=cfg.sampling.batch_size,
        halves=halves,
        grams=kept_bytes <= EXPECTED_MAX_BYTES,
        preconditioner=_preconditioner_of(model, params, moments),
    )
    seconds = time.perf_counter() - start
    noise = None
    if oracle.copies is not None:
        say(f"noise decomposition: {len(credits) + 2} credits x 2 groups per problem ...")
        n_problems = max(problems or 0, int(groups.max()) + 1 if groups.numel() else 0)
        noise = _noise(
            model,
            _rows(layout, rows),
            oracle,
            credits,
            references,
            batches,
            params,
            cfg,
            cos,
            halves,
            n_problems,
        )
    _, inv = torch.unique(groups.cpu(), return_inverse=True)
    headroom = [None if c is None else 1.0 - c for c in cos["references"]["grpo"]["oracle"]]
    ceiling = _ceiling(cos, cfg.oracle_k, why_not)
    return {
        **head,
        "status": "ok",
        "temperature": cfg.sampling.temperature,
        "batches": len(batches),
        "groups_per_batch": [int(torch.unique(inv[b]).numel()) for b in batches],
        "rollouts_per_batch": [int(b.numel()) for b in batches],
        "backward_passes": passes,
        "seconds": seconds,
        "headroom": _summary(headroom),
        "reliability": ceiling["reliability"],
        **({"headroom_corrected": ceiling["headroom_corrected"]} if "headroom_corrected" in ceiling else {}),
        **_summaries(cos, ceiling.get("credits", {})),
        "expected": _expected(cos, kept_bytes),
        "preconditioned": _preconditioned(cos, kept_bytes),
        **({"noise": noise} if noise is not None else {}),
    }


def with_gradient_columns(section: dict[str, Any], gradients: dict[str, Any]) -> dict[str, Any]:
    """The oracle section with "gradients" and, in each method's row with credit, grad_cos_oracle /
    grad_cos_grpo (and with the noise ceiling grad_cos_oracle_corrected) and their standard errors
    `<key>_se` (the mean and SE over batches)."""
    credits = gradients.get("credits", {})
    methods = {}
    for name, row in section["methods"].items():
        got = credits.get(name)
        extra: dict[str, Any] = {}
        if got is not None:
            keys = [f"cos_{r}" for r in REFERENCES] + [k for k in ("cos_oracle_corrected",) if k in got]
            for key in keys:
                extra[f"grad_{key}"] = got[key]["mean"]
                extra[f"grad_{key}_se"] = got[key]["se"]
        methods[name] = {**row, **extra}
    return {**section, "methods": methods, "gradients": gradients}
