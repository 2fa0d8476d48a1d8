"""A small PyTorch MoE language model trained on synthetic Zipf tokens, its
MoE layers epmoe's, expert parallel over the processes of mpirun.

    python examples/torch_moe_lm/train.py --steps 30                 # one process: every expert local
    mpirun -np 4 python examples/torch_moe_lm/train.py --steps 30    # 4 ranks, E/4 experts each

The two give the same per-step losses (to ~1e-7 relative here): the model,
its initial weights and the global batch of every step do not depend on the
number of ranks. README.md beside this file says what each part does and
why.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

import epmoe
import epmoe.torch


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=256, help="V, the tokens")
    parser.add_argument("--hidden", type=int, default=64, help="H")
    parser.add_argument("--ffn", type=int, default=128, help="F, each expert's inner size")
    parser.add_argument("--experts", type=int, default=8, help="E, per MoE layer; the ranks must divide it")
    parser.add_argument("--top-k", type=int, default=2, help="K, experts per token")
    parser.add_argument("--blocks", type=int, default=2, help="RMSNorm -> MoE -> residual blocks")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (global, over every rank)")
    parser.add_argument("--sequence", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--dispatch", default="alltoall", choices=["alltoall", "ring"])
    parser.add_argument("--lr", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="compute threads per rank (torch's and epmoe's); at this size a second thread costs "
                             "more in OpenMP barriers than it saves")
    parser.add_argument("--losses", default="losses.txt", help="written by rank 0: one line per step, the loss")
    return parser.parse_args()


def launched_by_mpirun() -> bool:
    return any(name in os.environ for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class MoeLanguageModel(torch.nn.Module):
    """embedding -> blocks of (RMSNorm -> epmoe MoE -> residual) -> RMSNorm -> LM head."""

    def __init__(self, group: epmoe.EpGroup, args):
        super().__init__()
        generator = torch.Generator().manual_seed(args.seed)  # the same replicated weights on every rank
        self.embedding = torch.nn.Parameter(torch.randn(args.vocab, args.hidden, generator=generator))
        self.norms = torch.nn.ModuleList(RMSNorm(args.hidden) for _ in range(args.blocks))
        self.moes = torch.nn.ModuleList(
            epmoe.torch.MoeLayer(group, ffn=args.ffn, seed=args.seed + 1 + block) for block in range(args.blocks))
        self.final_norm = RMSNorm(args.hidden)
        self.head = torch.nn.Parameter(torch.randn(args.hidden, args.vocab, generator=generator) * args.hidden**-0.5)

    def forward(self, tokens):
        h = self.embedding[tokens]  # [sequences, T, H]
        for norm, moe in zip(self.norms, self.moes):
            h = h + moe(norm(h))
        return self.final_norm(h) @ self.head  # logits [sequences, T, V]

    def replicated_parameters(self):
        """Every parameter but the experts' own: each rank holds a copy and
        computes its tokens' part of the gradient."""
        experts = {id(p) for moe in self.moes for p in (moe.wi0, moe.wi1, moe.wo)}
        return [p for p in self.parameters() if id(p) not in experts]


def zipf_batch(step: int, args) -> np.ndarray:
    """The global batch of `step`, [batch, sequence + 1] token ids, from the
    seed and the step alone (never the rank count): each token follows its
    predecessor's successor (a fixed random permutation) half the time, else
    is drawn from a Zipf law (p(v) ~ 1 / (v + 1)^1.1) - something to learn
    beyond the unigram frequencies."""
    structure = np.random.default_rng(args.seed)
    successor = structure.permutation(args.vocab)
    zipf = 1.0 / np.arange(1, args.vocab + 1) ** 1.1
    zipf /= zipf.sum()
    rng = np.random.default_rng([args.seed, step])
    draws = rng.choice(args.vocab, size=(args.batch, args.sequence + 1), p=zipf)
    follow = rng.random((args.batch, args.sequence + 1)) < 0.5
    tokens = draws.copy()
    for t in range(1, args.sequence + 1):
        tokens[:, t] = np.where(follow[:, t], successor[tokens[:, t - 1]], draws[:, t])
    return tokens


def main():
    args = parse_arguments()
    comm = None
    if launched_by_mpirun():
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    rank, size = (comm.rank, comm.size) if comm is not None else (0, 1)
    torch.set_num_threads(args.threads)
    epmoe.set_compute_threads(args.threads)

    # One EP group for every MoE layer of the model; None: one rank, no communication.
    group = epmoe.EpGroup(comm, num_experts=args.experts, top_k=args.top_k, hidden=args.hidden,
                          **({"dispatch": args.dispatch} if comm is not None else {}))
    model = MoeLanguageModel(group, args)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    replicated = model.replicated_parameters()
    num_tokens = args.batch * args.sequence
    sequences = slice(args.batch * rank // size, args.batch * (rank + 1) // size)  # this rank's share
    if rank == 0:
        expert_count = sum(p.numel() for moe in model.moes for p in (moe.wi0, moe.wi1, moe.wo))
        print(f"torch_moe_lm: {size} rank(s), {args.experts} experts x {args.blocks} MoE layers "
              f"({group.num_local_experts} per rank), {sum(p.numel() for p in replicated)} replicated parameters, "
              f"{expert_count} expert parameters on rank 0, {num_tokens} tokens a step", flush=True)

    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        tokens = torch.from_numpy(zipf_batch(step, args)[sequences])
        logits = model(tokens[:, :-1])
        # This rank's share of the global mean: its tokens' sum over every rank's tokens.
        loss_sum = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1),
                                                     reduction="sum")
        optimizer.zero_grad(set_to_none=True)
        (loss_sum / num_tokens).backward()
        # Replicated parameters: every rank's part of the gradient summed. In
        # float64: R float32 parts sum there without rounding for any order
        # MPI's allreduce picks, so the float32 result is the same for every
        # R and every algorithm (R = 1 is the identity); the bytes are the
        # replicated parameters' only (the experts' gradients are complete on
        # their rank), ~2 x 40 K here.
        local = np.concatenate([p.grad.numpy().ravel() for p in replicated] + [[loss_sum.item()]]).astype(np.float64)
        total = local.copy()
        if comm is not None:
            comm.Allreduce(local, total)
        offset = 0
        for p in replicated:
            p.grad.copy_(torch.from_numpy(total[offset:offset + p.numel()].reshape(p.shape)))
            offset += p.numel()
        optimizer.step()
        loss = total[-1] / num_tokens
        losses.append(loss)
        if rank == 0:
            print(f"step {step:3d}  loss {loss:.9f}", flush=True)
    if rank == 0:
        with open(args.losses, "w") as f:
            f.writelines(f"{loss!r}\n" for loss in losses)
        print(f"torch_moe_lm: {args.steps} steps in {time.perf_counter() - start:.2f} s; losses in {args.losses}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
