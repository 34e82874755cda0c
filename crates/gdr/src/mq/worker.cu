// gdr message queues: the persistent worker kernel. The library puts device.cuh, then the
// user's handler (which must define `handle`), then this file into one NVRTC program.
//
//   __device__ unsigned int handle(const unsigned char *req, unsigned int req_len,
//                                  unsigned char *resp, unsigned int resp_cap);
//
// returns the response length (a value above resp_cap is reported to the host as an error
// for that message). `req` and `resp` are 16-byte aligned.

// Grid: nqueues * blocks_per_queue blocks of whole warps. Block b serves queue
// b / blocks_per_queue; every warp is one worker of that queue.
extern "C" __global__ void gdr_mq_worker(const gdr_mq_queue_desc *descs, gdr_u32 nqueues,
                                         gdr_u32 blocks_per_queue, gdr_u64 idle_ns) {
    const gdr_u32 q = blockIdx.x / blocks_per_queue;
    if (q >= nqueues) return;
    const gdr_u32 warps_per_block = blockDim.x / 32u;
    const gdr_u32 warp = (blockIdx.x % blocks_per_queue) * warps_per_block + threadIdx.x / 32u;
    struct gdr_mq_worker w;  // "struct": the kernel below has the same name
    gdr_mq_worker_init(w, descs[q], warp);
    gdr_u32 err = 0, arg = 0, reason;
    for (;;) {
        gdr_mq_batch b;
        reason = gdr_mq_recv(w, b, idle_ns, &err, &arg);
        if (reason) break;
        gdr_u32 resp_len = 0;
        if (w.lane < b.n) resp_len = handle(b.req, b.req_len, w.resp_scratch, w.q.max_msg);
        gdr_mq_prof(w, 1);
        gdr_mq_send(w, b, w.resp_scratch, resp_len);
    }
    gdr_mq_worker_exit(w, reason, err, arg);
}

// The host-centric baseline: one launch per request, the same handler, one thread.
extern "C" __global__ void gdr_mq_oneshot(const unsigned char *req, gdr_u32 req_len,
                                          unsigned char *resp, gdr_u32 resp_cap,
                                          gdr_u32 *resp_len) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *resp_len = handle(req, req_len, resp, resp_cap);
}
