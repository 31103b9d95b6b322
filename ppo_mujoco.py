"""PPO under simulated asynchrony: the baseline of VACO.

Paper: Honari et al., "Align and Filter: Improving Performance in Asynchronous On-Policy RL",
arXiv 2603.01365 (2026). CleanRL's continuous-action PPO with the paper's simulated asynchrony
(docs/method.md §1, §2); the README lists the choices that are ours.

PPO (docs/method.md §3.1) corrects nothing for the policy lag: GAE on the lagged batch, the clipped surrogate.

Reading order: the algorithm's functions, the envs and the rollout, `main` (the training loop), the run's plumbing.

Usage: python ppo_mujoco.py --env-id Hopper-v5 --lag 4
"""

import signal

if __name__ == "__main__":  # Ctrl-C while the libraries load ends the run quietly; stop_on_signals takes over later
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import copy
import os
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.normal import Normal


@dataclass
class Args:
    # The algorithm
    total_timesteps: int = 100_000_000
    """total timesteps of the experiments (paper: 100M)"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization (per minibatch)"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold (stops the epochs of an iteration early)"""

    # Environment and simulated asynchrony (docs/method.md §2)
    env_id: str = "HalfCheetah-v5"
    """the id of the environment (a MuJoCo task with a continuous action space)"""
    num_envs: int = 500
    """the number of parallel actors (paper: 500)"""
    num_steps: int = 1000
    """the number of steps each actor runs per rollout (paper: 1000)"""
    lag: int = 0
    """the largest policy staleness, in updates: the buffer keeps the lag+1 most recent policies (0: on-policy)"""
    lag_mode: Literal["uniform", "fixed"] = "uniform"
    """uniform: each actor draws a buffer entry uniformly per rollout; fixed (ours): every actor uses the oldest"""
    overlap: bool = False
    """run the next rollout during the update, in a second thread, with the same results (docs/throughput.md#overlap)"""
    env_backend: Literal["auto", "envpool", "gymnasium"] = "auto"
    """vector env (gymnasium's is the reference: video, exact resume); auto: EnvPool from 4 envs up, gymnasium below"""
    env_threads: int = 0
    """EnvPool worker threads (0: one per CPU core)"""

    # The run
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """if toggled, train on CUDA when it is available (the 64-64 MLPs are usually faster on CPU)"""
    torch_threads: int = 1
    """torch CPU threads of the update (the rollout takes one); same seed and thread count, same bits (docs/throughput.md)"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "vaco"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of env 0 to `<run-dir>/videos` (needs --env-backend gymnasium; headless: MUJOCO_GL=egl)"""
    save_model: bool = False
    """save the agent (weights and observation statistics) and the args to `<run-dir>`; also on SIGINT/SIGTERM"""
    eval_episodes: int = 10
    """episodes of deterministic evaluation (mean action, frozen statistics) after training; 0 disables it"""
    run_dir: Optional[str] = None
    """the run's folder (default: runs/{env_id}__{exp_name}__{seed}__{time}; run by a wandb agent: runs/sweep-{id}/{run id})"""
    resume: bool = False
    """continue the run in `--run-dir` from its checkpoint.pt, with its saved arguments"""
    overwrite: bool = False
    """delete the run that `--run-dir` already holds and start afresh (otherwise an existing run is refused)"""
    auto_resume: bool = False
    """resume the run in `--run-dir` if it is this command's run, start it there otherwise: a requeued job's command"""
    checkpoint_every: int = 5
    """write `<run-dir>/checkpoint.pt` every N iterations (default shape: every ~15 min) and on SIGINT/SIGTERM"""

    batch_size = property(lambda self: self.num_envs * self.num_steps)
    minibatch_size = property(lambda self: self.batch_size // self.num_minibatches)
    num_iterations = property(lambda self: self.total_timesteps // self.batch_size)


# The algorithm's flags by meaning: (flags, rule, what the rule says); NaN fails every rule. check_args adds CHECKS.
ALGORITHM_CHECKS = [
    (("learning_rate", "clip_coef", "max_grad_norm"), lambda v: 0 < v < float("inf"), "a positive number"),
    (("gamma", "gae_lambda"), lambda v: 0 <= v <= 1, "in [0, 1]"),
    (("ent_coef", "vf_coef"), lambda v: 0 <= v < float("inf"), "a finite number >= 0"),
    (("num_minibatches",), lambda v: v > 0, "> 0"),
    (("update_epochs",), lambda v: 0 < v <= 1000, "in [1, 1000]"),
    (("target_kl",), lambda v: v is None or 0 < v < float("inf"), "a positive number"),
]


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class RunningMeanStd(nn.Module):
    """Running mean and variance (parallel algorithm of Chan et al.), kept in buffers so that they are saved
    and snapshotted with the module that owns them."""

    def __init__(self, shape=()):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x):
        x = x.double()
        batch_mean, batch_var, n = x.mean(0), x.var(0, unbiased=False), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + n
        self.var.copy_((self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total)
        self.mean.add_(delta * n / total)
        self.count.fill_(total)


class Agent(nn.Module):
    def __init__(self, obs_dim, act_dim):
        super().__init__()
        # The observation statistics belong to the policy (docs/method.md §2): a stale actor normalises with
        # its own snapshot of them, or the lag would not be what it claims to be.
        self.obs_rms = RunningMeanStd((obs_dim,))
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, act_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def normalize(self, x):
        x = (x - self.obs_rms.mean.float()) / torch.sqrt(self.obs_rms.var.float() + 1e-8)
        return x.clamp(-10.0, 10.0)

    # normalized=True: x is already self.normalize(s) (the update normalises its batch once, not per minibatch).
    def get_value(self, x, normalized=False):
        return self.critic(x if normalized else self.normalize(x)).squeeze(-1)

    def get_dist(self, x, normalized=False):
        action_mean = self.actor_mean(x if normalized else self.normalize(x))
        return Normal(action_mean, self.actor_logstd.expand_as(action_mean).exp())

    def get_action(self, x):
        """(mean, sample) of pi(.|s): the arithmetic and random stream of get_dist(x).sample(), without its overhead."""
        action_mean = self.actor_mean(self.normalize(x))
        return action_mean, action_mean + self.actor_logstd.exp() * torch.randn_like(action_mean)


def draw_staleness(num_policies, num_envs, mode, rng):
    """The staleness k (0 = newest) of the buffer entry each actor acts with for one rollout (docs/method.md §2)."""
    if mode == "fixed":
        return np.full(num_envs, num_policies - 1)
    return rng.integers(0, num_policies, size=num_envs)


def total_variation(logratio):
    """Sample estimate of TV(pi, beta): 1/2 mean |pi/beta - 1| over actions drawn from beta (docs/method.md §1)."""
    return 0.5 * (logratio.exp() - 1.0).abs().mean()


def compute_gae(rewards, values, next_values, terminations, dones, gamma, gae_lambda):
    """GAE(lambda) over a (num_steps, num_envs) batch. `next_values[t]` is V(s'_t), the value of the observation
    that followed step t (the true final one where the episode ended). Termination zeroes the bootstrap;
    any episode end (termination or truncation) cuts the trace (docs/method.md §3)."""
    deltas = (rewards + gamma * (1.0 - terminations) * next_values - values).cpu().numpy()
    coefs = (gamma * gae_lambda * (1.0 - dones)).cpu().numpy()  # the loop runs in numpy: same arithmetic, less overhead
    advantages, lastgaelam = np.zeros_like(deltas), np.zeros_like(deltas[0])
    for t in reversed(range(len(deltas))):
        lastgaelam = deltas[t] + coefs[t] * lastgaelam
        advantages[t] = lastgaelam
    advantages = torch.as_tensor(advantages, device=values.device)
    return advantages, advantages + values


def scale_rewards(rewards, dones, discounted_return, return_rms, gamma):
    """CleanRL's reward scaling (gymnasium's NormalizeReward), which every script uses and the method does not change:
    each step's rewards divided by the std of the discounted return up to that step. The arithmetic of
    return_rms.update at every step, in Python floats: one pass per rollout instead of a tensor op per step."""
    mean, var, count = return_rms.mean.item(), return_rms.var.item(), return_rms.count.item()
    variances = []
    for reward, done in zip(rewards, dones):
        discounted_return = discounted_return * gamma + reward
        x = torch.from_numpy(discounted_return).double()
        delta, n, total = x.mean(0).item() - mean, len(x), count + len(x)
        var = (var * count + x.var(0, unbiased=False).item() * n + delta * delta * count * n / total) / total
        mean, count = mean + delta * n / total, total
        variances.append(var)
        discounted_return = discounted_return * (1.0 - done)
    return_rms.mean.fill_(mean), return_rms.var.fill_(var), return_rms.count.fill_(count)
    std = torch.sqrt(torch.tensor(variances, dtype=torch.float64).float() + 1e-8)
    return (torch.from_numpy(rewards) / std[:, None]).clamp(-10.0, 10.0), discounted_return


def policy_loss(ratio, advantages, clip_coef):
    """PPO's clipped surrogate (docs/method.md §3.1)."""
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    return torch.max(pg_loss1, pg_loss2).mean()


def value_loss(newvalue, oldvalue, returns, clip_coef=None):
    """Squared error to the targets; with a clip coefficient, CleanRL's clipped value loss."""
    v_loss_unclipped = (newvalue - returns) ** 2
    if clip_coef is None:
        return 0.5 * v_loss_unclipped.mean()
    v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_coef, clip_coef)
    return 0.5 * torch.max(v_loss_unclipped, (v_clipped - returns) ** 2).mean()


def collect_rollout(envs, actor_groups, next_obs, episode_stats, num_steps):
    """num_steps vector steps from `next_obs`, each actor acting with the policy it drew (--overlap runs it during an
    update: Rollouts). Returns the next rollout's first observation and this rollout: observations, actions, log beta(a|s)
    (torch), and what the envs returned (numpy, moved to torch by main): next_obs[t] is s'_t, the observation after step
    t (the true final one at an episode end), rewards, terminations, dones."""
    space, device, shape = envs.single_action_space, next_obs.device, (num_steps, *next_obs.shape)
    obs, env_next_obs = torch.zeros(shape, device=device), np.zeros(shape, dtype=np.float32)
    actions, action_means = torch.zeros((2, *shape[:2], *space.shape), device=device)
    env_rewards, env_terminations, env_dones = np.zeros((3, *shape[:2]), dtype=np.float32)
    torch.set_num_threads(1)  # the policy acts on num_envs rows per step, too few to share: the cores go to the envs
    for step in range(num_steps):
        obs[step] = next_obs
        # ALGO LOGIC: action logic, with the policy each actor drew.
        with torch.inference_mode():
            for actor, env_idx in actor_groups:
                action_means[step, env_idx], actions[step, env_idx] = actor.get_action(next_obs[env_idx])
        # TRY NOT TO MODIFY: execute the game; the env gets the clipped action, the buffer keeps the sample.
        next_obs_np, reward, terminated, truncated, env_next_obs[step] = envs.step(
            np.clip(actions[step].cpu().numpy(), space.low, space.high)
        )
        done = np.logical_or(terminated, truncated)
        episode_stats.step(reward, done)
        env_rewards[step], env_terminations[step], env_dones[step] = reward, terminated, done
        next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
    # log beta(a|s) of each actor's policy: once per rollout, the same arithmetic as per step.
    logprobs = torch.zeros(shape[:2], device=device)
    for actor, env_idx in actor_groups:
        dist = Normal(action_means[:, env_idx], actor.actor_logstd.exp())
        logprobs[:, env_idx] = dist.log_prob(actions[:, env_idx]).sum(-1)
    return next_obs, (obs, actions, logprobs, env_next_obs, env_rewards, env_terminations, env_dones)


# ==================================================================================================
# The environments and the rollout: identical in all four MuJoCo scripts: edit them here, in ppo_mujoco.py, then
# copy them into the others with `python -m tools.sync_plumbing` (tests/test_mujoco_common.py checks it).
# What main's data and logs are: the two env backends (each step's final observation, which V(s') bootstraps from)
# and auto's choice of one, the episode statistics, which policy acts in an overlapped rollout, a run's first state,
# the logs, the evaluation (its seeds and its log).
# ==================================================================================================

import concurrent.futures
import dataclasses

import gymnasium as gym
import mujoco


def make_env(env_id, idx, capture_video, run_dir, max_episode_steps=None):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array", max_episode_steps=max_episode_steps)
            env = gym.wrappers.RecordVideo(env, f"{run_dir}/videos")
        else:
            env = gym.make(env_id, max_episode_steps=max_episode_steps)
        return env

    return thunk


class GymnasiumEnvs:
    """gymnasium's SyncVectorEnv in same-step autoreset mode: the observation returned at an episode end is
    already the next episode's first one, and the true final observation comes back as `final_obs`."""

    def __init__(self, env_id, num_envs, seed, capture_video=False, run_dir=None, max_episode_steps=None):
        self.envs = gym.vector.SyncVectorEnv(
            [make_env(env_id, i, capture_video, run_dir, max_episode_steps) for i in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        self.seed = seed
        self.single_observation_space = self.envs.single_observation_space
        self.single_action_space = self.envs.single_action_space

    def reset(self):
        return self.envs.reset(seed=self.seed)[0]

    def step(self, actions):
        """Returns (next_obs, reward, terminated, truncated, final_obs); final_obs == next_obs where not done."""
        obs, reward, terminated, truncated, info = self.envs.step(actions)
        final_obs = obs
        if "_final_obs" in info:
            final_obs = obs.copy()
            ended = info["_final_obs"]
            final_obs[ended] = np.stack(info["final_obs"][ended])
        return obs, reward, terminated, truncated, final_obs

    def get_state(self):
        """What the envs' future depends on: each env's full MuJoCo state, RNG and time-limit counter."""
        states = []
        for env in self.envs.envs:
            sim = env.unwrapped
            physics = np.empty(mujoco.mj_stateSize(sim.model, mujoco.mjtState.mjSTATE_INTEGRATION))
            mujoco.mj_getState(sim.model, sim.data, physics, mujoco.mjtState.mjSTATE_INTEGRATION)
            elapsed_steps = env.get_wrapper_attr("_elapsed_steps")
            states.append((torch.from_numpy(physics), sim.np_random.bit_generator.state, elapsed_steps))
        return {"envs": states, "autoreset": torch.from_numpy(self.envs._autoreset_envs.copy())}

    def set_state(self, state):
        for env, (physics, rng_state, elapsed_steps) in zip(self.envs.envs, state["envs"]):
            sim = env.unwrapped
            mujoco.mj_setState(sim.model, sim.data, physics.numpy(), mujoco.mjtState.mjSTATE_INTEGRATION)
            sim.np_random.bit_generator.state = rng_state
            env.set_wrapper_attr("_elapsed_steps", elapsed_steps)
        self.envs._autoreset_envs = state["autoreset"].numpy().copy()

    def close(self):
        self.envs.close()


class EnvPoolEnvs:
    """EnvPool as GymnasiumEnvs. EnvPool resets an env on the step *after* its episode ended (reward 0, the action
    ignored); we take that step for the ended envs at once, so it never reaches the rollout buffer."""

    def __init__(self, env_id, num_envs, seed, num_threads=0, max_episode_steps=None):
        import envpool

        kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
        self.envs = envpool.make(
            env_id, env_type="gymnasium", num_envs=num_envs, seed=seed, num_threads=num_threads or os.cpu_count(), **kwargs
        )
        self.single_observation_space = self.envs.observation_space
        self.single_action_space = self.envs.action_space

    def reset(self):
        return self.envs.reset()[0]

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.envs.step(actions)
        final_obs = obs
        ended = np.flatnonzero(terminated | truncated)
        if len(ended):
            obs = obs.copy()
            idle_actions = np.zeros((len(ended),) + self.single_action_space.shape, dtype=actions.dtype)
            reset_obs, _, _, _, reset_info = self.envs.step(idle_actions, ended)
            obs[reset_info["env_id"]] = reset_obs
        return obs, reward, terminated, truncated, final_obs

    def get_state(self):
        return None  # EnvPool's C++ envs cannot be saved: after a resume their episodes restart

    def close(self):
        self.envs.close()


# --env-backend auto: EnvPool's thread pool pays from this many envs up; below it gymnasium's
# SyncVectorEnv is faster (docs/throughput.md: Hopper-v5, 2,048-step batches, 1 to 8 envs).
ENVPOOL_FROM_NUM_ENVS = 4


def choose_backend(args):
    """--env-backend auto (parse_args resolves it): EnvPool from ENVPOOL_FROM_NUM_ENVS envs up, else (and for video) gymnasium."""
    import envpool

    many = args.num_envs >= ENVPOOL_FROM_NUM_ENVS
    return "envpool" if many and not args.capture_video and args.env_id in envpool.list_all_envs() else "gymnasium"


def make_envs(args, run_dir):
    """The vector env of --env-backend (parse_args has resolved auto)."""
    if args.env_backend == "envpool":
        return EnvPoolEnvs(args.env_id, args.num_envs, args.seed, args.env_threads)
    return GymnasiumEnvs(args.env_id, args.num_envs, args.seed, args.capture_video, run_dir)


class EpisodeStats:
    """Return and length of each env's episode in progress, and of those finished since the last take_finished."""

    def __init__(self, num_envs):
        self.returns, self.lengths = np.zeros(num_envs), np.zeros(num_envs, dtype=np.int64)
        self.finished_returns, self.finished_lengths = [], []

    def step(self, reward, done):
        self.returns += reward
        self.lengths += 1
        if done.any():
            self.finished_returns.extend(self.returns[done])
            self.finished_lengths.extend(self.lengths[done])
            self.returns[done] = 0.0
            self.lengths[done] = 0

    def take_finished(self):
        finished = self.finished_returns, self.finished_lengths
        self.finished_returns, self.finished_lengths = [], []
        return finished


class Rollouts:
    """Where main's rollouts run. With --overlap (--lag-mode fixed, --lag K >= 1), the next rollout's policy, the oldest
    entry of the buffer after the next append, is known before the update starts: that rollout then runs during the
    update, in a second thread, with the same arithmetic (the update draws no random numbers; the rollout's envs,
    action noise and episode counts are its own). What it changes that a checkpoint of this iteration holds (the envs,
    torch's generator, the episodes in progress) is copied before it starts (docs/throughput.md#overlap)."""

    def __init__(self, args):
        self.args, self.pool, self.next, self.at_end = args, concurrent.futures.ThreadPoolExecutor(1), None, None

    def collect(self, envs, actor_groups, next_obs, episode_stats):
        """This iteration's rollout: the one that ran during the last update, or one collected now."""
        if self.next is None:
            return collect_rollout(envs, actor_groups, next_obs, episode_stats, self.args.num_steps)
        started, self.next = self.next, None
        return started.result()

    def start_next(self, iteration, stop, policy_buffer, envs, next_obs, episode_stats):
        args, self.at_end = self.args, None
        if args.overlap and not stop and iteration < args.num_iterations:
            self.at_end = rollout_state(envs, episode_stats)
            actors = [(policy_buffer[len(policy_buffer) == policy_buffer.maxlen], slice(None))]  # oldest after append
            self.next = self.pool.submit(collect_rollout, envs, actors, next_obs, episode_stats, args.num_steps)

    def state_at_iteration_end(self, stop, envs, episode_stats):
        """The rollout's side of this iteration's checkpoint. After a signal the next rollout, if one runs, is waited
        for and dropped: the run stops here, as it would one step after the other, and its envs close after it."""
        if stop and self.next is not None:
            self.next.result()
            self.next = None
        return self.at_end or rollout_state(envs, episode_stats)


def rollout_state(envs, episode_stats):
    """What a checkpoint holds that a rollout changes: the envs, torch's generators, the episodes in progress."""
    return {
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "envs": envs.get_state(),
        "episode_stats": (episode_stats.returns.copy(), episode_stats.lengths.copy()),
    }


@dataclass
class Progress:
    """Where the run stands. A checkpoint holds it as a plain dict: torch.load(weights_only=True) refuses classes."""

    global_step: int = 0
    iteration: int = 0
    final_tv: float = float("nan")  # TV(pi_theta, beta) after the last update
    rollout_seconds: float = 0.0
    update_seconds: float = 0.0
    elapsed: float = 0.0  # wall-clock seconds up to the checkpoint (a resumed run counts them)
    # (global_step, mean episodic return) of every iteration that finished an episode
    return_history: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.start_time = time.time() - self.elapsed

    def seconds(self):
        """Wall-clock seconds since the run started, a resumed run's earlier processes included."""
        return time.time() - self.start_time


def initial_state(args, envs, device):
    """Where a new run starts: (progress, next_obs, discounted_return, episode_stats), the first observations those of
    the envs' seeded reset (a resumed run's are then the checkpoint's: restore_checkpoint)."""
    next_obs = torch.tensor(envs.reset(), dtype=torch.float32, device=device)
    discounted_return = np.zeros(args.num_envs, dtype=np.float32)
    return Progress(), next_obs, discounted_return, EpisodeStats(args.num_envs)


def log_iteration(writer, args, progress, episodes, scalars):
    """One iteration to TensorBoard (and so wandb): finished episodes, the algorithm's scalars, times; a line to stdout."""
    step, (finished_returns, finished_lengths) = progress.global_step, episodes
    sps = int(step / progress.seconds())
    row = {}
    if finished_returns:
        progress.return_history.append((step, float(np.mean(finished_returns))))
        row |= {"charts/episodic_return": np.mean(finished_returns), "charts/episodic_length": np.mean(finished_lengths)}
    row |= scalars
    row |= {"perf/rollout_seconds": progress.rollout_seconds, "perf/update_seconds": progress.update_seconds}
    log_row(writer, args, row | {"charts/SPS": sps}, step)
    last_return = progress.return_history[-1][1] if progress.return_history else float("nan")
    where = f"[{progress.iteration}/{args.num_iterations}] step {step:,}"
    # The time left at the run's mean pace so far (Progress.seconds); the evaluation at the end is not counted.
    elapsed = progress.seconds()
    left = elapsed / progress.iteration * (args.num_iterations - progress.iteration)
    times = f"elapsed {hours_minutes_seconds(elapsed)} | ETA {hours_minutes_seconds(left)}"
    print(f"{where} | SPS {sps:,} | {times} | return {last_return:.1f} | final TV {progress.final_tv:.3f}")


def hours_minutes_seconds(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


def load_agent(path):
    """Rebuild a saved agent (weights and observation statistics) for evaluation."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    agent = Agent(saved["obs_dim"], saved["act_dim"])
    agent.load_state_dict(saved["agent"])
    return agent


def evaluate(agent, env_id, episodes, seed):
    """Deterministic evaluation: the mean action, with the observation statistics frozen inside the agent."""
    env = gym.make(env_id)
    low, high = env.action_space.low, env.action_space.high
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, episodic_return = False, 0.0
        while not done:
            with torch.no_grad():
                action = agent.get_dist(torch.as_tensor(obs, dtype=torch.float32)[None]).mean[0]
            obs, reward, terminated, truncated, _ = env.step(np.clip(action.numpy(), low, high))
            episodic_return += float(reward)
            done = terminated or truncated
        returns.append(episodic_return)
    env.close()
    return returns


def evaluate_at_end(args, writer, agent, progress, stop):
    """The run's evaluation, not after a signal: --eval-episodes episodes of `evaluate` (on the CPU, where it moves the
    agent), seeded from --seed + 10,000 on, their mean logged as eval/episodic_return at the last step; the returns."""
    if args.eval_episodes == 0 or stop:
        return []
    returns = evaluate(agent.cpu(), args.env_id, args.eval_episodes, args.seed + 10_000)
    log_row(writer, args, {"eval/episodic_return": np.mean(returns)}, progress.global_step)
    print(f"eval: mean return {np.mean(returns):.1f} over {len(returns)} episodes")
    return returns


# ==================================================================================================
# End of the environments and the rollout.
# ==================================================================================================


def main(args):
    """The training loop: simulated asynchrony (the policy buffer), the rollout, the update of the method, the
    logs and checkpoints. Below it, in the plumbing, are only the run's start (start_run), its checkpoints (Learner,
    restore_checkpoint, save_checkpoint) and its end (save_model, finish)."""
    run_dir, checkpoint, stop, writer = start_run(args)

    # TRY NOT TO MODIFY: seeding
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if args.cuda else "cpu")  # check_args refused --cuda without a device
    print(f"device: {device}" + (f" ({torch.cuda.get_device_name(device)})" if args.cuda else ""), flush=True)
    envs = make_envs(args, run_dir)
    obs_dim, act_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]

    agent = Agent(obs_dim, act_dim).to(device)
    # The fused kernel does the same Adam step in one pass: about 20% of a small minibatch update on CPU.
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # The policy buffer of simulated asynchrony: the lag+1 most recent policies, the current one included.
    policy_buffer = deque(maxlen=args.lag + 1)
    # Reward scaling (CleanRL's NormalizeReward, vectorised): divide by the std of the discounted return.
    return_rms = RunningMeanStd().to(device)
    rollouts = Rollouts(args)  # with --overlap, the next rollout runs during the update where the lag allows it exactly

    learner = Learner(agent, optimizer, policy_buffer, return_rms, rng)
    state = initial_state(args, envs, device)
    if checkpoint is not None:  # a resumed run goes on where its checkpoint left off
        state = restore_checkpoint(checkpoint, envs, device, learner, state)
    progress, next_obs, discounted_return, episode_stats = state

    # The method's symbols (docs/method.md §1) and their names here: beta, the behaviour policy, is `logprobs`
    # (log beta(a|s) of the actor's snapshot); pi_T, the learner before the update, `start_logprobs`; pi_theta, the
    # learner during it, `newlogprob`; r = pi_theta / beta, `ratio`; A, `advantages`; V(s) and V(s'), `values` and
    # `next_values`.
    for iteration in range(progress.iteration + 1, args.num_iterations + 1):
        progress.iteration = iteration
        if args.anneal_lr:  # Annealing the rate if instructed to do so.
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        # Simulated asynchrony: the learner's policy joins the buffer, then each actor draws the entry it
        # acts with for this whole rollout. Actors that drew the same entry act as one batch.
        policy_buffer.append(copy.deepcopy(agent).requires_grad_(False))
        staleness = draw_staleness(len(policy_buffer), args.num_envs, args.lag_mode, rng)
        actor_groups = [
            (policy_buffer[-1 - k], torch.as_tensor(np.flatnonzero(staleness == k), device=device))
            for k in np.unique(staleness)
        ]
        if len(actor_groups) == 1:  # one policy for all actors: a slice is cheaper than an index list
            actor_groups = [(actor_groups[0][0], slice(None))]

        rollout_start = time.time()
        next_obs, rollout = rollouts.collect(envs, actor_groups, next_obs, episode_stats)
        obs, actions, logprobs, env_next_obs, env_rewards, env_terminations, env_dones = rollout
        progress.global_step += args.batch_size
        episodes = episode_stats.take_finished()  # this rollout's, for its log
        rewards, discounted_return = scale_rewards(env_rewards, env_dones, discounted_return, return_rms, args.gamma)
        rewards, next_obs_buf, terminations, dones = (
            torch.as_tensor(x, device=device) for x in (rewards, env_next_obs, env_terminations, env_dones)
        )
        progress.rollout_seconds += time.time() - rollout_start

        rollouts.start_next(iteration, stop, policy_buffer, envs, next_obs, episode_stats)  # --overlap only
        update_start = time.time()
        torch.set_num_threads(args.torch_threads)  # the update's large batches are what more threads pay for

        # Only the actors lag: the learner's critic values s_t and s'_t in one batched pass (docs/method.md §3).
        with torch.no_grad():
            values = agent.get_value(obs)
            next_values = agent.get_value(next_obs_buf)
            # log pi_T(a|s), the learner's policy before the update: pi_T / beta is the backward lag.
            start_logprobs = agent.get_dist(obs).log_prob(actions).sum(-1)
            backward_tv = total_variation(start_logprobs - logprobs).item()
            advantages, returns = compute_gae(rewards, values, next_values, terminations, dones, args.gamma, args.gae_lambda)

        b_obs, b_actions = obs.reshape((-1, obs_dim)), actions.reshape((-1, act_dim))  # flatten the batch
        b_nobs = agent.normalize(b_obs)  # the observation statistics stay fixed until the update's end
        b_logprobs, b_values = logprobs.reshape(-1), values.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        ratios = []  # of every minibatch, for the log
        for epoch in range(args.update_epochs):
            rng.shuffle(b_inds)
            # One gather per epoch lays the shuffled minibatches out as contiguous slices.
            perm = torch.as_tensor(b_inds, device=device)
            e_nobs, e_actions, e_logprobs, e_advantages, e_returns, e_values = (
                x[perm] for x in (b_nobs, b_actions, b_logprobs, b_advantages, b_returns, b_values)
            )
            for start in range(0, args.batch_size, args.minibatch_size):
                mb = slice(start, start + args.minibatch_size)

                dist = agent.get_dist(e_nobs[mb], normalized=True)
                newlogprob = dist.log_prob(e_actions[mb]).sum(1)
                newvalue = agent.get_value(e_nobs[mb], normalized=True)
                logratio = newlogprob - e_logprobs[mb]
                ratio = logratio.exp()
                ratios.append(ratio.detach())

                mb_advantages = e_advantages[mb]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                pg_loss = policy_loss(ratio, mb_advantages, args.clip_coef)
                v_clip = args.clip_coef if args.clip_vloss else None
                v_loss = value_loss(newvalue, e_values[mb], e_returns[mb], v_clip)
                # At the default --ent-coef 0 the entropy stays out of the graph (pg_loss - 0.0 is pg_loss).
                entropy_loss = dist.entropy().sum(1).mean() if args.ent_coef else 0.0
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
                if not np.isfinite(loss.item()):
                    sys.exit(f"error: non-finite loss at iteration {iteration} (epoch {epoch + 1}); stopping (nothing saved)")

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            with torch.no_grad():  # approx_kl of the epoch's last minibatch http://joschu.net/blog/kl-approx.html
                old_approx_kl = (-logratio).mean()
                approx_kl = ((ratio - 1) - logratio).mean()
            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        with torch.no_grad():
            entropy_loss = dist.entropy().sum(1).mean()  # logged: the last minibatch's, as when it was in the loss
            clipfracs = ((torch.stack(ratios) - 1.0).abs() > args.clip_coef).float().mean(1)
            new_logprobs = agent.get_dist(b_nobs, normalized=True).log_prob(b_actions).sum(1)
            progress.final_tv = total_variation(new_logprobs - b_logprobs).item()
        # The new observation statistics take effect with the next policy snapshot, so that a policy (weights
        # and statistics) stays fixed for the whole rollout it acts in and, at lag 0, the first ratio is 1.
        agent.obs_rms.update(b_obs)
        progress.update_seconds += time.time() - update_start

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        scalars = {
            "charts/learning_rate": optimizer.param_groups[0]["lr"],
            "losses/value_loss": v_loss.item(),
            "losses/policy_loss": pg_loss.item(),
            "losses/entropy": entropy_loss.item(),
            "losses/old_approx_kl": old_approx_kl.item(),
            "losses/approx_kl": approx_kl.item(),
            "losses/clipfrac": np.mean(clipfracs.tolist()),
            "losses/explained_variance": explained_var,
            "lag/staleness_mean": staleness.mean(),
            "lag/staleness_max": staleness.max(),
            "lag/backward_tv": backward_tv,
            "lag/final_tv": progress.final_tv,
        }
        log_iteration(writer, args, progress, episodes, scalars)
        if stop or (args.checkpoint_every and iteration % args.checkpoint_every == 0):
            at_end = rollouts.state_at_iteration_end(stop, envs, episode_stats)  # not --overlap's next rollout's
            save_checkpoint(args, run_dir, learner, progress, next_obs, discounted_return, at_end)
        if stop:
            break

    save_model(args, run_dir, envs, agent)  # before evaluate_at_end moves the agent to the CPU
    eval_returns = evaluate_at_end(args, writer, agent, progress, stop)
    finish(args, run_dir, writer, envs, progress, stop, eval_returns)


# ==================================================================================================
# The run's plumbing: identical in all four MuJoCo scripts: edit it here, in ppo_mujoco.py, then copy it into the
# others with `python -m tools.sync_plumbing` (tests/test_mujoco_common.py checks it).
# The arguments and their checks, the run folder and its lock, checkpoints' bytes, signals, TensorBoard's and wandb's
# writers, the saved model and summary.json: what keeps the user's data and drives the run. Given the arguments,
# nothing below decides what the algorithm sees or what a logged number means: that reads above (the algorithm, the
# environments and the rollout, and main).
# ==================================================================================================

import collections
import contextlib
import errno
import fcntl
import hashlib
import io
import itertools
import json
import logging
import re
import shutil
import socket
import stat
import threading
import typing
import uuid
import warnings

import tyro
from torch.utils.tensorboard import SummaryWriter

# mujoco 4 warns about HalfCheetah's deprecated `settotalmass` on every make (and writes MUJOCO_LOG.TXT).
mujoco.set_mju_user_warning(lambda msg: None)
# Argument checks cost a measurable share of every acting step (Agent's Normal); our inputs are always valid.
Normal.set_default_validate_args(False)
# The run's numeric flags (ALGORITHM_CHECKS has the algorithm's). Upper bounds are what the libraries take (C ints,
# TensorBoard's int64 step) or where a count stops describing a run that ends, not what is useful.
CHECKS = [
    (("seed", "lag"), lambda v: 0 <= v < 2**31, "in [0, 2**31)"),
    (("num_envs",), lambda v: 0 < v <= 2**16, "in [1, 65536] (the paper's runs take 500)"),  # the envs are built first
    (("num_steps",), lambda v: v > 0, "> 0"),
    (("total_timesteps",), lambda v: 0 < v < 2**63, "in [1, 2**63)"),
    (("eval_episodes",), lambda v: 0 <= v <= 10_000, "in [0, 10000]"),
    (("checkpoint_every",), lambda v: 0 <= v < 2**31, "in [0, 2**31)"),
    (("torch_threads",), lambda v: 0 < v <= 1024, "in [1, 1024]"),
    (("env_threads",), lambda v: 0 <= v <= 1024, "in [0, 1024]"),
]
# What a resume may change: the rest is the saved run's. The run folder is where the run is now (it may have moved);
# EnvPool's results do not depend on its thread count, torch's change slightly with theirs.
RESUME_MAY_CHANGE = {"resume", "overwrite", "auto_resume", "checkpoint_every", "save_model", "eval_episodes", "track"}
RESUME_MAY_CHANGE |= {"torch_threads", "env_threads", "run_dir", "overlap"}
# What a checkpoint holds (save_checkpoint); a file without these keys is not one of ours.
CHECKPOINT_KEYS = {*"agent optimizer policy_buffer return_rms rng torch_rng cuda_rng envs episodes progress wandb_id".split()}
# The run folder (docs/usage.md#the-run-folder). run.json names the script and the format that wrote the run
# and gives it an id, which each of its checkpoints repeats: a folder holds a run when it has run.json.
SCRIPT = os.path.splitext(os.path.basename(__file__))[0]
RUN_FORMAT = 1
# What every run writes in its folder; with the rest that written_by_a_run names, all that --overwrite removes.
RUN_FILES = {"run.json", "args.json", "checkpoint.pt", "checkpoint.prev.pt", "summary.json", "run.lock"}
# Bytes per step of the batch that the rollout and the update hold at once, besides 4-byte floats per observation and
# action dimension (check_args): the critic's two hidden layers over the batch and the per-step scalars.
STEP_BYTES = 4 * (2 * 64 + 16)
# A checkpoint file: a JSON header line of this many bytes (save_checkpoint), then torch.save's bytes.
CHECKPOINT_HEADER_BYTES = 256
# What wandb writes in <run-dir>/wandb: a folder per start of the run (named by the start's time and the run's id)
# and its links to the latest one.
WANDB_ENTRY = r"(offline-)?run-\d{8}_\d{6}-[a-z0-9]+|latest-run|debug(-internal|-cli\.\w+)?\.log"
RUN_LOCKS = {}  # the open run.lock of each run folder this process holds (lock_run_dir)
WANDB_LOST = []  # why wandb stopped taking this process's scalars (log_row), if it did


@dataclass
class Learner:
    """The learner's state that a checkpoint saves and restore_checkpoint sets, besides the progress, the envs and
    the episodes in progress (main's `next_obs`, `discounted_return`, `episode_stats`)."""

    agent: nn.Module
    optimizer: optim.Optimizer
    policy_buffer: deque  # the lag+1 most recent policies (docs/method.md §2)
    return_rms: nn.Module  # the reward scaling's statistics
    rng: np.random.Generator  # the staleness draws and the minibatch shuffles


class DamagedCheckpoint(ValueError):
    """A checkpoint file whose bytes are not what was written: truncated, altered or not a checkpoint."""


def env_spaces(env_id, env_backend):
    """(action space, observation space) of one env; a one-line ValueError if the id is unknown or cannot be built."""
    if env_backend == "envpool":
        import envpool

        if env_id not in envpool.list_all_envs():
            in_gym = env_id in gym.registry
            hint = "a gymnasium id: try --env-backend gymnasium" if in_gym else "nor in gymnasium's registry"
            raise ValueError(f"unknown env id for envpool: {env_id!r} ({hint})")
        spec = envpool.make_spec(env_id)
        return spec.action_space, spec.observation_space
    if env_id not in gym.registry:
        raise ValueError(f"unknown env id: {env_id!r} (not in gymnasium's registry)")
    try:
        with warnings.catch_warnings(action="ignore"):
            probe = gym.make(env_id)
    except Exception as e:  # registered, but a dependency is missing (e.g. mujoco-py for -v2, Box2D)
        raise ValueError(f"{env_id} cannot be built: {type(e).__name__}: {str(e).splitlines()[0]}")
    probe.close()
    return probe.action_space, probe.observation_space


def check_text(args):
    """Every text flag is UTF-8 (undecodable bytes of the command line reach Python as surrogates, which no file name,
    log or JSON takes), and a given --run-dir names a folder (an empty one would be the default folder)."""
    for name, value in dataclasses.asdict(args).items():
        try:
            value.encode() if isinstance(value, str) else None
        except UnicodeEncodeError:
            raise ValueError(f"--{name.replace('_', '-')} is not valid UTF-8: {os.fsencode(value)!r}")
    if args.run_dir == "":
        raise ValueError("--run-dir must name a folder, got ''")


def check_args(args: Args) -> None:
    """Raise ValueError with a one-line message for input that cannot run, before any env, model or file is made."""
    check_text(args)
    for names, rule, meaning in CHECKS + ALGORITHM_CHECKS:
        for name in names:
            if not rule(getattr(args, name)):
                raise ValueError(f"--{name.replace('_', '-')} must be {meaning}, got {getattr(args, name)}")
    if not re.fullmatch(r"[^/\x00]{1,100}", args.exp_name) or args.exp_name in (".", ".."):
        raise ValueError(f"--exp-name names files: 1 to 100 characters, not '/', '.' or '..', got {args.exp_name!r}")
    if args.batch_size % args.num_minibatches:
        raise ValueError(f"the batch of {args.batch_size} does not divide into {args.num_minibatches} minibatches")
    if args.norm_adv and args.minibatch_size < 2:
        raise ValueError(f"a minibatch of {args.minibatch_size} sample cannot be normalised (--norm-adv)")
    if args.total_timesteps < args.batch_size:
        raise ValueError(f"--total-timesteps {args.total_timesteps} is less than one batch ({args.batch_size} steps)")
    if args.capture_video and args.env_backend == "envpool":
        raise ValueError("--capture-video needs --env-backend gymnasium")
    if args.overlap and (args.lag_mode != "fixed" or args.lag < 1 or args.torch_threads != 1):
        raise ValueError("--overlap needs --lag-mode fixed and --lag >= 1 (the next policy known early), --torch-threads 1")
    action_space, observation_space = env_spaces(args.env_id, args.env_backend)
    if not isinstance(action_space, gym.spaces.Box):
        kind = type(action_space).__name__
        raise ValueError(f"{args.env_id} has a {kind} action space; only continuous (Box) is supported")
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise ValueError(f"{args.env_id} needs a flat Box observation space, got {observation_space}")
    # The batch's observations and actions, held four times each (the rollout's buffers, the update's copies).
    need = args.batch_size * (16 * (observation_space.shape[0] + action_space.shape[0]) + STEP_BYTES)
    have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > have:
        raise ValueError(
            f"--num-envs x --num-steps is a batch of {args.batch_size:,} steps: about {need / 2**30:,.1f} GiB, more than "
            f"this machine's {have / 2**30:,.1f} GiB of memory"
        )
    if args.eval_episodes and args.env_backend == "envpool":
        try:  # evaluate() runs on gymnasium, which may lack an id that EnvPool has (e.g. the -v3 tasks)
            env_spaces(args.env_id, "gymnasium")
        except ValueError as e:
            raise ValueError(f"the evaluation runs on gymnasium: {str(e).rstrip('.')}; --eval-episodes 0 skips it")
    if args.capture_video:  # the first frame is rendered after the run folder is written: render one now
        try:
            from gymnasium.envs.mujoco.mujoco_rendering import OffScreenViewer

            with warnings.catch_warnings(action="ignore"):  # glfw warns before it fails
                model = mujoco.MjModel.from_xml_string("<mujoco/>")
                OffScreenViewer(model, mujoco.MjData(model), 16, 16).close()
        except Exception as e:
            raise ValueError(f"--capture-video: no OpenGL renderer (headless: set MUJOCO_GL=egl): {str(e).splitlines()[0]}")
    if args.cuda and not torch.cuda.is_available():
        raise ValueError("--cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)")
    if args.resume and args.overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if args.resume and not args.run_dir:
        raise ValueError("--resume needs --run-dir: the run's folder (printed at its start as `run folder: ...`)")
    if args.auto_resume and args.overwrite:
        raise ValueError("--auto-resume and --overwrite exclude each other")
    if args.auto_resume and not args.run_dir:
        raise ValueError("--auto-resume needs --run-dir: a folder named by the run (e.g. runs/Hopper-v5__ppo__lag4__s1)")
    if args.overwrite and not args.run_dir:
        raise ValueError("--overwrite needs --run-dir: the folder of the run to replace")
    check_run_dir(args)


def written_by_a_run(run_dir, name, recorded):
    """Whether the entry `name` of run_dir is one that the folder's run wrote: RUN_FILES, the files its run.json records
    (`recorded`), the *.tmp of each, videos/ and wandb/; a link never is. recorded None: a run.json of an earlier
    version, which records none (then any events file and model file counts)."""
    path, name = f"{run_dir}/{name}", name.removesuffix(".tmp")
    pattern = {"videos": r"rl-video-[\w-]*\.mp4", "wandb": WANDB_ENTRY}.get(name)  # what each folder holds
    if pattern and os.path.isdir(path) and not os.path.islink(path):
        return all(re.fullmatch(pattern, entry) for entry in os.listdir(path))
    if recorded is None:
        recorded = [name] if name.startswith("events.out.tfevents.") or name.endswith(".cleanrl_model") else []
    return os.path.isfile(path) and not os.path.islink(path) and (name in RUN_FILES or name in recorded)


def read_json(path):
    """The JSON value in a file; a one-line ValueError if it cannot be read or parsed."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:  # a JSON or UTF-8 decoding error is a ValueError
        raise ValueError(f"{path} cannot be read ({e.strerror if isinstance(e, OSError) else str(e)[:100]})")


def read_run_record(run_dir):
    """run_dir's run.json (see RUN_FORMAT); ValueError if it holds no run of this script and format."""
    path = f"{run_dir}/run.json"
    if not os.path.isfile(path):
        raise ValueError(f"{run_dir} holds no run (no run.json)")
    record = read_json(path)
    keys = {"script": str, "format": int, "run_id": str}
    if not isinstance(record, dict) or not all(type(record.get(key)) is kind for key, kind in keys.items()):
        raise ValueError(f"{path} is not a run record (script, format and run_id)")
    if record["script"] != SCRIPT:
        raise ValueError(f"{run_dir} holds a run of {record['script']}.py, not of {SCRIPT}.py")
    if record["format"] != RUN_FORMAT:
        raise ValueError(f"{run_dir} holds a run in format {record['format']}; this version reads format {RUN_FORMAT}")
    # What a run.json of this version also records (record_written, start_run); one of an earlier version lacks them.
    files, digests = record.get("files", []), record.get("args_sha256", {})
    names = isinstance(files, list) and all(isinstance(f, str) and "/" not in f and f not in ("", ".", "..") for f in files)
    if not names or not (isinstance(digests, dict) and all(isinstance(d, str) for d in digests.values())):
        raise ValueError(f"{path} is not a run record (its files or args_sha256 are altered)")
    return record


def record_written(run_dir, name):
    """Add `name` to the files that run_dir's run.json records as written by the run (before the file is written, so
    that --overwrite finds it whatever happens next); a run.json of an earlier version records none and stays."""
    try:
        record = read_run_record(run_dir)
    except ValueError as e:  # run.json removed or altered while the run was going
        raise SystemExit(f"error: {e}; the run cannot record the files it writes")
    if "files" in record and name not in record["files"]:
        write_json(f"{run_dir}/run.json", {**record, "files": [*record["files"], name]})


def args_digests(saved):
    """The SHA-256 of each argument as args.json holds it: run.json keeps them from the run's start, so that a resume
    finds an argument changed by hand since."""
    return {name: hashlib.sha256(json.dumps(value).encode()).hexdigest() for name, value in saved.items()}


def default_run_name(args):
    """The default run folder's name (runs/<it>, or <it>-2, -3, ... where it is taken)."""
    return f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__{int(time.time())}"


def check_run_dir(args):
    """Raise ValueError if the run folder cannot be used as asked. A new run takes a new or empty folder (run.lock and
    *.tmp aside); --resume a run of this script; --overwrite one that holds nothing else."""
    run_dir = args.run_dir or "runs"
    parent = os.path.abspath(run_dir)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise ValueError(f"--run-dir {run_dir}: {parent} is not a writable folder")
    limit = 255  # the longest file name, in bytes, that the file system takes, where it does not say
    with contextlib.suppress(OSError, ValueError):
        limit = os.pathconf(parent, "PC_NAME_MAX")
    if any(len(os.fsencode(part)) > limit for part in os.path.abspath(run_dir).split("/")):
        raise ValueError(f"--run-dir {run_dir}: a name in it is longer than the {limit} bytes that the file system takes")
    # The file names that --exp-name makes: the model's (and its .tmp), the default folder's (room for a -99 suffix).
    made = [(f"{args.exp_name}.cleanrl_model.tmp", "the model file's name")] if args.save_model else []
    made += [] if args.run_dir else [(f"{default_run_name(args)}-99", "the run folder's name")]
    for name, what in made:
        if len(os.fsencode(name)) > limit:
            raise ValueError(f"--exp-name makes {what} {len(os.fsencode(name))} bytes long; the file system takes {limit}")
    if not args.run_dir or not os.path.exists(run_dir):
        if args.resume:
            raise ValueError(f"{run_dir} holds no run (no run.json)")
        return
    names = sorted(os.listdir(run_dir))
    # What a run opens for writing under a name it reuses (the lock, a *.tmp, videos/): never a link out of the folder,
    # symbolic or hard (a file with other names).
    videos = [f"videos/{name}" for name in os.listdir(f"{run_dir}/videos")] if os.path.isdir(f"{run_dir}/videos") else []
    for name in [name for name in names if name in ("run.lock", "videos") or name.endswith(".tmp")] + videos:
        found = os.lstat(f"{run_dir}/{name}")
        if stat.S_ISLNK(found.st_mode) or (stat.S_ISREG(found.st_mode) and found.st_nlink > 1):
            raise ValueError(
                f"{run_dir}/{name} is a link, which a run writes nothing through: remove it, or choose another --run-dir"
            )
    # Without run.json the names tell a run of an earlier version (the patterns of written_by_a_run) from other files.
    recorded = read_run_record(run_dir).get("files") if args.resume or "run.json" in names else None
    model = f"{args.exp_name}.cleanrl_model"
    if args.resume and args.save_model and model in names and recorded is not None and model not in recorded:
        raise ValueError(f"{run_dir} holds {model}, which the run did not write: move it away, or resume without --save-model")
    if args.resume:
        return
    others = [name for name in names if not written_by_a_run(run_dir, name, recorded)]
    listed = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
    if "run.json" not in names:
        if not others and all(name == "run.lock" or name.endswith(".tmp") for name in names):
            return
        if others:
            raise ValueError(f"{run_dir} holds files that are not a run of {SCRIPT}.py ({listed}): choose another --run-dir")
        raise ValueError(f"{run_dir} holds a run of an earlier version (no run.json): choose another --run-dir")
    if not args.overwrite and not (args.auto_resume and never_started(run_dir)):
        raise ValueError(f"{run_dir} already holds a run: --resume continues it, --overwrite replaces it")
    if others:
        raise ValueError(f"{run_dir} holds files that a run does not write ({listed}); --overwrite deletes only a run's")


def never_started(run_dir):
    """Whether run_dir's run.json is all that a start killed before it wrote args.json left (with run.lock, *.tmp and
    wandb's files): a run to start again."""
    return all(name in ("run.json", "run.lock", "wandb") or name.endswith(".tmp") for name in os.listdir(run_dir))


def json_fits(value, kind):
    """Whether a value read from JSON has the type of an Args field (an int is a float too; a bool is not an int), and
    that type in words."""
    if typing.get_origin(kind) is typing.Union:
        fits = [json_fits(value, option) for option in typing.get_args(kind)]
        return any(fit for fit, _ in fits), " or ".join(words for _, words in fits)
    if typing.get_origin(kind) is Literal:
        words = "one of " + ", ".join(map(json.dumps, typing.get_args(kind)))
        return isinstance(value, str) and value in typing.get_args(kind), words
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(kind, "null")
    return type(value) in ((int, float) if kind is float else (kind,)), words


def read_saved_args(run_dir):
    """The Args saved in a run's args.json; ValueError naming the first key that is missing, unknown or mistyped, or
    the keys changed since the run started (the digests in run.json), or if run.json holds no run of this script."""
    started, path = read_run_record(run_dir).get("args_sha256"), f"{run_dir}/args.json"
    if not os.path.isfile(path):
        never = "the run never started; --auto-resume or " if never_started(run_dir) else ""
        raise ValueError(f"{path} is missing: {never}--overwrite starts it afresh")
    saved = read_json(path)
    if not isinstance(saved, dict):
        raise ValueError(f"{path} is not a JSON object")
    kinds = {field.name: field.type for field in dataclasses.fields(Args)}
    missing, unknown = sorted(kinds.keys() - saved.keys()), sorted(saved.keys() - kinds.keys())
    if missing or unknown:
        raise ValueError(f"{path} " + (f"lacks {', '.join(missing)}" if missing else f"has unknown keys {', '.join(unknown)}"))
    for name, kind in kinds.items():
        fits, words = json_fits(saved[name], kind)
        if not fits:
            raise ValueError(f"{path}: {name} must be {words}, got {json.dumps(saved[name])}")
    changed = [name for name, digest in args_digests(saved).items() if started is not None and started.get(name) != digest]
    if changed:
        raise ValueError(
            f"{path} has changed since the run started ({', '.join(changed)}): put it back; a run's arguments change only "
            "on the command line, where --resume allows"
        )
    return Args(**saved)


def normalise_bool_flags(argv):
    """wandb sweeps pass booleans as `--flag=True`; tyro only knows `--flag` / `--no-flag`."""
    bools = {field.name for field in dataclasses.fields(Args) if field.type is bool}
    argv = list(argv)
    for i, arg in enumerate(argv):
        m = re.fullmatch(r"--([\w-]+)=(true|false)", arg, flags=re.IGNORECASE)
        if m and m.group(1).replace("-", "_") in bools:
            argv[i] = ("--" if m.group(2).lower() == "true" else "--no-") + m.group(1).replace("_", "-")
    return argv


def tyro_cli(argv, default=None):
    """tyro.cli on Args; its boxed error becomes a one-line ValueError: the box's first paragraph, less its title."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(Args, args=argv, default=default)
    except SystemExit as e:
        if not e.code:  # --help
            sys.stderr.write(captured.getvalue())
            raise
        text = re.sub(r"\x1b\[[0-9;]*m|[\u2500-\u257f]", " ", captured.getvalue()).strip()  # no colours, no box
        raise ValueError(" ".join(re.split(r"\n\s*\n", text)[0].split("\n", 1)[-1].split()))


def load_checkpoint(path, run_id):
    """The state in a checkpoint file of the run `run_id`; DamagedCheckpoint if its bytes are not what was
    written (the SHA-256 in its header), ValueError if it cannot be read or is another script's or run's."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}")
    try:
        header = json.loads(data[:CHECKPOINT_HEADER_BYTES])
        script, run, digest = header["script"], header["run_id"], header["sha256"]
    except (ValueError, KeyError, TypeError):
        raise DamagedCheckpoint("no checkpoint header")
    if script != SCRIPT:
        raise ValueError(f"{path} is a checkpoint of {script}.py, not of {SCRIPT}.py")
    if run != run_id:
        raise ValueError(f"{path} is another run's checkpoint (run {run}; the folder's run is {run_id})")
    payload = data[CHECKPOINT_HEADER_BYTES:]
    if hashlib.sha256(payload).hexdigest() != digest:
        raise DamagedCheckpoint("its SHA-256 differs from the one written")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # the digest matched: only a checkpoint that was wrong when written lands here
        raise DamagedCheckpoint(type(e).__name__)
    fields = {field.name for field in dataclasses.fields(Progress)}
    if not (isinstance(state, dict) and CHECKPOINT_KEYS <= set(state) and set(state["progress"]) == fields):
        raise DamagedCheckpoint("not a checkpoint of this script")
    return state


def read_checkpoint(run_dir):
    """The run's checkpoint, or None if it has none yet; ValueError if it cannot be read or is not this run's.
    checkpoint.prev.pt is taken only where checkpoint.pt is missing (a crash between save_checkpoint's renames)."""
    path, previous = f"{run_dir}/checkpoint.pt", f"{run_dir}/checkpoint.prev.pt"
    if not os.path.exists(path) and not os.path.exists(previous):
        return None
    path = path if os.path.exists(path) else previous
    run_id = read_run_record(run_dir)["run_id"]
    try:
        return load_checkpoint(path, run_id)
    except DamagedCheckpoint as e:
        hint = "--overwrite starts the run afresh"
        if path != previous and os.path.exists(previous):
            with contextlib.suppress(ValueError):
                load_checkpoint(previous, run_id)
                hint = f"the one before is intact: `mv {previous} {path}` resumes from there"
        raise ValueError(f"{path} is damaged ({e}); {hint}")


def parse_args(argv=None) -> Args:
    """tyro CLI plus check_args; writes nothing. Bad input prints one `error:` line and exits with code 2."""
    argv = normalise_bool_flags(sys.argv[1:] if argv is None else argv)
    try:
        args = tyro_cli(argv)
        check_text(args)
        args = with_sweep_run_dir(args)
        if args.run_dir:  # whatever else would be said of the folder, its run is in progress
            lock_run_dir(args.run_dir, look_only=True)
        if args.resume and args.run_dir and not args.overwrite:
            # Resume with the saved arguments as defaults; the command line may change only RESUME_MAY_CHANGE.
            saved = dataclasses.replace(read_saved_args(args.run_dir), resume=False, overwrite=False)
            args = tyro_cli(argv, default=saved)
            changed = [k for k, v in dataclasses.asdict(saved).items() if v != getattr(args, k) and k not in RESUME_MAY_CHANGE]
            if changed:
                raise ValueError(f"--resume keeps the run's arguments; cannot change {', '.join(changed)}")
        if args.env_threads > 1 and args.env_backend == "gymnasium":  # chosen: auto's choice leaves a launcher's cores
            raise ValueError(
                f"--env-threads {args.env_threads} sets EnvPool's threads: the gymnasium backend steps its envs in one"
            )
        if args.env_backend == "auto":
            args = dataclasses.replace(args, env_backend=choose_backend(args))
        if args.auto_resume and not args.resume and not args.overwrite and args.run_dir:
            args = resume_if_same_run(args)
        check_args(args)
        if args.resume:
            read_checkpoint(args.run_dir)
    except ValueError as e:
        refuse(e)
    return args


def resume_if_same_run(args):
    """--auto-resume: a run in --run-dir is resumed if its args.json equals the command's, but for RESUME_MAY_CHANGE,
    else refused (ValueError); a folder without a run, or with one that never started, starts it."""
    if not os.path.exists(f"{args.run_dir}/run.json") or never_started(args.run_dir):  # check_run_dir reads run.json
        return args
    saved, here = dataclasses.asdict(read_saved_args(args.run_dir)), dataclasses.asdict(args).items()
    changed = [f"{k} {saved[k]!r} there, {v!r} here" for k, v in here if v != saved[k] and k not in RESUME_MAY_CHANGE]
    if changed:
        listed = "; ".join(changed[:3]) + ("; ..." if len(changed) > 3 else "")
        raise ValueError(f"{args.run_dir} holds another run ({listed}): choose another --run-dir")
    return dataclasses.replace(args, resume=True)


def with_sweep_run_dir(args):
    """Started by a wandb sweep's agent without --run-dir: the folder runs/sweep-<sweep id>/<run id>, with --auto-resume,
    so that the agent's rerun of a preempted run (same WANDB_RUN_ID, same arguments) continues it, not starts over."""
    sweep_id, run_id = os.environ.get("WANDB_SWEEP_ID", ""), os.environ.get("WANDB_RUN_ID", "")
    if args.run_dir or args.resume or args.overwrite or not re.fullmatch(r"\w+ \w+", f"{sweep_id} {run_id}"):
        return args
    return dataclasses.replace(args, run_dir=f"runs/sweep-{sweep_id}/{run_id}", auto_resume=True)


def refuse(message):
    """Input that cannot run: one `error:` line and exit code 2, with nothing written."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


class LinkedFile(OSError):
    """A file of the run folder that open_own_file does not write: a link, or not a regular file."""


def open_own_file(path, flags):
    """os.open of a file of the run folder, never through a link: a symbolic link is refused (O_NOFOLLOW), and so is
    what is not a regular file of one name (a hard link's data is also a file elsewhere); LinkedFile then. Opened
    without O_TRUNC, so that nothing is cut before the check."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        symbolic = LinkedFile(errno.ELOOP, f"{path} is a symbolic link, which a run writes nothing through", path)
        raise symbolic if e.errno == errno.ELOOP else e
    found = os.fstat(fd)
    if stat.S_ISREG(found.st_mode) and found.st_nlink == 1:
        return fd
    os.close(fd)
    what = f"a hard link ({found.st_nlink} names)" if stat.S_ISREG(found.st_mode) else "not a regular file"
    raise LinkedFile(errno.EMLINK, f"{path} is {what}, which a run writes nothing through", path)


def write_atomically(path, data, previous=None):
    """`path` holds its old bytes or `data`, never a part of them: written to path.tmp, flushed to disk and
    renamed (the old file renamed to `previous` first, where given). A failure leaves no .tmp behind (but a link)."""
    fd = open_own_file(f"{path}.tmp", os.O_WRONLY | os.O_CREAT)
    try:
        with os.fdopen(fd, "wb") as f:
            f.truncate()  # what a killed write left
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename, or a power cut could leave a renamed but empty file
        if previous and os.path.exists(path):
            os.replace(path, previous)
        os.replace(f"{path}.tmp", path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(f"{path}.tmp")
        raise


def write_json(path, value):
    write_atomically(path, (json.dumps(value, indent=2) + "\n").encode())


def quiet_writer_thread(exception):
    """threading.excepthook: TensorBoard's writer thread keeps a write error for the main thread, which raises it at
    its next write (under `exit_on_write_error`), and then also raises it itself: that second report would be a traceback."""
    if not (isinstance(exception.exc_value, OSError) and type(exception.thread).__name__ == "_AsyncWriterThread"):
        sys.__excepthook__(exception.exc_type, exception.exc_value, exception.exc_traceback)


@contextlib.contextmanager
def exit_on_write_error(path):
    """A fault while the run writes its folder (disk full, a read-only or vanished folder) ends it with one line and
    exit code 1; what write_atomically wrote keeps its last whole version."""
    try:
        yield
    except OSError as e:
        raise SystemExit(f"error: cannot write {path}: {e.strerror or e}")


def lock_run_dir(run_dir, look_only=False):
    """Take run_dir's lock, run.lock (a POSIX lock: held until the process ends, however it ends, and honoured over
    NFS); ValueError naming the process that holds it, as the lock file says. look_only (parse_args): make and write
    nothing, and let the lock go at once (a lock this process holds is not tested: closing any descriptor of the file
    would release it)."""
    path = f"{run_dir}/run.lock"
    try:
        if look_only and any(os.path.samestat(os.lstat(path), os.fstat(fd)) for fd in RUN_LOCKS.values()):
            return
        fd = open_own_file(path, os.O_RDWR | (0 if look_only else os.O_CREAT))
    except OSError as e:
        if look_only:  # no lock file, or a link (which check_run_dir refuses)
            return
        raise ValueError(f"{e.strerror}: remove it, or choose another --run-dir") if isinstance(e, LinkedFile) else e
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EAGAIN):
            holder = os.read(fd, 200).decode(errors="replace").strip() or "a process that has not yet said which"
            os.close(fd)
            raise ValueError(f"{run_dir} is in use by {holder}")
        if not look_only:  # ENOLCK, EOPNOTSUPP, ...: a file system without locks
            print(f"warning: {run_dir} cannot be locked ({e.strerror}): make sure no other process uses it", flush=True)
    if look_only:
        os.close(fd)
        return
    with contextlib.suppress(OSError):  # a note for the message above; a full disk is reported where it matters
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode())
    RUN_LOCKS[run_dir] = fd


def claim_run_dir(args, run_name):
    """Create or take the run folder and lock it (ValueError if another process holds it); the default one is always
    new (runs/{run_name}, -2, -3, ...). Returns (run folder, whether this call created it)."""
    if args.run_dir:
        created = not os.path.exists(args.run_dir)
        os.makedirs(args.run_dir, exist_ok=True)
        lock_run_dir(args.run_dir)
        return args.run_dir, created
    for n in itertools.count(1):
        run_dir = f"runs/{run_name}" + (f"-{n}" if n > 1 else "")
        with contextlib.suppress(FileExistsError, ValueError):
            os.makedirs(run_dir)
            lock_run_dir(run_dir)
            return run_dir, True


def release_run_dir(run_dir, undo=None):
    """Let the run folder go. `undo` (a start that failed): remove what it wrote, and the folder if it made it."""
    if undo:
        for name in ("run.json", "args.json", "run.json.tmp", "args.json.tmp", "run.lock"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{run_dir}/{name}")
        if undo == "created":
            with contextlib.suppress(OSError):
                os.rmdir(run_dir)
    if run_dir in RUN_LOCKS:
        os.close(RUN_LOCKS.pop(run_dir))


def remove_run_files(run_dir, wandb_id):
    """--overwrite: delete the run that run_dir holds (check_run_dir: nothing else), file by file: what its run.json
    records. The folder, its lock and the files of the new wandb run `wandb_id` stay (wandb starts first, so that its
    refusal leaves the old run)."""
    recorded = read_run_record(run_dir).get("files") if os.path.exists(f"{run_dir}/run.json") else []
    for name in os.listdir(run_dir):
        if name == "wandb" and written_by_a_run(run_dir, name, recorded):
            remove_wandb_files(run_dir, keep=wandb_id)
        elif name != "run.lock" and written_by_a_run(run_dir, name, recorded):
            (shutil.rmtree if name == "videos" else os.remove)(f"{run_dir}/{name}")


def remove_wandb_files(run_dir, keep=None, only=None):
    """Delete wandb's folders of runs in <run_dir>/wandb but `keep`'s (or only `only`'s), its links that lead
    nowhere then, and the folder if that leaves it empty."""
    folder = f"{run_dir}/wandb"
    for entry in os.listdir(folder) if os.path.isdir(folder) else []:
        path = f"{folder}/{entry}"
        if not os.path.islink(path) and (entry.endswith(f"-{only}") if only else not entry.endswith(f"-{keep}")):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    for entry in os.listdir(folder) if os.path.isdir(folder) else []:
        if not os.path.exists(f"{folder}/{entry}"):
            os.remove(f"{folder}/{entry}")
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def start_run(args):
    """Everything before the seeds, the envs and the model: the run folder (claimed, then run.json and args.json for a
    new run), the checkpoint to resume from (or None), the signal handlers, wandb, TensorBoard. Returns (run_dir,
    checkpoint, stop, writer). A start that fails after taking the folder leaves it as it found it and exits with code 2."""
    with contextlib.suppress(ValueError):  # the run wrote its summary at the end, not after a signal: it has finished
        summary = read_json(f"{args.run_dir}/summary.json") if args.resume else None
        if isinstance(summary, dict) and summary.get("interrupted") is False:  # tools/grid/run_records.py's rule
            print(f"{args.run_dir}: the run has finished; nothing to do", flush=True)
            sys.exit(0)
    run_name = default_run_name(args)
    try:
        run_dir, created = claim_run_dir(args, run_name)
    except ValueError as e:
        refuse(e)
    except OSError as e:
        refuse(f"cannot write the run folder {args.run_dir or 'runs'}: {e.strerror}")
    run_name = run_name if args.run_dir else os.path.basename(run_dir)
    run_id, replacing, wandb_id = uuid.uuid4().hex, False, None
    try:
        check_run_dir(dataclasses.replace(args, run_dir=run_dir))  # again: now no other process can change it
        checkpoint = read_checkpoint(run_dir) if args.resume else None
        run_record = read_run_record(run_dir) if args.resume else {"run_id": run_id}
        run_id = run_record["run_id"]
        if args.track:
            import wandb

            # The script logs to wandb itself (log_iteration), not through wandb's TensorBoard watcher, which may
            # not have read the last iterations when the process exits and watches the folder wandb writes in.
            try:
                wandb.init(
                    project=args.wandb_project_name,
                    entity=args.wandb_entity,
                    config=dataclasses.asdict(args),
                    name=run_name,
                    save_code=True,
                    # Every start of the run continues one wandb run (a sweep's agent sets its own id, WANDB_RUN_ID).
                    id=run_record.get("wandb_id") or (checkpoint or {}).get("wandb_id") or run_id,
                    resume="allow",
                    dir=run_dir,
                )
            except Exception as e:  # no login, no network, a bad entity: wandb's own error classes
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise ValueError(f"--track: wandb could not start ({why}); run `wandb login` or set WANDB_MODE=offline")
            wandb_id = wandb.run.id
            wandb.define_metric("*", step_metric="global_step")
        if not args.resume:
            replacing = True  # from here on the folder's old run (--overwrite) is being deleted
            remove_run_files(run_dir, wandb_id)
            # the folder it is in, not how it was spelled
            saved = dataclasses.asdict(dataclasses.replace(args, run_dir=os.path.abspath(run_dir)))
            run_record = {"script": SCRIPT, "format": RUN_FORMAT, "run_id": run_id, "wandb_id": wandb_id}
            run_record |= {"files": [], "args_sha256": args_digests(saved)}
            write_json(f"{run_dir}/run.json", run_record)
            write_json(f"{run_dir}/args.json", saved)
    except (OSError, ValueError) as e:
        if wandb_id and not args.resume:
            remove_wandb_files(run_dir, only=wandb_id)
        # A start refused before it deleted anything leaves the folder's run (--resume, --overwrite) as it was.
        keep = args.resume or (args.overwrite and not replacing)
        release_run_dir(run_dir, undo=None if keep else "created" if created else "files")
        refuse(e if isinstance(e, ValueError) else f"cannot write the run folder {run_dir}: {e.strerror}")
    print(f"run folder: {run_dir}", flush=True)
    if args.resume and checkpoint is None:
        print("no checkpoint yet: the run starts afresh with its saved arguments", flush=True)
    stop = stop_on_signals()
    threading.excepthook = quiet_writer_thread
    # On resume, TensorBoard drops what a killed run logged after its last checkpoint (all of it, if it had none).
    purge_step = (0 if checkpoint is None else checkpoint["progress"]["global_step"] + 1) if args.resume else None
    with exit_on_write_error(run_dir):
        before = set(os.listdir(run_dir))
        writer = SummaryWriter(run_dir, purge_step=purge_step)
        for name in set(os.listdir(run_dir)) - before:  # TensorBoard's events file of this start
            record_written(run_dir, name)
        table = "\n".join(f"|{key}|{value}|" for key, value in dataclasses.asdict(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    if args.track and checkpoint is not None:
        replay_to_wandb(run_dir, checkpoint["progress"]["global_step"])
    return run_dir, checkpoint, stop, writer


def stop_on_signals():
    """SIGINT (Ctrl-C) and SIGTERM (e.g. preemption) stop the run after the current iteration, which then saves what
    it was asked to; the returned list receives the signal. A second signal stops the run at once, saving nothing."""
    received = []

    def handler(signum, frame):
        received.append(signum)
        signal.signal(signum, signal.SIG_DFL)
        name = signal.Signals(signum).name
        print(f"\n{name}: stopping after this iteration (send it again to stop now)", flush=True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return received


def save_checkpoint(args, run_dir, learner, progress, next_obs, discounted_return, at_end):
    """Everything the rest of the run depends on, as <run_dir>/checkpoint.pt under a header (run id, SHA-256 of the
    rest), written atomically; the one it replaces stays as checkpoint.prev.pt, so a crash leaves a readable one."""
    if args.track:
        import wandb
    in_numpy = (discounted_return, *at_end["episode_stats"])
    state = {
        "agent": learner.agent.state_dict(),
        "optimizer": learner.optimizer.state_dict(),
        "policy_buffer": [policy.state_dict() for policy in learner.policy_buffer],
        "return_rms": learner.return_rms.state_dict(),
        "rng": learner.rng.bit_generator.state,
        "torch_rng": at_end["torch_rng"],
        "cuda_rng": at_end["cuda_rng"],
        "envs": at_end["envs"],
        "episodes": (next_obs, *map(torch.from_numpy, in_numpy)),
        "progress": {**dataclasses.asdict(progress), "elapsed": progress.seconds()},
        "wandb_id": wandb.run.id if args.track else None,
    }
    payload = io.BytesIO()
    torch.save(state, payload)
    payload = payload.getvalue()
    path = f"{run_dir}/checkpoint.pt"
    try:
        run_id = read_run_record(run_dir)["run_id"]
    except ValueError as e:  # run.json removed or altered while the run was going
        raise SystemExit(f"error: {e}; no checkpoint can be written")
    with exit_on_write_error(path):
        digest = hashlib.sha256(payload).hexdigest()
        header = json.dumps({"script": SCRIPT, "format": RUN_FORMAT, "run_id": run_id, "sha256": digest})
        header = header.encode().ljust(CHECKPOINT_HEADER_BYTES - 1) + b"\n"
        write_atomically(path, header + payload, previous=f"{run_dir}/checkpoint.prev.pt")


def restore_checkpoint(checkpoint, envs, device, learner, state):
    """Where a resumed run left off: the learner's objects get their saved states (RNG states last), and `state`, a new
    run's (initial_state), becomes the checkpoint's: its progress and, where its envs were saved (gymnasium), the
    episodes in progress."""
    _, next_obs, discounted_return, episode_stats = state
    learner.agent.load_state_dict(checkpoint["agent"])
    learner.optimizer.load_state_dict(checkpoint["optimizer"])
    for policy in checkpoint["policy_buffer"]:
        learner.policy_buffer.append(copy.deepcopy(learner.agent).requires_grad_(False))
        learner.policy_buffer[-1].load_state_dict(policy)
    learner.return_rms.load_state_dict(checkpoint["return_rms"])
    learner.rng.bit_generator.state = checkpoint["rng"]
    torch.set_rng_state(checkpoint["torch_rng"])
    if checkpoint["cuda_rng"]:
        torch.cuda.set_rng_state_all(checkpoint["cuda_rng"])
    if checkpoint["envs"] is not None:  # gymnasium: the episodes in progress continue where they were
        envs.set_state(checkpoint["envs"])
        next_obs, *saved = checkpoint["episodes"]
        next_obs = next_obs.to(device)
        discounted_return, episode_stats.returns, episode_stats.lengths = (x.numpy() for x in saved)
    return Progress(**checkpoint["progress"]), next_obs, discounted_return, episode_stats


def log_row(writer, args, row, step):
    """Scalars at one environment step, to TensorBoard and (--track) to wandb, whose own step is the environment
    step: wandb drops a step logged again, so an iteration redone after a kill (the same bits) counts once."""
    with exit_on_write_error(writer.log_dir):  # TensorBoard's writer thread raises its write errors here
        for tag, value in row.items():
            writer.add_scalar(tag, value, step)
    if args.track and not WANDB_LOST:
        import wandb

        try:
            wandb.log({**{tag: float(value) for tag, value in row.items()}, "global_step": step}, step=step)
        except Exception as e:  # wandb's process ended: a signal to all the job's processes reaches it too
            WANDB_LOST.append(e)
            print(f"wandb stopped taking the run's scalars at step {step} ({type(e).__name__}); TensorBoard keeps them")


def replay_to_wandb(run_dir, up_to):
    """A resumed run gives its wandb run what TensorBoard holds up to the checkpoint's step `up_to` from wandb's own
    next step on (online: what wandb has; offline: every start's files hold the run): the scalars a start logged to
    TensorBoard but wandb did not take (it had been stopped, or it was slow to write) are then in wandb once."""
    import wandb
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # it warns of the purge on resume, which is expected
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    rows = collections.defaultdict(dict)
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            if wandb.run.step <= event.step <= up_to:
                rows[event.step][tag] = event.value
    for step in sorted(rows):
        wandb.log({**rows[step], "global_step": step}, step=step)


def save_model(args, run_dir, envs, agent):
    """--save-model, at the run's end, finished or stopped by a signal: the agent, its dimensions and the args."""
    if args.save_model:
        model_path = f"{run_dir}/{args.exp_name}.cleanrl_model"
        dims = {"obs_dim": envs.single_observation_space.shape[0], "act_dim": envs.single_action_space.shape[0]}
        model = io.BytesIO()
        torch.save({"agent": agent.state_dict(), **dims, "args": dataclasses.asdict(args)}, model)
        with exit_on_write_error(model_path):
            record_written(run_dir, os.path.basename(model_path))
            write_atomically(model_path, model.getvalue())
        print(f"model saved to {model_path}")


def finish(args, run_dir, writer, envs, progress, stop, eval_returns):
    """The end of the run, finished or stopped by a signal: summary.json (eval_returns: evaluate_at_end's); then
    everything is closed, and a stopped run exits as if the signal had ended it."""
    summary = {
        "global_step": progress.global_step,
        "sps": int(progress.global_step / progress.seconds()),
        "last_return": progress.return_history[-1][1] if progress.return_history else None,
        "final_tv": progress.final_tv,
        "rollout_seconds": progress.rollout_seconds,
        "update_seconds": progress.update_seconds,
        "eval_return": float(np.mean(eval_returns)) if eval_returns else None,
        "interrupted": bool(stop),
    }
    with exit_on_write_error(run_dir):
        write_json(f"{run_dir}/summary.json", summary)
        writer.flush()  # raises what the writer thread could not write; close() would not
        writer.close()
    envs.close()
    release_run_dir(run_dir)
    if args.track:
        import wandb

        try:
            if stop and not WANDB_LOST:  # a sweep's agent requeues a run marked preempting that exits non-zero
                wandb.run.mark_preempting()  # here, not in the signal handler: wandb's client is not reentrant
            if not WANDB_LOST:
                wandb.finish(exit_code=128 + stop[0] if stop else 0)
        except Exception as e:
            WANDB_LOST.append(e)
        with contextlib.suppress(Exception):  # now, not at exit: a wandb process a signal ended would be a traceback
            wandb.teardown()
    if WANDB_LOST:
        print(f"wandb's run ended with its process ({type(WANDB_LOST[0]).__name__}); the next start replays what it lacks")
    if stop:
        sys.exit(128 + stop[0])  # 130 after SIGINT, 143 after SIGTERM, as if the signal had ended the run


# ==================================================================================================
# End of the run's plumbing.
# ==================================================================================================


if __name__ == "__main__":
    main(parse_args())
