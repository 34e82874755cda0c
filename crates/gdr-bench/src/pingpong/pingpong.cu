// Ping-pong between the CPU and one persistent GPU thread.
//
// Round i: the CPU stores i into `flag`; the GPU thread, spinning on volatile loads of `flag`,
// sees it, stores i into `answer` and fences (__threadfence_system) so the store leaves the GPU
// before the next round's load; the CPU spins on `answer`. Either word may live in GPU memory
// (the CPU reaches it through the BAR1 mapping) or in mapped host memory (the GPU reaches it
// over PCIe). The thread gives up after `timeout_ns` without progress (watchdog) and reports
// that by storing 0xFFFFFFFF into `answer`.

static __device__ __forceinline__ unsigned long long gdr_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void gdr_pingpong(volatile unsigned int *flag, volatile unsigned int *answer,
                                        unsigned int rounds, unsigned long long timeout_ns) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    for (unsigned int i = 1; i <= rounds; ++i) {
        unsigned long long start = gdr_now_ns();
        unsigned int seen;
        while ((seen = *flag) < i) {
            if (gdr_now_ns() - start > timeout_ns) {
                *answer = 0xFFFFFFFFu;
                __threadfence_system();
                return;
            }
        }
        if (seen == 0xFFFFFFFFu) {  // the host asked us to stop
            return;
        }
        *answer = i;
        __threadfence_system();
    }
}

// The host-centric baseline: one launch per request; reads the request word, answers it.
extern "C" __global__ void gdr_answer_once(const unsigned int *req, unsigned int *resp) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *resp = *req + 1;
}
