// LeNet-5 on a 28x28 u8 image -> 10 f32 logits; the twin of crates/gdr-serve/src/lenet.rs.
// The host defines GDR_LENET_SEED and GDR_LENET_LAYERS (start, count, bits of 2*scale) before
// this file, from the same numbers the CPU reference uses.

#define GDR_LENET_C1W 0
#define GDR_LENET_C1B 150
#define GDR_LENET_C2W 156
#define GDR_LENET_C2B 2556
#define GDR_LENET_F1W 2572
#define GDR_LENET_F1B 33292
#define GDR_LENET_F2W 33412
#define GDR_LENET_F2B 43492
#define GDR_LENET_F3W 43576
#define GDR_LENET_F3B 44416
#define GDR_LENET_TOTAL 44426

// Rounded up so that the FC part (from GDR_LENET_F1W) is a whole number of float4s.
#define GDR_LENET_W_FLOATS 44428

// 128-byte aligned: the FC weights are prefetched line by line.
__device__ __align__(128) float gdr_lenet_w[GDR_LENET_W_FLOATS];

// The FC weights and biases are the app's resident data (serve.cuh): in a persistent worker's
// shared memory where the GPU has room for 167 KB more (Hopper), read from there on every
// request; elsewhere prefetched from global memory into L1 on each request.
#define GDR_SERVE_RESIDENT_FLOATS (GDR_LENET_W_FLOATS - GDR_LENET_F1W)
#define GDR_SERVE_RESIDENT_SRC (gdr_lenet_w + GDR_LENET_F1W)

// The block's shared constants (serve.cuh): 1/255 steps of the input bytes, and the conv
// weights with every 5x5 kernel padded to 28 floats so it loads as seven float4s.
#define GDR_LENET_K_LUT 0     // [256]: b / 255 (exactly as the CPU divides)
#define GDR_LENET_K_C1W 256   // [6][28]
#define GDR_LENET_K_C1B 424   // [6], 2 padding
#define GDR_LENET_K_C2W 432   // [16][6][28]
#define GDR_LENET_K_C2B 3120  // [16]
#define GDR_SERVE_CONST_FLOATS 3136

__device__ __forceinline__ unsigned int gdr_lenet_hash(unsigned int seed, unsigned int i) {
    unsigned int h = seed ^ (i * 0x9e3779b9u);
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return h;
}

// Fills every weight; thread t of n. Exactly rounded steps, as lenet.rs's `weight`.
__device__ void gdr_lenet_init(unsigned int t, unsigned int n) {
    const unsigned int layers[10][3] = GDR_LENET_LAYERS;
    for (int l = 0; l < 10; l++) {
        const float s2 = __uint_as_float(layers[l][2]);
        for (unsigned int i = layers[l][0] + t; i < layers[l][0] + layers[l][1]; i += n) {
            const float u = __uint2float_rn(gdr_lenet_hash(GDR_LENET_SEED, i) >> 8);
            gdr_lenet_w[i] = __fmul_rn(__fadd_rn(__fmul_rn(u, 5.9604644775390625e-8f), -0.5f), s2);
        }
    }
}

// Copies the conv weights into the block's constants (after gdr_lenet_init); thread t of n.
// The weights were written by another block of this launch: read them from L2.
__device__ void gdr_lenet_load(float *k, unsigned int t, unsigned int n) {
    const float *W = gdr_lenet_w;
    for (unsigned int i = t; i < 256u; i += n) k[GDR_LENET_K_LUT + i] = __fdiv_rn((float)i, 255.f);
    for (unsigned int i = t; i < 168u; i += n)
        k[GDR_LENET_K_C1W + i] =
            i % 28u < 25u ? __ldcg(W + GDR_LENET_C1W + i / 28u * 25u + i % 28u) : 0.f;
    for (unsigned int i = t; i < 8u; i += n)
        k[GDR_LENET_K_C1B + i] = i < 6u ? __ldcg(W + GDR_LENET_C1B + i) : 0.f;
    for (unsigned int i = t; i < 2688u; i += n)
        k[GDR_LENET_K_C2W + i] =
            i % 28u < 25u ? __ldcg(W + GDR_LENET_C2W + i / 28u * 25u + i % 28u) : 0.f;
    for (unsigned int i = t; i < 16u; i += n) k[GDR_LENET_K_C2B + i] = __ldcg(W + GDR_LENET_C2B + i);
}

