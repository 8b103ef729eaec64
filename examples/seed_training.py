"""The original UnstableBaselines training script, verbatim: mirror self-play on SimpleTak,
evaluated against an API model on SimpleTak and Kuhn Poker. The script as published lost its indentation; every
continuation line is inside brackets, so it is valid Python as written.

The API opponent reads `UNSTABLE_API_BASE_URL` (default: OpenRouter) and the key from `UNSTABLE_API_KEY`.
`tests/test_seed_scripts.py` runs it on the tiny model against a chat-completions server on 127.0.0.1.
"""

import ray, unstable
import unstable.reward_transformations as retra
ray.init(namespace="unstable")
tracker = unstable.Tracker.options(name="Tracker").remote(run_name="demo", wandb_project="UB")
step_buffer = unstable.StepBuffer.options(name="StepBuffer").remote(
max_buffer_size=768,
tracker=tracker,
final_reward_transformation=retra.ComposeFinalRewardTransforms([retra.RoleAdvantageByEnvFormatter()]),
step_reward_transformation=retra.ComposeStepRewardTransforms([retra.RewardForFormat(1.5), retra.PenaltyForInvalidMove(1.0, -1.0)]),
sampling_reward_transformation=retra.ComposeSamplingRewardTransforms([retra.NormalizeRewardsByEnv(True)]),
)
model_pool = unstable.ModelPool.options(name="ModelPool").remote(sample_mode="mirror", max_active_lora=3, tracker=tracker)
ray.get(model_pool.add_checkpoint.remote(path=None, iteration=-1)) # set initial checkpoint as no LoRA
lora_cfg = {
"lora_rank": 32, "lora_alpha": 32, "lora_dropout": 0.0,
"target_modules": ["q_proj","k_proj","v_proj","o_proj","gate_proj", "up_proj","down_proj"]
}
collector = unstable.Collector.options(name="Collector").remote(
num_actors=2,
step_buffer=step_buffer,
model_pool=model_pool,
tracker=tracker,
vllm_config={
"model_name": "Qwen/Qwen3-1.7B-base",
"max_parallel_seq": 128,
"max_tokens": 4096,
"max_loras": 5,
"lora_config": lora_cfg,
"max_model_len": 8192
},
training_envs=[("SimpleTak-v0-train", 2, "qwen3-zs")], # (env-id, num players, prompt template)
evaluation_envs=[("SimpleTak-v0-train", 2, "qwen3-zs"), ("KuhnPoker-v0-train", 2, "qwen3-zs")],
evaluation_opponent="google/gemini-2.0-flash-lite-001",
)
learner = unstable.StandardLearner.options(num_gpus=1, name="Learner").remote(
model_name="Qwen/Qwen3-1.7B-base",
step_buffer=step_buffer,
model_pool=model_pool,
tracker=tracker,
algorithm=unstable.algorithms.Reinforce(),
batch_size=384,
mini_batch_size=1,
learning_rate=1e-5,
grad_clip=0.2,
lora_cfg=lora_cfg,
activation_checkpointing=False,
gradient_checkpointing=False,
max_train_len=None, # always train on the full sequence
max_generation_len=4096, # important for Dr. GRPO
)
# start the collection and training loops
collector.collect.remote(num_workers=384, num_eval_workers=16)
ray.get(learner.train.remote(200)) # total update steps
