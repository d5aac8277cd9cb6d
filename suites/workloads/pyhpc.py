"""Ocean-model kernels in the spirit of the pyhpc benchmarks (our own implementations).

- ``pyhpc_equation_of_state``: density of sea water from salinity, temperature and pressure with the
  UNESCO EOS-80 formula (a secant bulk modulus polynomial): hundreds of elementwise ops on three
  inputs, which Inductor fuses into very few kernels.
- ``pyhpc_turbulent_kinetic_energy``: one step of a turbulent kinetic energy closure on a 3-D grid:
  mixing length, eddy viscosity, shear production, buoyancy flux, dissipation and an implicit vertical
  diffusion solved with a tridiagonal (Thomas) sweep along the vertical. The sweep is a Python loop
  over levels: eager launches many small kernels per level, which is what CUDA graphs pay for.

Both run at 1,048,576 grid points in the standard and full tiers, the size the paper reports.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from suites.workloads.common import generator, place, seed_weights, uniform
from suites.workloads.registry import Tag, workload


def _poly(x: torch.Tensor, coefficients: tuple[float, ...]) -> torch.Tensor:
    """sum_i c_i x^i by Horner's rule (coefficients in increasing order)."""
    acc = torch.full_like(x, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        acc = acc * x + c
    return acc


class UnescoDensity(nn.Module):
    """rho(S [psu], t [deg C], p [bar]) in kg/m^3 (UNESCO 1981 international equation of state)."""

    def forward(self, s: torch.Tensor, t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        s15 = s * torch.sqrt(s)
        rho_w = _poly(t, (999.842594, 6.793952e-2, -9.095290e-3, 1.001685e-4, -1.120083e-6, 6.536332e-9))
        rho_0 = (
            rho_w
            + s * _poly(t, (8.24493e-1, -4.0899e-3, 7.6438e-5, -8.2467e-7, 5.3875e-9))
            + s15 * _poly(t, (-5.72466e-3, 1.0227e-4, -1.6546e-6))
            + 4.8314e-4 * s * s
        )
        k_w = _poly(t, (19652.21, 148.4206, -2.327105, 1.360477e-2, -5.155288e-5))
        k_0 = (
            k_w
            + s * _poly(t, (54.6746, -0.603459, 1.09987e-2, -6.1670e-5))
            + s15 * _poly(t, (7.944e-2, 1.6483e-2, -5.3009e-4))
        )
        a = (
            _poly(t, (3.239908, 1.43713e-3, 1.16092e-4, -5.77905e-7))
            + s * _poly(t, (2.2838e-3, -1.0981e-5, -1.6078e-6))
            + 1.91075e-4 * s15
        )
        b = _poly(t, (8.50935e-5, -6.12293e-6, 5.2787e-8)) + s * _poly(t, (-9.9348e-7, 2.0816e-8, 9.1697e-10))
        k = k_0 + a * p + b * p * p
        return rho_0 / (1.0 - p / k)


GRID_SIZES = {
    "smoke": {"nx": 8, "ny": 8, "nz": 8},
    "standard": {"nx": 128, "ny": 256, "nz": 32},  # 1,048,576 points
    "full": {"nx": 128, "ny": 256, "nz": 32},
}


@workload(
    "pyhpc_equation_of_state",
    tags=(Tag.HPC, Tag.LAUNCH_BOUND, Tag.PI),
    sizes=GRID_SIZES,
    code=(_poly, UnescoDensity),
)
def build_equation_of_state(size: Any, device: Any, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...]]:
    """Sea-water density (UNESCO EOS-80) on a 3-D grid."""
    seed_weights()
    shape = (size["nx"], size["ny"], size["nz"])
    gen = generator()
    s = uniform(shape, 30.0, 40.0, device, dtype, gen)
    t = uniform(shape, -2.0, 30.0, device, dtype, gen)
    p = uniform(shape, 0.0, 1000.0, device, dtype, gen)
    return place(UnescoDensity(), device, dtype), (s, t, p)


class TurbulentKineticEnergy(nn.Module):
    """One implicit step of a TKE closure on fields shaped (nx, ny, nz), level 0 at the surface."""

    def __init__(self, dt: float = 360.0, dz: float = 10.0) -> None:
        super().__init__()
        self.dt, self.dz = dt, dz
        self.c_k, self.c_eps, self.prandtl = 0.1, 0.7, 10.0
        self.tke_min, self.mxl_min, self.kappa_max = 1e-6, 1e-8, 100.0

    def forward(
        self,
        tke: torch.Tensor,
        u: torch.Tensor,
        v: torch.Tensor,
        n2: torch.Tensor,
        wind_stress: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sqrt_tke = torch.sqrt(torch.clamp(tke, min=self.tke_min))
        mxl = torch.clamp(
            1.4142135623730951 * sqrt_tke / torch.sqrt(torch.clamp(n2, min=1e-12)), min=self.mxl_min
        )
        mxl = torch.minimum(mxl, torch.full_like(mxl, 4.0 * self.dz))
        kappa_m = torch.clamp(self.c_k * mxl * sqrt_tke, max=self.kappa_max)
        kappa_h = kappa_m / self.prandtl
        du = torch.zeros_like(u)
        dv = torch.zeros_like(v)
        du[..., :-1] = (u[..., :-1] - u[..., 1:]) / self.dz
        dv[..., :-1] = (v[..., :-1] - v[..., 1:]) / self.dz
        production = kappa_m * (du * du + dv * dv)
        buoyancy = -kappa_h * n2
        rhs = tke + self.dt * (production + buoyancy)
        rhs[..., 0] = rhs[..., 0] + self.dt * wind_stress / self.dz
        # interface diffusivities and the tridiagonal system a*x[k-1] + b*x[k] + c*x[k+1] = rhs
        k_face = torch.zeros_like(kappa_m)
        k_face[..., :-1] = 0.5 * (kappa_m[..., :-1] + kappa_m[..., 1:])
        scale = self.dt / (self.dz * self.dz)
        lower = torch.zeros_like(kappa_m)
        lower[..., 1:] = -scale * k_face[..., :-1]
        upper = -scale * k_face
        diag = 1.0 - lower - upper + self.dt * self.c_eps * sqrt_tke / mxl
        return self._thomas(lower, diag, upper, rhs).clamp(min=self.tke_min), kappa_m

    @staticmethod
    def _thomas(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        levels = d.shape[-1]
        cp = [c[..., 0] / b[..., 0]]
        dp = [d[..., 0] / b[..., 0]]
        for k in range(1, levels):
            denom = b[..., k] - a[..., k] * cp[k - 1]
            cp.append(c[..., k] / denom)
            dp.append((d[..., k] - a[..., k] * dp[k - 1]) / denom)
        x = [dp[-1]]
        for k in range(levels - 2, -1, -1):
            x.append(dp[k] - cp[k] * x[-1])
        return torch.stack(x[::-1], dim=-1)


@workload(
    "pyhpc_turbulent_kinetic_energy",
    tags=(Tag.HPC, Tag.LAUNCH_BOUND, Tag.PI),
    sizes=GRID_SIZES,
    code=(TurbulentKineticEnergy,),
)
def build_turbulent_kinetic_energy(
    size: Any, device: Any, dtype: torch.dtype
) -> tuple[nn.Module, tuple[Any, ...]]:
    """One implicit turbulent-kinetic-energy step with a tridiagonal vertical solve."""
    seed_weights()
    shape = (size["nx"], size["ny"], size["nz"])
    gen = generator()
    tke = uniform(shape, 1e-5, 1e-3, device, dtype, gen)
    u = uniform(shape, -0.5, 0.5, device, dtype, gen)
    v = uniform(shape, -0.5, 0.5, device, dtype, gen)
    n2 = uniform(shape, 1e-6, 1e-4, device, dtype, gen)
    wind = uniform(shape[:2], 0.0, 1e-4, device, dtype, gen)
    return place(TurbulentKineticEnergy(), device, dtype), (tke, u, v, n2, wind)
