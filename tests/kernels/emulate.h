// Runs CUDA kernel sources on the host, for tests on machines without a GPU.
//
// The kernels of bigdl_py/kernels/cuda use only what this header provides: the thread and
// block indices, shared memory, __syncthreads and the math library. A launch runs its
// blocks one after the other; within a block every thread is a fiber (ucontext), and the
// fibers run in turn, each up to its next __syncthreads, so a barrier holds for all of a
// block's threads before any passes it, as on a GPU. Compiled by g++ with -DREAL=float or
// double and the kernel source appended (see emulator.py).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <ucontext.h>
#include <vector>

using namespace std;

struct dim3 {
  unsigned x, y, z;
};
static dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

namespace emulator {

static ucontext_t scheduler;
static vector<ucontext_t> fibers;
static vector<bool> finished;
static unsigned current = 0;
static const function<void()>* body = nullptr;
static const size_t stack_bytes = 64 * 1024;
static vector<vector<char>> stacks;

static void run_fiber() {
  (*body)();
  finished[current] = true;
}

// Runs `kernel` as a launch of `blocks` x `threads` threads.
inline void launch(unsigned blocks, unsigned threads, const function<void()>& kernel) {
  body = &kernel;
  gridDim = {blocks, 1, 1};
  blockDim = {threads, 1, 1};
  fibers.assign(threads, ucontext_t());
  stacks.assign(threads, vector<char>(stack_bytes));
  for (unsigned block = 0; block < blocks; ++block) {
    blockIdx = {block, 0, 0};
    finished.assign(threads, false);
    for (unsigned t = 0; t < threads; ++t) {
      getcontext(&fibers[t]);
      fibers[t].uc_stack.ss_sp = stacks[t].data();
      fibers[t].uc_stack.ss_size = stack_bytes;
      fibers[t].uc_link = &scheduler;
      makecontext(&fibers[t], run_fiber, 0);
    }
    for (bool running = true; running;) {  // one round: every thread to its next barrier
      running = false;
      for (unsigned t = 0; t < threads; ++t) {
        if (finished[t]) continue;
        current = t;
        threadIdx = {t, 0, 0};
        swapcontext(&scheduler, &fibers[t]);
        running = running || !finished[t];
      }
    }
  }
}

}  // namespace emulator

inline void __syncthreads() { swapcontext(&emulator::fibers[emulator::current], &emulator::scheduler); }
