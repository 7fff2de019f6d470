//! A seccomp filter for the sandbox: system calls a command has no
//! business making fail with `EPERM`, as defence in depth under the
//! namespaces (they shrink what a kernel bug in those calls could reach).
//!
//! The filter is compiled once with `seccompiler` (pure Rust) into the
//! kernel's BPF program and handed to bubblewrap (`--seccomp`), which
//! installs it just before it runs the command. Everything not listed is
//! allowed: this is a deny list of rarely needed, often exploited calls,
//! not a profile of what commands use.

use std::collections::BTreeMap;

use seccompiler::{SeccompAction, SeccompFilter, TargetArch};

/// The calls refused, by what they would let a command do.
const DENIED: &[(&str, i64)] = &[
    // Inspect or change other processes' memory.
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    // Load or replace kernel code.
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    // Kernel facilities behind many privilege escalations.
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    // New namespaces and mounts: a sandbox inside the sandbox could undo
    // its limits.
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("open_tree", libc::SYS_open_tree),
    ("move_mount", libc::SYS_move_mount),
    ("fsopen", libc::SYS_fsopen),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    // Reach files by handle, around the mount namespace.
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    // The machine itself.
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
];

/// The filter as bubblewrap reads it: the `struct sock_filter` array in
/// the machine's byte order. `None` on an architecture seccompiler does not
/// know (the sandbox then runs without the filter).
pub fn program() -> Option<Vec<u8>> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).ok()?;
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> =
        DENIED.iter().map(|(_, nr)| (*nr, Vec::new())).collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .ok()?;
    let bpf: seccompiler::BpfProgram = filter.try_into().ok()?;
    let mut out = Vec::with_capacity(bpf.len() * 8);
    for insn in bpf {
        out.extend_from_slice(&insn.code.to_ne_bytes());
        out.push(insn.jt);
        out.push(insn.jf);
        out.extend_from_slice(&insn.k.to_ne_bytes());
    }
    Some(out)
}

/// The names of the refused calls, for the documentation and the status.
pub fn denied() -> impl Iterator<Item = &'static str> {
    DENIED.iter().map(|(name, _)| *name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_program_is_whole_instructions() {
        let p = super::program().expect("x86_64 and aarch64 are supported");
        assert!(!p.is_empty());
        assert_eq!(p.len() % 8, 0);
    }
}
