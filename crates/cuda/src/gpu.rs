//! `Gpu`: one device — its context, one stream, the cuBLAS handle and the loaded kernels —
//! and `DBuf`, a typed device allocation addressed by raw pointer.
//!
//! Invariants: all work runs on the one stream, in order, so no event tracking is needed
//! (it is turned off before the first allocation); every host read (`to_host`) synchronizes
//! the stream first, so a kernel's error surfaces at the next read at the latest; a `DBuf`
//! frees its memory on drop with its context bound.
//!
//! Step scratch: between [`Gpu::begin_step`] and [`Gpu::end_step`] every allocation is cut
//! from a bump arena that persists across steps (it grows by chunks, never shrinks), so a
//! step makes no `cuMemAlloc`/`cuMemFree` calls — those synchronize the device, and with
//! NCCL ranks in one process they serialized the ranks. Reusing the arena in the next step
//! without a host sync is safe because all work is ordered on the one stream.

use crate::error::{CudaError, Result};
use crate::kernels;
use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{result as drv, CudaContext, CudaFunction, CudaStream, LaunchConfig};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

/// Checks for the driver, NVRTC and cuBLAS libraries without calling into any of them.
pub fn check_libraries() -> Result<()> {
    // SAFETY: these only try to dlopen the libraries by name.
    let (drv_ok, nvrtc_ok, blas_ok) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    let missing: Vec<&str> = [
        (drv_ok, "libcuda (the NVIDIA driver)"),
        (nvrtc_ok, "libnvrtc"),
        (blas_ok, "libcublas"),
    ]
    .iter()
    .filter(|(ok, _)| !ok)
    .map(|(_, n)| *n)
    .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CudaError::Unavailable(format!(
            "{} not found on the library path",
            missing.join(", ")
        )))
    }
}

/// A device allocation of `len` elements of `T` (owned, or a view of the step arena).
pub struct DBuf<T> {
    ptr: u64,
    len: usize,
    ctx: Arc<CudaContext>,
    owned: bool,
    _t: PhantomData<T>,
}

// SAFETY: the pointer is plain device memory owned by this value; the context is Send + Sync.
unsafe impl<T> Send for DBuf<T> {}
unsafe impl<T> Sync for DBuf<T> {}

