"""Token-level credit assignment for RL with verifiable rewards."""

__version__ = "0.1.0"
