//! `NcclComm`: one rank's NCCL communicator on its GPU's stream, for tensor parallelism.
//!
//! The group is built the way that works with cudarc (../shared/design/gpu.md): the main
//! thread makes the unique id ([`NcclId::new`]), each rank's thread binds its own context and
//! calls [`NcclComm::new`] with it; `ncclCommInitRank` returns once every rank has joined.
//! Collectives are enqueued on the rank's stream. Invariant: a collective never hangs the
//! process — [`NcclComm::wait`] polls the stream with a deadline, and on timeout aborts the
//! communicator (`ncclCommAbort`) and returns an error naming the rank and the wait.

use crate::error::{CudaError, Result};
use crate::gpu::Gpu;
use cudarc::driver::CudaEvent;
use cudarc::nccl::{result as nccl, sys as nccl_sys};
use std::time::{Duration, Instant};

/// The group's rendezvous id (made once, copied to every rank).
#[derive(Clone, Copy)]
pub struct NcclId(nccl_sys::ncclUniqueId);

// SAFETY: a plain 128-byte value.
unsafe impl Send for NcclId {}
unsafe impl Sync for NcclId {}

impl NcclId {
    pub fn new() -> Result<Self> {
        check_nccl()?;
        nccl::get_uniqueid()
            .map(NcclId)
            .map_err(|e| CudaError::driver("ncclGetUniqueId", e))
    }
}

/// Errors unless libnccl can be loaded (cudarc would panic on first use otherwise).
pub fn check_nccl() -> Result<()> {
    // SAFETY: only tries to dlopen the library.
    if unsafe { nccl_sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::Unavailable(
            "libnccl (libnccl.so) not found on the library path".into(),
        ))
    }
}

pub struct NcclComm {
    comm: nccl_sys::ncclComm_t,
    /// Events around each all-reduce since the last `take_seconds` (timed on the stream).
    events: std::cell::RefCell<Vec<(CudaEvent, CudaEvent)>>,
    pub rank: usize,
    pub world_size: usize,
    pub timeout: Duration,
}

// SAFETY: the communicator is used only from the rank's own thread (it is moved there once).
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Joins the group as `rank` of `world_size` on `gpu` (call on the rank's thread).
    pub fn new(
        gpu: &Gpu,
        id: NcclId,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Self> {
        check_nccl()?;
        gpu.ctx
            .bind_to_thread()
            .map_err(|e| CudaError::driver("bind", e))?;
        let mut comm = std::ptr::null_mut();
        // SAFETY: comm is an out-pointer; the id is shared by every rank of the group.
        unsafe { nccl::comm_init_rank(&mut comm, world_size as i32, id.0, rank as i32) }.map_err(
            |e| CudaError::driver(format!("ncclCommInitRank rank {rank} of {world_size}"), e),
        )?;
        Ok(Self {
            comm,
            events: std::cell::RefCell::new(Vec::new()),
            rank,
            world_size,
            timeout,
        })
    }

    /// In-place sum of `len` f32 at device pointer `buf` over the group, on `gpu`'s stream.
    pub fn all_reduce_sum(&self, gpu: &Gpu, buf: u64, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let ev = || {
            gpu.ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| CudaError::driver("event", e))
        };
        let (e0, e1) = (ev()?, ev()?);
        e0.record(&gpu.stream)
            .map_err(|e| CudaError::driver("event record", e))?;
        // SAFETY: buf holds len f32 on this rank's device; in-place is allowed by NCCL.
        unsafe {
            nccl::all_reduce(
                buf as *const std::ffi::c_void,
                buf as *mut std::ffi::c_void,
                len,
                nccl_sys::ncclDataType_t::ncclFloat32,
                nccl_sys::ncclRedOp_t::ncclSum,
                self.comm,
                gpu.stream.cu_stream() as _,
            )
        }
        .map_err(|e| CudaError::driver(format!("ncclAllReduce on rank {}", self.rank), e))?;
        e1.record(&gpu.stream)
            .map_err(|e| CudaError::driver("event record", e))?;
        self.events.borrow_mut().push((e0, e1));
        Ok(())
    }

    /// Seconds the all-reduces since the last call took on the stream (call after a sync).
    pub fn take_seconds(&self) -> f64 {
        self.events
            .borrow_mut()
            .drain(..)
            .filter_map(|(a, b)| a.elapsed_ms(&b).ok())
            .map(|ms| ms as f64 / 1e3)
            .sum()
    }

    /// Waits for the stream with a deadline; on timeout aborts the communicator.
    pub fn wait(&self, gpu: &Gpu, what: &str) -> Result<()> {
        let t0 = Instant::now();
        loop {
            // SAFETY: querying a live stream.
            let r = unsafe { cudarc::driver::sys::cuStreamQuery(gpu.stream.cu_stream()) };
            match r {
                cudarc::driver::sys::CUresult::CUDA_SUCCESS => return Ok(()),
                cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY => {}
                e => return Err(CudaError::driver(format!("rank {} {what}", self.rank), e)),
            }
            if t0.elapsed() > self.timeout {
                // SAFETY: aborting our own communicator; later calls fail instead of hanging.
                let _ = unsafe { nccl::comm_abort(self.comm) };
                return Err(CudaError::Invalid(format!(
                    "rank {}: {what} did not finish within {:?} (a peer rank is stuck or gone); communicator aborted",
                    self.rank, self.timeout
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl NcclComm {
    /// Leaves the group at once: pending collectives of the peers fail instead of waiting.
    pub fn abort(mut self) {
        let c = std::mem::replace(&mut self.comm, std::ptr::null_mut());
        // SAFETY: our communicator, aborted once; Drop then sees null.
        let _ = unsafe { nccl::comm_abort(c) };
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if !self.comm.is_null() {
            // SAFETY: created by comm_init_rank, destroyed once.
            let _ = unsafe { nccl::comm_destroy(self.comm) };
        }
    }
}