// Sum over a warp (all 32 lanes take part).
__device__ __forceinline__ float gdr_warp_sum(float s) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

// Seven float4s of a padded 5x5 kernel into registers.
__device__ __forceinline__ void gdr_lenet_kernel5(const float *k, float w[28]) {
#pragma unroll
    for (int q = 0; q < 7; q++) {
        const float4 v = ((const float4 *)k)[q];
        w[4 * q] = v.x;
        w[4 * q + 1] = v.y;
        w[4 * q + 2] = v.z;
        w[4 * q + 3] = v.w;
    }
}

// A 6x6 patch of a row-major plane `stride` wide, from an even offset, as float2 loads.
__device__ __forceinline__ void gdr_lenet_patch6(const float *p, unsigned int stride,
                                                 float r[6][6]) {
#pragma unroll
    for (int y = 0; y < 6; y++)
#pragma unroll
        for (int c = 0; c < 3; c++) {
            const float2 v = *(const float2 *)(p + y * stride + 2 * c);
            r[y][2 * c] = v.x;
            r[y][2 * c + 1] = v.y;
        }
}

// The four 5x5 convolutions of one 2x2 pooling window, added to s.
__device__ __forceinline__ void gdr_lenet_window(const float w[28], const float r[6][6],
                                                 float s[4]) {
#pragma unroll
    for (int ky = 0; ky < 5; ky++)
#pragma unroll
        for (int kx = 0; kx < 5; kx++) {
            const float wv = w[ky * 5 + kx];
            s[0] += wv * r[ky][kx];
            s[1] += wv * r[ky][kx + 1];
            s[2] += wv * r[ky + 1][kx];
            s[3] += wv * r[ky + 1][kx + 1];
        }
}

__device__ __forceinline__ float gdr_max4(const float s[4]) {
    return fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
}

// A fully connected layer of NIN4 float4 inputs (in shared memory) and NOUT outputs: a warp
// per output, lanes over float4s of the input; each warp loads U outputs' weights (and
// biases) before it sums any, so their memory latencies overlap. U is the outputs a warp has
// in a 16-warp group (one pass: no second load-then-reduce round on the critical path).
// Weights and biases are read from the resident copy (g.resident holds the weights from
// GDR_LENET_F1W on).
template <unsigned int NIN4, unsigned int NOUT, bool RELU>
__device__ __forceinline__ void gdr_lenet_fc(const gdr_serve_group &g, const float *in,
                                             unsigned int wo, unsigned int bo, float *out) {
    constexpr unsigned int K = (NIN4 + 31u) / 32u, U = (NOUT + 15u) / 16u;
    const float *R = g.resident - GDR_LENET_F1W;
    const float4 *W4 = (const float4 *)(R + wo);
    const unsigned int lane = g.rank & 31u, warps = g.size / 32u;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 xin[K];
#pragma unroll
    for (unsigned int k = 0; k < K; k++) {
        const unsigned int i = lane + 32u * k;
        xin[k] = i < NIN4 ? ((const float4 *)in)[i] : zero;
    }
    for (unsigned int o0 = g.rank / 32u; o0 < NOUT; o0 += warps * U) {
        float4 wv[U][K];
        float b[U];
#pragma unroll
        for (unsigned int u = 0; u < U; u++) {
            const unsigned int o = o0 + u * warps;
            b[u] = o < NOUT ? R[bo + o] : 0.f;
#pragma unroll
            for (unsigned int k = 0; k < K; k++) {
                const unsigned int i = lane + 32u * k;
                wv[u][k] = o < NOUT && i < NIN4 ? W4[o * NIN4 + i] : zero;
            }
        }
#pragma unroll
        for (unsigned int u = 0; u < U; u++) {
            float s = 0.f;
#pragma unroll
            for (unsigned int k = 0; k < K; k++)
                s += wv[u][k].x * xin[k].x + wv[u][k].y * xin[k].y + wv[u][k].z * xin[k].z +
                     wv[u][k].w * xin[k].w;
            s = gdr_warp_sum(s) + b[u];
            const unsigned int o = o0 + u * warps;
            if (lane == 0 && o < NOUT) out[o] = RELU ? fmaxf(s, 0.f) : s;
        }
    }
}

