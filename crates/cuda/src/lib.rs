//! mlaserve-cuda: the CUDA executor.

use mlaserve_model::{AttentionPath, Executor, ForwardBatch, Model, ModelConfig, ModelError};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("{0}")]
    Msg(String),
}

pub struct CudaExecutor {
    model: Arc<Model>,
}

impl CudaExecutor {
    pub fn new(model: Arc<Model>, ordinal: usize) -> Result<Self, CudaError> {
        let _ = model;
        Err(CudaError::Msg(format!(
            "cuda:{ordinal}: the CUDA executor is under construction"
        )))
    }
}

impl Executor for CudaExecutor {
    fn config(&self) -> &ModelConfig {
        self.model.config()
    }
    fn attention_path(&self) -> AttentionPath {
        self.model.options().attention_path
    }
    fn init_cache(&mut self, _: usize, _: usize) -> Result<(), ModelError> {
        Err(ModelError::Batch("under construction".into()))
    }
    fn forward(&mut self, _: &ForwardBatch) -> Result<Vec<f32>, ModelError> {
        Err(ModelError::Batch("under construction".into()))
    }
    fn device(&self) -> String {
        "cuda".into()
    }
}
