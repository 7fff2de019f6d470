//! Shared home files on PostgreSQL ([`crate::shared`]).
//!
//! Every write takes the row lock of the one-row `shared_files_head`
//! counter and holds it until it commits, so writes are serialised and
//! commit in revision order: a node that has read up to revision `n` never
//! later finds a smaller revision committed behind it. Each file of a
//! write gets its own revision, so a reader pages by revision alone.

use async_trait::async_trait;
use deadpool_postgres::Object;
use sha2::{Digest, Sha256};

use super::step::{Step, column, settle, sql_limit};
use super::{NOW, PostgresStore};
use crate::shared::{
    Expect, MAX_SHARED_FILE_BYTES, SharedConflict, SharedFile, SharedFileInfo, SharedFileStore,
    SharedWrite, valid_shared_path,
};
use crate::{Result, StoreError};

/// The shared files and their revision counter: schema step 6.
pub(super) const SCHEMA: &str = r#"
CREATE TABLE shared_files (
    path        text COLLATE "C" PRIMARY KEY,
    content     bytea,
    sha256      text,
    revision    bigint NOT NULL,
    updated_at  double precision NOT NULL
);
CREATE INDEX shared_files_by_revision ON shared_files (revision);
CREATE TABLE shared_files_head (
    id        integer PRIMARY KEY CHECK (id = 1),
    revision  bigint NOT NULL
);
INSERT INTO shared_files_head (id, revision) VALUES (1, 0);
"#;

fn file_from_row(row: &tokio_postgres::Row) -> Step<SharedFile> {
    Ok(SharedFile {
        path: column(row, 0)?,
        content: column(row, 1)?,
        revision: column(row, 2)?,
    })
}

fn check(writes: &[SharedWrite]) -> Result<()> {
    if writes.is_empty() {
        return Err(StoreError::Invalid(
            "a shared-file write names no file".into(),
        ));
    }
    for w in writes {
        if !valid_shared_path(&w.path) {
            return Err(StoreError::Invalid(format!(
                "`{}` is not a shared file's path (memories/… or skills/…)",
                w.path
            )));
        }
        if let Some(bytes) = &w.content
            && bytes.len() > MAX_SHARED_FILE_BYTES
        {
            return Err(StoreError::Invalid(format!(
                "{} is {} bytes; shared files are at most {MAX_SHARED_FILE_BYTES}",
                w.path,
                bytes.len()
            )));
        }
    }
    Ok(())
}

async fn put(
    client: &mut Object,
    writes: &[SharedWrite],
) -> Step<std::result::Result<i64, SharedConflict>> {
    let tx = client.transaction().await?;
    // The head's row lock serialises writers until this one commits.
    let head = tx
        .prepare_cached("SELECT revision FROM shared_files_head WHERE id = 1 FOR UPDATE")
        .await?;
    let mut revision: i64 = column(&tx.query_one(&head, &[]).await?, 0)?;
    let current = tx
        .prepare_cached("SELECT revision FROM shared_files WHERE path = $1")
        .await?;
    for w in writes {
        if let Expect::Revision(expected) = w.expect {
            let now: Option<i64> = match tx.query_opt(&current, &[&w.path]).await? {
                Some(row) => Some(column(&row, 0)?),
                None => None,
            };
            if now != expected {
                // Dropping the transaction rolls it back.
                return Ok(Err(SharedConflict {
                    path: w.path.clone(),
                    revision: now,
                }));
            }
        }
    }
    let upsert = tx
        .prepare_cached(&format!(
            "INSERT INTO shared_files (path, content, sha256, revision, updated_at) \
             VALUES ($1, $2, $3, $4, {NOW}) \
             ON CONFLICT (path) DO UPDATE SET content = excluded.content, \
             sha256 = excluded.sha256, revision = excluded.revision, \
             updated_at = excluded.updated_at"
        ))
        .await?;
    for w in writes {
        revision += 1;
        let sha = w
            .content
            .as_deref()
            .map(|b| talaria_core::ids::to_hex(&Sha256::digest(b)));
        tx.execute(&upsert, &[&w.path, &w.content, &sha, &revision])
            .await?;
    }
    let bump = tx
        .prepare_cached("UPDATE shared_files_head SET revision = $1 WHERE id = 1")
        .await?;
    tx.execute(&bump, &[&revision]).await?;
    tx.commit().await?;
    Ok(Ok(revision))
}

#[async_trait]
impl SharedFileStore for PostgresStore {
    async fn shared_files_since(&self, after: i64, limit: usize) -> Result<Vec<SharedFile>> {
        let client = self.client().await?;
        let step: Step<Vec<SharedFile>> = async {
            let statement = client
                .prepare_cached(
                    "SELECT path, content, revision FROM shared_files \
                     WHERE revision > $1 ORDER BY revision LIMIT $2",
                )
                .await?;
            let rows = client
                .query(&statement, &[&after, &sql_limit(limit)])
                .await?;
            rows.iter().map(file_from_row).collect()
        }
        .await;
        settle(self, step)
    }

    async fn shared_file(&self, path: &str) -> Result<Option<SharedFile>> {
        let client = self.client().await?;
        let step: Step<Option<SharedFile>> = async {
            let statement = client
                .prepare_cached("SELECT path, content, revision FROM shared_files WHERE path = $1")
                .await?;
            match client.query_opt(&statement, &[&path]).await? {
                Some(row) => Ok(Some(file_from_row(&row)?)),
                None => Ok(None),
            }
        }
        .await;
        settle(self, step)
    }

    async fn shared_file_list(&self, prefix: &str, limit: usize) -> Result<Vec<SharedFileInfo>> {
        let client = self.client().await?;
        let step: Step<Vec<SharedFileInfo>> = async {
            let statement = client
                .prepare_cached(
                    "SELECT path, sha256, revision FROM shared_files \
                     WHERE starts_with(path, $1) ORDER BY path LIMIT $2",
                )
                .await?;
            let rows = client
                .query(&statement, &[&prefix, &sql_limit(limit)])
                .await?;
            rows.iter()
                .map(|row| {
                    Ok(SharedFileInfo {
                        path: column(row, 0)?,
                        sha256: column(row, 1)?,
                        revision: column(row, 2)?,
                    })
                })
                .collect()
        }
        .await;
        settle(self, step)
    }

    async fn put_shared_files(
        &self,
        writes: &[SharedWrite],
    ) -> Result<std::result::Result<i64, SharedConflict>> {
        check(writes)?;
        let mut client = self.client().await?;
        let step = put(&mut client, writes).await;
        settle(self, step)
    }

    async fn shared_revision(&self) -> Result<i64> {
        let client = self.client().await?;
        let step: Step<i64> = async {
            let statement = client
                .prepare_cached("SELECT revision FROM shared_files_head WHERE id = 1")
                .await?;
            Ok(column(&client.query_one(&statement, &[]).await?, 0)?)
        }
        .await;
        settle(self, step)
    }
}
