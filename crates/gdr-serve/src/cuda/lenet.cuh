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

// The conv weights and biases at the CPU's offsets (the part of lenet.rs's array before
// GDR_LENET_F1W); the FC layers live in gdr_lenet_fcw, in the order the GPU reads them.
__device__ float gdr_lenet_w[GDR_LENET_F1W];

// A fully connected layer of NIN4 float4 inputs and NOUT outputs, as the GPU computes it:
// lanes in groups of S (a power of two) that share M (1 or 2) outputs, each lane summing its
// slice of the inputs -- float4s s, s + S, s + 2S, ... for lane s of its group -- for all M
// outputs; then the group's lanes add up (gdr_lenet_fc). A warp's 32 lanes cover 32/S*M
// outputs ("a virtual warp": the work of one warp of a 16-warp group), NV of them cover the
// layer. The weights are stored in the order the lanes load them: for virtual warp v, load
// step k (output m = k / J of the lane's M, input step jj = k % J), lane l: one float4 at
// float4 index (v * M * J + k) * 32 + l. A warp's float4 load is thus 512 consecutive bytes:
// conflict-free in shared memory (4 wavefronts, the least for 512 B) and whole lines in
// global memory. Weights of padding (outputs >= NOUT, inputs >= NIN4) are 0. The NOUT
// biases follow the weights, padded to a float4. RW is the layer's offset in gdr_lenet_fcw,
// CW and CB the weights' and biases' offsets in the CPU's array.
template <unsigned int NIN4_, unsigned int NOUT_, unsigned int S_, unsigned int M_,
          unsigned int RW, unsigned int CW_, unsigned int CB_>
struct gdr_lenet_fcl {
    static constexpr unsigned int NIN4 = NIN4_, NOUT = NOUT_, S = S_, M = M_, CW = CW_, CB = CB_;
    static constexpr unsigned int J = (NIN4 + S - 1u) / S; // float4s of a lane's input slice
    static constexpr unsigned int OPW = 32u / S * M;       // outputs of a virtual warp
    static constexpr unsigned int NV = (NOUT + OPW - 1u) / OPW;
    static constexpr unsigned int W = RW;
    static constexpr unsigned int B = W + NV * M * J * 128u;
    static constexpr unsigned int END = B + (NOUT + 3u) / 4u * 4u;
    static_assert(32u % S == 0u && M >= 1u && M <= 2u && M <= S && W % 4u == 0u, "layout");
};
// fc1: 64 float4 inputs, slices of 8 (one wavefront of inputs feeds a whole warp), output
// pairs: 15 virtual warps. fc2: the same shape on 30 float4s (2 slices pad to 32), 11
// virtual warps (88 outputs, 4 of them padding). fc3: 21 float4s over 8 lanes (3 steps),
// one output a group, 3 virtual warps: short on the critical path.
typedef gdr_lenet_fcl<64u, 120u, 8u, 2u, 0u, GDR_LENET_F1W, GDR_LENET_F1B> gdr_lenet_fc1;
typedef gdr_lenet_fcl<30u, 84u, 8u, 2u, gdr_lenet_fc1::END, GDR_LENET_F2W, GDR_LENET_F2B>
    gdr_lenet_fc2;
typedef gdr_lenet_fcl<21u, 10u, 8u, 1u, gdr_lenet_fc2::END, GDR_LENET_F3W, GDR_LENET_F3B>
    gdr_lenet_fc3;

// The FC weights and biases in that order (lenet.rs's RESIDENT_FLOATS: the same layout).
#define GDR_LENET_RESIDENT_FLOATS 43352
static_assert(gdr_lenet_fc3::END == GDR_LENET_RESIDENT_FLOATS, "resident layout");

// 128-byte aligned: the FC weights are prefetched line by line.
__device__ __align__(128) float gdr_lenet_fcw[GDR_LENET_RESIDENT_FLOATS];

