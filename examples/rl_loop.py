"""An RL loop as two compiled graphs over the same actors: rollout, then training.

    rollout graph (once per step)                 training graph (once per step)

    step ─► policy0.act ─► env0.score ─┐          rollouts ─► learner.update ──┐
        └─► policy1.act ─► env1.score ─┴─► driver   0 ──► policy0.zeros ──────┤ allreduce (sum):
                                                    0 ──► policy1.zeros ──────┘ the new weights
                                                  policy{0,1}.load, learner.keep ◄─┘ on every member

The policies are in both graphs: with Ray Compiled Graphs the second graph would time
out on its first execute; with cgraph both stay compiled and the loop alternates them.
The task is a contextual bandit: each observation has one right action (a hidden
linear map picks it), the environment pays 1 for it and 0 otherwise, and a softmax
policy learns by REINFORCE. The broadcast of the new weights is an allreduce where
only the learner brings a non-zero tensor. Run: `python examples/rl_loop.py [--steps N]`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import ray  # noqa: E402
import torch  # noqa: E402

import cgraph  # noqa: E402
from cgraph.collective import allreduce  # noqa: E402

ACTIONS, FEATURES = 4, 8


@ray.remote(num_cpus=0)
class Policy:
    """Samples actions from softmax(W x); gets new weights from the training graph."""

    def __init__(self, rank: int, batch: int) -> None:
        self.rank, self.batch = rank, batch
        self.weights = torch.zeros(ACTIONS, FEATURES)

    def act(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = torch.Generator().manual_seed(1000 * step + self.rank)
        obs = torch.randn(self.batch, FEATURES, generator=rng)
        probs = torch.softmax(obs @ self.weights.T, dim=1)
        return obs, torch.multinomial(probs, 1, generator=rng).squeeze(1)

    def zeros(self, _: int) -> torch.Tensor:
        return torch.zeros(ACTIONS, FEATURES)  # this member's share of the broadcast

    def load(self, weights: torch.Tensor) -> float:
        self.weights = weights.clone()
        return float(weights.norm())


@ray.remote(num_cpus=0)
class Env:
    """Pays 1 for the action a hidden linear map picks for the observation, else 0."""

    def __init__(self) -> None:
        self.hidden = torch.randn(ACTIONS, FEATURES, generator=torch.Generator().manual_seed(7))

    def score(self, rollout: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        obs, actions = rollout
        rewards = (actions == (obs @ self.hidden.T).argmax(dim=1)).float()
        return obs, actions, rewards


@ray.remote(num_cpus=0)
class Learner:
    """REINFORCE on a softmax policy: W += lr * sum (r - mean r) (onehot(a) - pi(x)) x^T."""

    def __init__(self, lr: float) -> None:
        self.lr, self.weights, self.version = lr, torch.zeros(ACTIONS, FEATURES), 0

    def update(self, rollouts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        obs = torch.cat([o for o, _, _ in rollouts])
        actions = torch.cat([a for _, a, _ in rollouts])
        rewards = torch.cat([r for _, _, r in rollouts])
        advantage = rewards - rewards.mean()
        probs = torch.softmax(obs @ self.weights.T, dim=1)
        grad = (advantage[:, None] * (torch.nn.functional.one_hot(actions, ACTIONS) - probs)).T @ obs
        self.weights = self.weights + self.lr * grad / len(obs)
        return self.weights

    def keep(self, weights: torch.Tensor) -> int:
        self.version += 1  # the broadcast gave back what it sent
        return self.version


def build(policies: list, envs: list, learner) -> tuple[cgraph.MultiOutputNode, cgraph.MultiOutputNode]:
    with cgraph.InputNode() as step:
        rollout = cgraph.MultiOutputNode([env.score.bind(p.act.bind(step)) for p, env in zip(policies, envs, strict=True)])
    with cgraph.InputNode() as inp:
        shares = [learner.update.bind(inp[0])] + [p.zeros.bind(inp[1]) for p in policies]
        weights = allreduce.bind(shares)  # one result per member: the learner's weights
        training = cgraph.MultiOutputNode([learner.keep.bind(weights[0])]
                                          + [p.load.bind(w) for p, w in zip(policies, weights[1:], strict=True)])
    return rollout, training


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description="two compiled graphs over the same actors: an RL loop")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=256, help="observations per policy per step")
    parser.add_argument("--pictures", default="cgraph-schedules", help="where the two schedules are drawn")
    args = parser.parse_args(argv)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False)
    policies = [Policy.remote(rank, args.batch) for rank in range(2)]
    envs = [Env.remote() for _ in range(2)]
    learner = Learner.remote(lr=2.0)
    rollout_dag, training_dag = build(policies, envs, learner)
    rollout, training = cgraph.compile(rollout_dag), cgraph.compile(training_dag)
    try:
        Path(args.pictures).mkdir(exist_ok=True)
        for name, graph in (("rollout", rollout), ("training", training)):
            print(f"{name} schedule: {graph.visualize(str(Path(args.pictures) / name), format='svg').path}")
        curve = []
        for step in range(args.steps):
            rollouts = [ref.get(timeout=120) for ref in rollout.execute(step)]
            curve.append(float(torch.cat([r for _, _, r in rollouts]).mean()))
            version, *norms = [ref.get(timeout=120) for ref in training.execute(rollouts, 0)]
            print(f"step {step:3d}  reward {curve[-1]:.2f} {'#' * round(40 * curve[-1]):<40}  "
                  f"weights v{version}, |W| {norms[0]:.2f}")
        print(f"mean reward: first step {curve[0]:.2f}, last step {curve[-1]:.2f} (random: {1 / ACTIONS:.2f})")
        return curve
    finally:
        rollout.teardown()
        training.teardown()
        for actor in [*policies, *envs, learner]:
            ray.kill(actor)
        if started:
            ray.shutdown()


if __name__ == "__main__":
    main()
