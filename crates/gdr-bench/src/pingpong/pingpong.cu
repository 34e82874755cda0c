// Ping-pong between the CPU and one persistent GPU thread.
//
// Round i: the CPU stores i into `flag`; the GPU thread, spinning on volatile loads of `flag`,
// sees it and stores i into `answer`; the CPU spins on `answer`. Either word may live in GPU
// memory (the CPU reaches it through the BAR1 mapping) or in mapped host memory (the GPU
// reaches it over PCIe). The thread gives up after `timeout_ns` without progress (watchdog)
// and reports that by storing 0xFFFFFFFF into `answer`.
//
// Two knobs of the GPU loop (gdr_bench::pingpong::GpuLoop), so their cost can be timed:
// - `timer_every`: polls of `flag` between two reads of %globaltimer for the watchdog (1: every
//   poll; each read lengthens the poll loop, and so the time to notice the flag);
// - `fence`: __threadfence_system() after the answer. The answer is one aligned volatile store
//   that leaves the SM by itself; the fence makes the thread wait for it to land before it
//   polls again. Where the flag is in host memory that matters: a poll is a PCIe read, and one
//   sent at once samples the flag before the CPU can have written the next value.

static __device__ __forceinline__ unsigned long long gdr_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void gdr_pingpong(volatile unsigned int *flag, volatile unsigned int *answer,
                                        unsigned int rounds, unsigned long long timeout_ns,
                                        unsigned int timer_every, unsigned int fence) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    if (timer_every == 0) timer_every = 1;
    for (unsigned int i = 1; i <= rounds; ++i) {
        unsigned long long start = gdr_now_ns();
        unsigned int seen, polls = 0;
        while ((seen = *flag) < i) {
            if (++polls < timer_every) continue;
            polls = 0;
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
        if (fence) __threadfence_system();
    }
}

// The host-centric baseline: one launch per request; reads the request word, answers it.
extern "C" __global__ void gdr_answer_once(const unsigned int *req, unsigned int *resp) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *resp = *req + 1;
}
