//! The gateway under systemd (`Type=notify`): `READY=1` once it serves,
//! `WATCHDOG=1` from its event loop while it lives, `STOPPING=1` when it
//! starts to stop. Outside systemd (`NOTIFY_SOCKET` unset) every call is a
//! no-op.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;

/// Says the gateway is up: its listeners are bound and its connectors
/// started (a platform still connecting is `/readyz`'s business, not a
/// failed start: systemd would kill a gateway whose Telegram is down).
pub fn ready(platforms: &[&str]) {
    let status = if platforms.is_empty() {
        "serving".to_owned()
    } else {
        format!("serving {}", platforms.join(", "))
    };
    if let Err(e) = sd_notify::notify(false, &[NotifyState::Ready, NotifyState::Status(&status)]) {
        tracing::warn!(error = %e, "cannot tell systemd the gateway is ready");
    }
}

/// Pings systemd's watchdog at half its interval until `stop`, when the
/// unit asks for one (`WatchdogSec`). The pings come from a task on the
/// gateway's runtime, so a runtime that stops turning stops them.
pub fn watchdog(stop: CancellationToken) -> Option<tokio::task::JoinHandle<()>> {
    let mut usec = 0;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return None;
    }
    let every = Duration::from_micros(usec / 2).max(Duration::from_millis(100));
    tracing::info!(
        every_ms = every.as_millis() as u64,
        "pinging systemd's watchdog"
    );
    Some(tokio::spawn(async move {
        loop {
            if let Err(e) = sd_notify::notify(false, &[NotifyState::Watchdog]) {
                tracing::warn!(error = %e, "cannot ping systemd's watchdog");
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    }))
}

/// Tells systemd the gateway is stopping once `shutdown` fires, so
/// `systemctl status` shows it draining rather than hung.
pub fn stopping_on(shutdown: CancellationToken) {
    tokio::spawn(async move {
        shutdown.cancelled().await;
        let _ = sd_notify::notify(
            false,
            &[NotifyState::Stopping, NotifyState::Status("draining")],
        );
    });
}
