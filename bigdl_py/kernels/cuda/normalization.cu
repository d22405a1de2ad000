// Batch norm and layer norm, forward and backward (bigdl_py/autograd/ops/norm.py composes
// the same formulas; kernels/normalization.py has the NumPy twins). The backward kernels
// recompute the normalised input from x, the mean and 1/std instead of keeping it.
//
// Batch norm: x is (batch, channels, inner) with inner = the product of the spatial axes;
// a statistics or reduction kernel runs one block per channel (blocks stride over channels
// past the first), the element-wise ones one thread per element.

// The channel's mean and 1/sqrt(biased variance + eps), two passes over its values; with
// update_running the running statistics move towards them (the variance unbiased).
extern "C" __global__ void batch_norm_statistics(
    index_t batch, index_t channels, index_t inner, const real* x, real* mean, real* inv_std,
    real* running_mean, real* running_var, int update_running, real eps, real momentum,
    real one_minus_momentum, real unbias) {
  __shared__ real scratch[1024];
  const index_t count = batch * inner;
  for (index_t c = blockIdx.x; c < channels; c += gridDim.x) {
    real total = 0;
    BLOCK_STRIDE_LOOP(k, count) total += x[((k / inner) * channels + c) * inner + k % inner];
    const real average = block_sum(total, scratch) / (real)count;
    real squares = 0;
    BLOCK_STRIDE_LOOP(k, count) {
      const real centered = x[((k / inner) * channels + c) * inner + k % inner] - average;
      squares += centered * centered;
    }
    const real variance = block_sum(squares, scratch) / (real)count;
    if (threadIdx.x == 0) {
      mean[c] = average;
      inv_std[c] = (real)1 / sqrt(variance + eps);
      if (update_running) {
        running_mean[c] = running_mean[c] * one_minus_momentum + momentum * average;
        running_var[c] = running_var[c] * one_minus_momentum + momentum * (variance * unbias);
      }
    }
  }
}

extern "C" __global__ void batch_norm_forward(
    index_t total, index_t channels, index_t inner, const real* x, const real* mean,
    const real* inv_std, const real* weight, const real* bias, int has_weight, int has_bias,
    real* out) {
  GRID_STRIDE_LOOP(i, total) {
    const index_t c = (i / inner) % channels;
    real value = (x[i] - mean[c]) * inv_std[c];
    if (has_weight) value = value * weight[c];
    if (has_bias) value = value + bias[c];
    out[i] = value;
  }
}

// Per channel: the gradient's sum and its dot product with the normalised input.
extern "C" __global__ void batch_norm_backward_reduce(
    index_t batch, index_t channels, index_t inner, const real* grad, const real* x,
    const real* mean, const real* inv_std, real* grad_sum, real* grad_dot) {
  __shared__ real scratch[1024];
  const index_t count = batch * inner;
  for (index_t c = blockIdx.x; c < channels; c += gridDim.x) {
    real sum = 0, dot = 0;
    BLOCK_STRIDE_LOOP(k, count) {
      const index_t i = ((k / inner) * channels + c) * inner + k % inner;
      sum += grad[i];
      dot += grad[i] * ((x[i] - mean[c]) * inv_std[c]);
    }
    sum = block_sum(sum, scratch);
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) {
      grad_sum[c] = sum;
      grad_dot[c] = dot;
    }
  }
}

// With batch statistics (training): remove the gradient's mean and its projection on the
// normalised input, per channel, then scale by weight / std; with running ones, only scale.
extern "C" __global__ void batch_norm_backward_input(
    index_t total, index_t channels, index_t inner, const real* grad, const real* x,
    const real* mean, const real* inv_std, const real* weight, int has_weight,
    const real* grad_sum, const real* grad_dot, real count, int training, real* grad_x) {
  GRID_STRIDE_LOOP(i, total) {
    const index_t c = (i / inner) % channels;
    const real scale = has_weight ? inv_std[c] * weight[c] : inv_std[c];
    if (training) {
      const real normalized = (x[i] - mean[c]) * inv_std[c];
      real value = normalized * (-grad_dot[c] / count);
      value = value + grad[i];
      value = value - grad_sum[c] / count;
      grad_x[i] = value * scale;
    } else {
      grad_x[i] = grad[i] * scale;
    }
  }
}

// Layer norm: one block per row of `width` values (the normalised trailing axes).
extern "C" __global__ void layer_norm_forward(
    index_t rows, index_t width, const real* x, const real* weight, const real* bias,
    int has_weight, int has_bias, real eps, real* out, real* mean, real* inv_std) {
  __shared__ real scratch[1024];
  for (index_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const real* in = x + row * width;
    real total = 0;
    BLOCK_STRIDE_LOOP(j, width) total += in[j];
    const real average = block_sum(total, scratch) / (real)width;
    real squares = 0;
    BLOCK_STRIDE_LOOP(j, width) squares += (in[j] - average) * (in[j] - average);
    const real scale = (real)1 / sqrt(block_sum(squares, scratch) / (real)width + eps);
    BLOCK_STRIDE_LOOP(j, width) {
      real value = (in[j] - average) * scale;
      if (has_weight) value = value * weight[j];
      if (has_bias) value = value + bias[j];
      out[row * width + j] = value;
    }
    if (threadIdx.x == 0) {
      mean[row] = average;
      inv_std[row] = scale;
    }
  }
}

// Per row: subtract the mean of weight * grad and its projection on the normalised row.
extern "C" __global__ void layer_norm_backward_input(
    index_t rows, index_t width, const real* grad, const real* x, const real* mean,
    const real* inv_std, const real* weight, int has_weight, real* grad_x) {
  __shared__ real scratch[1024];
  for (index_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const index_t start = row * width;
    real total = 0, projection = 0;
    BLOCK_STRIDE_LOOP(j, width) {
      const real scaled = has_weight ? grad[start + j] * weight[j] : grad[start + j];
      total += scaled;
      projection += scaled * ((x[start + j] - mean[row]) * inv_std[row]);
    }
    const real average = block_sum(total, scratch) / (real)width;
    projection = block_sum(projection, scratch) / (real)width;
    BLOCK_STRIDE_LOOP(j, width) {
      const real scaled = has_weight ? grad[start + j] * weight[j] : grad[start + j];
      const real normalized = (x[start + j] - mean[row]) * inv_std[row];
      grad_x[start + j] = ((scaled - average) - normalized * projection) * inv_std[row];
    }
  }
}

// One block per column j of the affine parameters: sums over the rows.
extern "C" __global__ void layer_norm_backward_affine(
    index_t rows, index_t width, const real* grad, const real* x, const real* mean,
    const real* inv_std, real* grad_weight, real* grad_bias, int has_weight, int has_bias) {
  __shared__ real scratch[1024];
  for (index_t j = blockIdx.x; j < width; j += gridDim.x) {
    real dot = 0, sum = 0;
    BLOCK_STRIDE_LOOP(row, rows) {
      const real g = grad[row * width + j];
      dot += g * ((x[row * width + j] - mean[row]) * inv_std[row]);
      sum += g;
    }
    dot = block_sum(dot, scratch);
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) {
      if (has_weight) grad_weight[j] = dot;
      if (has_bias) grad_bias[j] = sum;
    }
  }
}
