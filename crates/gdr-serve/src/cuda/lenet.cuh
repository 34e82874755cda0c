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

__device__ float gdr_lenet_w[GDR_LENET_TOTAL];

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

// Sum over a warp (all 32 lanes take part).
__device__ __forceinline__ float gdr_warp_sum(float s) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

// A fully connected layer: warp per output, lanes over inputs.
__device__ __forceinline__ void gdr_lenet_fc(const gdr_serve_group &g, const float *in,
                                             unsigned int nin, unsigned int wo, unsigned int bo,
                                             unsigned int nout, bool relu, float *out) {
    const float *W = gdr_lenet_w;
    const unsigned int lane = g.rank & 31u, warps = g.size / 32u;
    for (unsigned int o = g.rank / 32u; o < nout; o += warps) {
        float s = 0.f;
        for (unsigned int i = lane; i < nin; i += 32u) s += W[wo + o * nin + i] * in[i];
        s = gdr_warp_sum(s) + W[bo + o];
        if (lane == 0) out[o] = relu ? fmaxf(s, 0.f) : s;
    }
}

__device__ unsigned int gdr_app_lenet(const gdr_serve_group &g, const unsigned char *req,
                                      unsigned int len, unsigned char *resp, unsigned int cap) {
    if (len != 784u || cap < 40u) return GDR_SERVE_FAILED;
    const float *W = gdr_lenet_w;
    float *x = g.smem, *p1 = x + 784, *p2 = p1 + 864, *f1 = p2 + 256, *f2 = f1 + 120;
    for (unsigned int rep = 0; rep < GDR_SERVE_WORK; rep++) {
        for (unsigned int i = g.rank; i < 49u; i += g.size) {
            const uint4 v = gdr_serve_load16(req + 16u * i);
            const unsigned int w4[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++)
#pragma unroll
                for (int b = 0; b < 4; b++)
                    x[16u * i + 4u * k + b] = __fdiv_rn((float)((w4[k] >> (8 * b)) & 255u), 255.f);
        }
        gdr_serve_sync(g);
        // conv1 (6@5x5) + ReLU + 2x2 max pool: one pooled output per thread.
        for (unsigned int o = g.rank; o < 864u; o += g.size) {
            const unsigned int oc = o / 144u, py = (o % 144u) / 12u, px = o % 12u;
            const float *wk = W + GDR_LENET_C1W + oc * 25u;
            const float *xb = x + (2u * py) * 28u + 2u * px;
            const float b = W[GDR_LENET_C1B + oc];
            float s00 = b, s01 = b, s10 = b, s11 = b;
#pragma unroll
            for (int ky = 0; ky < 5; ky++)
#pragma unroll
                for (int kx = 0; kx < 5; kx++) {
                    const float wv = wk[ky * 5 + kx];
                    const float *r = xb + ky * 28 + kx;
                    s00 += wv * r[0];
                    s01 += wv * r[1];
                    s10 += wv * r[28];
                    s11 += wv * r[29];
                }
            p1[o] = fmaxf(fmaxf(fmaxf(s00, s01), fmaxf(s10, s11)), 0.f);
        }
        gdr_serve_sync(g);
        // conv2 (16@5x5x6) + ReLU + 2x2 max pool.
        for (unsigned int o = g.rank; o < 256u; o += g.size) {
            const unsigned int oc = o / 16u, py = (o % 16u) / 4u, px = o % 4u;
            const float b = W[GDR_LENET_C2B + oc];
            float s00 = b, s01 = b, s10 = b, s11 = b;
            for (int ic = 0; ic < 6; ic++) {
                const float *wk = W + GDR_LENET_C2W + (oc * 6u + ic) * 25u;
                const float *xb = p1 + ic * 144u + (2u * py) * 12u + 2u * px;
#pragma unroll
                for (int ky = 0; ky < 5; ky++)
#pragma unroll
                    for (int kx = 0; kx < 5; kx++) {
                        const float wv = wk[ky * 5 + kx];
                        const float *r = xb + ky * 12 + kx;
                        s00 += wv * r[0];
                        s01 += wv * r[1];
                        s10 += wv * r[12];
                        s11 += wv * r[13];
                    }
            }
            p2[o] = fmaxf(fmaxf(fmaxf(s00, s01), fmaxf(s10, s11)), 0.f);
        }
        gdr_serve_sync(g);
        gdr_lenet_fc(g, p2, 256u, GDR_LENET_F1W, GDR_LENET_F1B, 120u, true, f1);
        gdr_serve_sync(g);
        gdr_lenet_fc(g, f1, 120u, GDR_LENET_F2W, GDR_LENET_F2B, 84u, true, f2);
        gdr_serve_sync(g);
        gdr_lenet_fc(g, f2, 84u, GDR_LENET_F3W, GDR_LENET_F3B, 10u, false, (float *)resp);
        gdr_serve_sync(g);
    }
    return 40u;
}
