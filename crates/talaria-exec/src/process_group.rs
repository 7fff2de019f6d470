//! Child processes that run in a process group of their own (the terminal
//! tool's commands, the gateway's hook handlers), so a timeout or an
//! abandoned run can kill everything they started, not just the shell.

/// Kills a process group with SIGKILL when dropped, unless disarmed:
/// covers the future that owns the child being dropped mid-run (a turn was
/// abandoned, a bounded wait gave up, the runtime is stopping) as well as
/// explicit timeouts.
#[derive(Debug)]
pub struct GroupKiller(Option<i32>);

impl GroupKiller {
    /// Guards the group led by `pid` (a child spawned with
    /// `process_group(0)`). `None` guards nothing: the child has already
    /// been reaped, or its pid does not fit a `pid_t`.
    pub fn new(pid: Option<u32>) -> GroupKiller {
        GroupKiller(pid.and_then(|p| i32::try_from(p).ok()))
    }

    /// Kills the group now; later calls and the drop do nothing.
    pub fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH (already gone) is the common, harmless failure.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// The group ended on its own: do not kill it (its pgid may be reused).
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        self.kill();
    }
}
