//! The kernel sources, compiled by NVRTC into a cubin for the device's architecture at start
//! and cached on disk by content hash, NVRTC version and defines (`$MLASERVE_KERNEL_CACHE`,
//! else `$XDG_CACHE_HOME/mlaserve/kernels`, else `~/.cache/mlaserve/kernels`). A cache that
//! cannot be read or written only costs a recompile (seconds to a minute and more: every core
//! of the host); it is never an error.

use crate::error::{CudaError, Result};
use cudarc::nvrtc::result::{self, NvrtcError};
use cudarc::nvrtc::{compile_ptx_with_opts, sys, CompileOptions, Ptx};
use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Every kernel, one translation unit: the shared prelude first.
pub const SOURCE: &str = concat!(
    include_str!("../kernels/common.cuh"),
    include_str!("../kernels/elementwise.cu"),
    include_str!("../kernels/pick.cu"),
    include_str!("../kernels/attention.cu"),
    include_str!("../kernels/mla_absorb.cu"),
    include_str!("../kernels/moe.cu"),
    include_str!("../kernels/gemv.cu"),
    include_str!("../kernels/mla_decode.cu"),
    include_str!("../kernels/mla_decode_wgmma.cu"),
    include_str!("../kernels/mla_attn_cl.cu"),
    include_str!("../kernels/qgemv.cu"),
    include_str!("../kernels/flash_attn.cu"),
    include_str!("../kernels/flash_attn_wgmma.cu"),
    include_str!("../kernels/moe_grouped.cu"),
    include_str!("../kernels/qmmq.cu"),
    include_str!("../kernels/lab.cu"),
);

