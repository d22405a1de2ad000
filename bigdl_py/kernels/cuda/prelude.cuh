// Shared by every kernel source (prepended to it). REAL, float or double, comes from the
// compiler options (-DREAL=float): each source is compiled once per dtype.
typedef REAL real;
typedef long long index_t;

// NVRTC includes no headers: the math functions are built in, INFINITY is not.
#define REAL_INFINITY ((real)__builtin_huge_val())

// One element per thread over any n: each thread strides by the whole grid.
#define GRID_STRIDE_LOOP(i, n)                                                     \
  for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < (index_t)(n); \
       i += (index_t)blockDim.x * gridDim.x)

// A block's threads stride over one row of `width` elements (one block per row).
#define BLOCK_STRIDE_LOOP(j, width) \
  for (index_t j = threadIdx.x; j < (index_t)(width); j += blockDim.x)

// The sum over the block of each thread's `value`; every thread gets it. blockDim.x is a
// power of two, at most 1024; `scratch` holds blockDim.x values in shared memory. Shared
// memory and barriers only (no warp shuffles), in a fixed order: the same sum every run.
__device__ inline real block_sum(real value, real* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) scratch[threadIdx.x] += scratch[threadIdx.x + half];
    __syncthreads();
  }
  real total = scratch[0];
  __syncthreads();
  return total;
}

// The largest of each thread's `value` over the block (as block_sum).
__device__ inline real block_max(real value, real* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) scratch[threadIdx.x] = fmax(scratch[threadIdx.x], scratch[threadIdx.x + half]);
    __syncthreads();
  }
  real largest = scratch[0];
  __syncthreads();
  return largest;
}
