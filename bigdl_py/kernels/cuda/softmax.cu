// Softmax and log-softmax over the last axis, the negative log-likelihood, and the fused
// softmax cross-entropy (bigdl_py/autograd/ops/activation.py and
// bigdl_py/nn/_loss_functions.py compose the same formulas; kernels/softmax.py has the NumPy
// twins). Rows are contiguous, `width` (classes) long; a row-wise kernel runs one block per
// row. Targets are class indices: one equal to `ignore_index` adds nothing, and one outside
// [0, classes) is clamped to a class, so a bad label (checked on the host, or reported at
// the next sync point) never reads outside its row. Label smoothing comes as `keep`
// (1 - eps) and `spread` (eps / classes), rounded once on the host.

__device__ inline index_t clamped_class(long long target, index_t classes) {
  return target < 0 ? 0 : (target >= classes ? classes - 1 : target);
}

extern "C" __global__ void softmax_forward(index_t rows, index_t width, const real* x, real* y) {
  __shared__ real scratch[1024];
  for (index_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const real* in = x + row * width;
    real* out = y + row * width;
    real largest = -REAL_INFINITY;
    BLOCK_STRIDE_LOOP(j, width) largest = fmax(largest, in[j]);
    largest = block_max(largest, scratch);
    real total = 0;
    BLOCK_STRIDE_LOOP(j, width) total += exp(in[j] - largest);
    total = block_sum(total, scratch);
    BLOCK_STRIDE_LOOP(j, width) out[j] = exp(in[j] - largest) / total;
  }
}

extern "C" __global__ void softmax_backward(
    index_t rows, index_t width, const real* grad, const real* y, real* grad_x) {
  __shared__ real scratch[1024];
  for (index_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const index_t start = row * width;
    real dot = 0;
    BLOCK_STRIDE_LOOP(j, width) dot += grad[start + j] * y[start + j];
    dot = block_sum(dot, scratch);
    BLOCK_STRIDE_LOOP(j, width) grad_x[start + j] = y[start + j] * (grad[start + j] - dot);
  }
}

extern "C" __global__ void log_softmax_forward(
    index_t rows, index_t width, const real* x, real* y) {
  __shared__ real scratch[1024];
  for (index_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const real* in = x + row * width;
    real* out = y + row * width;
    real largest = -REAL_INFINITY;
    BLOCK_STRIDE_LOOP(j, width) largest = fmax(largest, in[j]);
    largest = block_max(largest, scratch);
    real total = 0;
    BLOCK_STRIDE_LOOP(j, width) total += exp(in[j] - largest);
    const real log_total = log(block_sum(total, scratch));
    BLOCK_STRIDE_LOOP(j, width) out[j] = (in[j] - largest) - log_total;
  }
}

extern "C" __global__ void log_softmax_backward(
    index_t rows, index_t width, const real* grad, const real* y, real* grad_x) {
  __shared__ real scratch[1024];
  for (index_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const index_t start = row * width;
    real total = 0;
    BLOCK_STRIDE_LOOP(j, width) total += grad[start + j];
    total = block_sum(total, scratch);
    BLOCK_STRIDE_LOOP(j, width) grad_x[start + j] = grad[start + j] - exp(y[start + j]) * total;
  }
}

// One thread per row: the row's loss -weight[t] * log_probabilities[t] and its weight.
extern "C" __global__ void nll_forward(
    index_t rows, index_t classes, const real* log_probabilities, const long long* target,
    const real* class_weight, int has_weight, long long ignore_index, real* losses,
    real* weights) {
  GRID_STRIDE_LOOP(row, rows) {
    const bool valid = target[row] != ignore_index;
    const index_t t = valid ? clamped_class(target[row], classes) : 0;
    const real weight = valid ? (has_weight ? class_weight[t] : (real)1) : (real)0;
    losses[row] = -log_probabilities[row * classes + t] * weight;
    weights[row] = weight;
  }
}

// The gradient of a reduced loss per row: grad / denominator (mean), grad (sum), or the
// row's own grad (none).
__device__ inline real row_upstream(
    const real* grad, const real* denominator, int reduction, index_t row) {
  if (reduction == 0) return grad[row];
  return reduction == 2 ? grad[0] / denominator[0] : grad[0];
}

