// gdr message queues, device side. Compiled at run time by NVRTC (sm_70 or newer).
//
// The structs below are the C twins of crates/gdr-mq/src/layout.rs; the static_asserts pin
// every size and offset, and a Rust unit test reads these same lines, so both sides agree.
// Memory ordering (docs/mq.md has the full table):
//   RX  host writes slot(s), then [sfence if write-combined], then doorbell.prod.
//       A worker warp loads the doorbell with ld.acquire.sys in every lane, then reads the
//       slots it was shown with volatile loads and checks each slot's seq word.
//   TX  a lane writes the response as 8-byte words (data u32, seq u32), two per 16-byte
//       store, each word carrying its owner seq: no fence between them. The host checks
//       every word's seq.
//   rx_cons (status) is written after a batch is answered, in index order: lazily.
//
// How an application's device code receives and answers messages (gdr_mq::Handler):
//   - A per-lane handler (Handler::new): the program defines
//       __device__ unsigned int handle(const unsigned char *req, unsigned int req_len,
//                                      unsigned char *resp, unsigned int resp_cap);
//     and the library's worker kernel (worker.cu, appended to the program) calls it, each lane
//     of a worker warp for its own request.
//   - An application kernel (Handler::with_kernel): the program defines the persistent kernel
//     itself, and is this header and that source only (no worker.cu, so no `handle`). It takes
//     worker.cu's parameters, block b serving queue b / blocks_per_queue, and each of its
//     warps runs the loop below (the receive and the send are warp-collective; worker.cu's
//     gdr_mq_worker is the reference):
//       extern "C" __global__ void app_worker(const gdr_mq_queue_desc *descs, gdr_u32 nqueues,
//                                             gdr_u32 blocks_per_queue, gdr_u64 idle_ns) {
//           const gdr_u32 q = blockIdx.x / blocks_per_queue;
//           if (q >= nqueues) return;
//           const gdr_u32 warp = (blockIdx.x % blocks_per_queue) * (blockDim.x / 32u)
//                                + threadIdx.x / 32u;
//           struct gdr_mq_worker w;
//           gdr_mq_worker_init(w, descs[q], warp);
//           gdr_u32 err = 0, arg = 0, reason;
//           for (;;) {
//               gdr_mq_batch b;  // lane i < b.n: request b.first + i, b.req_len bytes at b.req
//               reason = gdr_mq_recv(w, b, idle_ns, &err, &arg);
//               if (reason) break;  // stopped, idle, or a protocol error
//               gdr_u32 len = 0;     // answer into resp (16-byte aligned, max_msg bytes)
//               if (w.lane < b.n) len = ...;
//               gdr_mq_send(w, b, resp, len);
//           }
//           gdr_mq_worker_exit(w, reason, err, arg);
//       }
//     A warp that only computes (GpuConfig::receiving_warps / receiving_blocks: one warp
//     receives for its block, as in gdr-serve's worker) calls gdr_mq_worker_init and
//     gdr_mq_worker_exit and nothing else of the queue.

#ifndef GDR_MQ_DEVICE_CUH
#define GDR_MQ_DEVICE_CUH

typedef unsigned int gdr_u32;
typedef unsigned long long gdr_u64;

#define GDR_MQ_SLOT_HEADER_SIZE 16
#define GDR_MQ_WARP_BATCH 32
// A lone message read by the whole warp into gdr_mq_worker::lone_req: 512 bytes of slot a
// round (a 16-byte load a lane), the loads of every round in flight together.
#define GDR_MQ_LONE_ROUNDS 4

// Request bytes that gdr_mq_recv hands over in registers (gdr_mq_batch::head) when the
// worker asks for them (gdr_mq_worker::head_copy): what fits beside the header in the
// eight 16-byte loads of one round trip.
#define GDR_MQ_HEAD_WORDS 7
#define GDR_MQ_HEAD_BYTES (16 * GDR_MQ_HEAD_WORDS)
#define GDR_MQ_TX_HEADER_WORDS 4
#define GDR_MQ_FLAG_RX_IN_HOST 1
#define GDR_MQ_FLAG_PROFILE 2
#define GDR_MQ_FLAG_RX_WORDS 4
#define GDR_MQ_FLAG_SEQ_PUBLISHES 8
#define GDR_MQ_STATE_RUNNING 1
#define GDR_MQ_STATE_STOPPED 2
#define GDR_MQ_STATE_IDLE_TIMEOUT 3
#define GDR_MQ_STATE_FAILED 4
#define GDR_MQ_ERR_BAD_SEQ 1
#define GDR_MQ_ERR_BAD_LEN 2
#define GDR_MQ_ERR_OVERRUN 3
#define GDR_MQ_ERR_STALLED 4

// How long a worker waits for the batch before its own to be retired by another worker of the
// queue. A handler that runs longer (or a worker that stopped without marking the queue failed)
// fails the queue with GDR_MQ_ERR_STALLED instead of holding every later batch forever. A
// program may define it before this header (Handler::with_retire_timeout).
#ifndef GDR_MQ_RETIRE_TIMEOUT_NS
#define GDR_MQ_RETIRE_TIMEOUT_NS 10000000000ull
#endif

struct gdr_mq_slot_header {
    gdr_u32 seq;
    gdr_u32 len;
    gdr_u64 tag;
};
static_assert(sizeof(gdr_mq_slot_header) == 16, "layout.rs SlotHeader");

struct gdr_mq_doorbell {
    gdr_u32 prod;
    gdr_u32 stop;
};
static_assert(sizeof(gdr_mq_doorbell) == 8, "layout.rs Doorbell");

struct gdr_mq_status {
    gdr_u64 messages;
    gdr_u64 batches;
    gdr_u32 rx_cons;
    gdr_u32 state;
    gdr_u32 error;
    gdr_u32 error_arg;
    gdr_u64 profile[4];  // GDR_MQ_FLAG_PROFILE: lane 0's cycles per stage, summed
};
static_assert(sizeof(gdr_mq_status) == 64, "layout.rs QueueStatus");

struct gdr_mq_worker_state {
    gdr_u32 claim;
    gdr_u32 retired;
    gdr_u32 live;
    gdr_u32 failed;
    gdr_u64 messages;
    gdr_u64 batches;
    gdr_u64 reserved[4];
};
static_assert(sizeof(gdr_mq_worker_state) == 64, "layout.rs WorkerState");

struct gdr_mq_queue_desc {
    gdr_u64 doorbell;
    gdr_u64 rx_slots;
    gdr_u64 tx_slots;
    gdr_u64 status;
    gdr_u64 state;
    gdr_u64 scratch;
    gdr_u32 slots;
    gdr_u32 stride;
    gdr_u32 max_msg;
    gdr_u32 first_index;
    gdr_u32 flags;
    gdr_u32 workers;
    gdr_u32 scratch_per_lane;
    gdr_u32 tx_stride;
};
static_assert(sizeof(gdr_mq_queue_desc) == 80, "layout.rs QueueDesc");

// Field offsets shared with layout.rs. NVRTC has no offsetof, so they cannot be static_asserts:
// gdr_mq_layout_check (below) checks them on the device, and a Rust test checks this list
// against the Rust structs.
#define GDR_MQ_OFFSETS(X) \
    X(gdr_mq_slot_header, seq, 0) \
    X(gdr_mq_slot_header, len, 4) \
    X(gdr_mq_slot_header, tag, 8) \
    X(gdr_mq_doorbell, prod, 0) \
    X(gdr_mq_doorbell, stop, 4) \
    X(gdr_mq_status, messages, 0) \
    X(gdr_mq_status, batches, 8) \
    X(gdr_mq_status, rx_cons, 16) \
    X(gdr_mq_status, state, 20) \
    X(gdr_mq_status, error, 24) \
    X(gdr_mq_status, error_arg, 28) \
    X(gdr_mq_status, profile, 32) \
    X(gdr_mq_worker_state, claim, 0) \
    X(gdr_mq_worker_state, retired, 4) \
    X(gdr_mq_worker_state, live, 8) \
    X(gdr_mq_worker_state, failed, 12) \
    X(gdr_mq_worker_state, messages, 16) \
    X(gdr_mq_worker_state, batches, 24) \
    X(gdr_mq_queue_desc, doorbell, 0) \
    X(gdr_mq_queue_desc, rx_slots, 8) \
    X(gdr_mq_queue_desc, tx_slots, 16) \
    X(gdr_mq_queue_desc, status, 24) \
    X(gdr_mq_queue_desc, state, 32) \
    X(gdr_mq_queue_desc, scratch, 40) \
    X(gdr_mq_queue_desc, slots, 48) \
    X(gdr_mq_queue_desc, stride, 52) \
    X(gdr_mq_queue_desc, max_msg, 56) \
    X(gdr_mq_queue_desc, first_index, 60) \
    X(gdr_mq_queue_desc, flags, 64) \
    X(gdr_mq_queue_desc, workers, 68) \
    X(gdr_mq_queue_desc, scratch_per_lane, 72) \
    X(gdr_mq_queue_desc, tx_stride, 76)