// The FC weights and biases are the app's resident data (serve.cuh): in a persistent worker's
// shared memory where the GPU has room for 173 KB more (Hopper), read from there on every
// request; elsewhere prefetched from global memory into L1 on each request.
#define GDR_SERVE_RESIDENT_FLOATS GDR_LENET_RESIDENT_FLOATS
#define GDR_SERVE_RESIDENT_SRC gdr_lenet_fcw

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

// Weight i of lenet.rs's array: exactly rounded steps, as lenet.rs's `weight`.
__device__ __forceinline__ float gdr_lenet_weight(unsigned int i, float s2) {
    const float u = __uint2float_rn(gdr_lenet_hash(GDR_LENET_SEED, i) >> 8);
    return __fmul_rn(__fadd_rn(__fmul_rn(u, 5.9604644775390625e-8f), -0.5f), s2);
}

// The CPU index (lenet.rs's array) of float j of layer L's part of gdr_lenet_fc, or ~0u for
// padding: the inverse of the layout described at gdr_lenet_fcl.
template <class L> __device__ unsigned int gdr_lenet_fc_source(unsigned int j) {
    if (j >= L::B - L::W) {
        const unsigned int b = j - (L::B - L::W);
        return b < L::NOUT ? L::CB + b : ~0u;
    }
    const unsigned int c = j % 4u, l = j / 4u % 32u, k = j / 128u % (L::M * L::J),
                       v = j / (128u * L::M * L::J);
    const unsigned int m = k / L::J, jj = k % L::J, q = l / L::S, s = l % L::S;
    const unsigned int o = (v * (32u / L::S) + q) * L::M + m, i4 = s + L::S * jj;
    return o < L::NOUT && i4 < L::NIN4 ? L::CW + o * 4u * L::NIN4 + 4u * i4 + c : ~0u;
}

// Fills every weight; thread t of n. The conv layers (the first four) at the CPU's offsets,
// the FC layers in gdr_lenet_fcw's order, each weight from its CPU index.
__device__ void gdr_lenet_init(unsigned int t, unsigned int n) {
    const unsigned int layers[10][3] = GDR_LENET_LAYERS;
    for (int l = 0; l < 4; l++) {
        const float s2 = __uint_as_float(layers[l][2]);
        for (unsigned int i = layers[l][0] + t; i < layers[l][0] + layers[l][1]; i += n)
            gdr_lenet_w[i] = gdr_lenet_weight(i, s2);
    }
    for (unsigned int j = t; j < GDR_LENET_RESIDENT_FLOATS; j += n) {
        const unsigned int i = j < gdr_lenet_fc2::W   ? gdr_lenet_fc_source<gdr_lenet_fc1>(j)
                               : j < gdr_lenet_fc3::W ? gdr_lenet_fc_source<gdr_lenet_fc2>(
                                                            j - gdr_lenet_fc2::W)
                                                      : gdr_lenet_fc_source<gdr_lenet_fc3>(
                                                            j - gdr_lenet_fc3::W);
        float v = 0.f;
        for (int l = 4; l < 10; l++)
            if (i - layers[l][0] < layers[l][1])
                v = gdr_lenet_weight(i, __uint_as_float(layers[l][2]));
        gdr_lenet_fcw[j] = v;
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

// A 6x6 patch of the 28x28 image's bytes from an even offset, as 2-byte loads, each pixel
// its integer value as a float (exact: 0x4B000000 | b is 2^23 + b; the subtraction leaves b).
__device__ __forceinline__ void gdr_lenet_patch6_bytes(const unsigned char *p, float r[6][6]) {
#pragma unroll
    for (int y = 0; y < 6; y++)
#pragma unroll
        for (int c = 0; c < 3; c++) {
            const unsigned int v = *(const unsigned short *)(p + y * 28 + 2 * c);
            r[y][2 * c] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7440)) - 8388608.f;
            r[y][2 * c + 1] = __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7441)) - 8388608.f;
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

