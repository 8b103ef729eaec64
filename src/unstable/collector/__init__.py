"""The Collector: concurrent training and evaluation games."""

from unstable.collector.collector import Collector

__all__ = ["Collector"]