// Counts the fields whose offset on the device differs from GDR_MQ_OFFSETS; 0 means the layout
// the device compiler sees is the one the host writes.
extern "C" __global__ void gdr_mq_layout_check(unsigned int *mismatches) {
    unsigned int bad = 0;
    // A local object of each type: its field addresses fold to constants. (Casting one buffer
    // to every struct type instead made NVRTC very slow over this kernel.)
#define GDR_MQ_CHECK_OFFSET(T, f, off) \
    { T probe; if ((unsigned long long)((char *)&probe.f - (char *)&probe) != (off)) ++bad; }
    GDR_MQ_OFFSETS(GDR_MQ_CHECK_OFFSET)
#undef GDR_MQ_CHECK_OFFSET
    if (threadIdx.x == 0 && blockIdx.x == 0) *mismatches = bad;
}

// ---- memory access primitives -------------------------------------------------------------

__device__ __forceinline__ gdr_u64 gdr_ld_acquire_sys_u64(const void *p) {
    gdr_u64 v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ gdr_u32 gdr_ld_acquire_gpu_u32(const void *p) {
    gdr_u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void gdr_st_release_gpu_u32(void *p, gdr_u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ gdr_u32 gdr_ld_volatile_u32(const void *p) {
    return *(const volatile gdr_u32 *)p;
}

__device__ __forceinline__ gdr_u64 gdr_ld_volatile_u64(const void *p) {
    return *(const volatile gdr_u64 *)p;
}

__device__ __forceinline__ void gdr_st_volatile_u32(void *p, gdr_u32 v) {
    *(volatile gdr_u32 *)p = v;
}

__device__ __forceinline__ void gdr_st_volatile_u64(void *p, gdr_u64 v) {
    *(volatile gdr_u64 *)p = v;
}

__device__ __forceinline__ void gdr_st_volatile_v4(void *p, uint4 v) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.x), "r"(v.y),
                 "r"(v.z), "r"(v.w)
                 : "memory");
}

// 16-byte volatile loads: from global memory (the rings), and through a generic address
// (a request that may be in shared memory, gdr_mq_worker::lone_req).
#define GDR_MQ_DEFINE_LD_VOLATILE_V4(name, space)                                    \
    __device__ __forceinline__ uint4 name(const void *p) {                           \
        uint4 v;                                                                     \
        asm volatile("ld.volatile" space ".v4.u32 {%0,%1,%2,%3}, [%4];"              \
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                    \
                     : "l"(p)                                                        \
                     : "memory");                                                    \
        return v;                                                                    \
    }
GDR_MQ_DEFINE_LD_VOLATILE_V4(gdr_ld_volatile_v4, ".global")
GDR_MQ_DEFINE_LD_VOLATILE_V4(gdr_ld_volatile_generic_v4, "")
#undef GDR_MQ_DEFINE_LD_VOLATILE_V4