/// Kernel names exported by [`SOURCE`] (each is loaded at start, so a missing one fails early).
pub const NAMES: &[&str] = &[
    "gather_rows_f32",
    "add_rows_indexed",
    "moe_route",
    "moe_norm_route",
    "moe_norm_route_cl",
    "moe_gemv",
    "moe_gemv_swiglu",
    "moe_gemv_combine",
    "moe_gemv_combine_r8",
    "moe_combine_pairs",
    "gemv_bf16_m1",
    "gemv_bf16_m2",
    "gemv_bf16_m4",
    "add_f32",
    "embed_bf16",
    "f32_to_bf16",
    "rms_norm",
    "logits_pick",
    "layer_norm",
    "rope_interleaved",
    "q_finish",
    "silu_mul_bf16",
    "gather_rows_bf16",
    "moe_combine",
    "cache_write_bf16",
    "kv_finish",
    "cache_write_f32",
    "gather_latent",
    "attn_mha",
    "attn_mqa_split",
    "attn_mqa_combine",
    "mla_q_absorb",
    "mla_combine_uv",
    "mla_attn_cl",
    "dsa_scores",
    "mla_decode_m1s3q",
    "mla_decode_m2s2",
    "mla_decode_m1s2",
    "mla_decode_m2k",
    "mla_decode_m1s3b",
    "mla_decode_m2kb",
    "mla_decode_w64",
    "mla_decode_w64_noload",
    "mla_decode_w64_nopv",
    "mla_decode_w64_nos",
    "mla_decode_w64_s",
    "mla_decode_w64_pv",
    "mla_decode_w64_bare",
    "q8_quantize_x",
    "q8_quantize_mmq",
    "qmmq_q4_k_n1",
    "qmmq_q4_k_n2",
    "qmmq_q4_k_n4",
    "qmmq_q4_k_n8",
    "qmmq_q8_0_n1",
    "qmmq_q8_0_n2",
    "qmmq_q8_0_n4",
    "qmmq_q8_0_n8",
    "q8_quantize_mmq_grouped",
    "qmmq_grouped_q4_k_n2",
    "qmmq_grouped_q4_k_n8",
    "qmmq_grouped_q8_0_n2",
    "qmmq_grouped_q8_0_n8",
    "qmv_q8_0_r1m1",
    "qmv_q8_0_r2m1",
    "qmv_q8_0_r4m1",
    "qmv_q8_0_r2m2",
    "qmv_q8_0_r2m4",
    "qmv_q8_0_r2m8",
    "qmv_q8_0_r2m1w",
    "qmv_q8_0_r4m1w",
    "qmv_q8_0_r2m2w",
    "qmv_q8_0_r2m4w",
    "qmv_q8_0_r2m8w",
    "qmv_q8_0_r2m1w3",
    "qmv_q4_k_r1m1",
    "qmv_q4_k_r2m1",
    "qmv_q4_k_r4m1",
    "qmv_q4_k_r2m2",
    "qmv_q4_k_r2m4",
    "qmv_q4_k_r2m8",
    "qmv_q4_k_r2m1w",
    "qmv_q4_k_r4m1w",
    "qmv_q4_k_r2m2w",
    "qmv_q4_k_r2m4w",
    "qmv_q4_k_r2m8w",
    "qmv_q4_k_r2m1w3",
    "qmv_q8_0_r2m1w_glu",
    "qmv_q8_0_r2m1w3_glu",
    "qmv_q4_k_r2m1w_glu",
    "qmv_q4_k_r2m1w3_glu",
    "qmv_q8_0_r2m1w_comb",
    "qmv_q8_0_r2m1w3_comb",
    "qmv_q4_k_r2m1w_comb",
    "qmv_q4_k_r2m1w3_comb",
    "qmv_q8_0_r2m1w_norm",
    "qmv_q8_0_r2m1w3_norm",
    "qmv_q4_k_r2m1w_norm",
    "qmv_q4_k_r2m1w3_norm",
    "qmv_q4_k_r2m1b_norm",
    "qmv_q4_k_r2m1b3_norm",
    "dequant_q8_0_bf16",
    "dequant_q4_k_bf16",
    "fa_pack_q",
    "fa_pack_kv",
    "fa_fwd_d64",
    "fa_fwd_d128",
    "fa_fwd_d192v128",
    "fa_fwd_d256",
    "fa_fwd_d192v128_w8",
    "fa_fwd_d256_w8",
    "fa_fwd_d256_w8n32",
    "fa_fwd_d192v128_m2",
    "fa_fwd_d192v128_m2n32",
    "fa_fwd_d128_m2",
    "fa_fwd_wg_d192v128",
    "fa_fwd_wg_d256",
    "fa_fwd_wg_d192v128_sf",
    "fa_fwd_wg_d256_sf",
    "moe_sort",
    "moe_gemm",
    "moe_gemm_m4",
    "moe_gemm_wg",
    "moe_gemm_wg2",
    "moe_gemm_wg2_glu",
    "moe_gemm_q8_0",
    "moe_gemm_q8_0_m4",
    "moe_gemm_q4_k",
    "moe_gemm_q4_k_m4",
    "qgemm_reduce",
    "lab_handoff",
    "lab_grid_sync",
    "lab_read_u1",
    "lab_read_u4",
    "lab_read_u8",
    "lab_read_u4h",
    "lab_read_u8h",
    "lab_rows_s4",
    "lab_rows_s8",
    "lab_rows_s4p",
    "lab_rows_s8p",
    "lab_copy",
    "lab_swiglu_m0",
    "lab_swiglu_m1",
    "lab_swiglu_m2",
    "mla_trace_read",
    "qmv_q4_k_r2m1b",
    "qmv_q4_k_r2m1b_glu",
    "qmv_q4_k_r2m1b_comb",
    "qmv_q4_k_r2m1b3",
    "qmv_q4_k_r2m1b3_glu",
    "qmv_q4_k_r2m1b3_comb",
    "lab_q4k_r2m1w_loads",
    "lab_q4k_r2m1w3_loads",
    "lab_q4k_r2m1w_bulk4q",
    "lab_q4k_r2m1w3_bulk3q",
    "lab_q4k_r2m1w_bulk4_loads",
];

