//! The home files several nodes share, on PostgreSQL: revisions that only
//! move forward, writes that name the revision they build on, tombstones,
//! and readers that page through everything without missing a write made
//! while they read.

use crate::common;

use std::collections::BTreeMap;

use common::Backend;
use talaria_store::{Expect, PostgresStore, SessionStore, SharedConflict, SharedWrite, StoreError};

fn write(path: &str, content: Option<&str>, expect: Expect) -> SharedWrite {
    SharedWrite {
        path: path.to_owned(),
        content: content.map(|c| c.as_bytes().to_vec()),
        expect,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_get_rising_revisions_and_stale_ones_are_refused() {
    let store = PostgresStore::fresh().await;
    let files = store.shared_files().expect("PostgreSQL shares files");
    assert_eq!(files.shared_revision().await.unwrap(), 0);
    let first = files
        .put_shared_files(&[write(
            "memories/MEMORY.md",
            Some("a"),
            Expect::Revision(None),
        )])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first, 1);
    // A second "first write" of the same file lost the race.
    let lost = files
        .put_shared_files(&[write(
            "memories/MEMORY.md",
            Some("b"),
            Expect::Revision(None),
        )])
        .await
        .unwrap();
    assert_eq!(
        lost,
        Err(SharedConflict {
            path: "memories/MEMORY.md".into(),
            revision: Some(1)
        })
    );
    // Two files in one write: each gets its own revision, and a conflict
    // on either writes neither.
    let both = files
        .put_shared_files(&[
            write(
                "memories/MEMORY.md",
                Some("a\n§\nb"),
                Expect::Revision(Some(1)),
            ),
            write("memories/USER.md", Some("Ana"), Expect::Revision(None)),
        ])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(both, 3);
    let refused = files
        .put_shared_files(&[
            write("memories/USER.md", Some("Bea"), Expect::Revision(Some(3))),
            write("memories/MEMORY.md", Some("x"), Expect::Revision(Some(1))),
        ])
        .await
        .unwrap();
    assert_eq!(refused.unwrap_err().path, "memories/MEMORY.md");
    let user = files
        .shared_file("memories/USER.md")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(user.content.as_deref(), Some(&b"Ana"[..]));
    assert_eq!(user.revision, 3);
    // An operator's write wins whatever is there.
    files
        .put_shared_files(&[write("memories/USER.md", Some("Cy"), Expect::Anything)])
        .await
        .unwrap()
        .unwrap();
    assert_eq!(files.shared_revision().await.unwrap(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_leave_tombstones_and_lists_follow_folders() {
    let store = PostgresStore::fresh().await;
    let files = store.shared_files().unwrap();
    for path in [
        "skills/cook/SKILL.md",
        "skills/cook/references/pans.md",
        "skills/cookery/SKILL.md",
    ] {
        files
            .put_shared_files(&[write(path, Some(path), Expect::Revision(None))])
            .await
            .unwrap()
            .unwrap();
    }
    let gone = files
        .put_shared_files(&[write(
            "skills/cook/references/pans.md",
            None,
            Expect::Revision(Some(2)),
        )])
        .await
        .unwrap()
        .unwrap();
    let tomb = files
        .shared_file("skills/cook/references/pans.md")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((tomb.content, tomb.revision), (None, gone));
    // `skills/cook/` is that skill's folder, not every name starting so.
    let listed = files.shared_file_list("skills/cook/", 100).await.unwrap();
    let paths: Vec<(&str, bool)> = listed
        .iter()
        .map(|f| (f.path.as_str(), f.sha256.is_some()))
        .collect();
    assert_eq!(
        paths,
        [
            ("skills/cook/SKILL.md", true),
            ("skills/cook/references/pans.md", false)
        ]
    );
    use sha2::Digest;
    let expected = talaria_core::ids::to_hex(&sha2::Sha256::digest(b"skills/cook/SKILL.md"));
    assert_eq!(listed[0].sha256.as_deref(), Some(expected.as_str()));
    // Paging by revision sees every write once, the delete included.
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let page = files.shared_files_since(after, 2).await.unwrap();
        if page.is_empty() {
            break;
        }
        after = page.last().unwrap().revision;
        seen.extend(page.into_iter().map(|f| (f.path, f.content.is_some())));
    }
    assert_eq!(
        seen,
        [
            ("skills/cook/SKILL.md".to_owned(), true),
            ("skills/cookery/SKILL.md".to_owned(), true),
            ("skills/cook/references/pans.md".to_owned(), false),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_outside_the_shared_folders_and_empty_writes_are_refused() {
    let store = PostgresStore::fresh().await;
    let files = store.shared_files().unwrap();
    for path in [
        "config.yaml",
        ".env",
        "skills/../.env",
        "/memories/M.md",
        "memories/",
    ] {
        let err = files
            .put_shared_files(&[write(path, Some("x"), Expect::Anything)])
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Invalid(_)), "{path}: {err}");
    }
    assert!(matches!(
        files.put_shared_files(&[]).await.unwrap_err(),
        StoreError::Invalid(_)
    ));
    let big = "x".repeat(talaria_store::shared::MAX_SHARED_FILE_BYTES + 1);
    let err = files
        .put_shared_files(&[write(
            "skills/a/assets/big.txt",
            Some(&big),
            Expect::Anything,
        )])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("at most"), "{err}");
    assert_eq!(files.shared_revision().await.unwrap(), 0);
}

/// Four writers and a reader at once: the reader, paging by revision
/// while they write, ends with every file's last version and never sees a
/// revision go backwards, so a node that has read up to `n` has missed
/// nothing below it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_racing_writers_misses_nothing() {
    let fixture = PostgresStore::fresh().await;
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(fixture.reopen().await);
    }
    let writers: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(w, store)| {
            tokio::spawn(async move {
                let files = store.shared_files().unwrap();
                for i in 0..25 {
                    files
                        .put_shared_files(&[write(
                            &format!("skills/w{w}/SKILL.md"),
                            Some(&format!("{w}:{i}")),
                            Expect::Anything,
                        )])
                        .await
                        .unwrap()
                        .unwrap();
                }
            })
        })
        .collect();
    let files = fixture.shared_files().unwrap();
    let mut after = 0;
    let mut latest: BTreeMap<String, String> = BTreeMap::new();
    let mut done = false;
    loop {
        let finished = writers.iter().all(|w| w.is_finished());
        // One more full read after every writer finished.
        loop {
            let page = files.shared_files_since(after, 7).await.unwrap();
            let Some(last) = page.last() else { break };
            for f in &page {
                assert!(f.revision > after, "revision went backwards");
                after = f.revision;
                latest.insert(
                    f.path.clone(),
                    String::from_utf8(f.content.clone().unwrap()).unwrap(),
                );
            }
            after = last.revision;
        }
        if done {
            break;
        }
        done = finished;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    for w in writers {
        w.await.unwrap();
    }
    assert_eq!(after, 100);
    for w in 0..4 {
        assert_eq!(latest[&format!("skills/w{w}/SKILL.md")], format!("{w}:24"));
    }
}

#[tokio::test]
async fn sqlite_shares_nothing() {
    let store = talaria_store::SqliteStore::fresh().await;
    assert!(store.shared_files().is_none());
}
