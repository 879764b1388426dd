//! `--device` and `--tp`: which executor runs the model.
//!
//! `cpu` (the default) is the reference [`CpuExecutor`]; `cuda` / `cuda:N` the CUDA executor
//! on GPU N. A host without a driver gets a clear error from `--device cuda`, never a panic.
//! `--device cpu --tp N` runs N tensor-parallel ranks on worker threads ([`TpExecutor`]);
//! `--device cuda:K --tp N` runs ranks on GPUs K..K+N with NCCL (`CudaTpExecutor`).

use anyhow::{bail, Context, Result};
use clap::Args;
use mlaserve_model::{CpuExecutor, Executor, LoadOptions, Model, TpExecutor, TpOptions};
use std::path::Path;
use std::sync::Arc;

/// Where a model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// CUDA device ordinal.
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Device::Cuda(n)),
                _ => Err(format!(
                    "unknown device `{s}` (expected cpu, cuda or cuda:N)"
                )),
            },
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Run on `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Tensor-parallel ranks (CPU: worker threads sharing the cores; CUDA: GPUs from N up).
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// With --tp: whole experts per rank instead of slices of every expert.
    #[arg(long)]
    pub expert_parallel: bool,
}

impl Default for DeviceArgs {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            tp: 1,
            expert_parallel: false,
        }
    }
}

/// Loads `path` onto the device `args` names.
pub fn load_executor(
    path: &Path,
    args: &DeviceArgs,
    opts: &LoadOptions,
) -> Result<Box<dyn Executor>> {
    if args.tp == 0 {
        bail!("--tp must be at least 1");
    }
    if args.expert_parallel && args.tp == 1 {
        tracing::warn!("--expert-parallel has no effect with --tp 1");
    }
    let t0 = std::time::Instant::now();
    let exec: Box<dyn Executor> = match args.device {
        Device::Cpu if args.tp > 1 => {
            let tp = TpOptions {
                expert_parallel: args.expert_parallel,
                ..TpOptions::new(args.tp)
            };
            Box::new(
                TpExecutor::load(path, opts, tp)
                    .with_context(|| format!("loading {} at --tp {}", path.display(), args.tp))?,
            )
        }
        Device::Cuda(ordinal) if args.tp > 1 => Box::new(
            mlaserve_cuda::CudaTpExecutor::load(
                path,
                opts,
                ordinal,
                args.tp,
                args.expert_parallel,
                std::time::Duration::from_secs(60),
            )
            .with_context(|| {
                format!(
                    "putting {} on cuda:{ordinal}..cuda:{} (--tp {})",
                    path.display(),
                    ordinal + args.tp - 1,
                    args.tp
                )
            })?,
        ),
        Device::Cpu => {
            let model =
                Model::load(path, opts).with_context(|| format!("loading {}", path.display()))?;
            Box::new(CpuExecutor::new(Arc::new(model)))
        }
        Device::Cuda(ordinal) => {
            let model =
                Model::load(path, opts).with_context(|| format!("loading {}", path.display()))?;
            Box::new(
                mlaserve_cuda::CudaExecutor::new(Arc::new(model), ordinal)
                    .with_context(|| format!("putting {} on cuda:{ordinal}", path.display()))?,
            )
        }
    };
    for w in &exec.config().warnings {
        tracing::warn!("{w}");
    }
    tracing::info!(
        "loaded {} on {} in {:.2}s",
        path.display(),
        exec.device(),
        t0.elapsed().as_secs_f64()
    );
    Ok(exec)
}
