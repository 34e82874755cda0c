// gdr message queues: the persistent worker kernel. For a per-lane handler (Handler::new) the
// library puts device.cuh, then the user's handler (which must define `handle`), then this
// file into one NVRTC program. A program with an application kernel of its own
// (Handler::with_kernel, the hook device.cuh describes) leaves this file out.
//
//   __device__ unsigned int handle(const unsigned char *req, unsigned int req_len,
//                                  unsigned char *resp, unsigned int resp_cap);
//
// returns the response length (a value above resp_cap is reported to the host as an error
// for that message). `req` and `resp` are 16-byte aligned.

// Largest max_msg for which a one-message batch's response goes to a small per-warp buffer
// (shared memory, or lane-local memory for warps past GDR_MQ_SHARED_WARPS).
#define GDR_MQ_LOCAL_RESP_BYTES 256
// Warps of a block with a shared-memory buffer for a lone message (its request head and its
// response): 8 * 512 bytes of static shared memory per block.
#define GDR_MQ_SHARED_WARPS 8

// Grid: nqueues * blocks_per_queue blocks of whole warps. Block b serves queue
// b / blocks_per_queue; every warp is one worker of that queue.
//
// A lone message (the latency case) stays in shared memory on its way through the handler:
// gdr_mq_recv reads the slot with the whole warp and stores the request to the warp's shared
// buffer (w.lone_req) itself (max_msg up to GDR_MQ_LOCAL_RESP_BYTES; past that a short
// request's first bytes arrive in registers with its header, gdr_mq_batch::head, and are
// stored here); its response is written to the warp's shared response buffer that
// gdr_mq_send reads back (every lane a 16-byte piece). Each of those store-then-load pairs is
// a shared memory round trip, a fraction of an L2 one. Through global scratch each was a store
// that empties the L1 line and a load that goes to L2 again; through lane-local memory the
// profile still showed about an L2 round trip for each. In a batch, each lane's short request
// goes to a lane-local array and its response to the lane's global scratch (the coalesced TX
// stores read other lanes' responses).
extern "C" __global__ void gdr_mq_worker(const gdr_mq_queue_desc *descs, gdr_u32 nqueues,
                                         gdr_u32 blocks_per_queue, gdr_u64 idle_ns) {
    const gdr_u32 q = blockIdx.x / blocks_per_queue;
    if (q >= nqueues) return;
    const gdr_u32 warps_per_block = blockDim.x / 32u;
    const gdr_u32 warp = (blockIdx.x % blocks_per_queue) * warps_per_block + threadIdx.x / 32u;
    struct gdr_mq_worker w;  // "struct": the kernel below has the same name
    gdr_mq_worker_init(w, descs[q], warp);
    __shared__ uint4 lone_req[GDR_MQ_SHARED_WARPS][GDR_MQ_LOCAL_RESP_BYTES / 16];
    __shared__ uint4 lone_resp[GDR_MQ_SHARED_WARPS][GDR_MQ_LOCAL_RESP_BYTES / 16];
    const gdr_u32 wib = threadIdx.x / 32u;
    const bool has_shared = wib < GDR_MQ_SHARED_WARPS;
    w.head_copy = 1;
    // The warp's buffers as generic pointers, made once: inside the loop each took two
    // special-register reads on the lone message's path.
    unsigned char *const my_lone_resp = has_shared ? (unsigned char *)lone_resp[wib] : 0;
    uint4 *const my_lone_req = has_shared ? lone_req[wib] : 0;
    if (has_shared) {
        // gdr_mq_recv may deliver a lone request here itself (warp-wide loads).
        w.lone_req = (unsigned char *)my_lone_req;
        w.lone_cap = GDR_MQ_LOCAL_RESP_BYTES;
    }
    gdr_u32 err = 0, arg = 0, reason;
    // Lone messages of the word format take gdr_mq_lone_words (device.cuh) until a batch
    // or a request it leaves to the general path below shows up.
    // A program built for the header format only carries no lone loop.
#if defined(GDR_MQ_RX_FORMAT_ONLY) && !GDR_MQ_RX_FORMAT_ONLY
    const bool lone_loop = false;
#else
    const bool lone_loop = has_shared && w.q.max_msg <= GDR_MQ_LOCAL_RESP_BYTES &&
                           gdr_mq_lone_words_ok(w);
#endif
    for (;;) {
        if (lone_loop) {
            reason = gdr_mq_lone_words(
                w, (uint2 *)my_lone_req, (uint2 *)my_lone_resp, w.q.max_msg, 1, idle_ns,
                [&](const unsigned char *req, gdr_u32 len, unsigned char *resp) {
                    return w.lane == 0 ? handle(req, len, resp, w.q.max_msg) : 0u;
                });
            if (reason != GDR_MQ_LONE_GENERAL) break;
        }
        gdr_mq_batch b;
        reason = gdr_mq_recv(w, b, idle_ns, &err, &arg);
        if (reason) break;
        uint4 req_local[GDR_MQ_HEAD_WORDS];
        uint4 resp_local[GDR_MQ_LOCAL_RESP_BYTES / 16];
        // Uniform: a lone message may have its response in a warp buffer (shared memory, or
        // lane-local past GDR_MQ_SHARED_WARPS, which gdr_mq_send writes out per lane); a
        // batch's coalesced stores read other lanes' responses, so those go to scratch. The
        // lone message's lane is lane 0, the only user of the warp's shared buffers.
        const bool lone = b.n == 1u && w.q.max_msg <= GDR_MQ_LOCAL_RESP_BYTES;
        const bool lone_shared = lone && has_shared;
        unsigned char *resp = lone_shared ? my_lone_resp
                              : lone      ? (unsigned char *)resp_local
                                          : w.resp_scratch;
        gdr_u32 resp_len = 0;
        if (w.lane < b.n) {
            const unsigned char *req = b.req;
            if (req != w.lone_req && b.req_len <= GDR_MQ_HEAD_BYTES) {
                uint4 *copy = lone_shared ? my_lone_req : req_local;
#pragma unroll
                for (int k = 0; k < GDR_MQ_HEAD_WORDS; k++) copy[k] = b.head[k];
                req = (const unsigned char *)copy;
            }
            resp_len = handle(req, b.req_len, resp, w.q.max_msg);
        }
        gdr_mq_prof(w, 1);
        gdr_mq_send(w, b, resp, resp_len);
    }
    gdr_mq_worker_exit(w, reason, err, arg);
}

// The host-centric baseline (HostCentricSlot, gdr-bench's HostCentric): one launch per
// request, the same handler, one thread.
extern "C" __global__ void gdr_mq_oneshot(const unsigned char *req, gdr_u32 req_len,
                                          unsigned char *resp, gdr_u32 resp_cap,
                                          gdr_u32 *resp_len) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *resp_len = handle(req, req_len, resp, resp_cap);
}
