"""Monomials: the terms of the HMC action. Each can refresh its auxiliary fields, give its action and its force.

The force is the momentum derivative Pdot = TA[U G^dag] (docs/conventions.md 3.4), so that P <- P + dt * Pdot
conserves H = h + sum of actions.
"""
from __future__ import annotations


class GaugeMonomial:
    """A gauge action (Wilson or Symanzik, from ``force``) as an HMC monomial."""

    kind = "gauge"

    def __init__(self, action, name: str = "gauge"):
        self.gauge_action = action
        self.name = name

    def refresh(self, u, rng) -> dict:
        return {}

    def action(self, u) -> float:
        return self.gauge_action.action(u)

    def force(self, u):
        return self.gauge_action.force(u)

    def describe(self) -> str:
        return f"{self.name}: {self.gauge_action.describe()}"