__device__ __forceinline__ gdr_u64 gdr_globaltimer_ns() {
    gdr_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Copies `bytes` (rounded up to 16) from `src` to `dst`, both 16-byte aligned, eight vector
// loads in flight before their stores: over PCIe that is one round trip per 128 bytes per
// lane instead of one per 16.
__device__ __forceinline__ void gdr_mq_copy16(void *dst, const void *src, gdr_u32 bytes) {
    const gdr_u32 words = (bytes + 15u) / 16u;
    uint4 *d = (uint4 *)dst;
    const char *s = (const char *)src;
    for (gdr_u32 base = 0; base < words; base += 8) {
        uint4 r[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (base + k < words) r[k] = gdr_ld_volatile_v4(s + 16u * (base + k));
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (base + k < words) d[base + k] = r[k];
    }
}

// ---- the worker side of one queue -----------------------------------------------------------

// One worker warp's view of its queue.
struct gdr_mq_worker {
    gdr_mq_queue_desc q;
    gdr_u32 lane;
    gdr_u32 next;            // next index to claim (single-warp queues)
    gdr_u64 last_activity;   // globaltimer at the last doorbell change (updated lazily)
    gdr_u32 last_prod;
    gdr_u32 active;          // the doorbell moved since last_activity was taken
    gdr_u64 messages;        // totals (single-warp queues)
    gdr_u64 batches;
    unsigned char *req_scratch;   // this lane's request copy (RX in host memory)
    unsigned char *resp_scratch;  // this lane's response buffer
    gdr_u64 prof_mark;       // GDR_MQ_FLAG_PROFILE: clock64 at the last stage boundary
    gdr_u64 prof[4];         //   cycles summed per stage: recv, handler, tx copy, tx fence
    gdr_u32 head_copy;       // 1: gdr_mq_recv fills gdr_mq_batch::head (0 after init)
    gdr_u32 polls;           // polls of the word format (the stop flag is read every 32nd)
    // Optional (0 after init): a buffer of lone_cap bytes (16-byte aligned, shared memory
    // best) that every lane of the warp can write. When a batch is one message and max_msg
    // <= lone_cap, gdr_mq_recv reads the request's words with the whole warp (lane j a
    // 16-byte piece, one load instruction) and the lanes store them here: b.req is then
    // lone_req and b.head is not filled.
    unsigned char *lone_req;
    gdr_u32 lone_cap;
};

// Stage boundaries for GDR_MQ_FLAG_PROFILE (lane 0's view; the flag is uniform, so the
// branch costs nothing when it is off). Stage k ends now; stage -1 only starts the clock.
__device__ __forceinline__ void gdr_mq_prof(gdr_mq_worker &w, int k) {
    if (w.q.flags & GDR_MQ_FLAG_PROFILE) {
        const gdr_u64 now = clock64();
        if (k >= 0) w.prof[k] += now - w.prof_mark;
        w.prof_mark = now;
    }
}

// A claimed batch: messages [first, first + n). Lane i (< n) owns message first + i.
struct gdr_mq_batch {
    gdr_u32 first;
    gdr_u32 n;
    // This lane's request (valid when lane < n).
    const unsigned char *req;
    gdr_u32 req_len;
    gdr_u64 tag;
    // With w.head_copy: the request's first GDR_MQ_HEAD_BYTES bytes (those up to req_len are
    // the request's; words past the slot are zero), loaded in the same round trip as the
    // header. A worker that copies them into lane-local memory gives its handler a request it
    // reads from L1 instead of from L2 (RX in GPU memory: the acquire emptied L1) or from
    // scratch (RX in host memory).
    uint4 head[GDR_MQ_HEAD_WORDS];
};

__device__ __forceinline__ gdr_mq_doorbell *gdr_mq_db(const gdr_mq_worker &w) {
    return (gdr_mq_doorbell *)w.q.doorbell;
}
__device__ __forceinline__ gdr_mq_worker_state *gdr_mq_ws(const gdr_mq_worker &w) {
    return (gdr_mq_worker_state *)w.q.state;
}
__device__ __forceinline__ gdr_mq_status *gdr_mq_st(const gdr_mq_worker &w) {
    return (gdr_mq_status *)w.q.status;
}
__device__ __forceinline__ unsigned char *gdr_mq_rx_slot(const gdr_mq_worker &w, gdr_u32 i) {
    return (unsigned char *)w.q.rx_slots + (gdr_u64)(i & (w.q.slots - 1u)) * w.q.stride;
}
__device__ __forceinline__ unsigned char *gdr_mq_tx_slot(const gdr_mq_worker &w, gdr_u32 i) {
    return (unsigned char *)w.q.tx_slots + (gdr_u64)(i & (w.q.slots - 1u)) * w.q.tx_stride;
}

// Warp-collective. Sets up worker `warp` (of q.workers) of queue `q` for the calling lane.
__device__ void gdr_mq_worker_init(gdr_mq_worker &w, const gdr_mq_queue_desc &q, gdr_u32 warp) {
    w.q = q;
    w.lane = threadIdx.x & 31u;
    w.next = q.first_index;
    w.last_prod = q.first_index;
    w.last_activity = gdr_globaltimer_ns();
    w.active = 0;
    w.messages = 0;
    w.batches = 0;
    w.prof_mark = 0;
    for (int k = 0; k < 4; k++) w.prof[k] = 0;
    w.head_copy = 0;
    w.polls = 0;
    w.lone_req = 0;
    w.lone_cap = 0;
    unsigned char *mine =
        (unsigned char *)q.scratch + (gdr_u64)(warp * 32u + w.lane) * q.scratch_per_lane;
    w.req_scratch = mine;
    w.resp_scratch = mine + q.scratch_per_lane / 2u;
    if (warp == 0 && w.lane == 0) {
        gdr_st_volatile_u32(&gdr_mq_st(w)->state, GDR_MQ_STATE_RUNNING);
        __threadfence_system();
    }
    __syncwarp();
}

// Warp-collective. Called once when the warp leaves; `state` is the reason. The last warp of
// the queue to leave publishes the final state (FAILED wins over any other reason).
__device__ void gdr_mq_worker_exit(gdr_mq_worker &w, gdr_u32 state, gdr_u32 err, gdr_u32 arg) {
    if (w.lane == 0) {
        gdr_mq_worker_state *ws = gdr_mq_ws(w);
        gdr_mq_status *st = gdr_mq_st(w);
        if (err != 0) {
            gdr_st_volatile_u32(&st->error_arg, arg);
            gdr_st_volatile_u32(&st->error, err);
            atomicExch(&ws->failed, 1u);
        }
        __threadfence_system();
        if (atomicSub(&ws->live, 1u) == 1u) {
            __threadfence();
            if (*(volatile gdr_u32 *)&ws->failed) state = GDR_MQ_STATE_FAILED;
            gdr_st_volatile_u32(&st->state, state);
            __threadfence_system();
        }
    }
    __syncwarp();
}

// Lane 0, after a batch is answered: the queue's totals, its consumer index (`end`, the
// index after the batch; lazily, in index order) and, when profiling, the stage cycles.
__device__ __forceinline__ void gdr_mq_status_after_batch(const gdr_mq_worker &w, gdr_u64 messages,
                                                          gdr_u64 batches, gdr_u32 end) {
    gdr_mq_status *st = gdr_mq_st(w);
    gdr_st_volatile_u64(&st->messages, messages);
    gdr_st_volatile_u64(&st->batches, batches);
    gdr_st_volatile_u32(&st->rx_cons, end);
    if (w.q.flags & GDR_MQ_FLAG_PROFILE)
        for (int k = 0; k < 4; k++) gdr_st_volatile_u64(&st->profile[k], w.prof[k]);
}

// The idle watchdog, called every so many empty polls: true once no request has come for
// idle_ns (the time runs from the first check after the last batch). Past 200 us idle the
// warp sleeps 1 us a check, to leave the SM's issue slots to others.
__device__ __forceinline__ bool gdr_mq_idle_expired(gdr_mq_worker &w, gdr_u64 idle_ns) {
    const gdr_u64 now = gdr_globaltimer_ns();
    if (w.active) {
        w.active = 0;
        w.last_activity = now;
    }
    const gdr_u64 idle = now - w.last_activity;
    if (idle > idle_ns) return true;
    if (idle > 200000ull) __nanosleep(1000);
    return false;
}

// ---- RX in the word format (GDR_MQ_FLAG_RX_WORDS, single-warp queues) ----------------------
// A slot is 16-byte units of two 8-byte words (data u32, seq u32): unit 0 = (len, seq, tag lo,
// seq), unit 1 = (tag hi, seq, 0, seq), unit 2 + k = payload bytes 8k..8k+7. The host writes
// every word whole (stream stores of whole units), so a word that carries the message's seq
// holds the message's data: no word needs ordering against another, and the worker polls
// the slots themselves instead of the doorbell. Detecting a request and reading its first
// bytes is then one memory round trip instead of two (doorbell, then slot).

__device__ __forceinline__ bool gdr_mq_unit_ok(uint4 u, gdr_u32 seq) {
    return u.y == seq && u.w == seq;
}

// 16 payload bytes from two units.
__device__ __forceinline__ uint4 gdr_mq_unit_pair(uint4 a, uint4 b) {
    return make_uint4(a.x, a.z, b.x, b.z);
}

// The lowest k lanes (k <= 32).
__device__ __forceinline__ gdr_u32 gdr_mq_low_lanes(gdr_u32 k) {
    return k >= 32u ? 0xffffffffu : (1u << k) - 1u;
}

// Makes units [first, first + N) of a slot current where they are below `need` (the rest are
// left alone): loads them, then re-reads any unit whose words do not carry `seq` yet (a
// request's words may land in any order) until all do. A unit that never turns current is a
// protocol error (GDR_MQ_ERR_BAD_SEQ): the header promised it.
template <int N>
__device__ __forceinline__ gdr_u32 gdr_mq_units_fetch(const uint4 *slot, gdr_u32 first,
                                                      gdr_u32 need, gdr_u32 seq, uint4 (&u)[N]) {
#pragma unroll
    for (int k = 0; k < N; k++)
        if (first + k < need) u[k] = gdr_ld_volatile_v4(slot + first + k);
    for (gdr_u32 tries = 0;; tries++) {
        bool missing = false;
#pragma unroll
        for (int k = 0; k < N; k++)
            if (first + k < need && !gdr_mq_unit_ok(u[k], seq)) {
                missing = true;
                u[k] = gdr_ld_volatile_v4(slot + first + k);
            }
        if (!missing) return 0;
        if (tries >= 1000u) return GDR_MQ_ERR_BAD_SEQ;
        if (tries >= 16u) __nanosleep(1000);
    }
}

// gdr_mq_recv for word-format RX (one worker warp per queue). A poll is one memory round
// trip: lane j loads unit j of slot `next` (its header and first 240 payload bytes, one
// coalesced load instruction), and lane j >= 1 the two header units of slot next + j (the
// rest of a batch). Slot `next` is there when every unit its length needs (of the first 32)
// carries its seq, so detecting a request and reading it are the same load; the batch is the
// run of present slots from `next`. Lane 0 reads the stop flag on every 32nd poll, in the
// same round trip.
// Inlined, as every receive is: a call would take the worker's address, and the compiler
// then keeps the whole gdr_mq_worker in local memory, where each field read after a poll
// (an acquire empties L1) was an L2 round trip on the message path.
__device__ __forceinline__ gdr_u32 gdr_mq_recv_words(gdr_mq_worker &w, gdr_mq_batch &b,
                                                     gdr_u64 idle_ns, gdr_u32 *err,
                                                     gdr_u32 *arg) {
    const gdr_u32 full = 0xffffffffu;
    gdr_mq_doorbell *db = gdr_mq_db(w);
    const gdr_u32 look_lanes = w.q.slots < 32u ? w.q.slots : 32u;
    const gdr_u32 units = w.q.stride / 16u;
    // Units of slot `next` each poll reads: up to GDR_MQ_LONE_ROUNDS loads a lane in GPU
    // memory (L2 hits; a whole LeNet image is 100 units), one in host memory (PCIe reads).
    const gdr_u32 poll_max = (w.q.flags & GDR_MQ_FLAG_RX_IN_HOST) ? 32u : 32u * GDR_MQ_LONE_ROUNDS;
    const gdr_u32 poll_units = units < poll_max ? units : poll_max;
    const gdr_u32 seq0 = w.next + 1u;
    const uint4 *slot0 = (const uint4 *)gdr_mq_rx_slot(w, w.next);
    const gdr_u32 idx = w.next + w.lane;
    const gdr_u32 seq = idx + 1u;
    const uint4 *slot = (const uint4 *)gdr_mq_rx_slot(w, idx);
    const bool looks = w.lane != 0u && w.lane < look_lanes;
    // Lane 31 also reads the header units of slot next + 1 in every poll, so a poll that finds
    // slot `next` knows in the same round trip whether it came alone. Only then (a batch) do
    // lanes j >= 1 read the header units of slot next + j, one more round trip. Every poll
    // used to read all 31 of them (62 loads on as many lines), which made a poll well over
    // twice one L2 round trip; this shortens it, and a request waits half a poll on average
    // before it is seen.
    const bool peek = w.lane == 31u && look_lanes > 1u;
    const uint4 *slot1 = (const uint4 *)gdr_mq_rx_slot(w, w.next + 1u);
    uint4 u[GDR_MQ_LONE_ROUNDS], h0 = make_uint4(0, 0, 0, 0), h1 = h0;
#pragma unroll
    for (int r = 0; r < GDR_MQ_LONE_ROUNDS; r++) u[r] = h0;
    gdr_u32 spins = 0, n, len0;
    for (;;) {
        const bool check_stop = (++w.polls & 31u) == 0u;  // uniform
        gdr_u32 stop = 0;
        if (check_stop && w.lane == 0) stop = gdr_ld_volatile_u32(&db->stop);
#pragma unroll
        for (gdr_u32 r = 0; r < GDR_MQ_LONE_ROUNDS; r++)
            if (32u * r + w.lane < poll_units) u[r] = gdr_ld_volatile_v4(slot0 + 32u * r + w.lane);
        if (peek) {
            h0 = gdr_ld_volatile_v4(slot1);
            h1 = gdr_ld_volatile_v4(slot1 + 1);
        }
        // Lane 0's length (meaningful once its unit is current, which the first round's
        // `want` includes). A length above max_msg is reported below; only the header is
        // waited for then.
        len0 = __shfl_sync(full, u[0].x, 0);
        const gdr_u32 need = len0 > w.q.max_msg ? 2u : 2u + (len0 + 7u) / 8u;
        const gdr_u32 have = need < poll_units ? need : poll_units;
        bool whole = true;  // every unit of slot `next` below `have` carries seq0 (uniform)
#pragma unroll
        for (gdr_u32 r = 0; r < GDR_MQ_LONE_ROUNDS; r++) {
            if (32u * r < have) {  // uniform
                const gdr_u32 want = gdr_mq_low_lanes(have - 32u * r);
                const gdr_u32 ok = __ballot_sync(full, gdr_mq_unit_ok(u[r], seq0));
                whole = whole && (ok & want) == want;
            }
        }
        if (check_stop && __shfl_sync(full, stop, 0)) return GDR_MQ_STATE_STOPPED;
        if (whole) break;
        if ((++spins & 127u) == 0) {
            if (gdr_mq_idle_expired(w, idle_ns)) return GDR_MQ_STATE_IDLE_TIMEOUT;
        }
    }
    // Slot `next` is here. The batch is the run of present slots from it: one slot unless lane
    // 31 saw slot next + 1 in the same poll.
    n = 1u;
    if (__ballot_sync(full, peek && gdr_mq_unit_ok(h0, seq0 + 1u) && gdr_mq_unit_ok(h1, seq0 + 1u))) {
        if (looks) {
            h0 = gdr_ld_volatile_v4(slot);
            h1 = gdr_ld_volatile_v4(slot + 1);
        }
        const bool here = w.lane == 0u || (looks && gdr_mq_unit_ok(h0, seq) && gdr_mq_unit_ok(h1, seq));
        const gdr_u32 present = __ballot_sync(full, here);
        n = present == full ? 32u : __ffs(~present) - 1u;
    }
    gdr_mq_prof(w, -1);
    b.first = w.next;
    b.n = n;
    b.req = 0;
    b.req_len = 0;
    b.tag = 0;
    w.next += n;
    w.active = 1;
    gdr_u32 bad = 0;
    const gdr_u32 tag_hi0 = __shfl_sync(full, u[0].x, 1);
    if (n == 1u && w.lone_req && w.q.max_msg <= w.lone_cap) {
        // One message (uniform): its words are in the warp's registers from the poll. Every
        // lane stores its 8 request bytes a unit to the warp's buffer.
        if (len0 > w.q.max_msg) {
            if (w.lane == 0) bad = GDR_MQ_ERR_BAD_LEN;
        } else {
            const gdr_u32 need = 2u + (len0 + 7u) / 8u;
            uint2 *dst = (uint2 *)w.lone_req;  // unit j holds request bytes 8(j-2)..8(j-2)+7
#pragma unroll
            for (gdr_u32 r = 0; r < GDR_MQ_LONE_ROUNDS; r++) {
                const gdr_u32 j = 32u * r + w.lane;
                if (j >= 2u && j < need && j < poll_units) dst[j - 2u] = make_uint2(u[r].x, u[r].z);
            }
            // Units past the poll's (a long request in host memory, or beyond the rounds):
            // every load of a round in flight, then re-reads of the late ones.
            for (gdr_u32 base = poll_units; base < need; base += 32u) {
                const gdr_u32 j = base + w.lane;
                uint4 v[1];
                const gdr_u32 late = gdr_mq_units_fetch<1>(slot0, j, need, seq0, v);
                if (late) bad = late;
                else if (j < need) dst[j - 2u] = make_uint2(v[0].x, v[0].z);
            }
            if (w.lane == 0) {
                b.req_len = len0;
                b.tag = ((gdr_u64)tag_hi0 << 32) | u[0].z;
                b.req = w.lone_req;
            }
        }
        __syncwarp();  // the request is in lone_req before the handler reads it
    } else if (w.lane < n) {
        if (w.lane == 0) {
            h0 = u[0];
            h1.x = tag_hi0;
        }
        const gdr_u32 len = h0.x;
        if (len > w.q.max_msg) {
            bad = GDR_MQ_ERR_BAD_LEN;
        } else {
            const gdr_u32 need = 2u + (len + 7u) / 8u;
            uint4 *scr = (uint4 *)w.req_scratch;
            // The head (112 bytes, 14 units) in two rounds of loads, then the rest eight
            // units (64 bytes) a round, into scratch only.
            uint4 pa[8], pb[6];
#pragma unroll
            for (int k = 0; k < 8; k++) pa[k] = make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int k = 0; k < 6; k++) pb[k] = make_uint4(0, 0, 0, 0);
            bad = gdr_mq_units_fetch<8>(slot, 2u, need, seq, pa);
            if (!bad && need > 10u) bad = gdr_mq_units_fetch<6>(slot, 10u, need, seq, pb);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint4 v = gdr_mq_unit_pair(pa[2 * j], pa[2 * j + 1]);
                if (w.head_copy) b.head[j] = v;
                if (16u * j < len) scr[j] = v;
            }
#pragma unroll
            for (int j = 0; j < 3; j++) {
                const uint4 v = gdr_mq_unit_pair(pb[2 * j], pb[2 * j + 1]);
                if (w.head_copy) b.head[4 + j] = v;
                if (16u * (4 + j) < len) scr[4 + j] = v;
            }
            for (gdr_u32 c = 16u; !bad && c < need; c += 8u) {
                uint4 pc[8];
#pragma unroll
                for (int k = 0; k < 8; k++) pc[k] = make_uint4(0, 0, 0, 0);
                bad = gdr_mq_units_fetch<8>(slot, c, need, seq, pc);
#pragma unroll
                for (gdr_u32 j = 0; j < 4u; j++)
                    if (c + 2u * j < need) scr[(c - 2u) / 2u + j] = gdr_mq_unit_pair(pc[2 * j], pc[2 * j + 1]);
            }
            if (!bad) {
                b.req_len = len;
                b.tag = ((gdr_u64)h1.x << 32) | h0.z;
                b.req = w.req_scratch;
            }
        }
    }
    const gdr_u32 bad_lanes = __ballot_sync(full, bad != 0);
    if (bad_lanes) {
        const gdr_u32 src = __ffs(bad_lanes) - 1;
        *err = __shfl_sync(full, bad, src);
        *arg = b.first + src;
        return GDR_MQ_STATE_FAILED;
    }
    gdr_mq_prof(w, 0);
    return 0;
}

