"""tokencredit's core on plain tensors: group advantages, token credit, the clipped loss, a diagnostic.

    python examples/core.py

No model, no download; a second or two on a CPU, most of it importing torch. The inputs are made
up (random token ids and log-probs, hand-written rewards); in training they come from the sampled
rollouts, the verifier and the old policy's forward pass. README.md shows this file from
`import torch` to the `assert`.
"""

import torch

from tokencredit import advantages, credit, diagnostics, objectives, recipes
from tokencredit.batch import RolloutBatch

# Inputs: 3 prompts x 4 sampled answers = 12 rollouts of up to 10 response tokens, vocabulary of 20 ids.
torch.manual_seed(0)
N, T, V = 12, 10, 20
ids = torch.randint(0, V, (N, T))  # response token ids
mask = torch.arange(T) < torch.randint(4, T + 1, (N, 1))  # [N, T] bool: valid tokens (answers of 4-10 tokens)
gids = torch.arange(N) // 4  # the prompt (group) each rollout answers
rewards = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 1])  # verifier scores; group 2 all correct
old_lp = -torch.rand(N, T) * mask  # log pi_old of each sampled token
ent = torch.rand(N, T) * mask  # the old policy's entropy at each position
logp = (old_lp + 0.1 * torch.randn(N, T)).requires_grad_()  # the current policy's log-probs

batch = RolloutBatch(ids, mask, gids, rewards, old_log_probs=old_lp, entropy=ent)
A = advantages.grpo(batch.scores, batch.group_ids)  # [N]: one advantage per rollout
A_hat = credit.compute("ktae", batch, A)  # [N, T]: one advantage per token
per_token = objectives.clipped_token_loss(logp, old_lp, A_hat, mask, eps_high=0.28, dual_clip=10.0)
loss = objectives.aggregate(per_token, mask, mode="token-mean")
loss.backward()
stats = diagnostics.summary(A_hat, mask, A, ent)  # where the credit went: Gini, EffN/T, sign flips, ...

# The same Â through the one pipeline every engine uses (recipe dapo+ktae: GRPO advantages, KTAE credit).
same = recipes.token_credit("dapo+ktae", batch).token_advantages
assert torch.allclose(same, A_hat, atol=1e-6), "recipes.token_credit disagrees with credit.compute"

torch.set_printoptions(precision=2, sci_mode=False, linewidth=120)
print("rewards           ", rewards.tolist())
print("A (GRPO, per group)", A)
print("Â of rollout 0     ", A_hat[0][mask[0]], f"(A = {A[0].item():+.2f} plus each token's KTAE value)")
print("Â of rollout 8     ", A_hat[8][mask[8]], "(all-correct group: A = 0, so no credit)")
print(f"loss {loss.item():+.4f}, gradient norm {logp.grad.norm().item():.4f}")
print("diagnostics       ", {k: round(v, 3) for k, v in stats.items()})
print("recipes.token_credit('dapo+ktae', batch) gives the same Â: ok")