// A block's share of layer L: the virtual warps v = rank + C * j (slot j, of VMAX), D floats
// each, then the layer's NOUT biases (padded to 4).
template <class L, unsigned int C> struct gdr_lenet_share {
    static constexpr unsigned int VMAX = (L::NV + C - 1u) / C;
    static constexpr unsigned int D = L::M * L::J * 128u;
    static constexpr unsigned int BIAS = VMAX * D;
    static constexpr unsigned int SIZE = BIAS + (L::NOUT + 3u) / 4u * 4u;
};

// A fully connected layer (layout and decomposition: gdr_lenet_fcl) from `in` (shared memory,
// NIN4 float4s), on a block's share of the layer (virtual warps rank + C * j, stored as
// gdr_lenet_share says; in shared or global memory), each output handed to `out(o, value)`.
// Each warp takes the share's virtual warps j = warp, warp + warps, ...: its lanes load their M*J
// weight float4s (all before any sum, so the loads overlap) and sum them against the J input
// float4s of their slice, loaded once per layer (a wavefront: S consecutive float4s shared by
// the warp's groups). The group's lanes then add up: with M = 2 a first exchange (lane xor 1)
// in which each lane keeps one output and sends the other (one shuffle for two outputs), then
// plain halving steps; lane s < M of the group ends with output m = s.
template <class L, unsigned int C, bool RELU, class Out>
__device__ __forceinline__ void gdr_lenet_fc_share(unsigned int rank, unsigned int t,
                                                   unsigned int n, const float *share,
                                                   const float *in, Out out) {
    typedef gdr_lenet_share<L, C> Sh;
    constexpr unsigned int S = L::S, M = L::M, J = L::J;
    const unsigned int lane = t & 31u, s = lane % S, warps = n / 32u;
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 xin[J];
#pragma unroll
    for (unsigned int jj = 0; jj < J; jj++) {
        const unsigned int i4 = s + S * jj;
        xin[jj] = S * (jj + 1u) <= L::NIN4 || i4 < L::NIN4 ? ((const float4 *)in)[i4] : zero;
    }
    for (unsigned int j = t / 32u; j < Sh::VMAX; j += warps) {
        const unsigned int v = rank + C * j;
        if (v >= L::NV) break;  // uniform in the warp
        const float4 *W4 = (const float4 *)share + j * (M * J * 32u) + lane;
        float4 w[M][J];
#pragma unroll
        for (unsigned int m = 0; m < M; m++)
#pragma unroll
            for (unsigned int jj = 0; jj < J; jj++) w[m][jj] = W4[(m * J + jj) * 32u];
        const unsigned int o = (v * (32u / S) + lane / S) * M + s;
        const float b = s < M && o < L::NOUT ? share[Sh::BIAS + o] : 0.f;
        float a[M];
#pragma unroll
        for (unsigned int m = 0; m < M; m++) {
            float4 acc = zero;
#pragma unroll
            for (unsigned int jj = 0; jj < J; jj++) {
                acc.x = fmaf(w[m][jj].x, xin[jj].x, acc.x);
                acc.y = fmaf(w[m][jj].y, xin[jj].y, acc.y);
                acc.z = fmaf(w[m][jj].z, xin[jj].z, acc.z);
                acc.w = fmaf(w[m][jj].w, xin[jj].w, acc.w);
            }
            a[m] = (acc.x + acc.y) + (acc.z + acc.w);
        }
        float r = a[0];
        unsigned int step = 1u;
        if (M == 2u) {
            const bool odd = (s & 1u) != 0u;
            r = (odd ? a[M - 1u] : a[0]) +
                __shfl_xor_sync(0xffffffffu, odd ? a[0] : a[M - 1u], 1);
            step = 2u;
        }
#pragma unroll
        for (; step < S; step <<= 1) r += __shfl_xor_sync(0xffffffffu, r, step);
        if (s < M && o < L::NOUT) out(o, RELU ? fmaxf(r + b, 0.f) : r + b);
    }
}