// ---- The lone-message loop (word-format RX in GPU memory, one worker warp) ------------------
// The latency case: one request at a time. gdr_mq_recv + handler + gdr_mq_send serve batches
// of up to 32 messages in any placement, and a lone message paid for that generality: one
// warp has nothing to overlap its dependent instructions with, so every instruction between
// seeing a lone request and issuing its response stores is on the round trip, and the
// general path has many of them (its poll alone is over twice one L2 round trip). This loop
// roughly halves the worker's profiled stages for a lone 64-byte echo and shortens the round
// trip from the host (docs/mq.md, "The lone-message loop"). It does only what a lone message
// needs:
//   - one load instruction a poll: lane j < 30 reads unit j of slot `next`, lanes 30 and 31
//     the two header units of slot next + 1 (when that one is here too, a batch follows and
//     the general path takes over);
//   - the request's payload words stored to `req` straight from the poll's registers;
//   - the response's header units made from the request's own (the TX header is the RX
//     header with the response length in it: seq, tag and the zero word are the same), and
//     lane j makes store j of the TX slot.
// A request over 224 bytes (more than 30 units) or over max_msg, and a batch, go back to the
// general path (GDR_MQ_LONE_GENERAL), which finds the same slots at once.
#define GDR_MQ_LONE_UNITS 30u
#define GDR_MQ_LONE_GENERAL 0xffffffffu

