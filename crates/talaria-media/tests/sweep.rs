//! Retention: old files go, new ones stay, nothing outside is touched.

use crate::common;

use std::path::Path;
use std::time::{Duration, SystemTime};

use common::listing;
use talaria_media::{Hint, MediaCache, SweepReport};

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// Makes `path` look last written `age` ago.
fn age(path: &Path, age: Duration) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
}

#[tokio::test]
async fn old_files_are_removed_and_new_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cache = MediaCache::new(dir.path().join("media"), 1024 * 1024);
    let old = cache
        .store(&b"old news"[..], Hint::default())
        .await
        .unwrap();
    let new = cache.store(&b"fresh"[..], Hint::default()).await.unwrap();
    age(&old.path, 8 * DAY);
    age(&new.path, DAY);

    // A temporary file an interrupted process left two hours ago, and one
    // a store is writing right now.
    let stale_temp = cache.dir().join(".tmp-1-2-3");
    let live_temp = cache.dir().join(".tmp-4-5-6");
    std::fs::write(&stale_temp, b"half").unwrap();
    std::fs::write(&live_temp, b"half").unwrap();
    age(&stale_temp, 2 * 60 * 60 * Duration::from_secs(1));
    // Something that is not the cache's: left alone, however old.
    let foreign = cache.dir().join("README");
    std::fs::write(&foreign, b"mine").unwrap();
    age(&foreign, 100 * DAY);

    let report = cache.sweep(7 * DAY).await.unwrap();
    assert_eq!(
        report,
        SweepReport {
            removed: 1,
            removed_temp: 1,
            freed_bytes: (b"old news".len() + b"half".len()) as u64,
            kept: 1,
            incomplete: false,
        }
    );
    assert!(!old.path.exists());
    assert!(new.path.exists() && live_temp.exists() && foreign.exists());
    assert!(!stale_temp.exists());

    // Storing the same content again renews it: it is not swept at once.
    let again = cache
        .store(&b"old news"[..], Hint::default())
        .await
        .unwrap();
    assert_eq!(again.path, old.path);
    assert_eq!(cache.sweep(7 * DAY).await.unwrap().removed, 0);
    assert!(again.path.exists());
}

#[tokio::test]
async fn a_missing_cache_is_an_empty_one() {
    let dir = tempfile::tempdir().unwrap();
    let cache = MediaCache::new(dir.path().join("never-made"), 10);
    assert_eq!(cache.sweep(DAY).await.unwrap(), SweepReport::default());
}

#[tokio::test]
#[cfg(unix)]
async fn links_are_not_followed_out_of_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = MediaCache::new(dir.path().join("media"), 1024);
    cache.store(&b"x"[..], Hint::default()).await.unwrap();

    // An old file outside, reached through a link with a cache-like name
    // and through a folder inside the cache.
    let outside = dir.path().join("precious");
    std::fs::create_dir(&outside).unwrap();
    let target = outside.join(format!("{}.txt", "a".repeat(64)));
    std::fs::write(&target, b"keep me").unwrap();
    age(&target, 30 * DAY);
    let link = cache.dir().join(format!("{}.txt", "b".repeat(64)));
    std::os::unix::fs::symlink(&target, &link).unwrap();
    std::os::unix::fs::symlink(&outside, cache.dir().join("sub")).unwrap();

    let report = cache.sweep(DAY).await.unwrap();
    assert_eq!((report.removed, report.kept), (0, 1));
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    assert!(link.symlink_metadata().is_ok(), "the link itself stays");
    assert_eq!(listing(&outside).len(), 1);
}