/// NVRTC's name for a compute capability.
/// A capability this build does not list (sm_87, sm_103, sm_121, ...) compiles for the
/// highest listed one of the same major version at or below it (binary compatible within a
/// major version). Compute capability 9.0 (H100, H200) compiles for `sm_90a`, which adds the
/// arch-specific instructions (wgmma) that only 9.0 runs: the kernels that use them test
/// `__CUDA_ARCH_FEAT_SM90_ALL` and trap elsewhere.
pub fn arch_for(major: i32, minor: i32) -> Result<&'static str> {
    const KNOWN: &[(i32, i32, &str)] = &[
        (7, 0, "sm_70"),
        (7, 5, "sm_75"),
        (8, 0, "sm_80"),
        (8, 6, "sm_86"),
        (8, 9, "sm_89"),
        (9, 0, "sm_90a"),
        (10, 0, "sm_100"),
        (12, 0, "sm_120"),
    ];
    KNOWN
        .iter()
        .rev()
        .find(|&&(ma, mi, _)| ma == major && mi <= minor)
        .map(|&(_, _, a)| a)
        .ok_or_else(|| {
            CudaError::Unavailable(format!(
                "compute capability {major}.{minor} is not one this build knows"
            ))
        })
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("MLASERVE_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("mlaserve/kernels"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mlaserve/kernels"))
}

/// The kernel image (cubin) of [`SOURCE`] for `arch`: from this process's first call for the
/// arch, else the disk cache, else NVRTC. Returns (cubin, from_cache). One compile a process:
/// the ranks of a tensor-parallel group, starting together, wait for the first one's.
pub fn image_for(arch: &'static str) -> Result<(Arc<Vec<u8>>, bool)> {
    type Images = Vec<(&'static str, Arc<Vec<u8>>)>; // (arch, cubin)
    static IMAGES: Mutex<Images> = Mutex::new(Vec::new());
    let mut images = IMAGES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, img)) = images.iter().find(|(a, _)| *a == arch) {
        return Ok((img.clone(), true));
    }
    let (img, cached) = disk_or_compile(arch)?;
    let img = Arc::new(img);
    images.push((arch, img.clone()));
    Ok((img, cached))
}

fn disk_or_compile(arch: &'static str) -> Result<(Vec<u8>, bool)> {
    let (major, minor) = nvrtc_version()?;
    let key = format!(
        "{:016x}",
        fnv1a(&[
            SOURCE.as_bytes(),
            arch.as_bytes(),
            env!("CARGO_PKG_VERSION").as_bytes(),
            format!("nvrtc {major}.{minor}").as_bytes(),
            trace_define().unwrap_or("").as_bytes(),
            lab_defines().join(" ").as_bytes()
        ])
    );
    let path = cache_dir().map(|d| d.join(format!("{key}-{arch}.cubin")));
    if let Some(p) = &path {
        if let Ok(img) = std::fs::read(p) {
            if img.starts_with(b"\x7fELF") {
                return Ok((img, true));
            }
        }
    }
    let img = compile(arch)?;
    if let Some(p) = &path {
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let wrote = p.parent().map(std::fs::create_dir_all).transpose().is_ok()
            && std::fs::write(&tmp, &img).is_ok()
            && std::fs::rename(&tmp, p).is_ok();
        if !wrote {
            tracing::debug!("could not cache kernels at {}", p.display());
        }
    }
    Ok((img, false))
}

/// The phase trace's shape (common.cuh: MLA_TRACE_BLOCKS blocks of 16 words; words 14 and
/// 15 are %globaltimer at a block's start and end).
pub const TRACE_BLOCKS: usize = 256;
pub const TRACE_WORDS: usize = 16;

/// `MLASERVE_KERNEL_TRACE=1` (a timing lab): kernels compiled with MLA_TRACE, whose phase
/// points (common.cuh) write clock stamps that [`crate::Gpu::kernel_trace`] reads back.
pub fn trace_define() -> Option<&'static str> {
    (std::env::var("MLASERVE_KERNEL_TRACE").as_deref() == Ok("1")).then_some("-DMLA_TRACE")
}

/// `MLASERVE_KERNEL_DEFINES="-DNAME ..."` (a timing lab): extra macros for NVRTC, so kernel
/// variants kept behind `#ifdef` are compared in one binary and one run. Only `-D` options
/// are taken; anything else is a lab mistake and is reported, not passed on.
/// Options are split at whitespace, so a value cannot hold a space. Read once a process.
pub fn lab_defines() -> &'static [String] {
    static DEFINES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    DEFINES.get_or_init(|| {
        let Ok(v) = std::env::var("MLASERVE_KERNEL_DEFINES") else {
            return Vec::new();
        };
        v.split_whitespace()
            .filter(|d| {
                let ok = d.starts_with("-D") && d.len() > 2;
                if !ok {
                    tracing::warn!(
                        "MLASERVE_KERNEL_DEFINES: {d:?} is not a -DNAME[=VALUE]; ignored"
                    );
                }
                ok
            })
            .map(String::from)
            .collect()
    })
}

