"""The StepBuffer between collector and learner."""

from unstable.buffer.step_buffer import StepBuffer

__all__ = ["StepBuffer"]
