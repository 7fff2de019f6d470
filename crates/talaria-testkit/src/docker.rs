//! A container image for the Docker backend's tests, made on this machine:
//! a root filesystem holding Debian's static busybox (`/bin/busybox` from
//! the `busybox-static` package) and its applets, imported through the
//! Engine API as `talaria-test-busybox:<hash>`. Nothing is pulled from a
//! registry.
//!
//! The daemon is found at `DOCKER_HOST` (a `unix://` URL) or
//! `/var/run/docker.sock`. A test that needs it fails, never skips, when it
//! is missing: `scripts/test` installs and starts one.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use bollard::query_parameters::{
    CreateImageOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};
use futures::StreamExt;
use sha2::{Digest, Sha256};

/// The repository part of the test image's name.
pub const IMAGE_REPO: &str = "talaria-test-busybox";

/// Where Debian's `busybox-static` puts the binary.
const BUSYBOX: &str = "/bin/busybox";

/// Bumped when the layout below changes, so a new layout gets a new tag.
const LAYOUT: &str = "talaria-test-rootfs-1";

/// The socket's path: `DOCKER_HOST` when it is a `unix://` URL, else the
/// default.
pub fn socket() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_owned))
        .unwrap_or_else(|| "/var/run/docker.sock".to_owned())
}

/// A client of the local daemon, speaking its API version.
///
/// # Panics
/// When no daemon answers, saying how to get one.
pub async fn client() -> bollard::Docker {
    let socket = socket();
    let api = bollard::Docker::connect_with_unix(&socket, 120, bollard::API_DEFAULT_VERSION)
        .unwrap_or_else(|e| no_daemon(&socket, &e.to_string()));
    match api.negotiate_version().await {
        Ok(api) => api,
        Err(e) => no_daemon(&socket, &e.to_string()),
    }
}

fn no_daemon(socket: &str, why: &str) -> ! {
    panic!(
        "no Docker daemon answers at {socket} ({why}): the Docker backend's tests need one; \
         install and start it (Debian: apt-get install docker.io && dockerd &, or run \
         scripts/test, which does)"
    )
}

/// The test image's name, imported on first use in this process (and only
/// when the daemon doesn't have it already).
///
/// # Panics
/// When busybox cannot be installed or the daemon refuses the import.
pub async fn busybox_image() -> String {
    static IMAGE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    IMAGE.get_or_init(import).await.clone()
}