// Whether a queue's worker may run gdr_mq_lone_words: uniform.
__device__ __forceinline__ bool gdr_mq_lone_words_ok(const gdr_mq_worker &w) {
    return (w.q.flags & GDR_MQ_FLAG_RX_WORDS) && !(w.q.flags & GDR_MQ_FLAG_RX_IN_HOST) &&
           w.q.workers == 1u;
}

// Warp-collective. Serves lone messages until a batch or a request for the general path
// shows up (GDR_MQ_LONE_GENERAL) or the worker must leave (a GDR_MQ_STATE_* reason).
// `req` (224 bytes at least) and `resp` (resp_cap bytes, rounded up to 8) are buffers every
// lane can read and write, shared memory best. `app(req, len, resp)` is called by every lane of the warp and
// returns the response length in lane 0 (a length above max_msg is reported to the host as
// too long; bytes past resp_cap are sent as zeros). Its time is profile stage `app_stage`.
template <class App>
__device__ __forceinline__ gdr_u32 gdr_mq_lone_words(gdr_mq_worker &w, uint2 *req, uint2 *resp,
                                                     gdr_u32 resp_cap, int app_stage,
                                                     gdr_u64 idle_ns, App app) {
    const gdr_u32 full = 0xffffffffu;
    const gdr_u32 units = w.q.stride / 16u;
    const bool peek = w.lane >= GDR_MQ_LONE_UNITS;
    const bool loads = w.lane < units || peek;
    gdr_mq_doorbell *db = gdr_mq_db(w);
    gdr_u32 spins = 0;
    for (;;) {
        // This lane's unit: unit `lane` of slot next, or unit lane - 30 of slot next + 1.
        const gdr_u32 seq = w.next + 1u + (peek ? 1u : 0u);
        const uint4 *p = (const uint4 *)gdr_mq_rx_slot(w, seq - 1u) +
                         (peek ? w.lane - GDR_MQ_LONE_UNITS : w.lane);
        uint4 v = make_uint4(0, 0, 0, 0);
        gdr_u32 len, need;
        for (;;) {
            if (loads) v = gdr_ld_volatile_v4(p);
            const gdr_u32 m = __ballot_sync(full, v.y == seq && v.w == seq);
            if (m & 1u) {
                len = __shfl_sync(full, v.x, 0);
                need = 2u + (len + 7u) / 8u;
                if (len > w.q.max_msg || need > GDR_MQ_LONE_UNITS) return GDR_MQ_LONE_GENERAL;
                const gdr_u32 want = (1u << need) - 1u;
                if ((m & want) == want) {
                    if ((m >> GDR_MQ_LONE_UNITS) == 3u) return GDR_MQ_LONE_GENERAL;  // a batch
                    break;
                }
                // Part of the request is still on its way: poll again.
            }
            if ((++spins & 31u) == 0) {  // uniform
                gdr_u32 stop = 0;
                if (w.lane == 0) stop = gdr_ld_volatile_u32(&db->stop);
                if (__shfl_sync(full, stop, 0)) return GDR_MQ_STATE_STOPPED;
                if ((spins & 127u) == 0) {
                    if (gdr_mq_idle_expired(w, idle_ns)) return GDR_MQ_STATE_IDLE_TIMEOUT;
                }
            }
        }
        gdr_mq_prof(w, -1);
        if (w.lane >= 2u && w.lane < need) req[w.lane - 2u] = make_uint2(v.x, v.z);
        __syncwarp();  // the request is in `req` before the app reads it
        gdr_mq_prof(w, 0);
        gdr_u32 resp_len = app((const unsigned char *)req, len, (unsigned char *)resp);
        __syncwarp();  // the response is in `resp` before the other lanes read it
        gdr_mq_prof(w, app_stage);
        resp_len = __shfl_sync(full, resp_len, 0);
        const gdr_u32 copy = resp_len < w.q.max_msg ? resp_len : w.q.max_msg;
        const gdr_u32 stores = 2u + (copy + 7u) / 8u;
        uint4 *tx = (uint4 *)gdr_mq_tx_slot(w, w.next);
        // Store j: header units 0 and 1, (len, seq, tag low, seq) and (tag high, seq, 0, seq),
        // then 8 response bytes a unit, as gdr_mq_send writes them. Lanes 0 and 1 select
        // their header words rather than branch: a branch on the lane splits the warp.
        for (gdr_u32 j = w.lane; j < stores; j += 32u) {
            const gdr_u32 k = j - 2u;
            const uint2 d = j >= 2u && 8u * k < resp_cap ? resp[k] : make_uint2(0u, 0u);
            uint4 o = make_uint4(d.x, w.next + 1u, d.y, w.next + 1u);
            if (j == 0u) {
                o.x = resp_len;
                o.z = v.z;
            }
            if (j == 1u) o.x = v.x;
            gdr_st_volatile_v4(tx + j, o);
        }
        gdr_mq_prof(w, 2);
        if (w.lane == 0) gdr_mq_status_after_batch(w, ++w.messages, ++w.batches, w.next + 1u);
        w.next += 1u;
        w.active = 1;
        __syncwarp();
    }
}