impl<T> DBuf<T> {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    /// Pointer to element `i`.
    pub fn at(&self, i: usize) -> u64 {
        debug_assert!(i <= self.len);
        self.ptr + (i * std::mem::size_of::<T>()) as u64
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
}

impl<T> Drop for DBuf<T> {
    fn drop(&mut self) {
        if self.owned && self.ptr != 0 {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: allocated by `Gpu::alloc` in this context and freed once.
            let _ = unsafe { drv::free_sync(self.ptr) };
        }
    }
}

/// One GPU.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    blas: blas_sys::cublasHandle_t,
    blas_ws: u64,
    funcs: HashMap<&'static str, CudaFunction>,
    pub name: String,
    pub ordinal: usize,
    pub arch: &'static str,
    /// With a communicator, host waits poll the stream with this deadline instead of
    /// blocking (a stuck collective becomes an error, not a hang).
    sync_timeout: Option<std::time::Duration>,
    arena: std::sync::Mutex<Arena>,
    /// Opt-in shared memory per block (bytes): kernels needing more fall back.
    pub max_smem_per_block: usize,
    /// Streaming multiprocessors (grid sizing).
    pub sm_count: usize,
    /// Kernels whose dynamic shared-memory limit was already raised (once per kernel).
    smem_raised: std::sync::Mutex<std::collections::HashSet<&'static str>>,
    /// Whether a kernel's clusters of a size can be scheduled here ([`Gpu::clusters_fit`]).
    clusters_ok: std::sync::Mutex<HashMap<(&'static str, u32), bool>>,
    /// While profiling ([`Gpu::prof_begin`]): an event recorded after every kernel and GEMM,
    /// with its label.
    prof: std::sync::Mutex<Option<Vec<(String, cudarc::driver::CudaEvent)>>>,
    /// The bf16 scratch quantized weights are dequantized into for large-M products
    /// (qgemv.rs), reserved once before any step so graph captures never allocate.
    pub(crate) dequant_scratch: std::sync::OnceLock<DBuf<u16>>,
    /// Kernels launch with programmatic stream serialization (sm_90+, unless
    /// `MLASERVE_PDL=0`): each may be scheduled while the previous kernel runs and waits for
    /// it in its first statement (`MLA_PDL()` in kernels/common.cuh).
    pub pdl: bool,
    /// Kernels launched twice each time (`MLASERVE_LAB_TWICE=name,name`): a timing lab's
    /// way to read one kernel's marginal cost inside a whole step (examples/decode_profile.rs
    /// `--replays`). Results change where a doubled kernel accumulates; never for serving.
    twice: Vec<String>,
}

/// The step scratch arena: chunks of device memory, bump-allocated, reset per step.
#[derive(Default)]
struct Arena {
    active: bool,
    /// (pointer, capacity in bytes); owned, freed with the Gpu.
    chunks: Vec<(u64, usize)>,
    chunk: usize,
    offset: usize,
}

const ARENA_CHUNK: usize = 256 << 20;
const BLAS_WORKSPACE: usize = 32 << 20;
const ARENA_ALIGN: usize = 256;

// SAFETY: the context, stream and cuBLAS handle move with the Gpu to the thread that drives
// it (an executor or a tensor-parallel rank); it is Send, not Sync, so one thread uses it at a
// time, and every call binds the context first.
unsafe impl Send for Gpu {}

impl Gpu {
    /// Opens device `ordinal`, compiles (or loads from cache) the kernels, creates cuBLAS.
    pub fn new(ordinal: usize) -> Result<Self> {
        check_libraries()?;
        let count =
            CudaContext::device_count().map_err(|e| CudaError::driver("cuDeviceGetCount", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::Unavailable(format!(
                "cuda:{ordinal} asked for, {count} device(s) present"
            )));
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| CudaError::driver("creating the context", e))?;
        // SAFETY: before any allocation on this context; we order all work on one stream.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own, not the legacy default one: CUDA graphs are captured from it.
        let stream = ctx
            .new_stream()
            .map_err(|e| CudaError::driver("creating the stream", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let (maj, min) = ctx
            .compute_capability()
            .map_err(|e| CudaError::driver("compute capability", e))?;
        let arch = kernels::arch_for(maj, min)?;
        let max_smem_per_block = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| CudaError::driver("shared memory per block", e))?
            .max(0) as usize;
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| CudaError::driver("multiprocessor count", e))?
            .max(1) as usize;
        let pdl = maj >= 9 && std::env::var("MLASERVE_PDL").map_or(true, |v| v != "0");
        let t0 = std::time::Instant::now();
        let (image, cached) = kernels::image_for(arch)?;
        let module = match ctx.load_module(cudarc::nvrtc::Ptx::from_binary(image.to_vec())) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(
                    "cuda:{ordinal}: the driver rejected the kernels' cubin ({e:?}): \
                     compiling PTX for its JIT instead (slower to start; a newer driver avoids it)"
                );
                ctx.load_module(kernels::compile_ptx(arch)?)
                    .map_err(|e| CudaError::driver("loading the kernel module (PTX)", e))?
            }
        };
        let mut funcs = HashMap::new();
        for &n in kernels::NAMES {
            let f = module
                .load_function(n)
                .map_err(|e| CudaError::driver(format!("kernel {n}"), e))?;
            funcs.insert(n, f);
        }
        tracing::info!(
            "cuda:{ordinal} {name} ({arch}): kernels {} in {:.2}s",
            if cached { "from cache" } else { "compiled" },
            t0.elapsed().as_secs_f64()
        );
        let blas = blas::create_handle().map_err(|e| CudaError::Cublas {
            op: "create".into(),
            msg: format!("{e:?}"),
        })?;
        // SAFETY: a valid handle and this context's stream.
        unsafe { blas::set_stream(blas, stream.cu_stream() as _) }.map_err(|e| {
            CudaError::Cublas {
                op: "set_stream".into(),
                msg: format!("{e:?}"),
            }
        })?;
        // A workspace of our own, so cuBLAS never allocates while a graph is captured.
        // SAFETY: plain device allocation, freed in drop after the handle.
        let blas_ws = unsafe { drv::malloc_sync(BLAS_WORKSPACE) }
            .map_err(|e| CudaError::driver("allocating the cuBLAS workspace", e))?;
        // SAFETY: a valid handle and a live allocation of BLAS_WORKSPACE bytes.
        let st = unsafe {
            blas_sys::cublasSetWorkspace_v2(blas, blas_ws as *mut std::ffi::c_void, BLAS_WORKSPACE)
        };
        if st != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(CudaError::Cublas {
                op: "set_workspace".into(),
                msg: format!("{st:?}"),
            });
        }
        Ok(Self {
            ctx,
            stream,
            blas,
            blas_ws,
            funcs,
            name,
            ordinal,
            arch,
            sync_timeout: None,
            arena: std::sync::Mutex::new(Arena::default()),
            max_smem_per_block,
            sm_count,
            smem_raised: std::sync::Mutex::new(std::collections::HashSet::new()),
            clusters_ok: std::sync::Mutex::new(HashMap::new()),
            prof: std::sync::Mutex::new(None),
            dequant_scratch: std::sync::OnceLock::new(),
            pdl,
            twice: lab_twice(),
        })
    }

    /// From here to [`Gpu::end_step`], allocations come from the step arena.
    pub fn begin_step(&self) {
        let mut a = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        a.active = true;
        a.chunk = 0;
        a.offset = 0;
    }

    /// Allocations are plain (owned) again. Arena views must be dropped by now.
    pub fn end_step(&self) {
        self.arena.lock().unwrap_or_else(|e| e.into_inner()).active = false;
    }

    /// Bytes the step arena holds.
    pub fn arena_bytes(&self) -> usize {
        let a = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        a.chunks.iter().map(|c| c.1).sum()
    }

    /// A pointer to `bytes` from the arena, or None when no step is active.
    fn arena_alloc(&self, bytes: usize) -> Result<Option<u64>> {
        let mut a = self.arena.lock().unwrap_or_else(|e| e.into_inner());
        if !a.active {
            return Ok(None);
        }
        let need = bytes.div_ceil(ARENA_ALIGN) * ARENA_ALIGN;
        loop {
            if a.chunk < a.chunks.len() {
                let (ptr, cap) = a.chunks[a.chunk];
                if a.offset + need <= cap {
                    let p = ptr + a.offset as u64;
                    a.offset += need;
                    return Ok(Some(p));
                }
                a.chunk += 1;
                a.offset = 0;
                continue;
            }
            let cap = need.max(ARENA_CHUNK);
            // SAFETY: plain device allocation, kept until the Gpu drops.
            let ptr = unsafe { drv::malloc_sync(cap) }.map_err(|e| {
                CudaError::driver(format!("growing the step arena by {cap} bytes"), e)
            })?;
            a.chunks.push((ptr, cap));
        }
    }

    /// Host waits give up after `t` (tensor-parallel ranks).
    pub fn set_sync_timeout(&mut self, t: std::time::Duration) {
        self.sync_timeout = Some(t);
    }

    pub fn blas(&self) -> blas_sys::cublasHandle_t {
        self.blas
    }

    /// Uninitialized allocation of `len` elements (at least one byte is allocated).
    pub fn alloc<T>(&self, len: usize) -> Result<DBuf<T>> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        if let Some(ptr) = self.arena_alloc(bytes)? {
            return Ok(DBuf {
                ptr,
                len,
                ctx: self.ctx.clone(),
                owned: false,
                _t: PhantomData,
            });
        }
        // SAFETY: plain device allocation, freed by DBuf::drop.
        let ptr = unsafe { drv::malloc_sync(bytes) }
            .map_err(|e| CudaError::driver(format!("allocating {bytes} bytes"), e))?;
        Ok(DBuf {
            ptr,
            len,
            ctx: self.ctx.clone(),
            owned: true,
            _t: PhantomData,
        })
    }

    /// An allocation outside the step arena even while a step is open (buffers a CUDA graph
    /// reads at fixed addresses across steps); freed when dropped.
    pub fn alloc_persistent<T>(&self, len: usize) -> Result<DBuf<T>> {
        let was = std::mem::replace(
            &mut self.arena.lock().unwrap_or_else(|e| e.into_inner()).active,
            false,
        );
        let r = self.alloc::<T>(len);
        self.arena.lock().unwrap_or_else(|e| e.into_inner()).active = was;
        r
    }

    /// Starts a profile: from now on every kernel launch and GEMM records an event after it
    /// (inside a graph capture the events become event-record nodes), so
    /// [`Gpu::prof_take`] can time each one on the GPU.
    pub fn prof_begin(&self) -> Result<()> {
        let mut p = self.prof.lock().unwrap_or_else(|e| e.into_inner());
        *p = Some(Vec::new());
        drop(p);
        self.prof_mark("start")
    }

    /// Whether a profile is being recorded ([`Gpu::prof_begin`]).
    pub fn profiling(&self) -> bool {
        self.prof
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Records a profile event labelled `label` (no-op unless profiling).
    pub fn prof_mark(&self, label: &str) -> Result<()> {
        let mut p = self.prof.lock().unwrap_or_else(|e| e.into_inner());
        let Some(v) = p.as_mut() else {
            return Ok(());
        };
        let ev = self
            .ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| CudaError::driver("profile event", e))?;
        use cudarc::driver::sys;
        let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: this context's live stream.
        unsafe { sys::cuStreamIsCapturing(self.stream.cu_stream(), &mut capture) }
            .result()
            .map_err(|e| CudaError::driver("profile event: capture status", e))?;
        // EXTERNAL makes a captured record a real event-record node of the graph; outside a
        // capture the flag is invalid (CUDA_ERROR_ILLEGAL_STATE: eager profiles failed with
        // it until session 28).
        let flags = if capture == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
            sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32
        } else {
            0
        };
        // SAFETY: a live event and this context's stream.
        unsafe { sys::cuEventRecordWithFlags(ev.cu_event(), self.stream.cu_stream(), flags) }
            .result()
            .map_err(|e| CudaError::driver("recording a profile event", e))?;
        v.push((label.to_string(), ev));
        Ok(())
    }

    /// Ends the profile: waits for the stream, returns (label, µs since the previous mark)
    /// per kernel or GEMM, in stream order.
    pub fn prof_take(&self) -> Result<Vec<(String, f64)>> {
        let v = self
            .prof
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default();
        self.sync()?;
        let mut out = Vec::with_capacity(v.len());
        for w in v.windows(2) {
            let ms = w[0]
                .1
                .elapsed_ms(&w[1].1)
                .map_err(|e| CudaError::driver("profile event time", e))?;
            out.push((w[1].0.clone(), ms as f64 * 1e3));
        }
        Ok(out)
    }

    /// Starts capturing the stream's work into a CUDA graph (relaxed mode: the arena may
    /// still grow by cuMemAlloc meanwhile). Nothing runs until the graph is launched.
    pub fn begin_capture(&self) -> Result<()> {
        self.stream
            .begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|e| CudaError::driver("beginning graph capture", e))
    }

    /// Ends a capture begun by [`Gpu::begin_capture`] and instantiates the graph.
    pub fn end_capture(&self) -> Result<cudarc::driver::CudaGraph> {
        self.stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map_err(|e| CudaError::driver("ending graph capture", e))?
            .ok_or_else(|| CudaError::Invalid("graph capture recorded no work".into()))
    }

    /// Sets every byte of `d` to zero (on the stream).
    pub fn zero<T>(&self, d: &DBuf<T>) -> Result<()> {
        // SAFETY: d is a live allocation of d.bytes() bytes.
        unsafe { drv::memset_d8_async(d.ptr, 0, d.bytes(), self.stream.cu_stream()) }
            .map_err(|e| CudaError::driver("memset", e))
    }

    /// Allocation filled with byte `b` (0 = zeros; 0xff = NaN poison for f32/bf16).
    pub fn alloc_filled<T>(&self, len: usize, b: u8) -> Result<DBuf<T>> {
        let d = self.alloc::<T>(len)?;
        // SAFETY: d is a live allocation of d.bytes() bytes.
        unsafe { drv::memset_d8_async(d.ptr, b, d.bytes(), self.stream.cu_stream()) }
            .map_err(|e| CudaError::driver("memset", e))?;
        Ok(d)
    }

    pub fn upload<T: Copy>(&self, host: &[T]) -> Result<DBuf<T>> {
        let d = self.alloc::<T>(host.len())?;
        self.write(&d, 0, host)?;
        Ok(d)
    }

    /// A buffer of `T` holding exactly `bytes` (their length a multiple of `size_of::<T>()`).
    pub fn upload_bytes<T>(&self, bytes: &[u8]) -> Result<DBuf<T>> {
        let sz = std::mem::size_of::<T>();
        if !bytes.len().is_multiple_of(sz) {
            return Err(CudaError::Invalid(format!(
                "{} bytes are not a whole number of {sz}-byte elements",
                bytes.len()
            )));
        }
        let d = self.alloc::<T>(bytes.len() / sz)?;
        if !bytes.is_empty() {
            // SAFETY: d holds exactly bytes.len() bytes.
            unsafe { drv::memcpy_htod_async(d.ptr, bytes, self.stream.cu_stream()) }
                .map_err(|e| CudaError::driver("copy to device", e))?;
        }
        Ok(d)
    }

    /// Copies `host` into `d` from element `at`.
    pub fn write<T: Copy>(&self, d: &DBuf<T>, at: usize, host: &[T]) -> Result<()> {
        if at + host.len() > d.len {
            return Err(CudaError::Invalid(format!(
                "write of {} elements at {at} into a buffer of {}",
                host.len(),
                d.len
            )));
        }
        if host.is_empty() {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        // SAFETY: bounds checked above; pageable source is staged before return.
        unsafe { drv::memcpy_htod_async(d.at(at), host, self.stream.cu_stream()) }
            .map_err(|e| CudaError::driver("copy to device", e))
    }

    /// Synchronizes, then copies `len` elements from element `at` of `d` to the host.
    pub fn read<T: Copy + Default>(&self, d: &DBuf<T>, at: usize, len: usize) -> Result<Vec<T>> {
        if at + len > d.len {
            return Err(CudaError::Invalid(format!(
                "read of {len} elements at {at} from a buffer of {}",
                d.len
            )));
        }
        self.sync()?;
        let mut out = vec![T::default(); len];
        if len > 0 {
            // SAFETY: bounds checked above.
            unsafe { drv::memcpy_dtoh_async(&mut out, d.at(at), self.stream.cu_stream()) }
                .map_err(|e| CudaError::driver("copy to host", e))?;
            self.sync()?;
        }
        Ok(out)
    }

    /// Lets kernel `name` use `bytes` of dynamic shared memory; the driver call happens once
    /// per kernel, not per launch.
    pub fn raise_smem(&self, name: &'static str, bytes: usize) -> Result<()> {
        let mut done = self.smem_raised.lock().unwrap_or_else(|e| e.into_inner());
        if done.contains(name) {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        self.func(name)?
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
            .map_err(|e| CudaError::driver(format!("{name}: {bytes} bytes of shared memory"), e))?;
        done.insert(name);
        Ok(())
    }

    /// Synchronizes, then copies `len` f32 from a raw device pointer into fresh memory (probes).
    pub fn read_f32_at(&self, ptr: u64, len: usize) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        self.read_f32_into(ptr, len, &mut out)?;
        Ok(out)
    }

    /// Synchronizes, then copies `len` f32 from a raw device pointer into `out` (its length
    /// becomes `len`), reusing `out`'s memory: a caller that keeps it pays no allocation or
    /// page faults per step (the logits: 26 MB at 64 rows of a 102,400-token vocabulary, 5.7
    /// ms into fresh memory against 2.1 into kept memory on the H200's host, session 27).
    pub fn read_f32_into(&self, ptr: u64, len: usize, out: &mut Vec<f32>) -> Result<()> {
        self.sync()?;
        if out.capacity() < len {
            *out = vec![0.0; len]; // zeroed pages from the allocator, not a fill
        } else {
            out.truncate(len);
            out.resize(len, 0.0);
        }
        if len > 0 {
            // SAFETY: the caller passes a pointer into a live allocation of >= len f32.
            unsafe { drv::memcpy_dtoh_async(&mut out[..], ptr, self.stream.cu_stream()) }
                .map_err(|e| CudaError::driver("copy to host", e))?;
            self.sync()?;
        }
        Ok(())
    }

    /// Copies `host` to the u32 at a raw device pointer, in stream order (the caller passes a
    /// pointer into a live allocation of >= `host.len()` u32).
    pub fn write_u32_at(&self, ptr: u64, host: &[u32]) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        // SAFETY: the caller's pointer holds host.len() u32; pageable source staged before return.
        unsafe { drv::memcpy_htod_async(ptr, host, self.stream.cu_stream()) }
            .map_err(|e| CudaError::driver("copy to device", e))
    }

    /// Synchronizes, then fills `out` from the f32 at a raw device pointer.
    pub fn read_f32_slice(&self, ptr: u64, out: &mut [f32]) -> Result<()> {
        self.sync()?;
        if !out.is_empty() {
            // SAFETY: the caller passes a pointer into a live allocation of >= out.len() f32.
            unsafe { drv::memcpy_dtoh_async(out, ptr, self.stream.cu_stream()) }
                .map_err(|e| CudaError::driver("copy to host", e))?;
            self.sync()?;
        }
        Ok(())
    }

    /// Synchronizes, then fills `out` from the u32 at a raw device pointer.
    pub fn read_u32_into(&self, ptr: u64, out: &mut [u32]) -> Result<()> {
        self.sync()?;
        if !out.is_empty() {
            // SAFETY: the caller passes a pointer into a live allocation of >= out.len() u32.
            unsafe { drv::memcpy_dtoh_async(out, ptr, self.stream.cu_stream()) }
                .map_err(|e| CudaError::driver("copy to host", e))?;
            self.sync()?;
        }
        Ok(())
    }

    /// A lab's copies of `len` f32 at `ptr` to the host (examples/decode_profile.rs
    /// `--forward`), median ms of `n` each: into fresh memory ([`Gpu::read_f32_at`]), into
    /// kept memory ([`Gpu::read_f32_into`]), into a page-locked buffer (the link's speed,
    /// for reference), and that buffer copied on into kept memory.
    pub fn lab_host_reads(&self, ptr: u64, len: usize, n: usize) -> Result<[f64; 4]> {
        if n == 0 {
            return Err(CudaError::Invalid("lab_host_reads: 0 repetitions".into()));
        }
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                let t0 = std::time::Instant::now();
                f()?;
                v.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            v.sort_by(|a, b| a.total_cmp(b));
            Ok(v[n / 2])
        };
        let mut out = Vec::new();
        let fresh = time(&mut || self.read_f32_at(ptr, len).map(drop))?;
        let kept = time(&mut || self.read_f32_into(ptr, len, &mut out))?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        let bytes = len.max(1) * std::mem::size_of::<f32>();
        // SAFETY: a page-locked allocation of len f32, freed below.
        let host = unsafe { drv::malloc_host(bytes, 0) }
            .map_err(|e| CudaError::driver("page-locked host memory", e))?;
        // SAFETY: host holds `bytes`, zeroed here so the slice below is of initialized f32.
        let stage = unsafe {
            std::ptr::write_bytes(host.cast::<u8>(), 0, bytes);
            std::slice::from_raw_parts_mut(host.cast::<f32>(), len)
        };
        let copy = |stage: &mut [f32]| -> Result<()> {
            self.sync()?;
            // SAFETY: the caller passes a pointer into a live allocation of >= len f32.
            unsafe { drv::memcpy_dtoh_async(stage, ptr, self.stream.cu_stream()) }
                .map_err(|e| CudaError::driver("copy to host", e))?;
            self.sync()
        };
        let pinned = time(&mut || copy(stage));
        let then_copied = time(&mut || {
            copy(stage)?;
            out.clear();
            out.extend_from_slice(stage);
            Ok(())
        });
        // SAFETY: allocated above, no copy in flight (each copy synchronized).
        unsafe { drv::free_host(host) }.map_err(|e| CudaError::driver("freeing it", e))?;
        Ok([fresh, kept, pinned?, then_copied?])
    }

    pub fn to_host<T: Copy + Default>(&self, d: &DBuf<T>) -> Result<Vec<T>> {
        self.read(d, 0, d.len)
    }

    /// The phase trace of the traced kernels' last launches (a timing lab, compiled in with
    /// `MLASERVE_KERNEL_TRACE=1`; common.cuh): [256 blocks][16] words, %clock64 at points
    /// 0..14, %globaltimer (ns) at 14 and 15; zeros where no traced kernel wrote since the
    /// last read (the read clears it, so a smaller grid's trace holds no older launch's blocks);
    /// then [256] the SM each block ran on (%smid; -1 or 0 where none wrote).
    pub fn kernel_trace(&self) -> Result<Vec<i64>> {
        use crate::kernels::{TRACE_BLOCKS, TRACE_WORDS};
        let buf = self.alloc::<i64>(TRACE_BLOCKS * (TRACE_WORDS + 1))?;
        self.launch(
            "mla_trace_read",
            Gpu::cfg((1, 1, 1), 256),
            &crate::args![buf.ptr()],
        )?;
        self.to_host(&buf)
    }

    pub fn sync(&self) -> Result<()> {
        let Some(timeout) = self.sync_timeout else {
            return self
                .stream
                .synchronize()
                .map_err(|e| CudaError::driver("stream synchronize (a kernel failed?)", e));
        };
        use cudarc::driver::sys::CUresult;
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        let t0 = std::time::Instant::now();
        loop {
            // SAFETY: querying this context's live stream.
            match unsafe { cudarc::driver::sys::cuStreamQuery(self.stream.cu_stream()) } {
                CUresult::CUDA_SUCCESS => return Ok(()),
                CUresult::CUDA_ERROR_NOT_READY => {}
                e => return Err(CudaError::driver("stream query (a kernel failed?)", e)),
            }
            if t0.elapsed() > timeout {
                return Err(CudaError::Invalid(format!(
                    "cuda:{}: the stream did not finish within {timeout:?} (a collective waits for a peer rank that is stuck or gone)",
                    self.ordinal
                )));
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }

    pub fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs
            .get(name)
            .ok_or_else(|| CudaError::Invalid(format!("no kernel named {name}")))
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .mem_get_info()
            .map_err(|e| CudaError::driver("cuMemGetInfo", e))
    }

    pub fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Launches kernel `name` with `args`, which must match its parameter list.
    pub fn launch(&self, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        self.launch_in(name, cfg, 1, args)
    }

    /// [`Gpu::launch`] with the grid's blocks in thread-block clusters of `cluster` blocks
    /// along x (sm_90+; `cluster` divides the grid's x, at most 8, the portable size), so
    /// the kernel may use distributed shared memory and cluster barriers.
    pub fn launch_cluster(
        &self,
        name: &str,
        cfg: LaunchConfig,
        cluster: u32,
        args: &[Arg],
    ) -> Result<()> {
        if !self.has_clusters()
            || cluster == 0
            || cluster > 8
            || !cfg.grid_dim.0.is_multiple_of(cluster)
        {
            return Err(CudaError::Invalid(format!(
                "{name}: clusters of {cluster} over a grid of {} blocks along x on {}",
                cfg.grid_dim.0, self.arch
            )));
        }
        self.launch_in(name, cfg, cluster, args)
    }

    /// Whether kernel `name` can run in clusters of `cluster` blocks of `block` threads here:
    /// sm_90+ and at least one such cluster schedulable at once (`cuOccupancyMaxActiveClusters`;
    /// a MIG or MPS partition may allow none). Asked once per (kernel, size).
    pub fn clusters_fit(&self, name: &'static str, cluster: u32, block: u32) -> bool {
        self.clusters_fit_smem(name, cluster, block, 0)
    }

    /// [`Gpu::clusters_fit`] for blocks of `smem` bytes of dynamic shared memory (raised for
    /// the kernel first, [`Gpu::raise_smem`]).
    pub fn clusters_fit_smem(
        &self,
        name: &'static str,
        cluster: u32,
        block: u32,
        smem: usize,
    ) -> bool {
        if !self.has_clusters()
            || cluster == 0
            || (smem > 0 && self.raise_smem(name, smem).is_err())
        {
            return false;
        }
        let mut known = self.clusters_ok.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&ok) = known.get(&(name, cluster)) {
            return ok;
        }
        let ok = self.func(name).is_ok_and(|f| {
            use cudarc::driver::sys as cu;
            // SAFETY: a zeroed attribute and launch config filled in below, read by the
            // call that follows; `f` is a loaded function of this context, bound first.
            unsafe {
                let mut attr: cu::CUlaunchAttribute = std::mem::zeroed();
                attr.id = cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
                attr.value.clusterDim.x = cluster;
                attr.value.clusterDim.y = 1;
                attr.value.clusterDim.z = 1;
                let mut lc: cu::CUlaunchConfig = std::mem::zeroed();
                (lc.gridDimX, lc.gridDimY, lc.gridDimZ) = (cluster, 1, 1);
                (lc.blockDimX, lc.blockDimY, lc.blockDimZ) = (block, 1, 1);
                lc.sharedMemBytes = smem as u32;
                lc.hStream = self.stream.cu_stream();
                lc.attrs = &mut attr;
                lc.numAttrs = 1;
                let mut n = 0i32;
                self.ctx.bind_to_thread().is_ok()
                    && cu::cuOccupancyMaxActiveClusters(&mut n, f.cu_function(), &lc)
                        .result()
                        .is_ok()
                    && n > 0
            }
        });
        if !ok {
            tracing::warn!(
                "cuda:{}: {name} cannot run in clusters of {cluster} here",
                self.ordinal
            );
        }
        known.insert((name, cluster), ok);
        ok
    }

    /// Whether this GPU launches thread-block clusters (compute capability 9.0 and newer).
    pub fn has_clusters(&self) -> bool {
        let sm = self.arch.trim_start_matches("sm_").trim_end_matches('a');
        sm.parse::<u32>().is_ok_and(|v| v >= 90)
    }

    fn launch_in(&self, name: &str, cfg: LaunchConfig, cluster: u32, args: &[Arg]) -> Result<()> {
        if cfg.grid_dim.0 == 0 || cfg.grid_dim.1 == 0 || cfg.grid_dim.2 == 0 {
            return Ok(());
        }
        if self.twice.iter().any(|t| t == name) {
            self.launch_once(name, cfg, cluster, args)?;
        }
        self.launch_once(name, cfg, cluster, args)
    }

    fn launch_once(&self, name: &str, cfg: LaunchConfig, cluster: u32, args: &[Arg]) -> Result<()> {
        let f = self.func(name)?;
        let mut vals: Vec<Arg> = args.to_vec();
        let mut params: Vec<*mut std::ffi::c_void> = vals
            .iter_mut()
            .map(|a| match a {
                Arg::P(v) => v as *mut u64 as *mut std::ffi::c_void,
                Arg::I(v) => v as *mut i32 as *mut std::ffi::c_void,
                Arg::L(v) => v as *mut i64 as *mut std::ffi::c_void,
                Arg::F(v) => v as *mut f32 as *mut std::ffi::c_void,
            })
            .collect();
        self.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        // SAFETY: `params` points into `vals`, alive across the call; each caller in ops.rs
        // passes the kernel's exact parameter list. With `pdl`, every kernel's first
        // statement waits for the grid before it (kernels.rs tests that each one does).
        // `attrs` outlives the call that reads it.
        unsafe {
            if self.pdl || cluster > 1 {
                use cudarc::driver::sys as cu;
                let mut attrs: [cu::CUlaunchAttribute; 2] = std::mem::zeroed();
                let mut n = 0;
                if self.pdl {
                    attrs[n].id = cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                    attrs[n].value.programmaticStreamSerializationAllowed = 1;
                    n += 1;
                }
                if cluster > 1 {
                    attrs[n].id = cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
                    attrs[n].value.clusterDim.x = cluster;
                    attrs[n].value.clusterDim.y = 1;
                    attrs[n].value.clusterDim.z = 1;
                    n += 1;
                }
                let lc = cu::CUlaunchConfig {
                    gridDimX: cfg.grid_dim.0,
                    gridDimY: cfg.grid_dim.1,
                    gridDimZ: cfg.grid_dim.2,
                    blockDimX: cfg.block_dim.0,
                    blockDimY: cfg.block_dim.1,
                    blockDimZ: cfg.block_dim.2,
                    sharedMemBytes: cfg.shared_mem_bytes,
                    hStream: self.stream.cu_stream(),
                    attrs: attrs.as_mut_ptr(),
                    numAttrs: n as u32,
                };
                cu::cuLaunchKernelEx(
                    &lc,
                    f.cu_function(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
                .result()
            } else {
                drv::launch_kernel(
                    f.cu_function(),
                    cfg.grid_dim,
                    cfg.block_dim,
                    cfg.shared_mem_bytes,
                    self.stream.cu_stream(),
                    &mut params,
                )
            }
        }
        .map_err(|e| CudaError::driver(format!("launching {name}"), e))?;
        self.prof_mark(name)
    }
}

/// `MLASERVE_LAB_TWICE`'s kernel names (said on stderr: a step's results may change).
fn lab_twice() -> Vec<String> {
    let names: Vec<String> = std::env::var("MLASERVE_LAB_TWICE")
        .unwrap_or_default()
        .split(',')
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect();
    if !names.is_empty() {
        eprintln!(
            "MLASERVE_LAB_TWICE: launching {names:?} twice (a timing lab; outputs may differ)"
        );
    }
    names
}

/// One kernel argument: a device pointer, an int, a long or a float.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
}

impl From<u64> for Arg {
    fn from(v: u64) -> Self {
        Arg::P(v)
    }
}
impl From<i32> for Arg {
    fn from(v: i32) -> Self {
        Arg::I(v)
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::L(v)
    }
}
impl From<f32> for Arg {
    fn from(v: f32) -> Self {
        Arg::F(v)
    }
}

/// `args![a, b, ..]`: kernel arguments from u64 pointers, i32, i64 and f32 values.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => { [$($crate::gpu::Arg::from($a)),*] };
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        let _ = self.ctx.bind_to_thread();
        let a = self.arena.get_mut().unwrap_or_else(|e| e.into_inner());
        for &(ptr, _) in &a.chunks {
            // SAFETY: arena chunks were allocated by arena_alloc and are freed once.
            let _ = unsafe { drv::free_sync(ptr) };
        }
        // SAFETY: created in new, destroyed once.
        let _ = unsafe { blas::destroy_handle(self.blas) };
        // SAFETY: allocated in new; the handle using it is gone.
        let _ = unsafe { drv::free_sync(self.blas_ws) };
    }
}