/// Compiles [`SOURCE`] with NVRTC into a cubin for `arch` (a real architecture, `sm_XY`: the
/// driver loads it without a JIT step). No GPU needed, only libnvrtc. NVRTC's defaults stay
/// (IEEE division and square root, no fast math): the quantize kernels' scales and the op
/// table's bit-exact host references (q8_block, q8u_sub) rest on them.
/// `-split-compile=0` runs NVVM's optimizer and ptxas on every core (16-core H100 host:
/// ~98 s as one thread of PTX and the driver's JIT, measured session 49); an NVRTC that
/// does not know the option compiles on one thread. Split compilation changes no kernel's
/// arithmetic: against one thread (NVRTC 12.9, sm_90a), 148 of 157 functions' SASS is
/// byte-identical and the rest differ in static shared-memory offsets and schedule. With it
/// ptxas prints its advisories to stderr itself (two C7518 lines on `mla_decode_w64_*`'s
/// wgmma), once, when the kernels compile.
pub fn compile(arch: &'static str) -> Result<Vec<u8>> {
    require_nvrtc()?;
    let opts: Vec<String> = std::iter::once(format!("--gpu-architecture={arch}"))
        .chain(options())
        .collect();
    let split = [opts.clone(), vec!["-split-compile=0".into()]].concat();
    match nvrtc_cubin(&split) {
        Err((NvrtcError(sys::nvrtcResult::NVRTC_ERROR_INVALID_OPTION), _)) => nvrtc_cubin(&opts),
        r => r,
    }
    .map_err(|(e, log)| CudaError::Compile {
        arch: arch.into(),
        log: format!("{e:?}: {log}"),
    })
}

/// PTX of [`SOURCE`] for `arch`, for the driver's JIT: the fallback where the driver rejects
/// NVRTC's cubin (an NVRTC newer than the driver). One thread, not cached (sessions 1-48's
/// path: ~98 s with the JIT on a fresh 16-core H100 host).
pub fn compile_ptx(arch: &'static str) -> Result<Ptx> {
    let opts = CompileOptions {
        arch: Some(arch),
        options: options().collect(),
        name: Some("mlaserve_kernels.cu".into()),
        ..Default::default()
    };
    compile_ptx_with_opts(SOURCE, opts).map_err(|e| CudaError::Compile {
        arch: arch.into(),
        log: format!("{e:?}"),
    })
}

/// NVRTC's options but the architecture: C++17, the trace and lab defines.
fn options() -> impl Iterator<Item = String> {
    std::iter::once("--std=c++17")
        .chain(trace_define())
        .map(String::from)
        .chain(lab_defines().iter().cloned())
}

/// One NVRTC program of [`SOURCE`] compiled with `opts`: its cubin, or the error and log.
fn nvrtc_cubin(opts: &[String]) -> std::result::Result<Vec<u8>, (NvrtcError, String)> {
    let src = CString::new(SOURCE).expect("kernel source without NUL");
    let prog = result::create_program(&src, Some(c"mlaserve_kernels.cu"))
        .map_err(|e| (e, String::new()))?;
    // SAFETY: prog is a live program, destroyed once below; the buffers are sized by NVRTC.
    let out = unsafe {
        match result::compile_program(prog, opts) {
            Err(e) => {
                let log = result::get_program_log(prog).unwrap_or_default();
                let log = CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned();
                Err((e, log))
            }
            Ok(()) => {
                let mut n = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut n)
                    .result()
                    .and_then(|()| {
                        let mut img = vec![0u8; n];
                        sys::nvrtcGetCUBIN(prog, img.as_mut_ptr().cast())
                            .result()
                            .map(|()| img)
                    })
                    .map_err(|e| (e, "no cubin (is the architecture a real sm_XY?)".into()))
            }
        }
    };
    // SAFETY: created above, not destroyed before
    let _ = unsafe { result::destroy_program(prog) };
    out
}

fn require_nvrtc() -> Result<()> {
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    Err(CudaError::Unavailable(
        "libnvrtc was not found on the library path".into(),
    ))
}