async fn import() -> String {
    let busybox = busybox_binary();
    let tag = {
        let mut h = Sha256::new();
        h.update(LAYOUT.as_bytes());
        h.update(&busybox);
        let digest = h.finalize();
        digest[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let name = format!("{IMAGE_REPO}:{tag}");
    let api = client().await;
    if api.inspect_image(&name).await.is_ok() {
        return name;
    }
    let rootfs = rootfs_tar(&busybox);
    // The tag goes with the name in `repo`: Podman's compatible API
    // ignores a separate `tag` on import (and tags it `latest`).
    let options = CreateImageOptionsBuilder::new()
        .from_src("-")
        .repo(&name)
        .build();
    let mut progress =
        api.create_image(Some(options), Some(bollard::body_full(rootfs.into())), None);
    while let Some(step) = progress.next().await {
        if let Err(e) = step {
            panic!("the daemon refused to import the test image {name}: {e}");
        }
    }
    if let Err(e) = api.inspect_image(&name).await {
        panic!("the test image {name} was imported but cannot be found: {e}");
    }
    name
}

/// Debian's static busybox, installed with apt-get when missing.
fn busybox_binary() -> Vec<u8> {
    if !Path::new(BUSYBOX).exists() {
        let installed = Command::new("apt-get")
            .args(["install", "-y", "-qq", "busybox-static"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status();
        if !matches!(installed, Ok(s) if s.success()) {
            panic!(
                "{BUSYBOX} is missing and `apt-get install busybox-static` failed \
                 ({installed:?}); install Debian's busybox-static (scripts/test does)"
            );
        }
    }
    let bytes = std::fs::read(BUSYBOX).unwrap_or_else(|e| panic!("cannot read {BUSYBOX}: {e}"));
    if has_interpreter(&bytes) {
        panic!(
            "{BUSYBOX} is dynamically linked (Debian's `busybox`, not `busybox-static`): it would \
             not run in an image without a C library; apt-get install busybox-static"
        );
    }
    bytes
}

/// Whether an ELF64 little-endian binary names a program interpreter (is
/// dynamically linked): a `PT_INTERP` entry among its program headers.
fn has_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let le16 = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let le32 = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let phoff = elf
        .get(0x20..0x28)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(|b| u64::from_le_bytes(b) as usize);
    let (Some(phoff), Some(size), Some(count)) = (phoff, le16(0x36), le16(0x38)) else {
        return false;
    };
    (0..count).any(|i| le32(phoff + i * size) == Some(PT_INTERP))
}

/// The root filesystem as a tarball: busybox in `/bin` with a link per
/// applet, `/usr/bin` and `/sbin` pointing there, the usual empty mount
/// points and a minimal `/etc/passwd`.
fn rootfs_tar(busybox: &[u8]) -> Vec<u8> {
    let listed = Command::new(BUSYBOX)
        .arg("--list")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {BUSYBOX} --list: {e}"));
    let applets = String::from_utf8_lossy(&listed.stdout).into_owned();
    let mut tar = tar::Builder::new(Vec::new());
    let dir = |tar: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(mode);
        h.set_size(0);
        tar.append_data(&mut h, path, std::io::empty())
            .unwrap_or_else(|e| panic!("cannot add {path} to the rootfs: {e}"));
    };
    for d in [
        "bin",
        "dev",
        "etc",
        "proc",
        "root",
        "sys",
        "usr",
        "var",
        "workspace",
    ] {
        dir(&mut tar, d, 0o755);
    }
    dir(&mut tar, "tmp", 0o1777);
    let file = |tar: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        tar.append_data(&mut h, path, data)
            .unwrap_or_else(|e| panic!("cannot add {path} to the rootfs: {e}"));
    };
    file(&mut tar, "bin/busybox", 0o755, busybox);
    file(
        &mut tar,
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    );
    file(
        &mut tar,
        "etc/group",
        0o644,
        b"root:x:0:\nnogroup:x:65534:\n",
    );
    let link = |tar: &mut tar::Builder<Vec<u8>>, path: &str, target: &str| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        tar.append_link(&mut h, path, target)
            .unwrap_or_else(|e| panic!("cannot add {path} to the rootfs: {e}"));
    };
    for applet in applets.split_whitespace().filter(|a| *a != "busybox") {
        link(&mut tar, &format!("bin/{applet}"), "busybox");
    }
    link(&mut tar, "sbin", "bin");
    link(&mut tar, "usr/bin", "../bin");
    link(&mut tar, "usr/sbin", "../bin");
    tar.into_inner()
        .unwrap_or_else(|e| panic!("cannot finish the rootfs tarball: {e}"))
}

/// Force-removes every container labelled `label=value` (a test's own,
/// whatever happened to the test); returns how many there were.
pub async fn remove_labelled(label: &str, value: &str) -> usize {
    let api = client().await;
    let filter = HashMap::from([("label".to_owned(), vec![format!("{label}={value}")])]);
    let listed = api
        .list_containers(Some(
            ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filter)
                .build(),
        ))
        .await
        .unwrap_or_else(|e| panic!("cannot list containers: {e}"));
    let mut n = 0;
    for c in listed {
        if let Some(id) = c.id {
            let options = RemoveContainerOptionsBuilder::new().force(true).build();
            let _ = api.remove_container(&id, Some(options)).await;
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_binary_is_told_from_a_dynamic_one() {
        assert!(!has_interpreter(&busybox_binary()));
        // Debian's /bin/sh (dash) is linked against the C library.
        let dash = std::fs::read("/bin/sh").unwrap();
        assert!(has_interpreter(&dash));
        assert!(!has_interpreter(b"not an ELF file"));
    }
}
