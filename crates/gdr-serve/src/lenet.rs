//! LeNet-5 for 28x28 images, with weights generated from a seed, and the CPU reference.
//!
//! The network (no padding, ReLU, 2x2 max pooling):
//! conv 6@5x5 -> 6x24x24 -> pool -> 6x12x12 -> conv 16@5x5x6 -> 16x8x8 -> pool -> 16x4x4 = 256
//! -> fc 120 -> fc 84 -> fc 10 (logits, no activation). About 282 k multiply-adds.
//!
//! Weights are not trained: every one is a pure function of (seed, index), an integer hash
//! mapped to a float with exactly rounded operations, so the GPU generates bit-identical
//! weights without any upload (`lenet.cu` holds the same function). Each layer is scaled by
//! sqrt(6 / fan_in) so activations keep their size and the logits are of order one.

/// Image side in pixels.
pub const SIDE: usize = 28;
/// Image size in bytes (one u8 per pixel).
pub const IMAGE_BYTES: usize = SIDE * SIDE;
/// Classes, one logit each.
pub const CLASSES: usize = 10;
/// Response size: 10 little-endian f32 logits.
pub const LOGITS_BYTES: usize = CLASSES * 4;

/// Offsets of every tensor in the flat weight array (floats), as in `lenet.cu`.
pub(crate) mod offsets {
    /// First convolution's weights, `[6][5][5]`.
    pub const C1W: usize = 0;
    /// First convolution's biases, `[6]`.
    pub const C1B: usize = C1W + 150;
    /// Second convolution's weights, `[16][6][5][5]`.
    pub const C2W: usize = C1B + 6;
    /// Second convolution's biases, `[16]`.
    pub const C2B: usize = C2W + 2400;
    /// First fully connected layer's weights, `[120][256]`.
    pub const F1W: usize = C2B + 16;
    /// First fully connected layer's biases, `[120]`.
    pub const F1B: usize = F1W + 30720;
    /// Second fully connected layer's weights, `[84][120]`.
    pub const F2W: usize = F1B + 120;
    /// Second fully connected layer's biases, `[84]`.
    pub const F2B: usize = F2W + 10080;
    /// Third fully connected layer's weights, `[10][84]`.
    pub const F3W: usize = F2B + 84;
    /// Third fully connected layer's biases, `[10]`.
    pub const F3B: usize = F3W + 840;
    /// Floats in all.
    pub const TOTAL: usize = F3B + 10;
}

/// Floats of the GPU's resident copy (`lenet.cuh`'s `gdr_lenet_fcw`): the FC weights and
/// biases, the weights reordered (and padded) for the GPU's loads; the GPU only.
pub const RESIDENT_FLOATS: usize =
    fc_floats(64, 120, 8, 2) + fc_floats(30, 84, 8, 2) + fc_floats(21, 10, 8, 1);

/// Floats of one FC layer in the GPU's layout (`gdr_lenet_fcl` in lenet.cuh): `nin4` float4
/// inputs, `nout` outputs, lanes in groups of `s` sharing `m` outputs. Weights for whole
/// virtual warps (32 / s * m outputs each) and whole slices (s float4s a step), then the
/// biases to a whole float4.
const fn fc_floats(nin4: usize, nout: usize, s: usize, m: usize) -> usize {
    let steps = nin4.div_ceil(s);
    let warps = nout.div_ceil(32 / s * m);
    warps * m * steps * 128 + nout.next_multiple_of(4)
}

/// The layers as (first index, count, fan in); biases share their layer's scale.
pub(crate) const LAYERS: [(usize, usize, usize); 10] = [
    (offsets::C1W, 150, 25),
    (offsets::C1B, 6, 25),
    (offsets::C2W, 2400, 150),
    (offsets::C2B, 16, 150),
    (offsets::F1W, 30720, 256),
    (offsets::F1B, 120, 256),
    (offsets::F2W, 10080, 120),
    (offsets::F2B, 84, 120),
    (offsets::F3W, 840, 84),
    (offsets::F3B, 10, 84),
];

/// The integer hash of (seed, index) weights are made from (a 32-bit avalanche mix).
pub(crate) fn hash(seed: u32, i: u32) -> u32 {
    let mut h = seed ^ i.wrapping_mul(0x9e37_79b9);
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846c_a68b);
    h ^= h >> 16;
    h
}

/// Twice the scale of a layer with `fan_in` inputs: 2 * sqrt(6 / fan_in), as an f32. The GPU
/// gets these exact bits in its source, so no square root has to agree across machines.
pub(crate) fn layer_scale2(fan_in: usize) -> f32 {
    (2.0 * (6.0f64 / fan_in as f64).sqrt()) as f32
}

