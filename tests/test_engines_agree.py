"""Every engine computes the same Â for a recipe: the trainer, explain, probe, the TRL plugin and the verl plugin.

One fixed batch (3 groups x 4 responses of the embedded toy tokenizer's ids, with EOS, padding, a
special id inside responses, a truncated response without EOS, mixed and all-equal rewards, and
every per-token signal) goes through each engine's own glue: the trainer's `Trainer.credit`, explain's
`explain_batch`, probe's `probe_batch`, `CreditGRPOTrainer._token_advantages` and verl's
`compute_advantage` through the plugin's hook. Each must equal the core pipeline,
`tokencredit.recipes.token_credit`, to 1e-6, and KTAE must give the tokenizer's special ids no key value.
A recipe whose estimator reads a learned critic's `values` (ppo, bpco) agrees once values are supplied (as the
trainer's critic and explain / probe with a loaded critic supply them); without them explain and probe show
it as skipped / n/a saying it needs a critic, and the TRL and verl plugins refuse it saying why.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tokencredit import models, objectives, probe
from tokencredit.batch import RolloutBatch
from tokencredit.columns import resolve_methods
from tokencredit.data.synthetic import ArithmeticTask
from tokencredit.errors import ConfigError
from tokencredit.explain import explain_batch, make_groups
from tokencredit.recipes import RECIPES, batch_fields, known_names, resolve, token_credit, zero_outside
from tokencredit.train.config import load_config
from tokencredit.train.trainer import Trainer

G, N_GROUPS, T, H = 4, 3, 9, 6
N = G * N_GROUPS
TOL = 1e-6
LORA_ONLY = {"arca", "policy-divergence"}
# ReMax's baseline is the reward of one greedy rollout per prompt (RolloutBatch.baseline_scores): the trainer
# generates it (and then agrees with the core); an engine without it (saved rollouts in explain / probe, TRL,
# verl outside its own remax) must refuse with a ConfigError naming the field, never train without it.
NEEDS_GREEDY_BASELINE = {"remax"}
# A learned critic's values V [N,T] (RolloutBatch.values): the trainer's critic supplies them (and the recipe then
# agrees with the core), explain / probe with a critic loaded (--critic RUN) too; without one explain / probe show
# the column as skipped / n/a naming the critic, and the TRL (no critic) and verl (its own: adv_estimator=gae)
# plugins refuse the recipe. Declared data: every name whose estimator reads `values` (ppo, bpco).
NEEDS_CRITIC = {n for n in known_names() if "values" in batch_fields(resolve(n))}
# Monte-Carlo values (oracle, vineppo) are sampled only by tokencredit's trainer (and probe / explain, with a model):
# the TRL and verl plugins refuse those recipes.
SAMPLED_VALUES = {"oracle", "vineppo"}
# TRL's GRPO loss is PPO-clip (trained on-policy, which REINFORCE's gradient equals) or one of its own loss types
# (cispo, sapo, vespo: the plugin checks GRPOConfig's loss_type and parameters); other losses are refused.
TRL_LOSSES = ("ppo-clip", "reinforce")


@pytest.fixture(scope="module")
def tokenizer():
    return models.build_toy_tokenizer()


@pytest.fixture(scope="module")
def fixed(tokenizer):
    """(batch, special ids, [eos, pad, special-in-text] ids) of the embedded toy tokenizer."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    special = models.special_token_ids(tokenizer)
    inner = next(i for i in special if i not in (eos, pad))  # <|im_start|> inside a response
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([9, 5, 7, 3, 6, 9, 4, 8, 2, 7, 5, 6])
    ids = torch.randint(10, 60, (N, T), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    ids[mask.logical_not()] = pad
    truncated = torch.zeros(N, dtype=torch.bool)
    truncated[5] = True  # row 5 fills T without EOS
    for i in range(N):
        if not truncated[i]:
            ids[i, lengths[i] - 1] = eos
    for i in (0, 2, 4, 7, 9):
        ids[i, 1] = inner
    ids[3, 0] = ids[8, 0] = 17  # a shared token id in correct and wrong responses
    scores = torch.tensor(
        [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    )  # last group all equal
    logp = -torch.rand(N, T, generator=gen) * 3 - 0.02
    ent = torch.rand(N, T, generator=gen) * 2
    ent[:, ::3] = 0.0  # many exact ties, as a confident policy gives
    p = logp.exp()
    signals = {
        "sum_sq_probs": p * p + torch.rand(N, T, generator=gen) * (1 - p * p),
        "old_log_probs": logp,
        "ref_log_probs": logp - 0.05,
        "entropy": ent,
        "hidden": torch.randn(N, T, H, generator=gen),
        "base_hidden": torch.randn(N, T, H, generator=gen),
        "base_log_probs": logp - 0.3 * torch.rand(N, T, generator=gen),
        "neg_log_probs": logp - torch.rand(N, T, generator=gen),
        "mc_advantages": torch.randn(N, T, generator=gen)
        * 0.3,  # the oracle's A*, as tokencredit.oracle samples it
        "mc_step_advantages": torch.randn(N, T, generator=gen) * 0.3,
    }
    signals = {k: v * (mask[..., None] if v.dim() == 3 else mask) for k, v in signals.items()}
    batch = RolloutBatch(
        token_ids=ids,
        mask=mask,
        group_ids=torch.arange(N) // G,
        scores=scores,
        truncated=truncated,
        **signals,
    )
    return batch, special, (eos, pad, inner)


def with_values(batch: RolloutBatch) -> RolloutBatch:
    """`batch` with critic values V [N,T] in [0, 1] (a bounded critic's range, BPCO's), 0 off the mask, as the
    trainer's critic fills them."""
    v = torch.rand(batch.mask.shape, generator=torch.Generator().manual_seed(3)) * batch.mask
    return dataclasses.replace(batch, values=v)


def reference(name: str, batch: RolloutBatch, special) -> torch.Tensor:
    """The core pipeline's Â, 0 outside a kept set (what the objective trains on)."""
    tc = token_credit(name, batch, special_ids=special)
    return zero_outside(tc.token_advantages, tc.keep)


def loss_tokens(tc) -> torch.Tensor:
    return zero_outside(tc.token_advantages, tc.keep)


def assert_same(got: torch.Tensor, want: torch.Tensor, engine: str, name: str) -> None:
    diff = float((got.double() - want.double()).abs().max())
    assert diff <= TOL, f"{engine} differs from the core for {name!r}: max |dA| = {diff:.3g}"


def assert_special_ids_get_no_key_value(
    name: str, got: torch.Tensor, batch: RolloutBatch, special, engine: str
):
    """KTAE: Â = A + k(id); at a special id k must be 0, so Â equals the sequence advantage there."""
    recipe = RECIPES.get(name)
    if (recipe.credit if recipe else name) != "ktae":
        return
    seq = token_credit(name, batch, special_ids=special).seq_advantages
    at = batch.mask & torch.isin(batch.token_ids, torch.tensor(special))
    assert bool(at.any())
    gap = (got - seq[:, None].expand_as(got))[at].abs().max()
    assert float(gap) == 0.0, f"{engine}: KTAE gives a special id a key value ({float(gap):.3g})"
    # and the setting matters on this batch: without the ids, those tokens get a value
    bare = token_credit(name, batch).token_advantages
    assert float((bare - seq[:, None])[at].abs().max()) > 0


ALL_NAMES = known_names()  # every recipe, then the credit methods that are not recipes


# ---------------------------------------------------------------------------------------------- trainer
@pytest.fixture(scope="module")
def trainers(tiny_model_dir, tmp_path_factory):
    from conftest import _micro_sets

    out = {}
    for name in ALL_NAMES:
        extra = {"rollout.max_new_tokens": 32, **({"model.lora_rank": 4} if name in LORA_ONLY else {})}
        sets = _micro_sets(tiny_model_dir, **extra)
        sets = [s for s in sets if not s.startswith("reward.function=")]
        cfg = load_config(sets=sets, recipe=name)
        out[name] = Trainer(cfg, tmp_path_factory.mktemp("agree"))
    return out


def assert_refused_without_greedy_baseline(call):
    with pytest.raises(ConfigError, match="baseline_scores"):
        call()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_trainer_path(name, trainers, fixed):
    batch, special, _ = fixed
    if name in NEEDS_GREEDY_BASELINE:
        assert_refused_without_greedy_baseline(lambda: trainers[name].credit(batch))
        batch = dataclasses.replace(
            batch, baseline_scores=torch.linspace(0.0, 1.0, N)
        )  # as Trainer.sample adds it
    if name in NEEDS_CRITIC:
        assert trainers[name].critic is not None  # the trainer built the critic that supplies them
        with pytest.raises(ConfigError, match="RolloutBatch.values"):
            trainers[name].credit(batch)
        batch = with_values(batch)  # as Trainer.step adds the critic's V_old
    tc = trainers[name].credit(batch)
    got = loss_tokens(tc)
    assert_same(got, reference(name, batch, special), "trainer", name)
    assert_special_ids_get_no_key_value(name, got, batch, special, "trainer")


# ---------------------------------------------------------------------------------------------- explain / probe
@pytest.mark.parametrize("name", ALL_NAMES)
def test_explain_path(name, fixed, tokenizer):
    batch, special, _ = fixed
    specs = resolve_methods([name])
    refused = name in NEEDS_GREEDY_BASELINE
    no_a = refused or name in NEEDS_CRITIC  # no sequence advantage to show without the field
    seq = torch.zeros(N) if no_a else token_credit(name, batch, special_ids=special).seq_advantages
    tokens = [[str(int(x)) for x in row[m]] for row, m in zip(batch.token_ids, batch.mask)]
    groups = make_groups(batch, tokens, seq, groups=N_GROUPS)
    credits: dict = {}
    data = explain_batch(
        batch, specs, groups, special_ids=models.special_token_ids(tokenizer), credits=credits
    )
    if refused:  # shown as skipped, with the reason
        assert data.methods[0].skipped and "baseline_scores" in data.methods[0].note
        return
    if name in NEEDS_CRITIC:  # without a critic: skipped, naming it; with its values: the core's Â
        assert data.methods[0].skipped and "needs a trained critic" in data.methods[0].note
        batch = with_values(batch)
        groups = make_groups(batch, tokens, token_credit(name, batch, special_ids=special).seq_advantages)
        data = explain_batch(
            batch, specs, groups, special_ids=models.special_token_ids(tokenizer), credits=credits
        )
    assert not data.methods[0].skipped, data.methods[0].note
    got = loss_tokens(credits[name])
    assert_same(got, reference(name, batch, special), "explain", name)
    assert_special_ids_get_no_key_value(name, got, batch, special, "explain")


@pytest.mark.parametrize("name", ALL_NAMES)
def test_probe_path(name, fixed, tokenizer):
    batch, special, _ = fixed
    problems = [p for p in ArithmeticTask(seed=1).sample(N_GROUPS, "heldout") for _ in range(G)]
    truth, _ = probe.build_truth(problems, batch.token_ids, batch.mask, batch.group_ids, tokenizer)
    credits: dict = {}

    def run(batch):
        return probe.probe_batch(
            batch,
            truth,
            resolve_methods([name]),
            lora=True,
            special_ids=models.special_token_ids(tokenizer),
            credits=credits,
        )

    res = run(batch)
    if name in NEEDS_GREEDY_BASELINE:
        assert res[name]["status"] == "n/a" and "baseline_scores" in res[name]["reason"]
        return
    if name in NEEDS_CRITIC:  # without --critic: n/a, naming it; with the critic's values: the core's Â
        assert res[name]["status"] == "n/a" and "needs a trained critic" in res[name]["reason"]
        batch = with_values(batch)
        res = run(batch)
    assert res[name]["status"] == "ok", res[name]
    got = loss_tokens(credits[name])
    assert_same(got, reference(name, batch, special), "probe", name)
    assert_special_ids_get_no_key_value(name, got, batch, special, "probe")


# ---------------------------------------------------------------------------------------------- TRL
@pytest.fixture(scope="module")
def trl_module():
    pytest.importorskip("trl", reason="TRL is not installed (extra tokencredit[trl])")
    import tokencredit.integrations.trl

    return tokencredit.integrations.trl


def _trl_trainer(trl_module, model_dir, tmp_path, name, **config):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = Dataset.from_list([{"prompt": "Compute 1 + 2.", "answer": "3"}] * 8)
    sequence = RECIPES[name].kernel in ("gspo", "gspo-token") if name in RECIPES else False
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=N,
        num_generations=G,
        max_completion_length=T,
        max_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
        beta=0.0,
        importance_sampling_level="sequence" if sequence else "token",
        **config,
    )
    return trl_module.CreditGRPOTrainer(
        model=str(model_dir),
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=ds,
        processing_class=tok,
        credit=name,
    )


@pytest.mark.extras
@pytest.mark.parametrize("name", list(RECIPES))
def test_trl_path(name, trl_module, fixed, tiny_model_dir, tmp_path, monkeypatch):
    """Table recipes only: a credit method on its own takes TRL's own normalisation (eps 1e-4) by design."""
    batch, special, _ = fixed
    recipe = RECIPES[name]
    if name in SAMPLED_VALUES:
        with pytest.raises(ConfigError, match="Monte-Carlo values"):
            _trl_trainer(trl_module, tiny_model_dir, tmp_path, name)
        return
    if name in NEEDS_CRITIC:  # TRL's GRPO trainer has no value model: refused, never trained without values
        with pytest.raises(ConfigError, match="has no critic.*adv_estimator=gae"):
            _trl_trainer(trl_module, tiny_model_dir, tmp_path, name)
        return
    if recipe.uses_ratio and recipe.kernel not in ("token", "gspo", "gspo-token"):
        with pytest.raises(ConfigError, match=recipe.kernel):
            _trl_trainer(trl_module, tiny_model_dir, tmp_path, name)
        return  # TRL's loss has no trace kernel: refused, never trained with another Â
    config = {}
    if recipe.loss in trl_module._TRL_LOSS_TYPES:
        # a loss TRL has (cispo, sapo, vespo): its loss_type and parameters must be set, or the recipe is refused
        params = {**objectives.get_loss(recipe.loss).defaults, **recipe.loss_arguments()}
        loss_type, settings = trl_module._TRL_LOSS_TYPES[recipe.loss](params)
        with pytest.raises(ConfigError, match=f"loss_type={loss_type!r}"):
            _trl_trainer(trl_module, tiny_model_dir, tmp_path, name)
        config = {"loss_type": loss_type, **settings}
    elif recipe.loss not in TRL_LOSSES:
        with pytest.raises(ConfigError, match=f"'{recipe.loss}' policy loss"):
            _trl_trainer(trl_module, tiny_model_dir, tmp_path, name)
        return  # refused, never trained with TRL's PPO-clip in its place
    trainer = _trl_trainer(trl_module, tiny_model_dir, tmp_path, name, **config)
    trainer.model.train()
    signals = {
        k: getattr(batch, k)
        for k in (
            "old_log_probs",
            "ref_log_probs",
            "entropy",
            "hidden",
            "base_hidden",
            "base_log_probs",
            "neg_log_probs",
            "sum_sq_probs",
        )
    }
    # TRL's forward pass is replaced by the fixed signals; the rest of the plugin's glue runs as in training.
    monkeypatch.setattr(trainer, "_signals", lambda inputs, output, mask, needs: dict(signals))
    trainer._tc_rewards = batch.scores[:, None].clone()
    output = {
        "completion_ids": batch.token_ids.clone(),
        "completion_mask": batch.mask.long(),
        "prompt_ids": torch.zeros(N, 1, dtype=torch.long),
        "prompt_mask": torch.ones(N, 1, dtype=torch.long),
    }
    if name in NEEDS_GREEDY_BASELINE:
        return assert_refused_without_greedy_baseline(lambda: trainer._token_advantages([], output))
    got = trainer._token_advantages([], output)
    assert_same(
        zero_outside(got, token_credit(name, batch, special_ids=special).keep),
        reference(name, batch, special),
        "TRL",
        name,
    )
    assert_special_ids_get_no_key_value(name, got, batch, special, "TRL")


# ---------------------------------------------------------------------------------------------- verl
@pytest.fixture(scope="module")
def tc_verl():
    pytest.importorskip("verl", reason="verl is not installed (extra tokencredit[verl])")
    import tokencredit.integrations.verl

    return tokencredit.integrations.verl


@pytest.mark.extras
@pytest.mark.parametrize("name", ALL_NAMES)
def test_verl_path(name, tc_verl, fixed, tokenizer):
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import ray_trainer

    from tokencredit.integrations.verl.estimators import slug

    if name in SAMPLED_VALUES:  # verl does not sample Monte-Carlo values: no tc_ estimator is registered
        assert f"tc_{slug(name)}" not in tc_verl.ESTIMATORS
        return
    if (
        name in NEEDS_CRITIC
    ):  # verl trains its own critic (adv_estimator=gae): no tc_ estimator, and one is refused
        assert f"tc_{slug(name)}" not in tc_verl.ESTIMATORS
        with pytest.raises(ConfigError, match="algorithm.adv_estimator=gae"):
            tc_verl.register_estimator(f"tc_{slug(name)}", name)
        return
    batch, special, _ = fixed
    lengths = batch.mask.sum(-1)
    rewards = torch.zeros(N, T).scatter(1, (lengths - 1)[:, None], batch.scores[:, None])
    keys = {name: tc_verl.SIGNAL_KEYS[name][0] for name in tc_verl.SIGNAL_KEYS}
    tensors = {
        "responses": batch.token_ids,
        "response_mask": batch.mask.long(),
        "token_level_rewards": rewards,
    }
    tensors.update({keys[s]: getattr(batch, s) for s in keys if getattr(batch, s) is not None})
    uid = np.array([f"prompt-{int(g)}" for g in batch.group_ids], dtype=object)
    data = DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid})

    class Legacy:  # verl's legacy trainer, as far as the plugin's old-log-prob hook reads it
        config = None

    Legacy.tokenizer = tokenizer

    def old_log_prob(self, data):
        return DataProto.from_dict(tensors={"old_log_probs": batch.old_log_probs}), 0.0

    tc_verl.hooks._wrap_legacy_old_log_prob(old_log_prob)(Legacy(), None)  # reads the tokenizer's special ids
    estimator = f"tc_{slug(name)}"
    try:
        if (
            name in NEEDS_GREEDY_BASELINE
        ):  # verl's greedy baseline ("reward_baselines") only under its own remax
            return assert_refused_without_greedy_baseline(
                lambda: ray_trainer.compute_advantage(
                    data, adv_estimator=estimator, config=AlgoConfig(adv_estimator=estimator)
                )
            )
        out = ray_trainer.compute_advantage(
            data, adv_estimator=estimator, config=AlgoConfig(adv_estimator=estimator)
        )
    finally:
        tc_verl.estimators._LEGACY_SPECIAL_IDS[0] = None
    got = out.batch["advantages"]
    assert_same(got, reference(name, batch, special), "verl", name)
    assert_special_ids_get_no_key_value(name, got, batch, special, "verl")
