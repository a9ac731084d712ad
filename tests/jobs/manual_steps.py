"""A loop without an optimizer that marks its steps with dpro.step()."""

import torch

import dpro

weights = torch.zeros(4)
for _ in range(6):
    weights += torch.randn(4)
    dpro.step()
