// Ping-pong between the CPU and one persistent GPU thread.
//
// Round i: the CPU stores i into `flag`; the GPU thread, spinning on volatile loads of `flag`,
// sees it and stores i into `answer`; the CPU spins on `answer`. Either word may live in GPU
// memory (the CPU reaches it through the BAR1 mapping) or in mapped host memory (the GPU
// reaches it over PCIe). The thread gives up after `timeout_ns` without progress (watchdog)
// and reports that by storing 0xFFFFFFFF into `answer`.
//
// The knobs of the GPU loop (gdr_bench::pingpong::GpuLoop), so their cost can be timed:
// - `pollers` (the launch, not a parameter): one thread polls (gdr_pingpong), or lane 0 of
//   each of several warps (gdr_pingpong_pollers, below), or with `blocks` thread 0 of each of
//   several blocks (gdr_pingpong_blocks);
// - `timer_every`: polls of `flag` between two reads of %globaltimer for the watchdog (1: every
//   poll; each read lengthens the poll loop, and so the time to notice the flag);
// - `fence`: __threadfence_system() after the answer. The answer is one aligned volatile store
//   that leaves the SM by itself; the fence makes the thread wait for it to land before it
//   polls again. Where the flag is in host memory that matters: a poll is a PCIe read, and one
//   sent at once samples the flag before the CPU can have written the next value.
// - `loads` (gdr_pingpong only; 1 to 8): volatile loads of the flag issued back to back in one
//   poll, so that several are in flight and the flag is sampled that much more often.
// - `stride` (gdr_pingpong_blocks only): words between one block's flag and answer and the
//   next block's (a 128-byte line each).

static __device__ __forceinline__ unsigned long long gdr_now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One poll: the largest of `loads` volatile loads of the flag, issued before any is used.
static __device__ __forceinline__ unsigned int gdr_poll(volatile unsigned int *flag,
                                                        unsigned int loads) {
    unsigned int seen = *flag;
#pragma unroll
    for (unsigned int k = 1; k < 8; ++k) {
        if (k < loads) seen = max(seen, *flag);
    }
    return seen;
}

extern "C" __global__ void gdr_pingpong(volatile unsigned int *flag, volatile unsigned int *answer,
                                        unsigned int rounds, unsigned long long timeout_ns,
                                        unsigned int timer_every, unsigned int fence,
                                        unsigned int loads, unsigned int stride) {
    (void)stride;  // one poller, one flag
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    if (timer_every == 0) timer_every = 1;
    for (unsigned int i = 1; i <= rounds; ++i) {
        unsigned long long start = gdr_now_ns();
        unsigned int seen, polls = 0;
        while ((seen = gdr_poll(flag, loads)) < i) {
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

// The same with several pollers: lane 0 of each warp of the block polls the flag; the first to
// see round r's flag claims the round with a compare-and-swap on a shared counter and answers
// it, so each round is answered once and in order. The pollers are at different points of
// their loops (and, with the flag in host memory, each has its own PCIe read in flight), so
// one of them sees a new flag sooner than a single poller would.
extern "C" __global__ void gdr_pingpong_pollers(volatile unsigned int *flag,
                                                volatile unsigned int *answer, unsigned int rounds,
                                                unsigned long long timeout_ns,
                                                unsigned int timer_every, unsigned int fence,
                                                unsigned int loads, unsigned int stride) {
    (void)loads;  // one load a poll: the pollers are the loads in flight here
    (void)stride;  // one flag
    __shared__ unsigned int answered;  // rounds answered so far (0xFFFFFFFF: given up)
    if (threadIdx.x == 0) answered = 0;
    __syncthreads();
    if ((threadIdx.x & 31) != 0 || blockIdx.x != 0) return;
    if (timer_every == 0) timer_every = 1;
    volatile unsigned int *done = &answered;
    unsigned long long start = gdr_now_ns();
    unsigned int polls = 0, last = 0;
    for (;;) {
        unsigned int r = *done;
        if (r >= rounds) return;  // all answered, given up, or stopped
        if (r != last) {          // progress restarts this poller's watchdog
            last = r;
            start = gdr_now_ns();
        }
        unsigned int seen = *flag;
        if (seen == 0xFFFFFFFFu) {  // the host asked us to stop
            atomicExch(&answered, 0xFFFFFFFFu);
            return;
        }
        if (seen > r) {  // round r + 1's flag: claim it and answer
            if (atomicCAS(&answered, r, r + 1) == r) {
                *answer = r + 1;
                if (fence) __threadfence_system();
            }
            continue;
        }
        if (++polls < timer_every) continue;
        polls = 0;
        if (gdr_now_ns() - start > timeout_ns) {
            if (atomicCAS(&answered, r, 0xFFFFFFFFu) == r) {
                *answer = 0xFFFFFFFFu;
                __threadfence_system();
            }
            return;
        }
    }
}

// Pollers in separate blocks (one thread each), each with its own copy of the flag and of the
// answer, a line apart (`stride` words): the CPU writes every flag copy and takes the first
// answer that has its round. Nothing is shared between the blocks, so no claim: each block
// answers every round it sees, skipping to the newest flag when it falls behind, and the
// blocks' PCIe reads of host memory come from different SMs. (Pollers that are warps of one
// block, on one flag or on a flag line each, are slower than one poller where the flag is
// in host memory.)
extern "C" __global__ void gdr_pingpong_blocks(volatile unsigned int *flag,
                                               volatile unsigned int *answer, unsigned int rounds,
                                               unsigned long long timeout_ns,
                                               unsigned int timer_every, unsigned int fence,
                                               unsigned int loads, unsigned int stride) {
    (void)loads;
    if (threadIdx.x != 0) return;
    flag += blockIdx.x * stride;
    answer += blockIdx.x * stride;
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
        if (seen == 0xFFFFFFFFu) return;  // the host asked us to stop
        i = seen;                         // a block that fell behind answers the newest round
        *answer = i;
        if (fence) __threadfence_system();
    }
}

// The host-centric baseline: one launch per request; reads the request word, answers it.
extern "C" __global__ void gdr_answer_once(const unsigned int *req, unsigned int *resp) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *resp = *req + 1;
}
