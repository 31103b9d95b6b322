"""VACO under simulated asynchrony: align advantages once, then filter by total variation.

Paper: Honari et al., "Align and Filter: Improving Performance in Asynchronous On-Policy RL",
arXiv 2603.01365 (2026). Spec: docs/method.md §1, §2 and §3.4.

VACO's two changes to ppo_mujoco.py (the diff between the two files shows only them):
- Align: once per iteration, V-trace with target pi_T (the learner's policy before the update) and the
  behaviour log-probs gives value targets and advantages that stay fixed for all epochs. The advantage form
  r_t + gamma_t (lambda v_{t+1} + (1 - lambda) V(s_{t+1})) - V(s_t) is ours; it is GAE(lambda) without lag.
- Filter: in a minibatch whose 1/2 mean|pi_theta/beta - 1| exceeds delta/2, the samples whose own step would
  increase it get no gradient; the loss is the unclipped surrogate -mean(M * r * A).

CleanRL's continuous-action PPO (ppo_continuous_action.py), rebuilt for gymnasium 1.x and MuJoCo `-v5`
tasks, with the paper's simulated asynchrony: after every update the learner's policy joins a buffer of the
`lag + 1` most recent policies, and before every rollout each actor (vectorised env) draws the policy it acts
with from that buffer. Every transition records `log beta(a|s)` of the policy that actually acted, so the
ratio `pi_theta / beta` measures the whole policy lag.

Choices that are ours (beyond CleanRL), each explained where it is coded:
- observation normalisation is part of the policy (running statistics live in the `Agent`, are snapshotted
  with the weights, saved with the model, and updated once per iteration after the update);
- time-limit truncation is not termination: bootstrap from the true final observation, cut the trace at
  every episode end, and no reset-only transition ever enters the buffer;
- `charts/episodic_return` is the mean over the episodes that finished during the iteration.

Usage: python vaco_mujoco.py --env-id Hopper-v5 --lag 4
"""

import copy
import dataclasses
import json
import os
import re
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal, Optional

import gymnasium as gym
import mujoco
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.normal import Normal
from torch.utils.tensorboard import SummaryWriter

