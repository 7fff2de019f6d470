//! Containers through the Docker Engine API (or Podman's compatible one).
//! SKELETON: being written; the signatures are the contract.

use std::sync::Arc;

use async_trait::async_trait;
use talaria_core::config::DockerConfig;

use crate::{Backend, BackendKind, CommandSpec, ExecError, Running, Workspace};

/// The Engine API client of one process and the containers it keeps.
#[derive(Debug)]
pub struct Docker {}

impl Docker {
    /// A client for `config`'s socket. `owner` labels this home's containers.
    pub fn connect(_config: &DockerConfig, _owner: &str) -> Result<Docker, ExecError> {
        Err(ExecError::Unavailable("docker: not built yet".into()))
    }
    /// Whether the daemon answers.
    pub async fn ping(&self) -> Result<(), ExecError> {
        Err(ExecError::Unavailable("docker: not built yet".into()))
    }
    /// The backend of `scope`, its container started if needed.
    pub async fn backend(
        &self,
        _scope: &str,
        _workspace: Workspace,
    ) -> Result<Arc<dyn Backend>, ExecError> {
        Err(ExecError::Unavailable("docker: not built yet".into()))
    }
    /// Removes `scope`'s container.
    pub async fn release(&self, _scope: &str) {}
    /// Removes containers of this home whose gateway is gone.
    pub async fn sweep(&self) -> Result<usize, ExecError> {
        Ok(0)
    }
    /// Removes idle containers.
    pub async fn reap_idle(&self) {}
}

#[derive(Debug)]
struct Container;

#[async_trait]
impl Backend for Container {
    fn kind(&self) -> BackendKind {
        BackendKind::Docker
    }
    fn workspace(&self) -> Option<&Workspace> {
        None
    }
    async fn spawn(&self, _spec: CommandSpec) -> Result<Running, ExecError> {
        Err(ExecError::Unavailable("docker: not built yet".into()))
    }
}