// gdr_mq_recv for header-format RX (the doorbell, then the slots). `on_lone(slot, len)` is
// called by the whole warp when one message has been found that goes to the warp's
// lone-request buffer (w.lone_req), as soon as this lane's acquire covers its slot and before
// the slot is read: a caller may start moving the slot (which the acquire has made current)
// while the receive reads its header, and returns whether it did (uniform). The slot is then
// expected to be current at once: if its header does not carry the message's seq on the first
// read (a write path slower than the doorbell, which the protocol's order rules out), the
// receive fails with GDR_MQ_ERR_BAD_SEQ instead of waiting, since what the caller moved may be
// stale. A moved slot is read for its header only: b.req then points at the request in its
// slot, and lone_req is not filled. gdr_mq_recv_header passes a hook that does nothing and
// returns false.
//
// With `poll_slot` (honoured for a queue with GDR_MQ_FLAG_SEQ_PUBLISHES, one worker warp, RX
// in GPU memory and lone messages going to w.lone_req), every lane polls with one acquire the
// (seq, len) word of slot `next`, and reads the doorbell (stop, and how many messages wait) with
// a plain load issued just before it, in the same round trip. The host stores that word only
// after the slot's tag and payload, with a store fence between (docs/mq.md, "Slots their seq
// publishes"), so a current seq publishes the slot as the doorbell does, and a lone message is
// found one memory round trip sooner: on_lone(slot, len) then has its length before anything
// else of the slot is read (the caller may hand the whole request on at once; when the
// doorbell found the message, `len` is GDR_MQ_LEN_UNKNOWN). A doorbell that shows more than
// one message still makes a batch, whose lanes then acquire the doorbell before their slots:
// one round trip more a batch. (Every lane issues both loads; lane 0 polling the slot and the
// other lanes the doorbell in one acquire instruction cost more a request: docs/mq.md, "Slots
// their seq publishes".)
#define GDR_MQ_LEN_UNKNOWN 0xffffffffu
template <class OnLone>
__device__ __forceinline__ gdr_u32 gdr_mq_recv_header_hook(gdr_mq_worker &w, gdr_mq_batch &b,
                                                           gdr_u64 idle_ns, gdr_u32 *err,
                                                           gdr_u32 *arg, bool poll_slot,
                                                           OnLone on_lone) {
    const gdr_u32 full = 0xffffffffu;
    gdr_mq_doorbell *db = gdr_mq_db(w);
    gdr_mq_worker_state *ws = gdr_mq_ws(w);
    gdr_u32 spins = 0;
    gdr_u64 mine;
    gdr_u32 first, n;
    const bool lone_ok = w.lone_req && w.q.max_msg <= w.lone_cap &&
                         w.q.stride <= 512u * GDR_MQ_LONE_ROUNDS;
    poll_slot = poll_slot && lone_ok && w.q.workers == 1 && (w.q.flags & GDR_MQ_FLAG_SEQ_PUBLISHES) &&
                !(w.q.flags & (GDR_MQ_FLAG_RX_IN_HOST | GDR_MQ_FLAG_RX_WORDS));
    bool early = false;  // a lone message found by its header (uniform)
    gdr_u32 early_len = 0;
    for (;;) {
        // Every lane does its own acquire (one memory transaction for the warp), so each
        // lane's later slot reads are ordered after the doorbell it saw. With poll_slot the
        // acquire is of slot next's (seq, len) word, and the doorbell (stop, and how many
        // messages wait) a plain load issued just before it, in the same round trip.
        gdr_u64 bell;
        if (poll_slot) {
            bell = gdr_ld_volatile_u64(db);
            mine = gdr_ld_acquire_sys_u64(gdr_mq_rx_slot(w, w.next));
        } else {
            mine = gdr_ld_acquire_sys_u64(db);
            bell = mine;
        }
        const gdr_u32 prod = __shfl_sync(full, (gdr_u32)bell, 0);
        const gdr_u32 stop = __shfl_sync(full, (gdr_u32)(bell >> 32), 0);
        if (stop) return GDR_MQ_STATE_STOPPED;
        gdr_u32 c;
        if (w.q.workers == 1) {
            c = w.next;
        } else {
            if (*(volatile gdr_u32 *)&ws->failed) return GDR_MQ_STATE_FAILED;
            c = __shfl_sync(full, w.lane == 0 ? gdr_ld_volatile_u32(&ws->claim) : 0u, 0);
        }
        // The clock is read only in the idle branch below, not on the message path.
        if (prod != w.last_prod) {
            w.last_prod = prod;
            w.active = 1;
        }
        // With poll_slot the doorbell may still be behind messages taken by their headers
        // (it is stored after them): a doorbell behind `next` shows nothing, not an overrun.
        const gdr_u32 avail = poll_slot && (int)(prod - c) < 0 ? 0u : prod - c;
        if (poll_slot) {
            const gdr_u64 h = __shfl_sync(full, mine, 0);
            const gdr_u32 len = (gdr_u32)(h >> 32);
            if ((gdr_u32)h == c + 1u && avail <= 1u && len <= w.q.max_msg) {
                // Every lane reads this one slot: a lane whose own acquire saw its seq current
                // reads it at once; only a lane that saw an older word acquires the doorbell
                // first (below), instead of every lane but lane 0 waiting for the doorbell.
                if ((gdr_u32)mine != c + 1u) mine = c;
                early = true;
                early_len = len;
                n = 1u;
                first = c;
                w.next = c + 1u;
                w.active = 1;
                break;
            }
            // The lanes acquired slot c's header, not the doorbell: their slot reads below
            // acquire the doorbell first unless that showed slot c (for lane 0's slot).
            if (w.lane != 0u || (gdr_u32)h != c + 1u) mine = c;
        }
        if (avail != 0 && avail <= w.q.slots) {
            n = avail < GDR_MQ_WARP_BATCH ? avail : GDR_MQ_WARP_BATCH;
            if (w.q.workers == 1) {
                w.next = c + n;
                first = c;
                break;
            }
            gdr_u32 won = 0;
            if (w.lane == 0) won = atomicCAS(&ws->claim, c, c + n) == c;
            if (__shfl_sync(full, won, 0)) {
                first = c;
                break;
            }
            continue;
        }
        if (avail > w.q.slots && w.q.workers == 1) {
            *err = GDR_MQ_ERR_OVERRUN;
            *arg = prod;
            return GDR_MQ_STATE_FAILED;
        }
        // Nothing to do (or, with several warps, our claim view is behind: retry).
        if ((++spins & 127u) == 0) {
            if (gdr_mq_idle_expired(w, idle_ns)) return GDR_MQ_STATE_IDLE_TIMEOUT;
        }
    }
    gdr_mq_prof(w, -1);
    b.first = first;
    b.n = n;
    b.req = 0;
    b.req_len = 0;
    b.tag = 0;
    gdr_u32 bad = 0;
    if (n == 1u && lone_ok) {
        // One message (uniform): lane j loads 16 bytes j (and j + 32, ...) of the slot, one
        // coalesced load instruction per 512 bytes, all in one round trip, and the lanes
        // store the request to the warp's buffer. In host memory this replaces lane 0's
        // eight loads, which go over PCIe one after another, eight round trips; in GPU memory
        // it hands the handler its request in shared memory instead of in L2.
        const unsigned char *slot = gdr_mq_rx_slot(w, first);
        bool moved;
        // Found by its header: every lane's acquire covers the slot; the hook may move it.
        if (early) moved = on_lone(slot, early_len);
        while ((gdr_u32)mine - first - 1u >= w.q.slots) mine = gdr_ld_acquire_sys_u64(db);
        if (!early) moved = on_lone(slot, GDR_MQ_LEN_UNKNOWN);
        // A slot the hook moved is read for its header alone (the request stays in place).
        const gdr_u32 units = moved ? 1u : w.q.stride / 16u;
        uint4 v[GDR_MQ_LONE_ROUNDS];
        for (gdr_u32 tries = 0;; tries++) {
#pragma unroll
            for (gdr_u32 r = 0; r < GDR_MQ_LONE_ROUNDS; r++) {
                const gdr_u32 j = 32u * r + w.lane;
                v[r] = j < units ? gdr_ld_volatile_v4(slot + 16u * j) : make_uint4(0, 0, 0, 0);
            }
            if (__shfl_sync(full, v[0].x, 0) == first + 1u) break;
            if (moved || tries >= 1000u) {  // uniform
                if (w.lane == 0) bad = GDR_MQ_ERR_BAD_SEQ;
                break;
            }
            __nanosleep(1000);
            mine = gdr_ld_acquire_sys_u64(db);
        }
        const gdr_u32 len = __shfl_sync(full, v[0].y, 0);
        const gdr_u32 tag_lo = __shfl_sync(full, v[0].z, 0);
        const gdr_u32 tag_hi = __shfl_sync(full, v[0].w, 0);
        if (!__any_sync(full, bad != 0)) {
            if (len > w.q.max_msg) {
                if (w.lane == 0) bad = GDR_MQ_ERR_BAD_LEN;
            } else {
#pragma unroll
                for (gdr_u32 r = 0; r < GDR_MQ_LONE_ROUNDS; r++) {
                    const gdr_u32 j = 32u * r + w.lane;  // unit j holds bytes 16(j-1)..
                    if (j >= 1u && j < units && 16u * (j - 1u) < len)
                        ((uint4 *)w.lone_req)[j - 1u] = v[r];
                }
                if (w.lane == 0) {
                    b.req_len = len;
                    b.tag = ((gdr_u64)tag_hi << 32) | tag_lo;
                    b.req = moved ? slot + GDR_MQ_SLOT_HEADER_SIZE : w.lone_req;
                }
            }
        }
        __syncwarp();  // the request is in lone_req before the handler reads it
    } else if (w.lane < n) {
        const gdr_u32 idx = first + w.lane;
        // Our own acquire must cover our slot; it is the same transaction as lane 0's, so
        // this loop ends at once, but the model does not promise that.
        while ((gdr_u32)mine - idx - 1u >= w.q.slots) mine = gdr_ld_acquire_sys_u64(db);
        const unsigned char *slot = gdr_mq_rx_slot(w, idx);
        uint4 h;
        gdr_u32 tries = 0;
        for (;;) {
            if (w.q.flags & GDR_MQ_FLAG_RX_IN_HOST) {
                // Header and the first 112 payload bytes in one round trip.
                uint4 r[8];
                const gdr_u32 first_words = w.q.stride / 16u < 8u ? w.q.stride / 16u : 8u;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if ((gdr_u32)k < first_words) r[k] = gdr_ld_volatile_v4(slot + 16 * k);
                h = r[0];
                uint4 *d = (uint4 *)w.req_scratch;
#pragma unroll
                for (int k = 1; k < 8; k++)
                    if ((gdr_u32)k < first_words) d[k - 1] = r[k];
                if (w.head_copy) {
#pragma unroll
                    for (int k = 1; k < 8; k++)
                        b.head[k - 1] = (gdr_u32)k < first_words ? r[k] : make_uint4(0, 0, 0, 0);
                }
            } else {
                // The handler reads the request in place: pull its first lines into L1
                // alongside the header load (this is after the acquire, so they are current)
                // instead of one dependent L2 round trip later.
                if (tries == 0) {
#pragma unroll
                    for (gdr_u32 off = 0; off < 256u; off += 64u)
                        if (off < w.q.stride)
                            asm volatile("prefetch.global.L1 [%0];" ::"l"(slot + off));
                }
                h = gdr_ld_volatile_v4(slot);
                if (w.head_copy) {
                    // The first payload bytes in the same round trip as the header: like the
                    // header they are ordered after the doorbell acquire, so reading them
                    // alongside it is as current as reading them after its check.
                    const gdr_u32 first_words = w.q.stride / 16u < 8u ? w.q.stride / 16u : 8u;
#pragma unroll
                    for (int k = 1; k < 8; k++)
                        b.head[k - 1] = (gdr_u32)k < first_words
                                            ? gdr_ld_volatile_v4(slot + 16 * k)
                                            : make_uint4(0, 0, 0, 0);
                }
            }
            if (h.x == idx + 1u) break;
            // The doorbell promised this slot; give a slow write path a moment, then fail.
            if (++tries > 1000) {
                bad = GDR_MQ_ERR_BAD_SEQ;
                break;
            }
            __nanosleep(1000);
            mine = gdr_ld_acquire_sys_u64(db);
        }
        if (!bad && h.y > w.q.max_msg) bad = GDR_MQ_ERR_BAD_LEN;
        if (!bad) {
            b.req_len = h.y;
            b.tag = ((gdr_u64)h.w << 32) | h.z;
            if (w.q.flags & GDR_MQ_FLAG_RX_IN_HOST) {
                if (h.y > 112u)
                    gdr_mq_copy16(w.req_scratch + 112, slot + 128, h.y - 112u);
                b.req = w.req_scratch;
            } else {
                b.req = slot + GDR_MQ_SLOT_HEADER_SIZE;
            }
        }
    }
    const gdr_u32 bad_lanes = __ballot_sync(full, bad != 0);
    if (bad_lanes) {
        const gdr_u32 src = __ffs(bad_lanes) - 1;
        *err = __shfl_sync(full, bad, src);
        *arg = b.first + src;
        return GDR_MQ_STATE_FAILED;
    }
    gdr_mq_prof(w, 0);
    return 0;
}

