//! Interleaved rotary embedding with DeepSeek YaRN.
//!
//! Invariants: pairs are adjacent dims `(2i, 2i+1)` rotated by `pos * inv_freq[i]` (GPT-J /
//! llama.cpp `ROPE_TYPE_NORM`, vLLM `is_neox_style=False`) — never NeoX half-split. Under YaRN,
//! `inv_freq` blends interpolated and extrapolated frequencies with a linear ramp over the
//! correction range (floor/ceil-truncated, as HF, vLLM and ggml); cos/sin are multiplied by
//! `attn_factor` (1.0 when mscale == mscale_all_dim). The softmax-scale `mscale^2` lives in
//! `ModelConfig::softmax_scale`, not here.

use crate::config::Yarn;
use std::f64::consts::PI;

/// Rotary embedding over `dim` dims.
#[derive(Debug, Clone)]
pub struct Rope {
    /// [dim/2] per-pair angular frequency.
    pub inv_freq: Vec<f32>,
    /// cos/sin magnitude.
    pub attn_factor: f32,
}

fn correction_dim(num_rotations: f64, dim: usize, base: f64, max_pos: usize) -> f64 {
    (dim as f64 * (max_pos as f64 / (num_rotations * 2.0 * PI)).ln()) / (2.0 * base.ln())
}

impl Rope {
    /// Frequencies for `dim` rotary dims with base `theta`, optionally YaRN-scaled.
    pub fn new(dim: usize, theta: f32, yarn: Option<&Yarn>) -> Self {
        let half = dim / 2;
        let base = theta as f64;
        // Computed in f64 then rounded, so the table does not depend on summation order.
        let pos_freq: Vec<f64> = (0..half)
            .map(|i| base.powf((2 * i) as f64 / dim as f64))
            .collect();
        match yarn {
            Some(y) if y.factor > 1.0 => {
                let factor = y.factor as f64;
                let low = correction_dim(y.beta_fast as f64, dim, base, y.original_context_length)
                    .floor()
                    .max(0.0);
                let high = correction_dim(y.beta_slow as f64, dim, base, y.original_context_length)
                    .ceil()
                    .min(dim as f64 - 1.0);
                let span = if high == low { 0.001 } else { high - low };
                let inv_freq = (0..half)
                    .map(|i| {
                        let ramp = ((i as f64 - low) / span).clamp(0.0, 1.0);
                        let extrap_weight = 1.0 - ramp;
                        let extrap = 1.0 / pos_freq[i];
                        let interp = 1.0 / (factor * pos_freq[i]);
                        (interp * (1.0 - extrap_weight) + extrap * extrap_weight) as f32
                    })
                    .collect();
                Rope {
                    inv_freq,
                    attn_factor: y.attn_factor,
                }
            }
            _ => Rope {
                inv_freq: pos_freq.iter().map(|p| (1.0 / p) as f32).collect(),
                attn_factor: 1.0,
            },
        }
    }

    /// cos and sin for one position: ([dim/2], [dim/2]).
    pub fn cos_sin(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let mut c = Vec::with_capacity(self.inv_freq.len());
        let mut s = Vec::with_capacity(self.inv_freq.len());
        for &f in &self.inv_freq {
            // Angle in f32 like the references (positions are exact in f32 below 2^24).
            let a = pos as f32 * f;
            c.push(a.cos() * self.attn_factor);
            s.push(a.sin() * self.attn_factor);
        }
        (c, s)
    }

    /// Rotate `x` ([dim], interleaved pairs) in place with a precomputed cos/sin.
    #[inline]
    pub fn apply(x: &mut [f32], cos: &[f32], sin: &[f32]) {
        for i in 0..cos.len() {
            let (x0, x1) = (x[2 * i], x[2 * i + 1]);
            x[2 * i] = x0 * cos[i] - x1 * sin[i];
            x[2 * i + 1] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rope_frequencies() {
        let r = Rope::new(8, 10000.0, None);
        assert_eq!(r.inv_freq.len(), 4);
        assert!((r.inv_freq[0] - 1.0).abs() < 1e-7);
        assert!((r.inv_freq[1] - 0.1).abs() < 1e-7);
    }

    #[test]
    fn rotation_is_interleaved_and_norm_preserving() {
        let r = Rope::new(4, 10000.0, None);
        let (c, s) = r.cos_sin(3);
        let mut x = [1.0f32, 0.0, 0.0, 1.0];
        Rope::apply(&mut x, &c, &s);
        // pair (0,1) rotated by 3 rad: (cos3, sin3)
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[1] - 3f32.sin()).abs() < 1e-6);
        let n: f32 = x.iter().map(|v| v * v).sum();
        assert!((n - 2.0).abs() < 1e-5);
    }

    #[test]
    fn yarn_interpolates_low_frequencies_only() {
        let y = Yarn {
            factor: 40.0,
            original_context_length: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            log_multiplier: 0.1,
            attn_factor: 1.0,
        };
        let plain = Rope::new(64, 10000.0, None);
        let scaled = Rope::new(64, 10000.0, Some(&y));
        // Highest frequency pair untouched, lowest divided by the factor.
        assert_eq!(plain.inv_freq[0], scaled.inv_freq[0]);
        let last = plain.inv_freq.len() - 1;
        assert!(
            (scaled.inv_freq[last] * 40.0 - plain.inv_freq[last]).abs() / plain.inv_freq[last]
                < 1e-5
        );
        // DSV3 mscale = 0.1*1*ln(40)+1
        assert!((y.mscale() - 1.368_888_8).abs() < 1e-5);
    }
}