__device__ unsigned int gdr_app_lenet(const gdr_serve_group &g, const unsigned char *req,
                                      unsigned int len, unsigned char *resp, unsigned int cap) {
    if (len != 784u || cap < 40u) return GDR_SERVE_FAILED;
    const float *K = g.consts;
    float *x = g.smem, *p1 = x + 784, *p2 = p1 + 864, *f1 = p2 + 256, *f2 = f1 + 120;
    // Global FC weights into L1 while the convolutions run (no registers, no waiting).
    if (!__isShared(g.resident))
        for (unsigned int l = GDR_LENET_F1W / 32u + g.rank; l <= (GDR_LENET_TOTAL - 1u) / 32u;
             l += g.size)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(gdr_lenet_w + 32u * l));
    for (unsigned int rep = 0; rep < GDR_SERVE_WORK; rep++) {
        GDR_SERVE_MARK(0);
        // The image: 16 bytes a thread, to floats through the table.
        for (unsigned int i = g.rank; i < 49u; i += g.size) {
            const uint4 v = gdr_serve_load16(req + 16u * i);
            const unsigned int w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++)
                ((float4 *)x)[4u * i + k] =
                    make_float4(K[w4[k] & 255u], K[(w4[k] >> 8) & 255u],
                                K[(w4[k] >> 16) & 255u], K[w4[k] >> 24]);
        }
        gdr_serve_sync(g);
        GDR_SERVE_MARK(1);
        // conv1 (6@5x5) + ReLU + 2x2 max pool: a pooled position and two channels a thread,
        // which share the 6x6 input patch.
        for (unsigned int it = g.rank; it < 432u; it += g.size) {
            const unsigned int pr = it / 144u, pos = it % 144u, py = pos / 12u, px = pos % 12u;
            float r[6][6];
            gdr_lenet_patch6(x + (2u * py) * 28u + 2u * px, 28u, r);
#pragma unroll
            for (unsigned int h = 0; h < 2u; h++) {
                const unsigned int oc = 2u * pr + h;
                float w[28];
                gdr_lenet_kernel5(K + GDR_LENET_K_C1W + oc * 28u, w);
                const float b = K[GDR_LENET_K_C1B + oc];
                float s[4] = {b, b, b, b};
                gdr_lenet_window(w, r, s);
                p1[oc * 144u + pos] = fmaxf(gdr_max4(s), 0.f);
            }
        }
        gdr_serve_sync(g);
        GDR_SERVE_MARK(2);
        // conv2 (16@5x5x6) + ReLU + 2x2 max pool: a pooled position, an output channel and
        // half of the input channels a thread (512 of them: a 16-warp block at once); the
        // two halves are neighbouring lanes.
        for (unsigned int it = g.rank; it < 512u; it += g.size) {
            const unsigned int oc = it / 32u, p = (it / 2u) % 16u, half = it & 1u;
            const unsigned int py = p / 4u, px = p % 4u;
            float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 1
            for (unsigned int ic = 3u * half; ic < 3u * half + 3u; ic++) {
                float r[6][6], w[28];
                gdr_lenet_patch6(p1 + ic * 144u + (2u * py) * 12u + 2u * px, 12u, r);
                gdr_lenet_kernel5(K + GDR_LENET_K_C2W + (oc * 6u + ic) * 28u, w);
                gdr_lenet_window(w, r, s);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) s[j] += __shfl_xor_sync(0xffffffffu, s[j], 1);
            if (half == 0u)
                p2[oc * 16u + p] = fmaxf(gdr_max4(s) + K[GDR_LENET_K_C2B + oc], 0.f);
        }
        gdr_serve_sync(g);
        GDR_SERVE_MARK(3);
        gdr_lenet_fc<64u, 120u, true>(g, p2, GDR_LENET_F1W, GDR_LENET_F1B, f1);
        gdr_serve_sync(g);
        GDR_SERVE_MARK(4);
        gdr_lenet_fc<30u, 84u, true>(g, f1, GDR_LENET_F2W, GDR_LENET_F2B, f2);
        gdr_serve_sync(g);
        GDR_SERVE_MARK(5);
        gdr_lenet_fc<21u, 10u, false>(g, f2, GDR_LENET_F3W, GDR_LENET_F3B, (float *)resp);
        GDR_SERVE_MARK(6);
        // The caller synchronises the group after the app; a repeat starts over on x.
        if (rep + 1u < GDR_SERVE_WORK) gdr_serve_sync(g);
    }
    return 40u;
}
