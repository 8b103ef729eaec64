"""Checkpoint evaluation (`unstable.evaluation.evaluate`): W/D/L against opponents per seat with Wilson
intervals, and the exact exploitability of a model's Kuhn Poker policy."""
