"""Device placement on a CPU machine: GPUs given in the config reach the inference engine and the learner as
`cuda` (the GPU benchmarks check the rest on a GPU)."""

from __future__ import annotations

import torch

import unstable.inference.transformers_backend as transformers_backend
from unstable.algorithms import Reinforce
from unstable.inference import InferenceConfig, make_backend
from unstable.learner import Learner, LearnerConfig


def test_an_inference_actor_given_a_gpu_serves_on_cuda_within_its_memory_share(monkeypatch):
    built, fractions = {}, []

    class RecordingBackend:
        def __init__(self, model_path, sampling, **kwargs):
            built.update(kwargs, model_path=model_path)

    monkeypatch.setattr(transformers_backend, "TransformersBackend", RecordingBackend)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fractions.append)
    make_backend("model", InferenceConfig(num_gpus=0.5, gpu_memory_utilization=0.3, num_threads=None))
    assert built["device"] == "cuda" and fractions == [0.3]
    make_backend("model", InferenceConfig(num_threads=None))
    assert built["device"] == "cpu" and fractions == [0.3]  # no GPU, no memory cap


def test_a_learner_given_a_gpu_trains_on_cuda():
    assert Learner.build("model", Reinforce(), LearnerConfig(num_gpus=0.5)).policy.device == "cuda"
    assert Learner.build("model", Reinforce(), LearnerConfig()).policy.device == "cpu"
