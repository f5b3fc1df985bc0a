"""TRL plugin under accelerate with two CPU processes (gloo): each process computes Â for its own rows only.

Two spawned processes each build a real `CreditGRPOTrainer` (accelerate in MULTI_CPU mode, so its
``process_index`` / ``num_processes`` are the real ones).

1. Fixed batch: each process holds its half of one global batch of 3 prompts x 4 completions, as TRL's
   scoring leaves it: the rewards of the whole batch (TRL gathers them) and only its own completions and
   per-token signals (hidden states [B, T, H] included), cut to its own widest completion (9 tokens on
   process 0, 6 on process 1); prompt 1's four completions are split two and two over the processes.
   For each credit method or recipe (`NAMES`, then every other one the trainer accepts),
   `_token_advantages` runs on both processes (TRL's forward pass replaced by the fixed signals, as in
   tests/test_engines_agree.py) and each process's Â must equal its rows of the Â the same plugin computes
   on the whole batch in one process (1e-5). Every `torch.distributed` collective made meanwhile is
   recorded: none may carry a per-token vector (no [*, T, H] gather; the largest is DelTA's [2, H + 1]
   centroid sums), and the plugin never calls accelerate's gather. A name the core cannot reduce across
   processes would have to raise ConfigError on both; none does (estimators included). The credit
   diagnostics each process adds to TRL's metrics (credit/gini, ...) equal the single-process ones.
2. One real TRL training step with DelTA (generation, the plugin's own signals pass, TRL's loss): each
   process's scores are its own completions' rewards, TRL's groups are consecutive rows of one prompt,
   and each process's Â equals the core's on the batch the test gathers afterwards. SaveRolloutsCallback
   gathers both processes' rows: process 0's file holds the whole batch with each row's Â.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.extras  # needs tokencredit[trl]: skipped without it, run by `pytest -m extras`
pytest.importorskip("trl", reason="TRL is not installed (extra tokencredit[trl])")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from tokencredit.batch import RolloutBatch  # noqa: E402
from tokencredit.credit import CREDIT_METHODS  # noqa: E402
from tokencredit.errors import ConfigError  # noqa: E402
from tokencredit.models import special_token_ids  # noqa: E402
from tokencredit.recipes import RECIPES, resolve, token_credit  # noqa: E402

G, N, T, H, WORLD = 4, 12, 9, 64, 2
N_LOCAL = N // WORLD
TOL = 1e-5
# The brief's methods and recipes; "ktae" is a credit method (TRL's own group normalisation, eps 1e-4), the
# others recipes. "strace" is refused by CreditGRPOTrainer (TRL's loss has no trace kernel): it is set on the
# trainer directly, to check the global S-trace kept set the shard gives.
NAMES = ("delta", "arca", "entropy-80-20", "strace", "ktae", "grpo")
# The collectives a credit method may call (torch.distributed's, by name).
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "scatter",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
)


def global_batch() -> dict:
    """The fixed global batch: ids of the toy tokenizer (pad 0, special 1, EOS 2), masks, scores, signals."""
    gen = torch.Generator().manual_seed(0)
    # process 0 holds rows 0-5 (widest 9 tokens), process 1 rows 6-11 (widest 6)
    lengths = torch.tensor([9, 5, 7, 3, 6, 8, 4, 6, 2, 5, 6, 3])
    ids = torch.randint(10, 60, (N, T), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    for i in range(N):
        ids[i, lengths[i] - 1] = 2
    for i in (0, 2, 4, 7, 9):
        ids[i, 1] = 1  # a special id inside a response (KTAE gives it no key value)
    ids[3, 0] = ids[6, 0] = ids[7, 0] = 17  # a token id shared by both sides of the split prompt
    ids[~mask] = 0
    # prompt 0 mixed, prompt 1 (split over the processes) mixed, prompt 2 all correct
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    logp = -torch.rand(N, T, generator=gen) * 3 - 0.02
    p = logp.exp()
    signals = {
        "old_log_probs": logp,
        "ref_log_probs": logp - 0.05,
        # quarter steps: many exact ties, so the 80/20 boundary falls inside a tie broken by global row order
        "entropy": torch.randint(0, 8, (N, T), generator=gen).float() / 4,
        "sum_sq_probs": p * p + torch.rand(N, T, generator=gen) * (1 - p * p),
        "hidden": torch.randn(N, T, H, generator=gen),
        "base_hidden": torch.randn(N, T, H, generator=gen),
        "base_log_probs": logp - 0.3 * torch.rand(N, T, generator=gen),
        "neg_log_probs": logp - torch.rand(N, T, generator=gen),
    }
    signals = {k: v * (mask[..., None] if v.dim() == 3 else mask) for k, v in signals.items()}
    return {"ids": ids, "mask": mask, "scores": scores, "signals": signals}


def local_part(data: dict, rank: int, world: int) -> dict:
    """This process's rows of the global batch, cut to their widest completion (TRL pads per process)."""
    n_local = N // world
    rows = slice(rank * n_local, (rank + 1) * n_local)
    width = int(data["mask"][rows].sum(1).max())
    return {
        "ids": data["ids"][rows, :width].clone(),
        "mask": data["mask"][rows, :width].clone(),
        "signals": {k: v[rows, :width].clone() for k, v in data["signals"].items()},
    }


