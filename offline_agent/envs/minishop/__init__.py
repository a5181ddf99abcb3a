"""MiniShop: an offline WebShop-style shopping environment (Yao et al. 2022)."""

from offline_agent.envs.minishop.env import MiniShop

__all__ = ["MiniShop"]
