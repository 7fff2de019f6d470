//! This process's identity, and whether a recorded process is still alive.
//!
//! An [`Owner`] is a pid plus the process's start time (field 22 of
//! `/proc/<pid>/stat`, clock ticks since boot). The pid alone is not enough:
//! pids are recycled, and a reply stamped by a gateway that crashed must not
//! be considered "still being delivered" because an unrelated process got
//! the same pid. The start time tells the two apart, across reboots too
//! (ticks since boot restart at zero, so a recycled pid after a reboot almost
//! never has the same value).

use std::sync::OnceLock;

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// A process: its pid and its start time (clock ticks since boot, from
/// `/proc/<pid>/stat`), so a recycled pid is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    /// The process id.
    pub pid: u32,
    /// `None` where the start time could not be read.
    pub started_at: Option<u64>,
}

/// This process: its pid and its start time (read once, then cached).
pub fn current() -> Owner {
    static CURRENT: OnceLock<Owner> = OnceLock::new();
    *CURRENT.get_or_init(|| Owner {
        pid: std::process::id(),
        started_at: std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|line| parse_stat(&line))
            .map(|stat| stat.start_time),
    })
}

/// The start time of process `pid` (clock ticks since boot), or `None` if
/// the process does not exist or `/proc` cannot be read.
pub fn start_time(pid: u32) -> Option<u64> {
    read_stat(pid).map(|stat| stat.start_time)
}

/// Whether the process recorded as `owner` is still running.
///
/// - No such pid (`kill(pid, 0)` fails with `ESRCH`) → dead. `EPERM` means
///   the process exists but belongs to someone else → it exists.
/// - A zombie (exited, not yet reaped) → dead: it will never act again.
/// - A start time was recorded, the pid's current start time is readable and
///   differs → dead (the pid was recycled).
/// - The pid exists but its start time cannot be read (no `/proc`, or none
///   was recorded) → alive: without evidence to the contrary, the safe
///   answer is that the owner may still be working.
pub fn is_alive(owner: &Owner) -> bool {
    let Some(pid) = as_single_pid(owner.pid) else {
        return false;
    };
    match kill(pid, None) {
        Ok(()) | Err(Errno::EPERM) => {}
        Err(Errno::ESRCH) => return false,
        // Nothing else is expected from a null signal; treating the process
        // as alive errs on the side of not stealing its work.
        Err(_) => return true,
    }
    let Some(stat) = read_stat(owner.pid) else {
        return true;
    };
    if matches!(stat.state, 'Z' | 'X' | 'x') {
        return false;
    }
    match owner.started_at {
        Some(recorded) => recorded == stat.start_time,
        None => true,
    }
}

/// `pid` as a [`Pid`] that names exactly one process. Pid 0 and anything
/// that does not fit in a positive `i32` would make `kill` address a process
/// group (or everyone), so they name no process here.
pub(crate) fn as_single_pid(pid: u32) -> Option<Pid> {
    match i32::try_from(pid) {
        Ok(raw) if raw > 0 => Some(Pid::from_raw(raw)),
        _ => None,
    }
}

/// The two fields of `/proc/<pid>/stat` liveness needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// Field 3: `R`, `S`, `D`, `Z` (zombie), `T` (stopped), …
    state: char,
    /// Field 22: start time in clock ticks since boot.
    start_time: u64,
}

fn read_stat(pid: u32) -> Option<Stat> {
    let line = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&line)
}

/// Parses a `/proc/<pid>/stat` line.
///
/// Field 2 is the command name in parentheses, and it may itself contain
/// spaces and parentheses (a process can name itself `a) (b`). No later
/// field contains `)`, so the fields are counted from the *last* `)`:
/// field 3 is the first after it.
fn parse_stat(line: &str) -> Option<Stat> {
    let close = line.rfind(')')?;
    let mut fields = line[close + 1..].split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4..=21 lie between the state (field 3) and the start time.
    let start_time = fields.nth(22 - 4)?.parse().ok()?;
    Some(Stat { state, start_time })
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::*;

    fn owner_of(child: &std::process::Child) -> Owner {
        Owner {
            pid: child.id(),
            started_at: start_time(child.id()),
        }
    }

    #[test]
    fn the_current_process_is_alive() {
        let me = current();
        assert_eq!(me.pid, std::process::id());
        assert!(
            me.started_at.is_some(),
            "/proc/self/stat should be readable"
        );
        assert_eq!(me.started_at, start_time(me.pid));
        assert!(is_alive(&me));
        assert!(is_alive(&Owner {
            pid: me.pid,
            started_at: None
        }));
    }

    #[test]
    fn a_reaped_child_is_dead() {
        let mut child = Command::new("true").spawn().unwrap();
        let owner = owner_of(&child);
        child.wait().unwrap();
        assert!(!is_alive(&owner));
    }

    #[test]
    fn a_recycled_pid_is_dead() {
        let me = current();
        let impostor = Owner {
            pid: me.pid,
            started_at: Some(me.started_at.unwrap() + 1),
        };
        assert!(!is_alive(&impostor));
    }

    #[test]
    fn pid_zero_and_group_pids_are_never_alive() {
        for pid in [0, u32::MAX, i32::MAX as u32 + 1] {
            assert!(!is_alive(&Owner {
                pid,
                started_at: None
            }));
        }
    }

    #[test]
    fn a_live_child_is_alive_until_killed() {
        let mut child = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let owner = owner_of(&child);
        assert!(owner.started_at.is_some());
        assert!(is_alive(&owner));
        kill(
            Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        child.wait().unwrap();
        assert!(!is_alive(&owner));
    }

    #[test]
    fn an_unreaped_zombie_is_dead() {
        let mut child = Command::new("true").spawn().unwrap();
        let owner = owner_of(&child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while read_stat(child.id()).map(|s| s.state) != Some('Z') {
            assert!(Instant::now() < deadline, "the child never became a zombie");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Still present in the process table: kill(pid, 0) succeeds.
        assert_eq!(kill(Pid::from_raw(child.id() as i32), None), Ok(()));
        assert!(!is_alive(&owner));
        child.wait().unwrap();
    }

    #[test]
    fn parses_a_stat_line_with_a_hostile_command_name() {
        let line = "4242 (evil) (name) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    1 2 0 0 20 0 1 0 987654 10000000 200 18446744073709551615 \
                    1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                start_time: 987654
            })
        );
        let zombie = "7 (a b) Z 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0";
        assert_eq!(
            parse_stat(zombie),
            Some(Stat {
                state: 'Z',
                start_time: 55
            })
        );
        assert_eq!(parse_stat("12 (short) S 1 2 3"), None);
        assert_eq!(parse_stat("no parentheses here"), None);
        assert_eq!(
            parse_stat("1 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 notanumber"),
            None
        );
    }
}
