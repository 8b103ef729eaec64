"""Agents that play games: the model-backed policy agent and scripted reference opponents."""
