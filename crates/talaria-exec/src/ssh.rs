//! Commands on another machine through the system `ssh`.
//! SKELETON: being written; the signatures are the contract.

use async_trait::async_trait;
use talaria_core::config::SshConfig;

use crate::{Backend, BackendKind, CommandSpec, ExecError, Running, Workspace};

/// The SSH backend.
#[derive(Debug)]
pub struct Ssh {}

impl Ssh {
    /// The backend `config` describes; refused when it names no host.
    pub fn new(_config: &SshConfig) -> Result<Ssh, ExecError> {
        Err(ExecError::Unavailable("ssh: not built yet".into()))
    }
}

#[async_trait]
impl Backend for Ssh {
    fn kind(&self) -> BackendKind {
        BackendKind::Ssh
    }
    fn workspace(&self) -> Option<&Workspace> {
        None
    }
    async fn spawn(&self, _spec: CommandSpec) -> Result<Running, ExecError> {
        Err(ExecError::Unavailable("ssh: not built yet".into()))
    }
}
