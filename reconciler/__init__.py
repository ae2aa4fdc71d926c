"""A declarative GitOps reconciler for LLM serving fleets."""

__version__ = "0.1.0"
