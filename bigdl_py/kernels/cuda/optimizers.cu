// One kernel per OptimMethod: its whole update of the flat vector in one pass, one thread
// per element (bigdl_py/optim/*.py give each rule; kernels/optimizers.py the NumPy twins).
//
// Every kernel takes `applied` and `steps` on the device: where *applied is false the
// kernel writes nothing (a step with a NaN/Inf loss, decided on the device), and *steps
// counts the updates applied so far, this one included (the caller adds *applied to it
// first), so bias corrections never read the host's count. The learning rate is read from
// the device too (a double the host fills before the step), so a step replayed from a
// CUDA graph follows a schedule. Constants such as 1 - beta come computed in double on
// the host and rounded once, as the NumPy rules compute them; a learning rate divided by
// a bias correction is computed in double for the same reason.

extern "C" __global__ void sgd_update(
    index_t n, real* weight, const real* gradient, real* buffer, const double* learning_rate,
    real momentum, real one_minus_dampening, real weight_decay, int nesterov,
    const long long* steps, const bool* applied) {
  if (!*applied) return;
  const real rate = (real)*learning_rate;
  const bool first = *steps == 1;  // the first update starts the buffer undamped
  GRID_STRIDE_LOOP(i, n) {
    real grad = gradient[i];
    if (weight_decay != 0) grad = grad + weight_decay * weight[i];
    if (momentum != 0) {
      real kept = momentum * buffer[i];
      kept = first ? grad : kept + (one_minus_dampening == 1 ? grad : one_minus_dampening * grad);
      buffer[i] = kept;
      grad = nesterov ? grad + momentum * kept : kept;
    }
    weight[i] = weight[i] - rate * grad;
  }
}

// Adam and AdamW (`decoupled`: the weight decays by 1 - learning rate * weight decay
// before the update instead of the decay joining the gradient); `max_exp_avg_sq` is read
// only with `amsgrad`.
extern "C" __global__ void adam_update(
    index_t n, real* weight, const real* gradient, real* exp_avg, real* exp_avg_sq,
    real* max_exp_avg_sq, const double* learning_rate, double beta1, double beta2,
    real one_minus_beta1, real one_minus_beta2, real eps, double decay, int decoupled,
    int amsgrad, const long long* steps, const bool* applied) {
  if (!*applied) return;
  const double t = (double)*steps;
  const real bias_correction2_root = (real)sqrt(1.0 - pow(beta2, t));
  const real step_size = (real)(*learning_rate / (1.0 - pow(beta1, t)));
  const real b1 = (real)beta1, b2 = (real)beta2;
  const real weight_decay = (real)decay;
  const real decay_factor = (real)(1.0 - *learning_rate * decay);
  GRID_STRIDE_LOOP(i, n) {
    real grad = gradient[i];
    real w = weight[i];
    if (weight_decay != 0) {
      if (decoupled) w = w * decay_factor;
      else grad = grad + weight_decay * w;
    }
    const real m = b1 * exp_avg[i] + grad * one_minus_beta1;
    const real v = b2 * exp_avg_sq[i] + grad * grad * one_minus_beta2;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    real second = v;
    if (amsgrad) {
      second = fmax(max_exp_avg_sq[i], v);
      max_exp_avg_sq[i] = second;
    }
    weight[i] = w - m / (sqrt(second) / bias_correction2_root + eps) * step_size;
  }
}

extern "C" __global__ void adamax_update(
    index_t n, real* weight, const real* gradient, real* exp_avg, real* exp_inf,
    const double* learning_rate, double beta1, real one_minus_beta1, real beta2, real eps,
    real weight_decay, const long long* steps, const bool* applied) {
  if (!*applied) return;
  const real step_size = (real)(*learning_rate / (1.0 - pow(beta1, (double)*steps)));
  const real b1 = (real)beta1;
  GRID_STRIDE_LOOP(i, n) {
    real grad = gradient[i];
    if (weight_decay != 0) grad = grad + weight_decay * weight[i];
    const real m = b1 * exp_avg[i] + grad * one_minus_beta1;
    const real u = fmax(beta2 * exp_inf[i], fabs(grad) + eps);
    exp_avg[i] = m;
    exp_inf[i] = u;
    weight[i] = weight[i] - m / u * step_size;
  }
}

extern "C" __global__ void adagrad_update(
    index_t n, real* weight, const real* gradient, real* square_sum,
    const double* learning_rate, double lr_decay, real eps, real weight_decay,
    const long long* steps, const bool* applied) {
  if (!*applied) return;
  const real step_size = (real)(*learning_rate / (1.0 + (double)(*steps - 1) * lr_decay));
  GRID_STRIDE_LOOP(i, n) {
    real grad = gradient[i];
    if (weight_decay != 0) grad = grad + weight_decay * weight[i];
    const real total = square_sum[i] + grad * grad;
    square_sum[i] = total;
    weight[i] = weight[i] - grad / (sqrt(total) + eps) * step_size;
  }
}

// `grad_avg` is read only when `centered`, `buffer` only with momentum > 0.
extern "C" __global__ void rmsprop_update(
    index_t n, real* weight, const real* gradient, real* square_avg, real* grad_avg,
    real* buffer, const double* learning_rate, real alpha, real one_minus_alpha, real eps,
    real weight_decay, real momentum, int centered, const long long* steps,
    const bool* applied) {
  if (!*applied) return;
  (void)steps;
  const real rate = (real)*learning_rate;
  GRID_STRIDE_LOOP(i, n) {
    real grad = gradient[i];
    if (weight_decay != 0) grad = grad + weight_decay * weight[i];
    const real v = alpha * square_avg[i] + grad * grad * one_minus_alpha;
    square_avg[i] = v;
    real denominator;
    if (centered) {
      const real m = alpha * grad_avg[i] + grad * one_minus_alpha;
      grad_avg[i] = m;
      denominator = sqrt(v - m * m) + eps;
    } else {
      denominator = sqrt(v) + eps;
    }
    real step = grad / denominator;
    if (momentum > 0) {
      step = momentum * buffer[i] + step;
      buffer[i] = step;
    }
    weight[i] = weight[i] - step * rate;
  }
}

extern "C" __global__ void adadelta_update(
    index_t n, real* weight, const real* gradient, real* square_avg, real* acc_delta,
    const double* learning_rate, real rho, real one_minus_rho, real eps, real weight_decay,
    const long long* steps, const bool* applied) {
  if (!*applied) return;
  (void)steps;
  const real rate = (real)*learning_rate;
  GRID_STRIDE_LOOP(i, n) {
    real grad = gradient[i];
    if (weight_decay != 0) grad = grad + weight_decay * weight[i];
    const real v = rho * square_avg[i] + grad * grad * one_minus_rho;
    square_avg[i] = v;
    const real delta = sqrt(acc_delta[i] + eps) / sqrt(v + eps) * grad;
    acc_delta[i] = rho * acc_delta[i] + delta * delta * one_minus_rho;
    weight[i] = weight[i] - delta * rate;
  }
}
