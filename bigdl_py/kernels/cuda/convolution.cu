// 2-d convolution's data movement around its GEMMs (kernels/convolution.py has the NumPy
// twins; bigdl_py/autograd/ops/conv_device.py runs them). A tile is `samples` samples from
// `first`; its columns are (channels * kernel_h * kernel_w, samples * out_h * out_w), rows in
// (channel, kernel row, kernel column) order, columns in (sample, output row, output column)
// order, so a group's rows are one block and the product with the weight (O, C*KH*KW) is one
// 2-d GEMM. One thread per written element; nothing is zeroed first.

// The convolution's shape, passed as 13 ints in every launch (no device copy to make).
struct Geometry {
  int channels, height, width, kernel_h, kernel_w, pad_h, pad_w, stride_h, stride_w,
      dilation_h, dilation_w, out_h, out_w;
};
#define GEOMETRY_PARAMETERS                                                              \
  int channels, int height, int width, int kernel_h, int kernel_w, int pad_h, int pad_w, \
      int stride_h, int stride_w, int dilation_h, int dilation_w, int out_h, int out_w
#define GEOMETRY                                                                       \
  const Geometry g = {channels, height, width, kernel_h, kernel_w, pad_h, pad_w,       \
                      stride_h, stride_w, dilation_h, dilation_w, out_h, out_w}

// columns[row, column] = the input value window (column) sees at kernel tap (row), or 0 in
// the padding.
extern "C" __global__ void im2col(
    index_t total, const real* x, index_t first, index_t samples, GEOMETRY_PARAMETERS,
    real* columns) {
  GEOMETRY;
  const index_t area = (index_t)g.out_h * g.out_w;
  const index_t tile_width = samples * area;
  GRID_STRIDE_LOOP(i, total) {
    const index_t row = i / tile_width, column = i % tile_width;
    const index_t sample = column / area, position = column % area;
    const int oh = (int)(position / g.out_w), ow = (int)(position % g.out_w);
    const int kw = (int)(row % g.kernel_w), kh = (int)((row / g.kernel_w) % g.kernel_h);
    const index_t c = row / ((index_t)g.kernel_h * g.kernel_w);
    const int ih = oh * g.stride_h - g.pad_h + kh * g.dilation_h;
    const int iw = ow * g.stride_w - g.pad_w + kw * g.dilation_w;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    columns[i] = inside
        ? x[(((first + sample) * g.channels + c) * g.height + ih) * g.width + iw]
        : (real)0;
  }
}

// The adjoint of im2col: each input position of the tile sums the column entries of the
// windows that read it (kernel rows outer, columns inner), and is written once.
extern "C" __global__ void col2im(
    index_t total, const real* columns, index_t first, index_t samples, GEOMETRY_PARAMETERS,
    real* x_grad) {
  GEOMETRY;
  const index_t area = (index_t)g.out_h * g.out_w;
  const index_t tile_width = samples * area;
  const index_t image = (index_t)g.height * g.width;
  GRID_STRIDE_LOOP(i, total) {
    const index_t sample = i / (g.channels * image);
    const index_t c = (i / image) % g.channels;
    const int ih = (int)((i % image) / g.width), iw = (int)(i % g.width);
    real value = 0;
    for (int kh = 0; kh < g.kernel_h; ++kh) {
      const int row_offset = ih + g.pad_h - kh * g.dilation_h;
      if (row_offset < 0 || row_offset % g.stride_h != 0) continue;
      const int oh = row_offset / g.stride_h;
      if (oh >= g.out_h) continue;
      for (int kw = 0; kw < g.kernel_w; ++kw) {
        const int column_offset = iw + g.pad_w - kw * g.dilation_w;
        if (column_offset < 0 || column_offset % g.stride_w != 0) continue;
        const int ow = column_offset / g.stride_w;
        if (ow >= g.out_w) continue;
        const index_t row = (c * g.kernel_h + kh) * g.kernel_w + kw;
        value += columns[row * tile_width + sample * area + (index_t)oh * g.out_w + ow];
      }
    }
    x_grad[((first + sample) * g.channels + c) * image + (i % image)] = value;
  }
}

// out[first + s, o, l] = product[o, s * area + l] (+ bias[o]): a tile's GEMM result into NCHW.
extern "C" __global__ void conv_store(
    index_t total, const real* product, const real* bias, int has_bias, index_t first,
    index_t samples, index_t out_channels, index_t area, real* out) {
  GRID_STRIDE_LOOP(i, total) {
    const index_t sample = i / (out_channels * area);
    const index_t o = (i / area) % out_channels, l = i % area;
    const real value = product[o * (samples * area) + sample * area + l];
    out[(first + sample) * out_channels * area + o * area + l] =
        has_bias ? value + bias[o] : value;
  }
}

// matrix[o, s * area + l] = grad[first + s, o, l]: a tile of NCHW as the GEMMs take it.
extern "C" __global__ void conv_gather(
    index_t total, const real* grad, index_t first, index_t samples, index_t out_channels,
    index_t area, real* matrix) {
  GRID_STRIDE_LOOP(i, total) {
    const index_t o = i / (samples * area);
    const index_t sample = (i / area) % samples, l = i % area;
    matrix[i] = grad[(first + sample) * out_channels * area + o * area + l];
  }
}