def id_parity_reward(completion_ids, **_):
    """1.0 when the sum of a completion's token ids is odd: mixed groups from a random policy, and a score
    each process can recompute from its own completions (so their global row is the one TRL's scores use)."""
    return [float(sum(ids) % 2) for ids in completion_ids]


def make_trainer(model_dir: str, per_device: int, out_dir: str):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig

    from tokencredit.integrations.trl import CreditGRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=per_device,
        num_generations=G,
        max_completion_length=T,
        max_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        seed=0,
        beta=0.0,
        logging_steps=1,
    )
    prompts = [{"prompt": f"Compute {a} + {b}."} for a in range(1, 4) for b in range(5, 7)]
    trainer = CreditGRPOTrainer(
        model=model_dir,
        reward_funcs=id_parity_reward,
        args=args,
        train_dataset=Dataset.from_list(prompts),
        processing_class=tok,
        credit="grpo",
    )
    trainer.model.train()
    return trainer


def plugin_advantages(trainer, name: str, part: dict, scores: torch.Tensor) -> torch.Tensor:
    """`CreditGRPOTrainer._token_advantages` for `name` on this process's part, as TRL's scoring calls it."""
    trainer.recipe = resolve(name)  # strace: past the constructor's refusal (see NAMES)
    signals = part["signals"]
    # TRL's forward pass replaced by the fixed signals: only the ones the method reads, as the pass computes
    trainer._signals = lambda inputs, output, mask, needs: {k: signals[k] for k in needs.forward}
    trainer._tc_rewards = scores[:, None].clone()  # TRL gathers every reward function's output
    trainer._metrics["train"].clear()  # only this scoring's credit diagnostics (`logged_diagnostics`)
    output = {
        "completion_ids": part["ids"],
        "completion_mask": part["mask"].long(),
        "prompt_ids": torch.zeros(len(part["ids"]), 1, dtype=torch.long),
        "prompt_mask": torch.ones(len(part["ids"]), 1, dtype=torch.long),
    }
    return trainer._token_advantages([], output)


def logged_diagnostics(trainer) -> dict[str, float]:
    """The credit/<name> values the last scoring added to TRL's metrics."""
    return {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("credit/")}