# Argument checks cost a measurable share of every acting step; our inputs are always valid.
Normal.set_default_validate_args(False)
# mujoco 4 warns about HalfCheetah's deprecated `settotalmass` on every make (and writes MUJOCO_LOG.TXT).
mujoco.set_mju_user_warning(lambda msg: None)


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """if toggled, train on CUDA when it is available (the 64-64 MLPs are usually faster on CPU)"""
    torch_threads: int = 1
    """torch CPU threads; results are bit-identical for the same seed and thread count"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "vaco"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """record videos of env 0 to `<run-dir>/videos` (gymnasium backend; headless needs MUJOCO_GL=egl)"""
    save_model: bool = False
    """save the agent (weights and observation statistics) and the args to `<run-dir>`; also on Ctrl-C"""
    eval_episodes: int = 10
    """episodes of deterministic evaluation (mean action, frozen statistics) after training; 0 disables it"""
    run_dir: Optional[str] = None
    """where logs, args.json, summary.json and the model go (default: runs/{env_id}__{exp_name}__{seed}__{time})"""

    # Environment and simulated asynchrony (docs/method.md §2)
    env_id: str = "HalfCheetah-v5"
    """the id of the environment (a MuJoCo task with a continuous action space)"""
    env_backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """vector-env implementation: gymnasium's SyncVectorEnv, or EnvPool's C++ thread pool"""
    env_threads: int = 0
    """EnvPool worker threads (0: one per CPU core)"""
    num_envs: int = 500
    """the number of parallel actors (paper: 500)"""
    num_steps: int = 1000
    """the number of steps each actor runs per rollout (paper: 1000)"""
    lag: int = 0
    """the largest policy staleness, in updates: the buffer keeps the lag+1 most recent policies (0: on-policy)"""
    lag_mode: Literal["uniform", "fixed"] = "uniform"
    """uniform: each actor draws a buffer entry uniformly per rollout; fixed (ours): every actor uses the oldest"""

    # Algorithm specific arguments
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
    """the value-clipping coefficient (VACO's policy loss is not clipped)"""
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
    tv_threshold: float = 0.2
    """delta: the filter acts in a minibatch whose 1/2 mean|pi_theta/beta - 1| exceeds delta/2 (paper: 0.2)"""
    rho_bar: float = 1.0
    """V-trace truncation of the importance weight: rho_t = min(rho_bar, pi_T/beta)"""
    c_bar: float = 1.0
    """V-trace truncation of the trace: c_t = gae_lambda * min(c_bar, pi_T/beta)"""
    realign: bool = True
    """realign the advantages with V-trace once per iteration (ablation off: GAE on the lagged batch, as PPO)"""
    filter: bool = True
    """filter samples by TV when over budget (ablation off: the plain importance-sampled surrogate)"""

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_iterations(self) -> int:
        return self.total_timesteps // self.batch_size


def check_args(args: Args) -> None:
    """Raise ValueError with a one-line message for input that cannot run, before any training env is built."""
    for name in ("num_envs", "num_steps", "total_timesteps", "num_minibatches", "update_epochs"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("lag", "eval_episodes", "env_threads"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not 0 < args.learning_rate < float("inf"):
        raise ValueError(f"--learning-rate must be a positive number, got {args.learning_rate}")
    if args.torch_threads <= 0:
        raise ValueError(f"--torch-threads must be positive, got {args.torch_threads}")
    if args.batch_size % args.num_minibatches:
        raise ValueError(
            f"the batch (num_envs*num_steps = {args.batch_size}) does not divide into {args.num_minibatches} minibatches"
        )
    if args.total_timesteps < args.batch_size:
        raise ValueError(f"--total-timesteps {args.total_timesteps} is less than one batch ({args.batch_size} steps)")
    if args.env_backend == "envpool":
        import envpool

        if args.env_id not in envpool.list_all_envs():
            raise ValueError(f"unknown env id for envpool: {args.env_id!r}")
        if args.capture_video:
            raise ValueError("--capture-video needs --env-backend gymnasium")
        spec = envpool.make_spec(args.env_id)
        action_space, observation_space = spec.action_space, spec.observation_space
    else:
        if args.env_id not in gym.registry:
            raise ValueError(f"unknown env id: {args.env_id!r} (not in gymnasium's registry)")
        probe = gym.make(args.env_id)
        action_space, observation_space = probe.action_space, probe.observation_space
        probe.close()
    if not isinstance(action_space, gym.spaces.Box):
        raise ValueError(f"{args.env_id} has a {type(action_space).__name__} action space; only continuous (Box) is supported")
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise ValueError(f"{args.env_id} needs a flat Box observation space, got {observation_space}")


def parse_args(argv=None) -> Args:
    """tyro CLI plus validation. Bad input prints one `error:` line and exits with code 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    # wandb sweeps pass booleans as `--flag=True`; tyro only knows `--flag` / `--no-flag`.
    bool_fields = {f.name for f in dataclasses.fields(Args) if f.type is bool}
    for i, arg in enumerate(argv):
        m = re.fullmatch(r"--([\w-]+)=(true|false)", arg, flags=re.IGNORECASE)
        if m and m.group(1).replace("-", "_") in bool_fields:
            argv[i] = ("--" if m.group(2).lower() == "true" else "--no-") + m.group(1).replace("_", "-")
    args = tyro.cli(Args, args=argv)
    try:
        check_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    return args


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

    def close(self):
        self.envs.close()


class EnvPoolEnvs:
    """EnvPool with the same interface and semantics as GymnasiumEnvs. EnvPool resets an env on the step
    *after* its episode ended (that step ignores the action and returns reward 0); we take that reset step for
    the ended envs at once, so a reset-only transition never reaches the rollout buffer."""

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

    def close(self):
        self.envs.close()


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

    def get_value(self, x):
        return self.critic(self.normalize(x)).squeeze(-1)

    def get_dist(self, x):
        action_mean = self.actor_mean(self.normalize(x))
        return Normal(action_mean, self.actor_logstd.expand_as(action_mean).exp())


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
    """CleanRL's NormalizeReward over a (num_steps, num_envs) rollout: divide each step's rewards by the std of the
    discounted return up to that step. The arithmetic of return_rms.update at every step, in Python floats."""
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


def vtrace(rewards, values, next_values, terminations, dones, log_rhos, gamma, gae_lambda, rho_bar, c_bar):
    """VACO's realignment (docs/method.md §3.4): V-trace targets v_t for a target policy pi with
    log_rhos = log pi - log beta, and the advantages r_t + gamma_t (lambda v_{t+1} + (1 - lambda) V(s_{t+1})) - V(s_t).
    Episode ends are handled as in compute_gae; with all ratios 1 both outputs equal GAE's."""
    rhos = log_rhos.exp().clamp(max=rho_bar)
    cs = gae_lambda * log_rhos.exp().clamp(max=c_bar)
    discounts = gamma * (1.0 - terminations)
    deltas = (rhos * (rewards + discounts * next_values - values)).cpu().numpy()
    coefs = (gamma * (1.0 - dones) * cs).cpu().numpy()  # the loop runs in numpy: same arithmetic, less overhead
    vs_minus_v, acc = np.zeros_like(deltas), np.zeros_like(deltas[0])
    for t in reversed(range(len(deltas))):
        acc = deltas[t] + coefs[t] * acc
        vs_minus_v[t] = acc
    vs_minus_v = torch.as_tensor(vs_minus_v, device=values.device)
    # v_{t+1} - V(s_{t+1}) for the next state of the same episode; 0 past an episode end or the batch (v_T = V(s_T)).
    next_vs_minus_v = torch.cat([vs_minus_v[1:], torch.zeros_like(vs_minus_v[:1])]) * (1.0 - dones)
    advantages = rewards + discounts * (next_values + gae_lambda * next_vs_minus_v) - values
    return values + vs_minus_v, advantages


def policy_loss(logratio, advantages, tv_threshold, use_filter=True):
    """VACO's filtered surrogate (docs/method.md §3.4): -mean(M * r * A) with r = pi_theta/beta. Over budget
    (D > delta/2), a sample keeps its gradient only if A * sign(log pi_theta - log beta) <= 0, i.e. if its step
    does not increase |r - 1|; the sign is taken in log space, where it survives underflow of pi or beta.
    Returns the loss, D and the mask."""
    tv = total_variation(logratio.detach())
    mask = torch.ones_like(logratio)
    if use_filter and tv > tv_threshold / 2:
        mask = (advantages * torch.sign(logratio.detach()) <= 0).float()
    return -(mask * logratio.exp() * advantages).mean(), tv, mask


def value_loss(newvalue, oldvalue, returns, clip_coef=None):
    """Squared error to the targets; with a clip coefficient, CleanRL's clipped value loss."""
    v_loss_unclipped = (newvalue - returns) ** 2
    if clip_coef is None:
        return 0.5 * v_loss_unclipped.mean()
    v_clipped = oldvalue + torch.clamp(newvalue - oldvalue, -clip_coef, clip_coef)
    return 0.5 * torch.max(v_loss_unclipped, (v_clipped - returns) ** 2).mean()


def format_eta(seconds):
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


if __name__ == "__main__":
    args = parse_args()
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_dir = args.run_dir or f"runs/{run_name}"
    os.makedirs(run_dir, exist_ok=True)
    with open(f"{run_dir}/args.json", "w") as f:
        json.dump(dataclasses.asdict(args), f, indent=2)
    if args.track:
        import wandb

        # Patching TensorBoard (rather than sync_tensorboard=True) avoids wandb's 10 s wait at exit offline.
        wandb.tensorboard.patch(root_logdir=run_dir)
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            config=dataclasses.asdict(args),
            name=run_name,
            save_code=True,
        )
    writer = SummaryWriter(run_dir)
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in dataclasses.asdict(args).items()])),
    )

    # TRY NOT TO MODIFY: seeding
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    if args.env_backend == "envpool":
        envs = EnvPoolEnvs(args.env_id, args.num_envs, args.seed, args.env_threads)
    else:
        envs = GymnasiumEnvs(args.env_id, args.num_envs, args.seed, args.capture_video, run_dir)
    obs_dim = envs.single_observation_space.shape[0]
    act_dim = envs.single_action_space.shape[0]
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high

    agent = Agent(obs_dim, act_dim).to(device)
    # The fused kernel does the same Adam step in one pass: about 20% of a small minibatch update on CPU.
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # The policy buffer of simulated asynchrony: the lag+1 most recent policies, the current one included.
    policy_buffer = deque(maxlen=args.lag + 1)
    # Reward scaling (CleanRL's NormalizeReward, vectorised): divide by the std of the discounted return.
    return_rms = RunningMeanStd().to(device)
    discounted_return = np.zeros(args.num_envs, dtype=np.float32)

    # ALGO Logic: Storage setup. next_obs[t] is s'_t: the observation after step t, the true final one at an episode end.
    obs = torch.zeros((args.num_steps, args.num_envs, obs_dim), device=device)
    actions = torch.zeros((args.num_steps, args.num_envs, act_dim), device=device)
    action_means = torch.zeros((args.num_steps, args.num_envs, act_dim), device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    # What the envs return is collected in numpy and goes to torch once per rollout.
    env_next_obs = np.zeros((args.num_steps, args.num_envs, obs_dim), dtype=np.float32)
    env_rewards, env_terminations, env_dones = np.zeros((3, args.num_steps, args.num_envs), dtype=np.float32)

    global_step = 0
    start_time = time.time()
    rollout_seconds = update_seconds = 0.0
    next_obs = torch.tensor(envs.reset(), dtype=torch.float32, device=device)
    episodic_return = np.zeros(args.num_envs)
    episodic_length = np.zeros(args.num_envs, dtype=np.int64)
    return_history = []  # (global_step, mean episodic return of the iteration)
    final_tv = float("nan")
    interrupted = False

    try:
        for iteration in range(1, args.num_iterations + 1):
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
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
            finished_returns, finished_lengths = [], []
            for step in range(0, args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs

                # ALGO LOGIC: action logic, with the policy each actor drew (its log-probs follow after the rollout).
                with torch.inference_mode():
                    for actor, env_idx in actor_groups:
                        dist = actor.get_dist(next_obs[env_idx])
                        action_means[step, env_idx] = dist.loc
                        # The arithmetic and random stream of dist.sample(), without its overhead.
                        actions[step, env_idx] = dist.loc + dist.scale * torch.randn_like(dist.loc)

                # TRY NOT TO MODIFY: execute the game; the env gets the clipped action, the buffer keeps the sample.
                next_obs_np, reward, terminated, truncated, env_next_obs[step] = envs.step(
                    np.clip(actions[step].cpu().numpy(), action_low, action_high)
                )
                done = np.logical_or(terminated, truncated)
                episodic_return += reward
                episodic_length += 1
                if done.any():
                    finished_returns.extend(episodic_return[done])
                    finished_lengths.extend(episodic_length[done])
                    episodic_return[done] = 0.0
                    episodic_length[done] = 0

                env_rewards[step], env_terminations[step], env_dones[step] = reward, terminated, done
                next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)

            # log beta(a|s) of each actor's policy, and reward scaling: once per rollout, same arithmetic as per step.
            for actor, env_idx in actor_groups:
                dist = Normal(action_means[:, env_idx], actor.actor_logstd.exp())
                logprobs[:, env_idx] = dist.log_prob(actions[:, env_idx]).sum(-1)
            rewards, discounted_return = scale_rewards(env_rewards, env_dones, discounted_return, return_rms, args.gamma)
            rewards, next_obs_buf, terminations, dones = (
                torch.as_tensor(x, device=device) for x in (rewards, env_next_obs, env_terminations, env_dones)
            )
            rollout_seconds += time.time() - rollout_start
            update_start = time.time()

            # Only the actors lag: the learner's critic values s_t and s'_t in one batched pass (docs/method.md §3).
            with torch.no_grad():
                values = agent.get_value(obs)
                next_values = agent.get_value(next_obs_buf)
                # log pi_T(a|s), the learner's policy before the update: pi_T / beta is the backward lag.
                start_logprobs = agent.get_dist(obs).log_prob(actions).sum(-1)
                backward_tv = total_variation(start_logprobs - logprobs).item()
                if args.realign:  # align once: these targets and advantages stay fixed for every epoch
                    returns, advantages = vtrace(
                        rewards,
                        values,
                        next_values,
                        terminations,
                        dones,
                        start_logprobs - logprobs,
                        args.gamma,
                        args.gae_lambda,
                        args.rho_bar,
                        args.c_bar,
                    )
                else:
                    advantages, returns = compute_gae(
                        rewards, values, next_values, terminations, dones, args.gamma, args.gae_lambda
                    )

            # flatten the batch
            b_obs = obs.reshape((-1, obs_dim))
            b_logprobs = logprobs.reshape(-1)
            b_actions = actions.reshape((-1, act_dim))
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            b_values = values.reshape(-1)

            # Optimizing the policy and value network
            b_inds = np.arange(args.batch_size)
            filter_stats = []  # per minibatch: D, over budget or not, fraction of samples masked
            for epoch in range(args.update_epochs):
                rng.shuffle(b_inds)
                for start in range(0, args.batch_size, args.minibatch_size):
                    mb_inds = torch.as_tensor(b_inds[start : start + args.minibatch_size], device=device)

                    dist = agent.get_dist(b_obs[mb_inds])
                    newlogprob = dist.log_prob(b_actions[mb_inds]).sum(1)
                    entropy = dist.entropy().sum(1)
                    newvalue = agent.get_value(b_obs[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    ratio = logratio.exp()

                    with torch.no_grad():
                        # calculate approx_kl http://joschu.net/blog/kl-approx.html
                        old_approx_kl = (-logratio).mean()
                        approx_kl = ((ratio - 1) - logratio).mean()

                    mb_advantages = b_advantages[mb_inds]
                    if args.norm_adv:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                    pg_loss, tv, mask = policy_loss(logratio, mb_advantages, args.tv_threshold, args.filter)
                    filter_stats.append((tv.item(), float(tv > args.tv_threshold / 2), 1.0 - mask.mean().item()))
                    v_loss = value_loss(
                        newvalue, b_values[mb_inds], b_returns[mb_inds], args.clip_coef if args.clip_vloss else None
                    )
                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
                    if not torch.isfinite(loss):
                        raise FloatingPointError(f"non-finite loss at iteration {iteration} (epoch {epoch + 1})")

                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()

                if args.target_kl is not None and approx_kl > args.target_kl:
                    break

            with torch.no_grad():
                final_tv = total_variation(agent.get_dist(b_obs).log_prob(b_actions).sum(1) - b_logprobs).item()
            # The new observation statistics take effect with the next policy snapshot, so that a policy (weights
            # and statistics) stays fixed for the whole rollout it acts in and, at lag 0, the first ratio is 1.
            agent.obs_rms.update(b_obs)
            update_seconds += time.time() - update_start

            y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
            var_y = np.var(y_true)
            explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

            # TRY NOT TO MODIFY: record rewards for plotting purposes
            sps = int(global_step / (time.time() - start_time))
            if finished_returns:
                return_history.append((global_step, float(np.mean(finished_returns))))
                writer.add_scalar("charts/episodic_return", np.mean(finished_returns), global_step)
                writer.add_scalar("charts/episodic_length", np.mean(finished_lengths), global_step)
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            tv_mean, over_budget_frac, filter_frac = np.mean(filter_stats, axis=0)
            writer.add_scalar("vaco/tv", tv_mean, global_step)
            writer.add_scalar("vaco/over_budget_frac", over_budget_frac, global_step)
            writer.add_scalar("vaco/filter_frac", filter_frac, global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            writer.add_scalar("lag/staleness_mean", staleness.mean(), global_step)
            writer.add_scalar("lag/staleness_max", staleness.max(), global_step)
            writer.add_scalar("lag/backward_tv", backward_tv, global_step)
            writer.add_scalar("lag/final_tv", final_tv, global_step)
            writer.add_scalar("perf/rollout_seconds", rollout_seconds, global_step)
            writer.add_scalar("perf/update_seconds", update_seconds, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            recent = f"{return_history[-1][1]:.1f}" if return_history else "n/a"
            eta = format_eta((args.num_iterations - iteration) * (time.time() - start_time) / iteration)
            # One live line on a terminal, one line per iteration in a log file.
            live = sys.stdout.isatty()
            print(
                ("\r" if live else "") + f"[{iteration}/{args.num_iterations}] step {global_step:,} | SPS {sps:,} | "
                f"return {recent} | final TV {final_tv:.3f} | ETA {eta}  ",
                end="" if live else "\n",
                flush=True,
            )
    except KeyboardInterrupt:
        interrupted = True
        print(f"\ninterrupted at step {global_step:,}", flush=True)
    except FloatingPointError as e:
        writer.close()
        envs.close()
        sys.exit(f"\nerror: {e}; stopping (nothing saved)")
    if sys.stdout.isatty():
        print()

    if args.save_model:
        model_path = f"{run_dir}/{args.exp_name}.cleanrl_model"
        torch.save(
            {"agent": agent.state_dict(), "obs_dim": obs_dim, "act_dim": act_dim, "args": dataclasses.asdict(args)},
            model_path,
        )
        print(f"model saved to {model_path}")

    eval_returns = []
    if args.eval_episodes > 0 and not interrupted:
        eval_returns = evaluate(agent.cpu(), args.env_id, args.eval_episodes, args.seed + 10_000)
        for idx, episodic_return in enumerate(eval_returns):
            writer.add_scalar("eval/episodic_return", episodic_return, idx)
        print(f"eval: mean return {np.mean(eval_returns):.1f} over {len(eval_returns)} episodes")

    if not interrupted:
        last = [r for s, r in return_history if s > 0.9 * global_step] or [r for _, r in return_history[-1:]]
        summary = {
            "global_step": global_step,
            "sps": int(global_step / (time.time() - start_time)),
            "final_return": float(np.mean(last)) if last else None,
            "final_tv": final_tv,
            "rollout_seconds": rollout_seconds,
            "update_seconds": update_seconds,
            "eval_return": float(np.mean(eval_returns)) if eval_returns else None,
        }
        with open(f"{run_dir}/summary.json", "w") as f:
            json.dump(summary, f, indent=2)

    envs.close()
    writer.close()
    if args.track:
        wandb.finish()
    if interrupted:
        sys.exit(130)