// reduction: 0 none, 1 sum, 2 mean (denominator: the summed weights, from loss_reduce).
extern "C" __global__ void nll_backward(
    index_t total, index_t classes, const long long* target, const real* class_weight,
    int has_weight, long long ignore_index, const real* grad, const real* denominator,
    int reduction, real* grad_x) {
  GRID_STRIDE_LOOP(i, total) {
    const index_t row = i / classes, column = i % classes;
    const bool valid = target[row] != ignore_index;
    const index_t t = valid ? clamped_class(target[row], classes) : 0;
    const real weight = valid ? (has_weight ? class_weight[t] : (real)1) : (real)0;
    grad_x[i] = column == t ? -row_upstream(grad, denominator, reduction, row) * weight : (real)0;
  }
}

// Block per row: log-softmax, the row's loss ((1 - eps) * nll + eps / C * the smoothing
// term), its weight, and the row's max and log-sum-exp for the backward.
extern "C" __global__ void softmax_cross_entropy_forward(
    index_t rows, index_t classes, const real* logits, const long long* target,
    const real* class_weight, int has_weight, long long ignore_index, real keep, real spread,
    real* losses, real* weights, real* row_max, real* row_log_total) {
  __shared__ real scratch[1024];
  for (index_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const real* in = logits + row * classes;
    real largest = -REAL_INFINITY;
    BLOCK_STRIDE_LOOP(j, classes) largest = fmax(largest, in[j]);
    largest = block_max(largest, scratch);
    real total = 0;
    BLOCK_STRIDE_LOOP(j, classes) total += exp(in[j] - largest);
    const real log_total = log(block_sum(total, scratch));
    const bool valid = target[row] != ignore_index;
    const index_t t = valid ? clamped_class(target[row], classes) : 0;
    const real weight = valid ? (has_weight ? class_weight[t] : (real)1) : (real)0;
    real loss = -((in[t] - largest) - log_total) * weight;
    if (spread != 0) {
      real smooth = 0;
      BLOCK_STRIDE_LOOP(j, classes) {
        smooth += ((in[j] - largest) - log_total) * (has_weight ? class_weight[j] : (real)1);
      }
      smooth = -block_sum(smooth, scratch) * (real)valid;
      loss = keep * loss + spread * smooth;
    }
    if (threadIdx.x == 0) {
      losses[row] = loss;
      weights[row] = weight;
      row_max[row] = largest;
      row_log_total[row] = log_total;
    }
  }
}

// With class weights spread_total is spread * total_weight[0] (their sum); without, the
// host's eps / classes * classes (total_weight is then not read).
extern "C" __global__ void softmax_cross_entropy_backward(
    index_t total, index_t classes, const real* logits, const real* row_max,
    const real* row_log_total, const long long* target, const real* class_weight,
    int has_weight, const real* total_weight, long long ignore_index, real keep, real spread,
    real spread_total, const real* grad, const real* denominator, int reduction,
    real* grad_x) {
  GRID_STRIDE_LOOP(i, total) {
    const index_t row = i / classes, column = i % classes;
    const bool valid = target[row] != ignore_index;
    const index_t t = valid ? clamped_class(target[row], classes) : 0;
    const real weight = valid ? (has_weight ? class_weight[t] : (real)1) : (real)0;
    const real upstream = row_upstream(grad, denominator, reduction, row) * (real)valid;
    const real coefficient_sum = keep * weight + (has_weight ? spread * total_weight[0] : spread_total);
    const real probability = exp((logits[i] - row_max[row]) - row_log_total[row]);
    real value = probability * (upstream * coefficient_sum);
    if (spread != 0) {
      value -= spread * upstream * (has_weight ? class_weight[column] : (real)1);
    }
    grad_x[i] = value - (column == t ? keep * upstream * weight : (real)0);
  }
}

// One block: out[0] = the summed losses, over the summed weights when `mean`; out[1] = the
// summed weights (the mean's denominator, for the backward).
extern "C" __global__ void loss_reduce(
    index_t rows, const real* losses, const real* weights, int mean, real* out) {
  __shared__ real scratch[1024];
  real loss_total = 0, weight_total = 0;
  BLOCK_STRIDE_LOOP(j, rows) {
    loss_total += losses[j];
    weight_total += weights[j];
  }
  loss_total = block_sum(loss_total, scratch);
  weight_total = block_sum(weight_total, scratch);
  if (threadIdx.x == 0) {
    out[0] = mean ? loss_total / weight_total : loss_total;
    out[1] = weight_total;
  }
}
