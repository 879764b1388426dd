//! Run-time choice of the instruction set the kernels use.
//!
//! Invariant: [`Isa::detect`] returns a level whose every feature the running CPU has, so a
//! kernel compiled with `#[target_feature(enable = ...)]` for that level is safe to call.

use std::sync::OnceLock;

/// An instruction-set level with its own kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust: the reference every other level is tested against.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// [`Isa::Avx2`] plus AVX-512 F and BW (used by the Q4_K/Q5_K/Q8_0/Q5_0 kernels; every other
    /// type runs its AVX2 kernel at this level).
    Avx512,
}

impl Isa {
    /// The best level this CPU supports (detected once, then cached). Setting the environment
    /// variable `MLASERVE_NO_AVX512` caps it at [`Isa::Avx2`].
    pub fn detect() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                let avx2 = std::is_x86_feature_detected!("avx2")
                    && std::is_x86_feature_detected!("fma")
                    && std::is_x86_feature_detected!("f16c");
                let avx512 = std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw");
                if avx2 && avx512 && std::env::var_os("MLASERVE_NO_AVX512").is_none() {
                    return Isa::Avx512;
                }
                if avx2 {
                    return Isa::Avx2;
                }
            }
            Isa::Scalar
        })
    }

    /// Every level this CPU can run, scalar first (for tests that compare levels).
    pub fn available() -> Vec<Isa> {
        match Isa::detect() {
            Isa::Scalar => vec![Isa::Scalar],
            Isa::Avx2 => vec![Isa::Scalar, Isa::Avx2],
            Isa::Avx512 => vec![Isa::Scalar, Isa::Avx2, Isa::Avx512],
        }
    }

    /// Whether this CPU can run level `self`.
    pub fn is_available(self) -> bool {
        match (self, Isa::detect()) {
            (Isa::Scalar, _) => true,
            (Isa::Avx2, d) => matches!(d, Isa::Avx2 | Isa::Avx512),
            (Isa::Avx512, d) => d == Isa::Avx512,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn available_levels_are_runnable_and_ordered() {
        let levels = Isa::available();
        assert_eq!(levels[0], Isa::Scalar);
        assert_eq!(*levels.last().unwrap(), Isa::detect());
        for l in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            assert_eq!(l.is_available(), levels.contains(&l), "{l:?}");
        }
    }
}
