"""The compact one-device trainer (`tokencredit train`)."""

from tokencredit.train.config import TrainConfig, load_config

__all__ = ["TrainConfig", "load_config"]
