"""A heterogeneous min-max toy problem with the members of ``Trainable`` the backends use.

Site k:  f_k(x, y) = ½ xᵀA_k x + xᵀB y − ½ μ‖y‖² + e_kᵀx − d_kᵀy, strongly convex in x,
strongly concave in y. The global saddle point of f = (1/K) Σ_k f_k solves a linear system.
"""

from __future__ import annotations

import torch

from fed_auc.trainable import Trainable


class ToyTrainable(Trainable):
    """Primal ``w/x`` (dim 2), dual ``auc/alpha`` (dim 1); batches carry gradient noise."""

    def __init__(
        self, A: torch.Tensor, B: torch.Tensor, mu: float, e: torch.Tensor, d: torch.Tensor
    ) -> None:
        self.A, self.B, self.mu, self.e, self.d = A, B, mu, e, d
        self.primal = {"w/x": torch.zeros(2, dtype=torch.float64)}
        self.dual = {"auc/alpha": torch.zeros(1, dtype=torch.float64)}
        self.buffers = {}
        self.model = torch.nn.Module()
        self.loss = None

    def gradients(self, noise_x: torch.Tensor, noise_y: torch.Tensor):
        x, y = self.primal["w/x"], self.dual["auc/alpha"]
        gx = self.A @ x + self.B @ y + self.e + noise_x
        gy = self.B.T @ x - self.mu * y - self.d + noise_y
        value = 0.5 * x @ self.A @ x + x @ self.B @ y - 0.5 * self.mu * y @ y
        return value, [gx.clone()], [gy.clone()]

    def dual_gradients_at(self, point, noise_x: torch.Tensor, noise_y: torch.Tensor):
        """∇_y f at the primal ``point`` (Fed-Norm-SGDA+'s snapshot) and the current y."""
        y = self.dual["auc/alpha"]
        return [self.B.T @ point["w/x"] - self.mu * y - self.d + noise_y]


def toy_sites(k: int = 4) -> list[ToyTrainable]:
    """K sites with different curvature and linear terms (heterogeneous)."""
    gen = torch.Generator().manual_seed(0)
    sites = []
    for i in range(k):
        scale = 0.5 + 2.0 * i / max(k - 1, 1)
        A = torch.diag(torch.tensor([scale, 1.0 / scale], dtype=torch.float64))
        B = torch.tensor([[0.5], [-0.3]], dtype=torch.float64)
        e = torch.randn(2, generator=gen, dtype=torch.float64) * 2
        d = torch.randn(1, generator=gen, dtype=torch.float64)
        sites.append(ToyTrainable(A, B, 1.0, e, d))
    return sites


def saddle_point(sites: list[ToyTrainable]) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve ∇_x f = 0 and ∇_y f = 0 for f = (1/K) Σ_k f_k."""
    A = sum(s.A for s in sites) / len(sites)
    e = sum(s.e for s in sites) / len(sites)
    d = sum(s.d for s in sites) / len(sites)
    B, mu = sites[0].B, sites[0].mu
    top = torch.cat([A, B], dim=1)
    bottom = torch.cat([B.T, -mu * torch.eye(1, dtype=torch.float64)], dim=1)
    solution = torch.linalg.solve(torch.cat([top, bottom]), -torch.cat([e, -d]))
    return solution[:2], solution[2:]


def zero_noise():
    """An endless stream of zero noise: deterministic gradients."""
    while True:
        yield torch.zeros(2, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)


def weighted_saddle_point(
    sites: list[ToyTrainable], weights: list[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Saddle point of Σ_k weight_k f_k (weights summing to 1; B and μ shared by the sites)."""
    A = sum(w * s.A for s, w in zip(sites, weights, strict=True))
    e = sum(w * s.e for s, w in zip(sites, weights, strict=True))
    d = sum(w * s.d for s, w in zip(sites, weights, strict=True))
    B, mu = sites[0].B, sites[0].mu
    top = torch.cat([A, B], dim=1)
    bottom = torch.cat([B.T, -mu * torch.eye(1, dtype=torch.float64)], dim=1)
    solution = torch.linalg.solve(torch.cat([top, bottom]), -torch.cat([e, -d]))
    return solution[:2], solution[2:]
