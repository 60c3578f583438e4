"""The sqrt_sum example as a plain PyTorch function, for `neptune-eq explore` through the frontend.

    neptune-eq explore examples/sqrt_sum_torch.py --rules sqrt
"""

import torch


def fn(x):
    m = x.amax(dim=-1, keepdim=True)
    return torch.exp(x - m).sqrt().sum(dim=-1)


def example_inputs():
    return (torch.randn(64, 1000),)
