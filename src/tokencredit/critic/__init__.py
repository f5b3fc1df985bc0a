"""PPO's learned critic (docs/spec/ppo.md): the value model and its clipped value loss.

`model`: `ValueModel`, the policy architecture's backbone with a scalar head (V_t from the state before
response token t); `loss`: verl's clipped value loss and the explained variance. The GAE estimator that
turns the critic's values into the policy's advantages is `tokencredit.advantages.gae`.
"""

from tokencredit.critic.loss import explained_variance, value_loss
from tokencredit.critic.model import ValueModel

__all__ = ["ValueModel", "explained_variance", "value_loss"]
