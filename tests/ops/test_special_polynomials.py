"""torch.special orthogonal polynomials (Chebyshev T/U/V/W and shifted, Hermite H/He,
Laguerre L, Legendre P) vs CPU: end points, the trigonometric branch, the recurrence,
truncated / negative / non-finite degrees, integer inputs, scalar degrees."""

import pytest
import torch

NAMES = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
         "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
         "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
         "laguerre_polynomial_l", "legendre_polynomial_p"]

# x = NaN is left out: there CPU returns an uninitialized variable for n >= 2 (Math.h's
# ``T r;`` when the NaN check skips the loop), not a defined value.
XS = [-2.0, -1.0, -0.7, -0.5, 0.0, 1e-3, 0.3, 0.5, 0.9, 1.0, 1.5, 3.0, float("inf"), -float("inf")]
NS = [-3.0, -0.5, 0.0, 0.7, 1.0, 2.0, 3.0, 4.9, 5.0, 6.0, 7.0, 9.0, 12.0, 20.0, 130.0,
      float("nan"), float("inf")]


@pytest.mark.parametrize("name", NAMES)
def test_polynomial_grid_vs_cpu(name, eager_mode):
    f = getattr(torch.special, name)
    x, n = torch.meshgrid(torch.tensor(XS), torch.tensor(NS), indexing="ij")
    expected = f(x, n)
    actual = f(x.to("tpu") * 1, n.to("tpu"))  # (* 1: an op before it, fused in DEFER_AND_FUSE)
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_polynomial_integer_inputs_and_scalar_degree(name):
    f = getattr(torch.special, name)
    xi, ni = torch.tensor([0, 1, 2, -1]), torch.tensor([0, 1, 3, 4])
    ei, ai = f(xi, ni), f(xi.to("tpu"), ni.to("tpu"))
    assert ai.dtype == ei.dtype
    torch.testing.assert_close(ai.cpu(), ei)
    x = torch.linspace(-1.2, 1.2, 25)
    torch.testing.assert_close(f(x.to("tpu"), 5).cpu(), f(x, 5), atol=1e-5, rtol=1e-4)