__device__ __forceinline__ gdr_u32 gdr_mq_recv_header(gdr_mq_worker &w, gdr_mq_batch &b,
                                                      gdr_u64 idle_ns, gdr_u32 *err,
                                                      gdr_u32 *arg) {
    return gdr_mq_recv_header_hook(w, b, idle_ns, err, arg, true,
                                   [](const unsigned char *, gdr_u32) { return false; });
}

// Warp-collective receive. Waits for requests, claims up to 32 of them and gives lane i
// request first + i. Returns 0 with a batch, or a GDR_MQ_STATE_* exit reason (stop flag, idle
// longer than idle_ns, or a protocol error with *err and *arg set). Both formats are inlined
// here; a kernel that knows its queues' format calls gdr_mq_recv_header or
// gdr_mq_recv_words directly and carries the code (and registers) of one.
// A program built for one format defines GDR_MQ_RX_FORMAT_ONLY (1: words, 0: header;
// Handler::program_for) and carries only that receive.
__device__ __forceinline__ gdr_u32 gdr_mq_recv(gdr_mq_worker &w, gdr_mq_batch &b, gdr_u64 idle_ns,
                                               gdr_u32 *err, gdr_u32 *arg) {
#if defined(GDR_MQ_RX_FORMAT_ONLY) && GDR_MQ_RX_FORMAT_ONLY
    return gdr_mq_recv_words(w, b, idle_ns, err, arg);
#elif defined(GDR_MQ_RX_FORMAT_ONLY)
    return gdr_mq_recv_header(w, b, idle_ns, err, arg);
#else
    if (w.q.flags & GDR_MQ_FLAG_RX_WORDS) return gdr_mq_recv_words(w, b, idle_ns, err, arg);
    return gdr_mq_recv_header(w, b, idle_ns, err, arg);
#endif
}

// One 16-byte TX store of message `idx`: store j of its slot (0 and 1 the header words, j >= 2
// payload bytes 8(j-2) .. 8(j-2)+7 of `resp`).
__device__ __forceinline__ uint4 gdr_mq_tx_pair(gdr_u32 j, gdr_u32 seq, gdr_u32 len, gdr_u64 tag,
                                                const unsigned char *resp) {
    if (j == 0) return make_uint4(len, seq, (gdr_u32)tag, seq);
    if (j == 1) return make_uint4((gdr_u32)(tag >> 32), seq, 0u, seq);
    const uint2 d = ((const uint2 *)resp)[j - 2u];
    return make_uint4(d.x, seq, d.y, seq);
}

// Payload bytes 4k .. 4k+3 of a response as one 8-byte TX word (data, seq) of `slot`: word
// 4 + k, the one gdr_mq_tx_pair puts in half k % 2 of store 2 + k / 2. For answers written a
// word at a time by whichever thread computed it: the host checks every word's seq, so the
// words of one slot may come from several threads, in any order, with no fence.
__device__ __forceinline__ void gdr_mq_tx_word(unsigned char *slot, gdr_u32 seq, gdr_u32 k,
                                               gdr_u32 data) {
    gdr_st_volatile_u64(slot + 32u + 8u * k, ((gdr_u64)seq << 32) | data);
}

