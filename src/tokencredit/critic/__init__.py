"""PPO's learned critic (docs/spec/ppo.md): the value model and its clipped value loss.

`model`: `ValueModel`, the policy architecture's backbone with a scalar head (V_t from the state before
response token t); `loss`: verl's clipped value loss and the explained variance; `load`: a trained
critic rebuilt from its saved weights (`TrainedCritic`, for explain and probe). The GAE estimator that
turns the critic's values into the policy's advantages is `tokencredit.advantages.gae`.
"""

from tokencredit.critic.load import (
    TrainedCritic,
    critic_recipes,
    needs_values,
    no_critic_reason,
    value_bounds,
    value_model_from_state,
)
from tokencredit.critic.loss import explained_variance, value_loss
from tokencredit.critic.model import ValueModel

__all__ = [
    "TrainedCritic",
    "ValueModel",
    "critic_recipes",
    "explained_variance",
    "needs_values",
    "no_critic_reason",
    "value_bounds",
    "value_loss",
    "value_model_from_state",
]