/// Weight `i` of a layer whose doubled scale is `scale2`: uniform in [-scale, scale).
pub(crate) fn weight(seed: u32, i: u32, scale2: f32) -> f32 {
    let u = (hash(seed, i) >> 8) as f32; // 24 bits: exact
    (u * (1.0 / 16_777_216.0) - 0.5) * scale2 // exact, exact, one rounding
}

/// All weights for `seed`.
pub fn weights(seed: u32) -> Vec<f32> {
    let mut w = vec![0f32; offsets::TOTAL];
    for (start, count, fan_in) in LAYERS {
        let s2 = layer_scale2(fan_in);
        for (i, v) in w.iter_mut().enumerate().skip(start).take(count) {
            *v = weight(seed, i as u32, s2);
        }
    }
    w
}

/// The CPU reference: logits of one image.
pub fn forward(w: &[f32], image: &[u8; IMAGE_BYTES]) -> [f32; CLASSES] {
    use offsets::*;
    let x: Vec<f32> = image.iter().map(|&b| b as f32 / 255.0).collect();
    // conv1 + ReLU + pool
    let mut p1 = [0f32; 6 * 12 * 12];
    for oc in 0..6 {
        for py in 0..12 {
            for px in 0..12 {
                let mut best = f32::NEG_INFINITY;
                for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let (y, xx) = (2 * py + dy, 2 * px + dx);
                    let mut s = w[C1B + oc];
                    for ky in 0..5 {
                        for kx in 0..5 {
                            s += w[C1W + oc * 25 + ky * 5 + kx] * x[(y + ky) * SIDE + xx + kx];
                        }
                    }
                    best = best.max(s);
                }
                p1[oc * 144 + py * 12 + px] = best.max(0.0);
            }
        }
    }
    // conv2 + ReLU + pool
    let mut p2 = [0f32; 256];
    for oc in 0..16 {
        for py in 0..4 {
            for px in 0..4 {
                let mut best = f32::NEG_INFINITY;
                for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let (y, xx) = (2 * py + dy, 2 * px + dx);
                    let mut s = w[C2B + oc];
                    for ic in 0..6 {
                        for ky in 0..5 {
                            for kx in 0..5 {
                                s += w[C2W + ((oc * 6 + ic) * 5 + ky) * 5 + kx]
                                    * p1[ic * 144 + (y + ky) * 12 + xx + kx];
                            }
                        }
                    }
                    best = best.max(s);
                }
                p2[oc * 16 + py * 4 + px] = best.max(0.0);
            }
        }
    }
    let fc = |input: &[f32], wo: usize, bo: usize, outs: usize, relu: bool| -> Vec<f32> {
        (0..outs)
            .map(|o| {
                let s = w[bo + o]
                    + input
                        .iter()
                        .enumerate()
                        .map(|(i, v)| w[wo + o * input.len() + i] * v)
                        .sum::<f32>();
                if relu {
                    s.max(0.0)
                } else {
                    s
                }
            })
            .collect()
    };
    let f1 = fc(&p2, F1W, F1B, 120, true);
    let f2 = fc(&f1, F2W, F2B, 84, true);
    let f3 = fc(&f2, F3W, F3B, 10, false);
    f3.try_into().expect("10 logits")
}

/// Logits as the 40-byte response.
pub fn logits_bytes(l: &[f32; CLASSES]) -> [u8; LOGITS_BYTES] {
    let mut b = [0u8; LOGITS_BYTES];
    for (i, v) in l.iter().enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    b
}

/// Parses a 40-byte response; None for any other length.
pub fn parse_logits(b: &[u8]) -> Option<[f32; CLASSES]> {
    if b.len() != LOGITS_BYTES {
        return None;
    }
    let mut l = [0f32; CLASSES];
    for (i, v) in l.iter_mut().enumerate() {
        *v = f32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
    }
    Some(l)
}

/// Whether `got` matches `want` within `rel` of the largest logit's magnitude (sums run in a
/// different order on the GPU, so bit equality is not expected).
pub fn logits_match(got: &[f32; CLASSES], want: &[f32; CLASSES], rel: f32) -> bool {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .all(|(g, w)| g.is_finite() && (g - w).abs() <= rel * scale)
}