// The whole layer from `in` to `out`; R is the resident data (shared or global memory).
template <class L, bool RELU>
__device__ __forceinline__ void gdr_lenet_fc(const gdr_serve_group &g, const float *R,
                                             const float *in, float *out) {
    // The whole layer is the share of a cluster of one: the same layout from L::W on.
    gdr_lenet_fc_share<L, 1u, RELU>(0u, g.rank, g.size, R + L::W, in,
                                    [&](unsigned int o, float v) { out[o] = v; });
}

// The worker's dynamic shared memory (kernels.cu's gdr_serve_dyn, the same memory): only to
// turn a generic pointer into it into one the compiler knows is shared (LDS, not generic LD).
extern __shared__ __align__(16) float gdr_lenet_dyn[];

__device__ __forceinline__ const float *gdr_lenet_shared(const float *p) {
    const unsigned int at = (unsigned int)__cvta_generic_to_shared(p);
    return gdr_lenet_dyn + (at - (unsigned int)__cvta_generic_to_shared(gdr_lenet_dyn)) / 4u;
}

// The three FC layers from p2 (16x4x4 in shared memory) to the logits in resp, reading the
// resident data at R.
__device__ __forceinline__ void gdr_lenet_fcs(const gdr_serve_group &g, const float *R,
                                              const float *p2, float *f1, float *f2,
                                              float *logits) {
    gdr_lenet_fc<gdr_lenet_fc1, true>(g, R, p2, f1);
    gdr_serve_sync(g);
    GDR_SERVE_MARK(4);
    gdr_lenet_fc<gdr_lenet_fc2, true>(g, R, f1, f2);
    gdr_serve_sync(g);
    GDR_SERVE_MARK(5);
    gdr_lenet_fc<gdr_lenet_fc3, false>(g, R, f2, logits);
    GDR_SERVE_MARK(6);
}

