"""Every metric name, once: producers and consumers (CLI, dashboard, reports, tests) import these.

Names are namespaced by the component that produces them (`learner/...`, `collector/...`, `inference/...`,
`buffer/...`, `pool/...`, `eval/...`). Each row of `metrics.jsonl` holds them under these exact keys.
"""

# learner: one row per update
STEP = "learner/step"
LOSS = "learner/loss"  # the total loss the algorithm minimised (every algorithm reports it)
PG_LOSS = "learner/pg_loss"
VALUE_LOSS = "learner/value_loss"
KL_LOSS = "learner/kl_loss"
REF_KL = "learner/ref_kl"  # KL(policy || reference policy), k3 estimate on the sampled completion tokens
REF_KL_LOSS = "learner/ref_kl_loss"
REF_KL_COEF = "learner/ref_kl_coef"  # the KL coefficient of the step (`ref_kl_coef`, a number or a schedule)
ENTROPY_LOSS = "learner/entropy_loss"
AWR_LOSS = "learner/awr_loss"
VALUE_MSE = "learner/value_mse"
VF_PRE_LOSS = "learner/vf_pre_loss"
VF_POST_LOSS = "learner/vf_post_loss"
VALUE_MEAN = "learner/value_mean"
GRAD_NORM = "learner/grad_norm"
LEARNING_RATE = "learner/learning_rate"
APPROX_KL = "learner/approx_kl"
CLIP_FRACTION = "learner/clip_fraction"
KL_COEF = "learner/kl_coef"
RHO_MEAN = "learner/rho_mean"
AWR_WEIGHT_MAX = "learner/awr_weight_max"
GROUPED_FRACTION = "learner/grouped_fraction"
RATIO_MEAN = "learner/ratio_mean"
RATIO_MAX = "learner/ratio_max"
# share of the update's completion tokens whose importance weight was truncated at the algorithm's `importance_cap`
IMPORTANCE_CAPPED_FRACTION = "learner/importance_capped_fraction"
BATCH_SIZE = "learner/batch_size"
MEAN_REWARD = "learner/mean_reward"
MEAN_COMPLETION_TOKENS = "learner/mean_completion_tokens"
STALENESS_MEAN = "learner/staleness_mean"
STALENESS_MAX = "learner/staleness_max"
STALE_DROPPED = "learner/stale_dropped"
# steps left out of the update because `learner.policy.max_train_len` cut off their whole completion (no token to
# train on), with those cut to keep the learners' shards equal
TRUNCATED_DROPPED = "learner/truncated_dropped"
SKIPPED_UPDATES = "learner/skipped_updates"  # optimizer steps skipped in this update for a non-finite gradient
SKIPPED_UPDATES_TOTAL = "learner/skipped_updates_total"
UPDATE_SECONDS = "learner/update_seconds"
# seconds the learner sat waiting for the StepBuffer to hold a batch of fresh steps (polling it, taking the batch,
# dropping stale steps), in this learner step
WAIT_SECONDS = "learner/wait_seconds"
# wall seconds of this learner step: from the previous step's row (a session's first step: from the learner's call)
# to this row; waiting for the batch, the update, the checkpoint and the previous step's resume state
STEP_SECONDS = "learner/step_seconds"
WAIT_SHARE = "learner/wait_share"  # wait_seconds / step_seconds: the share of the step the learner waited for data
# seconds the previous step spent on its resume state on the learner's path (the snapshot, waiting for the write
# before it); 0 for a step after one that saved none
STATE_SAVE_SECONDS = "learner/state_save_seconds"
TRAIN_TOKENS_PER_S = "learner/tokens_per_s"
# seconds from the end of this step's update until its policy was registered with the pool, servable: handed to the
# inference engines in memory (`learner.weight_handover: memory`), else its checkpoint folder written
WEIGHT_SYNC_SECONDS = "learner/weight_sync_seconds"

# collector: counts and throughput over the games finished since the previous row
GAMES_PER_S = "collector/games_per_s"
GAME_TOKENS_PER_S = "collector/tokens_per_s"
GAME_TOKENS = "collector/generated_tokens"  # tokens generated in those games (with their branches or vines), all seats
TRAIN_GAMES = "collector/train_games"
FAILED_GAMES = "collector/failed_games"
# + the exception's name (an env that raised, APIOpponentError, a dead inference actor's RayActorError, ...):
# failed games by cause since the run began
FAILED_BY_CAUSE = "total/failed_games/"
# collector: rates over the rolling window of the last `TrackerConfig.window_games` training games
MEAN_TURNS = "collector/mean_turns"  # game length in turns
MEAN_GAME_SECONDS = "collector/mean_game_seconds"  # game length in wall-clock seconds
SECONDS_PER_TURN = "collector/seconds_per_turn"
FORMAT_OK_RATE = "collector/format_ok_rate"
INVALID_MOVE_RATE = "collector/invalid_move_rate"
# entropy in bits of the learner's chosen moves (well-formed, valid ones); most telling in fixed-move games
# such as TicTacToe, where it falls as the policy settles on a few openings
ACTION_ENTROPY = "collector/action_entropy"
DISTINCT_ACTIONS = "collector/distinct_actions"
# the learner's W/D/L against each opponent over the same window, {opponent: {"games", "win_rate", "draw_rate",
# "loss_rate"}} (mirror self-play games have no opponent and are left out); what `unstable train` prints per step
TRAIN_WDL_BY_OPPONENT = "collector/wdl_by_opponent"
# training games whose start pacing held back while their steps would not fit in the StepBuffer (collector.pacing):
# each counted once, however long it waited; counted since the collector (re)started
GAMES_HELD_BACK = "collector/games_held_back"
# game-slot seconds since the previous row during which a training-game slot (one of collector.num_workers) stayed
# empty because pacing held its game back: collection waiting for the learner to take a batch (and publish newer
# weights) before its steps would fit in the StepBuffer
HELD_BACK_SLOT_SECONDS = "collector/held_back_slot_seconds"
# held_back_slot_seconds / the training slots' seconds since the previous row (num_workers x the row's seconds while
# collecting): the share of collection's capacity that waited for the learner (0 without pacing)
HELD_BACK_SHARE = "collector/held_back_share"
# vines (collector.vines), over the training games finished since the previous row: tokens generated in vines per
# token of the learner moves the games give the StepBuffer (the game's and the vines' first moves)
VINE_TOKENS_PER_LEARNER_TOKEN = "collector/vine_tokens_per_learner_token"
VINED_MOVE_SHARE = "collector/vined_move_share"  # share of the games' learner moves that got vines
# population std of the vined moves' Monte Carlo values (each the mean return of the game's move and its vines)
VINE_VALUE_SPREAD = "collector/vine_value_spread"
VINE_RETURN_SPREAD = "collector/vine_return_spread"  # mean population std of the returns at one vined move