// Warp-collective send: lane i (< b.n) publishes `resp_len` bytes of `resp` (16-byte aligned)
// as the answer to request b.first + i (len above max_msg is recorded as such and the payload
// cut), then the batch retires in index order and the consumer index is written back.
//
// TX format (layout.rs, TX_WORD_SIZE): 8-byte words (data, seq), seq = idx + 1 in every word;
// words 0..3 are len, tag low, tag high, 0; then 4 payload bytes per word. Each 16-byte store
// carries two whole words, and the host checks every word's seq, so the words may land in
// any order: no __threadfence_system() (a PCIe round trip) on the response path. Nothing
// after the stores waits for them either; they drain on their own.
//
// The path is chosen per batch (the choice is uniform over the warp):
// - one message (the latency case) whose response the other lanes can read (shared or
//   global memory): lane j makes the j-th 16-byte store of the slot, so the response leaves
//   in one store instruction (per 512 bytes), a few large PCIe writes;
// - several messages (the throughput case): the warp writes the slots together, one
//   message at a time: lane k makes the k-th 16-byte store of the slot, so one store
//   instruction covers 512 contiguous bytes and leaves the GPU as a few large PCIe writes
//   instead of one 16-byte write per lane per instruction (each lane in its own slot). That
//   needs every `resp` readable by the other lanes (global or shared memory);
// - if a lane passes a local-memory buffer, each lane writes its own slot: 128 response
//   bytes loaded at a time (16-byte loads, all issued before the round's stores; the header
//   stores go out while they are in flight).
__device__ void gdr_mq_retire(gdr_mq_worker &w, const gdr_mq_batch &b);
__device__ void gdr_mq_send(gdr_mq_worker &w, const gdr_mq_batch &b, const unsigned char *resp,
                            gdr_u32 resp_len) {
    const gdr_u32 full = 0xffffffffu;
    const bool mine = w.lane < b.n;
    const gdr_u32 copy = resp_len < w.q.max_msg ? resp_len : w.q.max_msg;
    // 16-byte stores of this lane's response: 2 of header, one per 8 payload bytes.
    const gdr_u32 stores = mine ? 2u + (copy + 7u) / 8u : 0u;
    const bool shareable = __ballot_sync(full, mine && __isLocal(resp)) == 0u;
    if (b.n == 1u && shareable) {
        // One message whose response the other lanes can read (shared or global memory):
        // lane j makes store j of the slot, so the whole response leaves in one store
        // instruction, as a few large PCIe writes instead of one 16-byte write per store.
        __syncwarp();  // lane 0's response is written before the other lanes read it
        const gdr_u32 m_stores = __shfl_sync(full, stores, 0);
        const gdr_u32 m_len = __shfl_sync(full, resp_len, 0);
        const gdr_u64 m_tag = __shfl_sync(full, b.tag, 0);
        const unsigned char *m_resp =
            (const unsigned char *)__shfl_sync(full, (gdr_u64)resp, 0);
        uint4 *slot = (uint4 *)gdr_mq_tx_slot(w, b.first);
        for (gdr_u32 j = w.lane; j < m_stores; j += 32u)
            gdr_st_volatile_v4(slot + j, gdr_mq_tx_pair(j, b.first + 1u, m_len, m_tag, m_resp));
    } else if (b.n > 1u && shareable) {
        __syncwarp();  // every lane's response is written before any lane reads it
        // Rounds of the warp per message, and their exclusive prefix over the lanes: unit u
        // of the batch is round u - excl[m] of the message m with the last excl[m] <= u.
        const gdr_u32 units = (stores + 31u) / 32u;
        gdr_u32 incl = units;
#pragma unroll
        for (gdr_u32 d = 1; d < 32u; d <<= 1) {
            const gdr_u32 t = __shfl_up_sync(full, incl, d);
            if (w.lane >= d) incl += t;
        }
        const gdr_u32 excl = incl - units;
        const gdr_u32 total = __shfl_sync(full, incl, 31);
        const gdr_u64 rp = (gdr_u64)resp;
        // Eight units' loads (another lane's scratch: one L1/L2 round trip) in flight before
        // their stores.
        for (gdr_u32 base = 0; base < total; base += 8u) {
            uint4 v[8];
            uint4 *dst[8];
#pragma unroll
            for (gdr_u32 k = 0; k < 8u; k++) {
                dst[k] = 0;
                const gdr_u32 u = base + k;
                if (u < total) {  // uniform
                    const gdr_u32 m = 31u - __clz(__ballot_sync(full, mine && excl <= u));
                    const gdr_u32 j = (u - __shfl_sync(full, excl, m)) * 32u + w.lane;
                    const gdr_u32 m_stores = __shfl_sync(full, stores, m);
                    const gdr_u32 m_len = __shfl_sync(full, resp_len, m);
                    const gdr_u64 m_tag = __shfl_sync(full, b.tag, m);
                    const gdr_u64 m_resp = __shfl_sync(full, rp, m);
                    if (j < m_stores) {
                        const gdr_u32 idx = b.first + m;
                        v[k] = gdr_mq_tx_pair(j, idx + 1u, m_len, m_tag,
                                              (const unsigned char *)m_resp);
                        dst[k] = (uint4 *)gdr_mq_tx_slot(w, idx) + j;
                    }
                }
            }
#pragma unroll
            for (gdr_u32 k = 0; k < 8u; k++)
                if (dst[k]) gdr_st_volatile_v4(dst[k], v[k]);
        }
    } else if (mine) {
        const gdr_u32 idx = b.first + w.lane;
        const gdr_u32 seq = idx + 1u;
        uint4 *slot = (uint4 *)gdr_mq_tx_slot(w, idx);
        const gdr_u32 pay = stores - 2u;  // payload stores, 8 response bytes each
        const uint4 *src = (const uint4 *)resp;
        // Rounds of 16 payload stores: their eight 16-byte loads are issued together, before
        // any store (a store is a compiler barrier, so a load after one waits for it), and
        // the two header stores, which need no loaded data, leave while the loads are in
        // flight. A response up to 128 bytes costs one load round trip, not one per eight
        // stores. A half word at the end is loaded as 8 bytes: nothing past the response
        // (rounded up to 8) is read or written.
        gdr_u32 base = 0;
        do {
            uint4 r[8];
#pragma unroll
            for (gdr_u32 k = 0; k < 8u; k++) {
                const gdr_u32 p = base + 2u * k;
                if (p + 1u < pay) {
                    r[k] = src[p / 2u];
                } else if (p < pay) {
                    const uint2 h = ((const uint2 *)src)[p];
                    r[k] = make_uint4(h.x, h.y, 0u, 0u);
                }
            }
            if (base == 0) {
                gdr_st_volatile_v4(slot, make_uint4(resp_len, seq, (gdr_u32)b.tag, seq));
                gdr_st_volatile_v4(slot + 1, make_uint4((gdr_u32)(b.tag >> 32), seq, 0u, seq));
            }
#pragma unroll
            for (gdr_u32 k = 0; k < 8u; k++) {
                const gdr_u32 p = base + 2u * k;
                if (p < pay) gdr_st_volatile_v4(slot + 2u + p, make_uint4(r[k].x, seq, r[k].y, seq));
                if (p + 1u < pay)
                    gdr_st_volatile_v4(slot + 3u + p, make_uint4(r[k].z, seq, r[k].w, seq));
            }
            base += 16u;
        } while (base < pay);
    }
    gdr_mq_retire(w, b);
}

// Warp-collective: batch b is answered; it retires in index order and the consumer index is
// written back (gdr_mq_send's end). Called directly for a batch whose TX words other threads
// of the block wrote (each word carries its seq, so they need no fence before this).
__device__ void gdr_mq_retire(gdr_mq_worker &w, const gdr_mq_batch &b) {
    gdr_mq_prof(w, 2);
    gdr_mq_prof(w, 3);  // the TX fence stage: empty since the word format
    __syncwarp();
    if (w.lane == 0) {
        gdr_mq_status *st = gdr_mq_st(w);
        const gdr_u32 end = b.first + b.n;
        gdr_u64 messages, batches;
        if (w.q.workers == 1) {
            messages = (w.messages += b.n);
            batches = ++w.batches;
        } else {
            gdr_mq_worker_state *ws = gdr_mq_ws(w);
            const gdr_u64 since = gdr_globaltimer_ns();
            while (gdr_ld_acquire_gpu_u32(&ws->retired) != b.first) {
                if (*(volatile gdr_u32 *)&ws->failed) break;
                if (gdr_globaltimer_ns() - since > (gdr_u64)GDR_MQ_RETIRE_TIMEOUT_NS) {
                    gdr_st_volatile_u32(&st->error_arg, b.first);
                    gdr_st_volatile_u32(&st->error, GDR_MQ_ERR_STALLED);
                    atomicExch(&ws->failed, 1u);
                    break;
                }
            }
            volatile gdr_u64 *tot = (volatile gdr_u64 *)&ws->messages;
            messages = tot[0] + b.n;
            batches = tot[1] + 1;
            tot[0] = messages;
            tot[1] = batches;
            gdr_st_release_gpu_u32(&ws->retired, end);
        }
        gdr_mq_status_after_batch(w, messages, batches, end);
    }
    __syncwarp();
}

#endif // GDR_MQ_DEVICE_CUH