@contextlib.contextmanager
def recorded_collectives():
    """[(collective name, [tensor shapes])] of every torch.distributed collective called inside."""
    calls: list[tuple[str, list[tuple[int, ...]]]] = []
    saved = {}

    def shapes(args, kwargs) -> list[tuple[int, ...]]:
        out = []
        for a in [*args, *kwargs.values()]:
            for x in a if isinstance(a, list | tuple) else [a]:
                if isinstance(x, torch.Tensor):
                    out.append(tuple(x.shape))
        return out

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            calls.append((name, shapes(args, kwargs)))
            return fn(*args, **kwargs)

        return wrapped

    for name in COLLECTIVES:
        if hasattr(dist, name):
            saved[name] = getattr(dist, name)
            setattr(dist, name, spy(name, saved[name]))
    try:
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _worker(rank: int, port: int, model_dir: str, reference_path: str) -> None:
    """One of the two processes: both phases of the module docstring."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_WORLD_SIZE=str(WORLD),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    out = str(Path(reference_path).with_name(f"out{rank}"))
    trainer = make_trainer(model_dir, N_LOCAL, out)  # accelerate starts the gloo process group
    acc = trainer.accelerator
    assert dist.is_initialized() and acc.num_processes == WORLD and acc.process_index == rank
    reference = torch.load(reference_path)
    data = global_batch()
    part = local_part(data, rank, WORLD)
    n_local, width = part["ids"].shape
    rows = slice(rank * n_local, (rank + 1) * n_local)
    accelerate_calls = []
    for attr in ("gather", "gather_for_metrics", "pad_across_processes"):
        fn = getattr(acc, attr)
        setattr(acc, attr, lambda *a, _fn=fn, _attr=attr, **k: accelerate_calls.append(_attr) or _fn(*a, **k))
    refused = []
    for name in reference:  # NAMES first, then every other name CreditGRPOTrainer accepts
        try:
            with recorded_collectives() as calls:
                got = plugin_advantages(trainer, name, part, data["scores"])
        except (
            ConfigError
        ) as err:  # on every rank alike: the core reduces no statistic of this name across ranks
            assert name not in NAMES, f"rank {rank}, {name}: {err}"
            refused.append(name)
            continue
        want = reference[name]
        assert got.shape == (n_local, width), (name, rank, got.shape)
        diff = float((got.double() - want["advantages"][rows, :width].double()).abs().max())
        assert diff <= TOL, f"rank {rank}, {name}: Â differs from the single-process Â by {diff:.3g}"
        assert (want["advantages"][rows, width:] == 0).all()  # beyond this process's width: padding
        credit = trainer.last_credit
        torch.testing.assert_close(credit["sequence_advantages"], want["seq"][rows], atol=TOL, rtol=0)
        assert torch.equal(credit["group_ids"], torch.arange(N)[rows] // G), name
        assert torch.equal(credit["rows"], torch.arange(N)[rows]), name
        # the credit diagnostics TRL logs are the whole batch's, the same on every process
        got_diag = logged_diagnostics(trainer)
        assert got_diag.keys() == want["diagnostics"].keys() and "credit/gini" in got_diag, name
        for key, value in want["diagnostics"].items():
            assert abs(got_diag[key] - value) <= TOL, f"rank {rank}, {name}: {key} {got_diag[key]} != {value}"
        if (
            want["keep"] is not None
        ):  # a kept set (S-trace's): the global top-20% entropies, ties by global row
            assert credit["keep"] is not None and torch.equal(credit["keep"], want["keep"][rows, :width]), (
                name
            )
        # no per-token vector crosses processes: every collective tensor is smaller than one row's hidden states
        sizes = [(c, s) for c, ss in calls for s in ss]
        too_big = [(c, s) for c, s in sizes if torch.Size(s).numel() >= width * H or len(s) > 2]
        assert not too_big, f"rank {rank}, {name}: collectives moved {too_big}"
        if name in NAMES and name != "grpo":
            assert calls, f"{name}: no collective, so no global statistic"  # the shard path was taken
    everyone: list = [None] * WORLD
    dist.all_gather_object(everyone, refused)
    assert everyone == [refused] * WORLD, everyone
    if rank == 0:
        Path(reference_path).with_name("refused.txt").write_text("\n".join(refused))
    assert not accelerate_calls, accelerate_calls  # the plugin gathers nothing (TRL gathered the rewards)
    train_one_step(trainer, rank, Path(reference_path).with_name("rollouts"))
    dist.barrier()
    dist.destroy_process_group()


def train_one_step(trainer, rank: int, saved_dir: Path) -> None:
    """One real TRL step with DelTA on both processes: generation, TRL's gathered rewards, the plugin's signals
    pass on each process's own rows, and TRL's loss. The test then gathers what each process held (ids,
    masks, hidden states: the test's own gather, after training) and checks each process's Â against the core
    on the gathered batch, the scores against each process's own completions, and the groups against prompts."""
    trainer.__dict__.pop("_signals", None)  # the plugin's own forward pass again
    trainer.recipe = resolve("delta")
    trainer._tc_rewards = None
    scored = []
    compute = trainer._token_advantages

    def recording(inputs, output):
        with recorded_collectives() as calls:
            adv = compute(inputs, output)
        scored.append({**trainer.last_credit, "prompts": [x["prompt"] for x in inputs], "calls": calls})
        return adv

    trainer._token_advantages = recording
    from tokencredit.integrations.trl import SaveRolloutsCallback

    trainer.add_callback(SaveRolloutsCallback(saved_dir, every=1))
    trainer.train()
    assert trainer.state.global_step == 1 and len(scored) == 1
    mine = scored[0]
    n_local, width = mine["completion_ids"].shape
    assert n_local == N_LOCAL and mine["signals"]["hidden"].dim() == 3
    hidden_size = mine["signals"]["hidden"].shape[-1]
    too_big = [(c, s) for c, ss in mine["calls"] for s in ss if torch.Size(s).numel() >= width * hidden_size]
    assert not too_big, f"rank {rank}: collectives moved {too_big}"
    # this process's scores are those of its own completions (its rows of TRL's gathered rewards)
    ids, mask = mine["completion_ids"], mine["mask"]
    assert torch.equal(mine["scores"], ((ids * mask).sum(1) % 2).float()), rank
    keys = ("completion_ids", "mask", "scores", "rows", "group_ids", "prompts", "advantages", "signals")
    everyone: list = [None] * WORLD
    dist.all_gather_object(everyone, {k: mine[k] for k in keys})
    rows = torch.cat([e["rows"] for e in everyone])
    assert torch.equal(rows, torch.arange(N)), rows
    prompts = [p for e in everyone for p in e["prompts"]]
    assert all(prompts[i] == prompts[i - i % G] for i in range(N)), (
        prompts
    )  # TRL's groups: G consecutive rows
    top = max(e["mask"].shape[1] for e in everyone)

    def cat(get) -> torch.Tensor:
        parts = [get(e) for e in everyone]
        return torch.cat(
            [torch.nn.functional.pad(x, [0, 0] * (x.dim() - 2) + [0, top - x.shape[1]]) for x in parts]
        )

    batch = RolloutBatch(
        cat(lambda e: e["completion_ids"]),
        cat(lambda e: e["mask"]),
        torch.arange(N) // G,
        torch.cat([e["scores"] for e in everyone]),
        **{k: cat(lambda e, k=k: e["signals"][k]) for k in mine["signals"]},
    )
    per_group = batch.scores.view(-1, G).sum(1)
    assert ((per_group > 0) & (per_group < G)).any(), batch.scores  # DelTA has both sides to separate
    want = token_credit(
        trainer._engine_recipe(), batch, special_ids=special_token_ids(trainer.processing_class)
    )
    got = mine["advantages"]
    diff = float((got - want.token_advantages[rank * N_LOCAL : (rank + 1) * N_LOCAL, :width]).abs().max())
    assert diff <= TOL, f"rank {rank}: trained DelTA Â differs from the gathered batch's by {diff:.3g}"
    # SaveRolloutsCallback: process 0 wrote the whole batch (both processes' rows, in global order, their Â)
    dist.barrier()
    from tokencredit.explain.jsonl import load_jsonl

    groups = load_jsonl(saved_dir / "step_000001.jsonl")
    comps = [c for g in groups for c in g.completions]
    assert [g.group_id for g in groups] == list(range(N // G)) and len(comps) == N
    assert all(g.prompt == prompts[G * g.group_id] for g in groups)
    advantages = cat(lambda e: e["advantages"])
    for i, c in enumerate(comps):
        assert c.token_ids == batch.token_ids[i, : len(c.token_ids)].tolist() and c.score == float(
            batch.scores[i]
        )
        torch.testing.assert_close(
            torch.tensor(c.token_advantages), advantages[i, : len(c.token_ids)], atol=1e-6, rtol=0
        )


def accepted_names(trainer) -> tuple[str, ...]:
    """Every other recipe and credit method CreditGRPOTrainer accepts (its constructor's check)."""
    names = []
    for name in [*RECIPES, *(f"credit:{m}" for m in CREDIT_METHODS)]:
        trainer.recipe = resolve(name)
        try:
            trainer._check_compatible()
        except ConfigError:
            continue
        if name not in NAMES:
            names.append(name)
    return tuple(names)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(world: int, *args, timeout: float = 150.0) -> None:
    """_worker in `world` spawned processes; their exceptions (with tracebacks) re-raised here."""
    ctx = mp.start_processes(_worker, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"the {world} processes did not finish within {timeout:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join()


@pytest.mark.slow
def test_each_process_computes_its_rows_of_the_single_process_advantages(tiny_model_dir, tmp_path):
    # the reference: the plugin on the whole batch in this one process
    trainer = make_trainer(tiny_model_dir, N, str(tmp_path / "out"))
    assert trainer.accelerator.num_processes == 1
    data = global_batch()
    whole = {"ids": data["ids"], "mask": data["mask"], "signals": data["signals"]}
    reference = {}
    for name in NAMES + accepted_names(trainer):
        try:
            got = plugin_advantages(trainer, name, whole, data["scores"])
        except ConfigError:  # ReMax: no greedy baseline in TRL (refused on one process too)
            assert name not in NAMES
            continue
        credit = trainer.last_credit
        reference[name] = {
            "advantages": got,
            "seq": credit["sequence_advantages"],
            "keep": credit["keep"],
            "diagnostics": logged_diagnostics(trainer),
        }
        # which is the core pipeline's Â on the whole batch (tests/test_engines_agree.py checks this for every recipe)
        batch = RolloutBatch(
            data["ids"], data["mask"], torch.arange(N) // G, data["scores"], **data["signals"]
        )
        tc = token_credit(
            trainer._engine_recipe(), batch, special_ids=special_token_ids(trainer.processing_class)
        )
        torch.testing.assert_close(got, tc.token_advantages, atol=0, rtol=0)
    keep, ent, mask = reference["strace"]["keep"], data["signals"]["entropy"], data["mask"]
    # the kept set's boundary value is tied with tokens left out: the tie is broken by global row order
    assert keep is not None and ((ent == ent[keep].min()) & mask & ~keep).any()
    assert not (reference["delta"]["advantages"] == reference["grpo"]["advantages"]).all()
    path = tmp_path / "reference.pt"
    torch.save(reference, path)
    _run(WORLD, _free_port(), tiny_model_dir, str(path))
    refused = (tmp_path / "refused.txt").read_text().split()
    # every name the trainer accepts reduces its statistics across processes (estimators included)
    assert refused == [], f"refused on a batch split across processes: {refused}"