__device__ unsigned int gdr_app_lenet(const gdr_serve_group &g, const unsigned char *req,
                                      unsigned int len, unsigned char *resp, unsigned int cap) {
    if (len != 784u || cap < 40u) return GDR_SERVE_FAILED;
    const float *K = g.consts;
    float *x = g.smem, *p1 = x + 784, *p2 = p1 + 864, *f1 = p2 + 256, *f2 = f1 + 120;
    const bool shared_fc = __isShared(g.resident);
    for (unsigned int rep = 0; rep < GDR_SERVE_WORK; rep++) {
        GDR_SERVE_MARK(0);
        // The image: a 4-byte word a thread (196 of them), to floats through the table.
        const unsigned int *req4 = (const unsigned int *)req;
        unsigned int word = 0;
        if (g.rank < 196u) word = gdr_ld_volatile_u32(req4 + g.rank);
        // While that load is out: global FC weights into L1 for later (no registers, no
        // waiting), and this thread's first conv1 kernels (two channels, below) into
        // registers -- neither depends on the image.
        if (!shared_fc && rep == 0u)
            for (unsigned int l = g.rank; l < GDR_LENET_RESIDENT_FLOATS / 32u + 1u; l += g.size)
                asm volatile("prefetch.global.L1 [%0];" ::"l"(g.resident + 32u * l));
        float c1w[2][28], c1b[2];
        if (g.rank < 432u)
#pragma unroll
            for (unsigned int h = 0; h < 2u; h++) {
                const unsigned int oc = 2u * (g.rank / 144u) + h;
                gdr_lenet_kernel5(K + GDR_LENET_K_C1W + oc * 28u, c1w[h]);
                c1b[h] = K[GDR_LENET_K_C1B + oc];
            }
        for (unsigned int i = g.rank; i < 196u; i += g.size) {
            if (i != g.rank) word = gdr_ld_volatile_u32(req4 + i);
            ((float4 *)x)[i] = make_float4(K[word & 255u], K[(word >> 8) & 255u],
                                           K[(word >> 16) & 255u], K[word >> 24]);
        }
        gdr_serve_sync(g);
        GDR_SERVE_MARK(1);
        // conv1 (6@5x5) + ReLU + 2x2 max pool: a pooled position and two channels a thread
        // (432 of them), which share the 6x6 input patch. 16 consecutive positions of a
        // half-warp read their float2s from 16 different bank pairs (28 * 2 * py + 2 * px
        // is 2 * position mod 32): conflict-free.
        for (unsigned int it = g.rank; it < 432u; it += g.size) {
            const unsigned int pr = it / 144u, pos = it % 144u, py = pos / 12u, px = pos % 12u;
            if (it != g.rank)
#pragma unroll
                for (unsigned int h = 0; h < 2u; h++) {
                    gdr_lenet_kernel5(K + GDR_LENET_K_C1W + (2u * pr + h) * 28u, c1w[h]);
                    c1b[h] = K[GDR_LENET_K_C1B + 2u * pr + h];
                }
            float r[6][6];
            gdr_lenet_patch6(x + (2u * py) * 28u + 2u * px, 28u, r);
#pragma unroll
            for (unsigned int h = 0; h < 2u; h++) {
                float s[4] = {c1b[h], c1b[h], c1b[h], c1b[h]};
                gdr_lenet_window(c1w[h], r, s);
                p1[(2u * pr + h) * 144u + pos] = fmaxf(gdr_max4(s), 0.f);
            }
        }
        gdr_serve_sync(g);
        GDR_SERVE_MARK(2);
        // conv2 (16@5x5x6) + ReLU + 2x2 max pool: 256 threads, each a pooled position (lane
        // % 16), half of the input channels (lane / 16) and two output channels (the warp):
        // each 6x6 patch loaded feeds two channels' 100 FMAs (one channel a patch was
        // shared-memory bound). A half-warp's 16 positions hit 16 different bank pairs (24 *
        // py + 2 * px); the kernels are two addresses a warp. The halves then swap (lane xor
        // 16): each keeps one output channel's window sums and adds the other's.
        for (unsigned int t = g.rank; t < 256u; t += g.size) {
            const unsigned int p = t % 16u, h = t / 16u % 2u, ocp = t / 32u;
            const unsigned int py = p / 4u, px = p % 4u;
            float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (unsigned int k = 0; k < 3u; k++) {
                const unsigned int ic = 3u * h + k;
                float r[6][6], w[28];
                gdr_lenet_patch6(p1 + ic * 144u + (2u * py) * 12u + 2u * px, 12u, r);
                gdr_lenet_kernel5(K + GDR_LENET_K_C2W + (2u * ocp * 6u + ic) * 28u, w);
                gdr_lenet_window(w, r, s0);
                gdr_lenet_kernel5(K + GDR_LENET_K_C2W + ((2u * ocp + 1u) * 6u + ic) * 28u, w);
                gdr_lenet_window(w, r, s1);
            }
            float s[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                s[j] = (h ? s1[j] : s0[j]) + __shfl_xor_sync(0xffffffffu, h ? s0[j] : s1[j], 16);
            const unsigned int oc = 2u * ocp + h;
            p2[oc * 16u + p] = fmaxf(gdr_max4(s) + K[GDR_LENET_K_C2B + oc], 0.f);
        }
        gdr_serve_sync(g);
        GDR_SERVE_MARK(3);
        // The FC layers, compiled twice so that every weight load is of a known kind: shared
        // (LDS) from the block's resident copy, else global (LDG, L1-cached, where the
        // prefetch put them) from gdr_lenet_fcw itself -- which g.resident then is (serve.cuh).
        if (shared_fc)
            gdr_lenet_fcs(g, gdr_lenet_shared(g.resident), p2, f1, f2, (float *)resp);
        else
            gdr_lenet_fcs(g, gdr_lenet_fcw, p2, f1, f2, (float *)resp);
        // The caller synchronises the group after the app; a repeat starts over on x.
        if (rep + 1u < GDR_SERVE_WORK) gdr_serve_sync(g);
    }
    return 40u;
}

#if GDR_SERVE_CLUSTER > 1
// ---- LeNet over a cluster of C blocks (GDR_SERVE_CLUSTER; serve.cuh) -----------------------
// On one SM the app is bound by that SM: conv1 and conv2 by its FMA issue, fc1 by its
// shared-memory bandwidth (123 KB of weights). Over C blocks each does 1/C of every layer and
// sends its outputs to the blocks that read them:
//   image    every block's conv1 reads its own copy of the request's bytes (kernels.cu pushes it)
//   conv1    block r: outputs [r*864/C, (r+1)*864/C) (channel, position) -> p1 of every block
//   conv2    block r: output channels [r*16/C, (r+1)*16/C), the six input channels summed in
//            shared memory -> p2 of every block
//   fc1      block r: virtual warps r, r + C, ... (gdr_lenet_fcl) -> f1 of every block
//   fc2      likewise -> f2 of block 0
//   fc3      block 0 alone -> the response
// Each arrow is an st.async counted on an mbarrier of the receiving block (X1..X4 below),
// which that block arms with the bytes it expects at the start of the request.
//
// Reuse of a buffer across requests is safe by the data flow: block 0 answers request k only
// after fc2 of every block, which came after every block's fc1, conv2 and conv1 inputs were
// complete there; the next request's stores into those buffers are made after that.

#define GDR_LENET_CL GDR_SERVE_CLUSTER
static_assert(GDR_LENET_CL == 2 || GDR_LENET_CL == 4 || GDR_LENET_CL == 8, "cluster of 2, 4 or 8");

typedef gdr_lenet_share<gdr_lenet_fc1, GDR_LENET_CL> gdr_lenet_sh1;
typedef gdr_lenet_share<gdr_lenet_fc2, GDR_LENET_CL> gdr_lenet_sh2;
typedef gdr_lenet_share<gdr_lenet_fc3, 1u> gdr_lenet_sh3; // block 0 has all of fc3
#define GDR_LENET_CL_FC2 (gdr_lenet_sh1::SIZE)
#define GDR_LENET_CL_FC3 (GDR_LENET_CL_FC2 + gdr_lenet_sh2::SIZE)
static_assert(GDR_LENET_CL_FC3 + gdr_lenet_sh3::SIZE <= GDR_LENET_RESIDENT_FLOATS, "share fits");

// Copies layer L's share for block `rank` from gdr_lenet_fcw; thread t of n.
template <class L, unsigned int C>
__device__ void gdr_lenet_share_copy(float *dst, unsigned int rank, unsigned int t,
                                     unsigned int n) {
    typedef gdr_lenet_share<L, C> S;
    const float4 *src = (const float4 *)gdr_lenet_fcw;
    for (unsigned int i = t; i < S::BIAS / 4u; i += n) {
        const unsigned int j = i / (S::D / 4u), v = rank + C * j;
        ((float4 *)dst)[i] = v < L::NV ? __ldcg(src + (L::W + v * S::D) / 4u + i % (S::D / 4u))
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (unsigned int i = t; i < L::NOUT; i += n) dst[S::BIAS + i] = __ldcg(gdr_lenet_fcw + L::B + i);
}

// The block's share of the resident data (kernels.cu calls it once per block, after
// gdr_lenet_init): fc1's and fc2's virtual warps of this rank, and fc3 whole in block 0.
__device__ void gdr_lenet_cl_resident(float *dst, unsigned int rank, unsigned int t,
                                      unsigned int n) {
    gdr_lenet_share_copy<gdr_lenet_fc1, GDR_LENET_CL>(dst, rank, t, n);
    gdr_lenet_share_copy<gdr_lenet_fc2, GDR_LENET_CL>(dst + GDR_LENET_CL_FC2, rank, t, n);
    if (rank == 0u) gdr_lenet_share_copy<gdr_lenet_fc3, 1u>(dst + GDR_LENET_CL_FC3, 0u, t, n);
}

// The app's mbarriers (gdr_serve_cluster::mbar): what each block receives.
#define GDR_LENET_X1 0 // p1, 864 floats, in every block
#define GDR_LENET_X2 1 // p2, 256 floats, in every block
#define GDR_LENET_X3 2 // f1, 120 floats, in every block
#define GDR_LENET_X4 3 // f2, 84 floats, in block 0

__device__ unsigned int gdr_app_lenet_cluster(const gdr_serve_cluster &c, const unsigned char *req,
                                              unsigned int len, unsigned char *resp,
                                              unsigned int cap) {
    constexpr unsigned int C = GDR_LENET_CL, OCB = 16u / C, COMBOS = OCB * 16u;
    constexpr unsigned int P1_PER = (864u + C - 1u) / C;
    // Uniform over the cluster (every block has the same header): nothing is exchanged.
    if (len != 784u || cap < 40u) return GDR_SERVE_FAILED;
    const float *K = c.consts;
    // The first 784 floats are the one-block form's image, unused here.
    float *p1 = c.smem + 784, *p2 = p1 + 864, *f1 = p2 + 256, *f2 = f1 + 128,
          *part = f2 + 96;  // part: [6][COMBOS] float4, conv2's per-input-channel sums
    static_assert(2128u + 6u * COMBOS * 4u <= GDR_SERVE_CL_SMEM_FLOATS, "cluster smem");
    const unsigned int t = c.t, n = c.n, rank = c.rank;
    unsigned long long *mb = c.mbar;
    const float *R = gdr_lenet_shared(c.resident);
    GDR_SERVE_CL_MARK(0);
    if (t == 0u) {
        gdr_cl_mbar_expect(mb + GDR_LENET_X1, 864u * 4u);
        gdr_cl_mbar_expect(mb + GDR_LENET_X2, 256u * 4u);
        gdr_cl_mbar_expect(mb + GDR_LENET_X3, 120u * 4u);
        if (rank == 0u) gdr_cl_mbar_expect(mb + GDR_LENET_X4, 84u * 4u);
    }
    GDR_SERVE_CL_MARK(1);
    // conv1: one (channel, pooled position) a thread, straight from the request's pixel bytes
    // in this block's copy (shared memory): the window's sums of weight x byte, then the
    // largest of the four scaled by 1/255 (pixels are byte / 255) and the bias added. No
    // pass turns the image into floats first, and no barrier waits for one.
    for (unsigned int u = t; u < P1_PER; u += n) {
        const unsigned int it = rank * P1_PER + u;
        if (it >= 864u) break;
        const unsigned int oc = it / 144u, pos = it % 144u, py = pos / 12u, px = pos % 12u;
        float w[28], r[6][6];
        gdr_lenet_kernel5(K + GDR_LENET_K_C1W + oc * 28u, w);
        const float b = K[GDR_LENET_K_C1B + oc];
        gdr_lenet_patch6_bytes(req + (2u * py) * 28u + 2u * px, r);
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        gdr_lenet_window(w, r, s);
        const float v = fmaf(gdr_max4(s), 1.f / 255.f, b);
        gdr_cl_put_all<C>(p1 + it, fmaxf(v, 0.f), mb + GDR_LENET_X1);
    }
    GDR_SERVE_CL_MARK(2);
    gdr_cl_mbar_wait(mb + GDR_LENET_X1, c.parity);
    GDR_SERVE_CL_MARK(3);
    // conv2: (input channel, output channel of this block's OCB, position) a thread, window
    // sums to `part`; then one thread an output adds the six input channels.
    for (unsigned int u = t; u < 6u * COMBOS; u += n) {
        const unsigned int ic = u / COMBOS, combo = u % COMBOS;
        const unsigned int oc = rank * OCB + combo / 16u, pos = combo % 16u;
        const unsigned int py = pos / 4u, px = pos % 4u;
        float w[28], r[6][6];
        gdr_lenet_patch6(p1 + ic * 144u + (2u * py) * 12u + 2u * px, 12u, r);
        gdr_lenet_kernel5(K + GDR_LENET_K_C2W + (oc * 6u + ic) * 28u, w);
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        gdr_lenet_window(w, r, s);
        ((float4 *)part)[u] = make_float4(s[0], s[1], s[2], s[3]);
    }
    gdr_serve_sync_bar(c.bar, n);
    GDR_SERVE_CL_MARK(4);
    for (unsigned int u = t; u < COMBOS; u += n) {
        float4 a = ((const float4 *)part)[u];
#pragma unroll
        for (unsigned int ic = 1; ic < 6u; ic++) {
            const float4 b = ((const float4 *)part)[ic * COMBOS + u];
            a.x += b.x;
            a.y += b.y;
            a.z += b.z;
            a.w += b.w;
        }
        const unsigned int oc = rank * OCB + u / 16u;
        const float s[4] = {a.x, a.y, a.z, a.w};
        gdr_cl_put_all<C>(p2 + oc * 16u + u % 16u,
                          fmaxf(gdr_max4(s) + K[GDR_LENET_K_C2B + oc], 0.f), mb + GDR_LENET_X2);
    }
    GDR_SERVE_CL_MARK(5);
    gdr_cl_mbar_wait(mb + GDR_LENET_X2, c.parity);
    GDR_SERVE_CL_MARK(6);
    gdr_lenet_fc_share<gdr_lenet_fc1, C, true>(rank, t, n, R, p2, [&](unsigned int o, float v) {
        gdr_cl_put_all<C>(f1 + o, v, mb + GDR_LENET_X3);
    });
    GDR_SERVE_CL_MARK(7);
    gdr_cl_mbar_wait(mb + GDR_LENET_X3, c.parity);
    GDR_SERVE_CL_MARK(8);
    const unsigned int f2_at = gdr_cl_map(gdr_cl_local(f2), 0u),
                       x4_at = gdr_cl_map(gdr_cl_local(mb + GDR_LENET_X4), 0u);
    gdr_lenet_fc_share<gdr_lenet_fc2, C, true>(rank, t, n, R + GDR_LENET_CL_FC2, f1,
                                               [&](unsigned int o, float v) {
                                                   gdr_cl_put_f32(f2_at + 4u * o, v, x4_at);
                                               });
    GDR_SERVE_CL_MARK(9);
    if (rank != 0u) return 40u;
    if (c.answer) {
        // Each logit leaves the lane that computed it, as one TX word (serve.cuh,
        // gdr_serve_cluster::answer); logit 0's lane writes the header too.
        const gdr_serve_answer a = gdr_serve_answer_get(c);
        gdr_cl_mbar_wait(mb + GDR_LENET_X4, c.parity);
        GDR_SERVE_CL_MARK(10);
        gdr_lenet_fc_share<gdr_lenet_fc3, 1u, false>(
            0u, t, n, R + GDR_LENET_CL_FC3, f2, [&](unsigned int o, float v) {
                gdr_serve_answer_word(a, o, __float_as_uint(v));
                if (o == 0u) gdr_serve_answer_header(a, 40u);
            });
    } else {
        gdr_cl_mbar_wait(mb + GDR_LENET_X4, c.parity);
        GDR_SERVE_CL_MARK(10);
        float *logits = (float *)resp;
        gdr_lenet_fc_share<gdr_lenet_fc3, 1u, false>(
            0u, t, n, R + GDR_LENET_CL_FC3, f2, [&](unsigned int o, float v) { logits[o] = v; });
    }
    GDR_SERVE_CL_MARK(11);
    return 40u;
}
#endif
