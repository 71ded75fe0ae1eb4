"""abpo: Anchored Bandit Policy Optimization for LLM recommenders, as a monthly production pipeline."""

__version__ = "0.1.0"