/// The loaded libnvrtc's version (a cache key: another NVRTC may emit other code).
fn nvrtc_version() -> Result<(i32, i32)> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Unavailable(format!("libnvrtc's version: {e:?}")))?;
    Ok((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `src` without its `//` and `/* */` comments.
    fn strip_comments(src: &str) -> String {
        let mut out = String::with_capacity(src.len());
        let mut rest = src;
        while let Some(i) = rest.find("/*").into_iter().chain(rest.find("//")).min() {
            out.push_str(&rest[..i]);
            let end = if rest[i..].starts_with("/*") {
                rest[i..].find("*/").map_or(rest.len(), |e| i + e + 2)
            } else {
                rest[i..].find('\n').map_or(rest.len(), |e| i + e)
            };
            rest = &rest[end..];
        }
        out.push_str(rest);
        out
    }

    /// The brace-matched block that opens at the first `{` at or after `at`: (start, end) of
    /// its contents.
    fn block(src: &str, at: usize) -> (usize, usize) {
        let open = at + src[at..].find('{').unwrap();
        let mut depth = 0;
        for (i, c) in src[open..].char_indices() {
            depth += (c == '{') as i32 - (c == '}') as i32;
            if depth == 0 {
                return (open + 1, open + i);
            }
        }
        panic!("unbalanced block at {at}");
    }

    /// Whether `src` indexes or offsets one of `names` (`name[` or `name +`).
    fn reads_any(src: &str, names: &[&str]) -> Option<String> {
        let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let mut i = 0;
        while i < src.len() {
            let c = src[i..].chars().next().unwrap();
            if ident(c) && (i == 0 || !src[..i].ends_with(ident)) {
                let len = src[i..].find(|c: char| !ident(c)).unwrap_or(src.len() - i);
                let name = &src[i..i + len];
                let next = src[i + len..].trim_start().chars().next();
                if names.contains(&name) && matches!(next, Some('[') | Some('+')) {
                    return Some(name.to_string());
                }
                i += len;
            } else {
                i += c.len_utf8();
            }
        }
        None
    }

    /// Every kernel's body starts with `MLA_PDL();`: launched with programmatic stream
    /// serialization (sm_90+), a kernel that touched memory before waiting for the previous
    /// grid would race with it. The exception (common.cuh): `MLA_WEIGHTS_FIRST();` first, for
    /// a kernel that reads only weights before its `MLA_PDL();`, which is in its body or in
    /// the device function it runs, ahead of that function's first read of kernel output.
    /// Not checked here: common.cuh's second exception, `moe_gemv_swiglu`'s shared-slice
    /// branch (`tab_on & 2`), which reads x and writes act without waiting and returns; and
    /// its third, `moe_gemv_combine` reading ids before its wait under `tab_on` bit 1 (the
    /// same for qmv_t's pairs is checked by qmv_t_waits_before_reading).
    #[test]
    fn every_kernel_waits_for_the_previous_grid_first() {
        let source = strip_comments(SOURCE);
        let qmv_t_waits = qmv_t_waits_before_reading(&source);
        let qmmq_waits = qmmq_body_waits_before_reading(&source);
        let mut n = 0;
        for (i, _) in source.match_indices("extern \"C\" __global__") {
            let body = &source[i..][source[i..].find('{').unwrap() + 1..];
            let first = body.trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
            // a macro's body ends at its first line without a continuation
            let header = source[i..].lines().next().unwrap_or("");
            let end = if header.trim_end().ends_with('\\') {
                body.lines()
                    .take_while(|l| l.trim_end().ends_with('\\'))
                    .map(|l| l.len() + 1)
                    .sum::<usize>()
                    .min(body.len())
            } else {
                body.find("\n}").unwrap_or(body.len())
            };
            let weights_first = first.starts_with("MLA_WEIGHTS_FIRST();")
                && (body[..end].contains("MLA_PDL();")
                    || (body[..end].contains("qmv_t<") && qmv_t_waits)
                    || (body[..end].contains("qmmq_body<") && qmmq_waits));
            assert!(
                first.starts_with("MLA_PDL();") || weights_first,
                "a kernel does not start with MLA_PDL(): {}",
                &source[i..i + 120.min(source.len() - i)]
            );
            n += 1;
        }
        assert!(n >= 40, "{n} kernels found");
    }

    /// qgemv.cu's qmv_t, which its kernels enter before any wait: the pairs wait before
    /// reading the routing's ids (unless `early`, the host's accumulate bit 1: common.cuh's
    /// third exception, ids through ld_cg_s32), a launch without a matrix before storing, and
    /// a dense or early launch between requesting its first weights and reading x — with
    /// nothing else a kernel writes (x, ids, out, act, cy, cw) read before that wait.
    fn qmv_t_waits_before_reading(source: &str) -> bool {
        let at = source.find("void qmv_t(").expect("qmv_t");
        let (b0, b1) = block(source, at);
        let src = &source[b0..b1];
        let wait = "if (ids == nullptr || early) MLA_PDL();";
        if !src.contains("const bool early = ids != nullptr && (accumulate & 2);") {
            return false;
        }
        let starts_with_wait = |opener: &str, w: &str| {
            src.find(opener).is_some_and(|o| {
                let (c0, c1) = block(src, o);
                src[c0..c1].trim_start().starts_with(w)
            })
        };
        let (Some(pre), Some(xrow)) = (src.find("load(pre[d]);"), src.find("xrow = x +")) else {
            return false;
        };
        let Some(dense) = src[pre..xrow].find(wait).map(|p| pre + p) else {
            return false;
        };
        // before the dense wait, outside the two blocks that wait first, nothing is read
        let mut before = src[..dense].to_string();
        for opener in ["if (w == nullptr)", "if (ids != nullptr)"] {
            if let Some(o) = before.find(opener) {
                let (c0, c1) = block(&before, o);
                before.replace_range(c0..c1, "");
            }
        }
        let outputs = ["x", "ids", "out", "act", "cy", "cw"];
        // the pairs' block runs before any wait when early: it reads the one id, through
        // ld_cg_s32 (common.cuh's third exception), and nothing else a kernel writes
        let id_read = "(early ? ld_cg_s32(ids + p) : ids[p])";
        let ids_block_reads_only_the_id = src.find("if (ids != nullptr)").is_some_and(|o| {
            let (c0, c1) = block(src, o);
            let b = &src[c0..c1];
            b.contains(id_read) && reads_any(&b.replace(id_read, ""), &outputs).is_none()
        });
        starts_with_wait("if (ids != nullptr)", "if (!early) MLA_PDL();")
            && ids_block_reads_only_the_id
            && starts_with_wait("if (w == nullptr)", wait)
            && reads_any(&before, &outputs).is_none()
    }

    /// qmmq.cu's qmmq_body, which its kernels enter before any wait: it loads its first
    /// weights, then waits, and reads nothing a kernel writes (xq, xds, out) before that.
    fn qmmq_body_waits_before_reading(source: &str) -> bool {
        let at = source.find("void qmmq_body(").expect("qmmq_body");
        let (b0, b1) = block(source, at);
        let src = &source[b0..b1];
        src.find("MLA_PDL();")
            .is_some_and(|p| reads_any(&src[..p], &["xq", "xds", "out"]).is_none())
    }

    /// The whole source through NVRTC into a cubin, then the disk cache read back without a
    /// compile. Needs libnvrtc (no GPU), e.g. `pip install nvidia-cuda-nvrtc-cu12` and its
    /// `lib/` on LD_LIBRARY_PATH; ~30 s on 2 cores.
    #[test]
    #[ignore = "needs libnvrtc: run with --ignored where it is on the library path"]
    fn compiles_to_a_cubin_and_caches_it() {
        let dir = std::env::temp_dir().join(format!("mlaserve-kc-{}", std::process::id()));
        std::env::set_var("MLASERVE_KERNEL_CACHE", &dir);
        let (img, cached) = disk_or_compile("sm_90a").unwrap();
        assert!(img.starts_with(b"\x7fELF") && !cached);
        let (again, cached) = disk_or_compile("sm_90a").unwrap();
        assert!(cached && again == img);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn archs() {
        assert_eq!(arch_for(9, 0).unwrap(), "sm_90a");
        assert_eq!(arch_for(8, 7).unwrap(), "sm_86");
        assert_eq!(arch_for(12, 1).unwrap(), "sm_120");
        assert!(arch_for(6, 1).is_err());
    }
}
