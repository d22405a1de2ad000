// Activations and their gradients, one element per thread (bigdl_py/autograd/ops/
// activation.py composes the same formulas; kernels/activations.py has the NumPy twins).
// `kind` picks the function; the backward reads what the forward saved: the output for
// ReLU, tanh and sigmoid, the input for leaky ReLU and the two GELUs.
#define RELU 0
#define LEAKY_RELU 1
#define TANH 2
#define SIGMOID 3
#define GELU 4
#define GELU_TANH 5

// Phi(x) = erfc(-x / sqrt(2)) / 2 with Numerical Recipes' erfc fit, as the host computes
// it (_normal_cdf in activation.py), coefficient for coefficient.
__device__ inline real normal_cdf(real x) {
  real z = fabs(x) * (real)0.7071067811865475;
  real t = (real)1 / (z * (real)0.5 + (real)1);
  real polynomial = t * (real)0.17087277 + (real)-0.82215223;
  const real coefficients[8] = {(real)1.48851587,  (real)-1.13520398, (real)0.27886807,
                                (real)-0.18628806, (real)0.09678418,  (real)0.37409196,
                                (real)1.00002368,  (real)-1.26551223};
  for (int k = 0; k < 8; ++k) polynomial = polynomial * t + coefficients[k];
  polynomial = polynomial - z * z;
  const real half_erfc = exp(polynomial) * t * (real)0.5;
  return x >= 0 ? (real)1 - half_erfc : half_erfc;
}

__device__ inline real tanh_gelu_inner(real x) {
  return (real)0.7978845608028654 * (x + (real)0.044715 * (x * x * x));
}

extern "C" __global__ void activation_forward(
    index_t n, int kind, real parameter, const real* x, real* y) {
  GRID_STRIDE_LOOP(i, n) {
    const real a = x[i];
    real out;
    switch (kind) {
      case RELU: out = (a > 0 || a != a) ? a : (real)0; break;  // NaN passes, as np.maximum's
      case LEAKY_RELU: out = a * (a > 0 ? (real)1 : parameter); break;
      case TANH: out = tanh(a); break;
      case SIGMOID: {
        const real e = exp(-fabs(a));
        out = a >= 0 ? (real)1 / ((real)1 + e) : e / ((real)1 + e);
        break;
      }
      case GELU: out = a * normal_cdf(a); break;
      default: out = (real)0.5 * a * ((real)1 + tanh(tanh_gelu_inner(a))); break;
    }
    y[i] = out;
  }
}

extern "C" __global__ void activation_backward(
    index_t n, int kind, real parameter, const real* grad, const real* saved, real* grad_x) {
  GRID_STRIDE_LOOP(i, n) {
    const real g = grad[i], s = saved[i];
    real out;
    switch (kind) {
      case RELU: out = g * (real)(s > 0); break;
      case LEAKY_RELU: out = g * (s > 0 ? (real)1 : parameter); break;
      case TANH: out = ((real)1 - s * s) * g; break;
      case SIGMOID: out = g * s * ((real)1 - s); break;
      case GELU: {
        const real pdf = exp((real)-0.5 * s * s) / (real)2.5066282746310002;
        out = g * (normal_cdf(s) + s * pdf);
        break;
      }
      default: {
        const real t = tanh(tanh_gelu_inner(s));
        const real inner_slope = (real)0.7978845608028654 * ((real)1 + (real)0.134145 * s * s);
        out = g * ((real)0.5 * ((real)1 + t) + (real)0.5 * s * ((real)1 - t * t) * inner_slope);
        break;
      }
    }
    grad_x[i] = out;
  }
}
