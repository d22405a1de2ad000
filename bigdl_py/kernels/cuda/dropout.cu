// Dropout from a counter-based generator, Philox4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011; the generator of cuRAND's and PyTorch's dropout).
// Element i's 32 random bits are word i % 4 of Philox(counter = offset + i / 4, key =
// seed): any thread computes any element's bits without a state of its own, so the
// backward regenerates the forward's mask instead of keeping it, and the generator's
// state is two device words, [seed, offset], that a launch reads and never the host.
// kernels/dropout.py has the NumPy twins; element i is kept where its bits >= threshold
// (ceil(p * 2**32)).

typedef unsigned int word_t;
typedef unsigned long long counter_t;

__device__ inline void philox_round(word_t* c, word_t k0, word_t k1) {
  const counter_t p0 = (counter_t)0xD2511F53u * c[0];
  const counter_t p1 = (counter_t)0xCD9E8D57u * c[2];
  const word_t hi0 = (word_t)(p0 >> 32), lo0 = (word_t)p0;
  const word_t hi1 = (word_t)(p1 >> 32), lo1 = (word_t)p1;
  c[0] = hi1 ^ c[1] ^ k0;
  c[1] = lo1;
  c[2] = hi0 ^ c[3] ^ k1;
  c[3] = lo0;
}

// The four 32-bit words of block `group` of the stream `state` = [seed, offset].
__device__ inline void philox_words(const counter_t* state, counter_t group, word_t* c) {
  const counter_t counter = state[1] + group;
  c[0] = (word_t)counter;
  c[1] = (word_t)(counter >> 32);
  c[2] = 0;
  c[3] = 0;
  word_t k0 = (word_t)state[0], k1 = (word_t)(state[0] >> 32);
  for (int round = 0; round < 10; ++round) {
    philox_round(c, k0, k1);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// taken = state (the stream of this draw); state's offset moves past `groups` blocks.
extern "C" __global__ void philox_take(counter_t* state, counter_t* taken, counter_t groups) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    taken[0] = state[0];
    taken[1] = state[1];
    state[1] = state[1] + groups;
  }
}

extern "C" __global__ void dropout_mask(
    index_t n, const counter_t* state, counter_t threshold, bool* keep) {
  GRID_STRIDE_LOOP(group, (n + 3) / 4) {
    word_t c[4];
    philox_words(state, (counter_t)group, c);
    for (int k = 0; k < 4 && group * 4 + k < n; ++k) keep[group * 4 + k] = c[k] >= threshold;
  }
}

// y = x * keep * scale (grad_x from grad alike in the backward: the same kernel).
extern "C" __global__ void dropout_apply(
    index_t n, const real* x, const counter_t* state, counter_t threshold, real scale, real* y) {
  GRID_STRIDE_LOOP(group, (n + 3) / 4) {
    word_t c[4];
    philox_words(state, (counter_t)group, c);
    for (int k = 0; k < 4 && group * 4 + k < n; ++k) {
      const index_t i = group * 4 + k;
      y[i] = x[i] * (real)(c[k] >= threshold) * scale;
    }
  }
}