/// A deterministic pseudo-random image for `(seed, n)`: what `gdr load` sends, so answers can
/// be checked without remembering the images.
pub fn image(seed: u32, n: u64) -> [u8; IMAGE_BYTES] {
    let mut img = [0u8; IMAGE_BYTES];
    let base = hash(
        seed ^ 0x5eed_1a6e,
        n as u32 ^ ((n >> 32) as u32).wrapping_mul(31),
    );
    for (i, chunk) in img.chunks_mut(4).enumerate() {
        chunk.copy_from_slice(&hash(base, i as u32).to_le_bytes());
    }
    img
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_deterministic_bounded_and_seed_dependent() {
        let a = weights(7);
        assert_eq!(a, weights(7));
        assert_ne!(a, weights(8));
        for (start, count, fan_in) in LAYERS {
            let bound = (6.0f32 / fan_in as f32).sqrt() * 1.0001;
            let s = &a[start..start + count];
            assert!(s.iter().all(|v| v.abs() <= bound), "layer at {start}");
            // Uniform on [-b, b): mean near zero, not all one sign.
            let mean = s.iter().sum::<f32>() / count as f32;
            assert!(mean.abs() < bound * 0.5, "layer at {start}: mean {mean}");
        }
    }

    // Known answers, computed independently (Python, IEEE single rounding at each step): the
    // GPU twin (lenet.cuh) and any refactor of this file must stay on these numbers.
    const HASH_1_0: u32 = 0x6889_90c0;
    const HASH_1_12345: u32 = 0x2dc6_12f7;
    const SCALE2_25_BITS: u32 = 0x3f7a_d3e7;
    const W1_0_BITS: u32 = 0xbdb7_e8a9;
    const W1_LAST_BITS: u32 = 0x3c9c_e4e3;

    #[test]
    fn hash_and_weight_known_answers() {
        assert_eq!(hash(0, 0), 0);
        assert_eq!(hash(1, 0), HASH_1_0);
        assert_eq!(hash(1, 12345), HASH_1_12345);
        assert_eq!(layer_scale2(25).to_bits(), SCALE2_25_BITS);
        let w = weights(1);
        assert_eq!(w[0].to_bits(), W1_0_BITS);
        assert_eq!(w[offsets::F3B + 9].to_bits(), W1_LAST_BITS);
    }

    #[test]
    fn forward_of_a_black_image_is_the_bias_path() {
        // A zero image makes conv1 outputs equal to relu(bias); check conv1's effect by hand on
        // a tiny case: the logits then depend only on biases and weights, computed here by a
        // second, independent formulation.
        let w = weights(3);
        let zero = [0u8; IMAGE_BYTES];
        let got = forward(&w, &zero);
        use offsets::*;
        let p1: Vec<f32> = (0..6).map(|oc| w[C1B + oc].max(0.0)).collect();
        let mut p2 = [0f32; 16];
        for oc in 0..16 {
            let mut s = w[C2B + oc];
            for (ic, v) in p1.iter().enumerate() {
                let k: f32 = (0..25).map(|t| w[C2W + (oc * 6 + ic) * 25 + t]).sum();
                s += k * v;
            }
            p2[oc] = s.max(0.0);
        }
        let f1: Vec<f32> = (0..120)
            .map(|o| {
                let mut s = w[F1B + o];
                for oc in 0..16 {
                    for t in 0..16 {
                        s += w[F1W + o * 256 + oc * 16 + t] * p2[oc];
                    }
                }
                s.max(0.0)
            })
            .collect();
        let f2: Vec<f32> = (0..84)
            .map(|o| {
                (w[F2B + o] + (0..120).map(|i| w[F2W + o * 120 + i] * f1[i]).sum::<f32>()).max(0.0)
            })
            .collect();
        let f3: [f32; 10] = std::array::from_fn(|o| {
            w[F3B + o] + (0..84).map(|i| w[F3W + o * 84 + i] * f2[i]).sum::<f32>()
        });
        assert!(logits_match(&got, &f3, 1e-5), "{got:?} vs {f3:?}");
    }

    #[test]
    fn different_images_give_different_finite_logits() {
        let w = weights(1);
        let a = forward(&w, &image(1, 0));
        let b = forward(&w, &image(1, 1));
        assert!(a.iter().chain(&b).all(|v| v.is_finite()));
        assert!(!logits_match(&a, &b, 1e-3));
        let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            scale > 1e-3 && scale < 1e3,
            "logits of order one, got {a:?}"
        );
    }

    #[test]
    fn logits_round_trip_and_mismatch_is_caught() {
        let l: [f32; 10] = std::array::from_fn(|i| i as f32 * 0.5 - 2.0);
        assert_eq!(parse_logits(&logits_bytes(&l)), Some(l));
        assert_eq!(parse_logits(&[0u8; 39]), None);
        let mut m = l;
        m[3] += 0.01;
        assert!(!logits_match(&m, &l, 1e-4));
        m[3] = f32::NAN;
        assert!(!logits_match(&m, &l, 1e-4));
        assert!(logits_match(&l, &l, 0.0));
    }
}
