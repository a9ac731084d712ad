"""A training loop of many tiny ops (the profiler's cost per op is a large share of each step)."""

import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(16, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(16)
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 40):
    h = x
    for _ in range(1500):
        h = torch.tanh(h * 0.5 + 0.1)
    loss = model(h).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