# evaluation: W/D/L over the rolling window of the last `TrackerConfig.window_games` eval games
EVAL_GAMES = "eval/games"
EVAL_WIN_RATE = "eval/win_rate"
EVAL_DRAW_RATE = "eval/draw_rate"
EVAL_LOSS_RATE = "eval/loss_rate"
EVAL_WIN_LOW = "eval/win_low"
EVAL_WIN_HIGH = "eval/win_high"

# inference servers, summed over actors
INFERENCE_REQUESTS = "inference/requests"
INFERENCE_BATCHES = "inference/batches"
INFERENCE_GENERATED_TOKENS = "inference/generated_tokens"
INFERENCE_TOKENS_PER_S = "inference/tokens_per_s"
INFERENCE_TOKENS_PER_S_BY_ACTOR = "inference/tokens_per_s_by_actor"  # [tokens/s of server 0, server 1, ...]
INFERENCE_MEAN_BATCH_SIZE = "inference/mean_batch_size"
INFERENCE_BUSY_FRACTION = "inference/busy_fraction"
INFERENCE_REQUESTS_BY_ACTOR = "inference/requests_by_actor"  # [requests of server 0, server 1, ...]
INFERENCE_PROMPT_TOKENS = "inference/prompt_tokens"  # prompt tokens of the requests finished
INFERENCE_CACHED_PROMPT_TOKENS = "inference/cached_prompt_tokens"  # of which taken from a prefix cache
INFERENCE_PREFIX_CACHE_HIT_RATE = "inference/prefix_cache_hit_rate"  # cached / prompt tokens
INFERENCE_POLICY_VERSION = "inference/policy_version"  # one server's newest checkpoint served (-1: the initial)
INFERENCE_POLICY_VERSION_BY_ACTOR = "inference/policy_version_by_actor"  # [newest served by server 0, 1, ...]
INFERENCE_CHECKPOINTS_FETCHED = "inference/checkpoints_fetched"  # copied from another node's disk
INFERENCE_CHECKPOINT_BYTES = "inference/checkpoint_bytes_fetched"

# step buffer
BUFFER_SIZE = "buffer/size"
BUFFER_CAPACITY = "buffer/capacity"
BUFFER_GAMES_ADDED = "buffer/games_added"
BUFFER_GAMES_SKIPPED = "buffer/games_skipped"
BUFFER_STEPS_ADDED = "buffer/steps_added"
BUFFER_STEPS_DROPPED = "buffer/steps_dropped"

# opponent pool
POOL_GAMES_RATED = "pool/games_rated"
POOL_CHECKPOINTS = "pool/checkpoints"  # every checkpoint registered, those the pool has forgotten included
POOL_LATEST_MU = "pool/latest_mu"  # the newest checkpoint's: the prior (25, 25/3) until it has played
POOL_LATEST_SIGMA = "pool/latest_sigma"
POOL_ACTIVE_CHECKPOINTS = "pool/active_checkpoints"  # the newest max_active_lora checkpoints, sampled as opponents
# [{"agent", "mu", "sigma", "conservative", "games", "provisional", "win_probability", "match_quality"}]: agents with
# pool.ladder_min_games rated games (or an anchor) by conservative score (mu - 3 sigma), then the provisional rest;
# win_probability and match_quality are against the latest checkpoint, None unless both are ranked. Retired
# checkpoints beyond pool.max_retired are forgotten, so the ladder and the match matrix hold a bounded set of agents
POOL_LADDER = "pool/ladder"
POOL_MATCH_MATRIX = "pool/match_matrix"  # {agent: {opponent: {"games", "wins", "draws", "losses", "win_rate"}}}
# tables of the run's checkpoints (up to pool.max_retired retired ones) and opponents: the Tracker writes them to their
# own files (`tracking.history.TABLES_FILE`, `LATEST_TABLES_FILE`), never into a metrics row, so rows keep one size
TABLES = (POOL_LADDER, POOL_MATCH_MATRIX)

# running totals since the run started
TOTAL_TRAIN_GAMES = "total/train_games"
TOTAL_EVAL_GAMES = "total/eval_games"
TOTAL_FAILED_GAMES = "total/failed_games"

# the row itself
TIME = "time"
# in the final row: why the run stopped before its last learner step or cannot train, a sentence (None: it did its
# work); the row's failed-game counts above say how many games failed and of what
RUN_STOPPED = "run/stopped"
