//! The shared backend: PostgreSQL, for several gateways on several hosts.
//!
//! One database is the system of record for every node of a deployment.
//! Connections come from a pool; every trait method is one short
//! transaction at READ COMMITTED, written so that concurrent nodes cannot
//! interleave badly: inserts settle races with `ON CONFLICT`, state changes
//! are updates guarded on the state they expect, check-then-act steps take
//! a row lock or a transaction-scoped advisory lock, and queue claims use
//! `FOR UPDATE SKIP LOCKED` so claimers never wait on each other.
//!
//! # Clock
//!
//! Every time this backend stamps (creation, updates, leases, heartbeats)
//! is the database server's clock, so nodes whose clocks drift apart still
//! agree on who holds a lease. Times are stored as Unix seconds in
//! `double precision`, the same numbers the SQLite backend stores.
//!
//! # Layout
//!
//! - this file: options, the pool, errors, the clock expression;
//! - `schema`: versioned migrations, run under an advisory lock so nodes
//!   starting together migrate once;
//! - `tls`: libpq's `sslmode` semantics on rustls;
//! - `sessions`: sessions and transcripts ([`crate::SessionStore`]);
//! - `rows`: reading rows into the crate's types and the conversions
//!   every query shares (column lists, counts, NUL-free text);
//! - `search`: full-text search (`tsvector`, and `pg_trgm` where it can
//!   be installed); `snippet`: the marked excerpts of its hits;
//! - `routes`: session routes ([`crate::RouteStore`]);
//! - `gateway`: DM pairing, inbound dedupe and adapter cursors;
//! - `step`: a trait method's body and its error, as `gateway` and `cron`
//!   write them, with the checked reads of counters;
//! - `cron`: scheduled jobs and the claimed record of their runs;
//! - `cluster`: nodes and leases; `ledger`: the delivery ledger;
//! - `copy`: reading a store out and writing a copy in ([`crate::copy`]).
//! - `shared`: the home files every node shares ([`crate::shared`]).
//! - `upkeep`: sessions a page at a time, idle ones deleted, the counts
//!   of what is stored ([`crate::upkeep`]).

mod cluster;
mod copy;
mod cron;
mod gateway;
mod ledger;
mod owed;
mod routes;
mod rows;
mod schema;
mod search;
mod sessions;
mod shared;
mod snippet;
mod spend;
mod step;
mod tls;
mod upkeep;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::error::SqlState;

use crate::{Result, StoreError};

/// SQL for "now" in Unix seconds on the server's clock: the start of the
/// current statement, so one statement compares and stamps with one value,
/// and a lease granted late in a transaction is measured from its grant.
pub(crate) const NOW: &str = "extract(epoch from statement_timestamp())::float8";

/// How to reach the database, and how many connections to keep.
#[derive(Clone)]
pub struct PostgresOptions {
    /// A libpq-style URL or key/value string:
    /// `postgres://user:password@host:5432/dbname?sslmode=require`.
    pub url: String,
    /// The schema Talaria's tables live in; created if missing. `None`
    /// uses the connection's default (`public`, usually).
    pub schema: Option<String>,
    /// Most connections open at once.
    pub max_connections: usize,
    /// How long to wait for a connection (opening one, or a free one from
    /// the pool) before reporting the database unavailable.
    pub connect_timeout: Duration,
}

impl PostgresOptions {
    /// Options for `url` with the defaults: schema from the connection,
    /// 16 connections, a 10-second connect timeout.
    pub fn new(url: impl Into<String>) -> PostgresOptions {
        PostgresOptions {
            url: url.into(),
            schema: None,
            max_connections: 16,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("url", &redact_url(&self.url))
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

/// The PostgreSQL-backed store. Cloning is cheap; clones share the pool.
///
/// It follows the conventions documented on [`crate::SqliteStore`]; where
/// the two differ, the method's documentation says so.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    /// For messages: the URL without its password.
    target: String,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("target", &self.inner.target)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects, checks the server answers, and migrates the schema to the
    /// version this build writes.
    ///
    /// # Errors
    /// [`StoreError::Database`] when the URL does not parse, the server
    /// cannot be reached or refuses the login, or the schema was written by
    /// a newer Talaria.
    pub async fn connect(options: PostgresOptions) -> Result<PostgresStore> {
        let target = redact_url(&options.url);
        let (url, verify) = tls::split_policy(&options.url);
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e| StoreError::Database(format!("invalid PostgreSQL URL {target}: {e}")))?;
        config.connect_timeout(options.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("talaria");
        }
        if let Some(schema) = &options.schema {
            validate_schema_name(schema)?;
            // Every pooled connection resolves unqualified names in the
            // schema (and finds extensions' functions in `public`).
            let existing = config.get_options().unwrap_or("").to_owned();
            config.options(format!("{existing} -c search_path={schema},public").trim());
        }
        let manager = Manager::from_config(
            config,
            tls::connector(&verify)?,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.max_connections.max(1))
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Database(format!("cannot build a connection pool: {e}")))?;
        let store = PostgresStore {
            inner: Arc::new(Inner { pool, target }),
        };
        let mut client = store.client().await?;
        schema::migrate(&mut client, options.schema.as_deref()).await?;
        Ok(store)
    }

    /// A connection from the pool.
    pub(crate) async fn client(&self) -> Result<Object> {
        self.inner.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Timeout(_) => StoreError::Busy,
            deadpool_postgres::PoolError::Backend(e) => self.error(e),
            other => StoreError::Database(format!(
                "cannot reach PostgreSQL at {}: {other}",
                self.inner.target
            )),
        })
    }

    /// Turns a driver error into the public type.
    ///
    /// Lock timeouts, deadlocks and serialization failures are
    /// [`StoreError::Busy`] (trying again can succeed); unique violations
    /// are [`StoreError::Conflict`]; everything else, including a lost
    /// connection, is [`StoreError::Database`] naming the server.
    pub(crate) fn error(&self, e: tokio_postgres::Error) -> StoreError {
        if let Some(code) = e.code() {
            if code == &SqlState::T_R_SERIALIZATION_FAILURE
                || code == &SqlState::T_R_DEADLOCK_DETECTED
                || code == &SqlState::LOCK_NOT_AVAILABLE
                || code == &SqlState::QUERY_CANCELED
                || code == &SqlState::TOO_MANY_CONNECTIONS
            {
                return StoreError::Busy;
            }
            if code == &SqlState::UNIQUE_VIOLATION {
                let detail = e
                    .as_db_error()
                    .map(|d| d.message().to_owned())
                    .unwrap_or_else(|| e.to_string());
                return StoreError::Conflict(detail);
            }
        }
        let detail = match e.as_db_error() {
            Some(db) => db.message().to_owned(),
            None => e.to_string(),
        };
        StoreError::Database(format!("PostgreSQL at {}: {detail}", self.inner.target))
    }

    /// The server's clock, in Unix seconds.
    pub async fn now(&self) -> Result<f64> {
        let client = self.client().await?;
        let row = client
            .query_one(&format!("SELECT {NOW}"), &[])
            .await
            .map_err(|e| self.error(e))?;
        Ok(row.get(0))
    }
}

/// A schema name goes into `search_path` and DDL unquoted: plain
/// lower-case identifiers only.
fn validate_schema_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Database(format!(
            "invalid PostgreSQL schema name {name:?}: use lower-case letters, digits and '_'"
        )))
    }
}

/// `url` with any password replaced by `***`, for logs and errors.
pub fn redact_url(url: &str) -> String {
    // postgres://user:password@host/...: the password sits between the
    // first ':' after the scheme and the last '@' before the path.
    if let Some(rest) = url
        .strip_prefix("postgres://")
        .map(|r| ("postgres://", r))
        .or_else(|| {
            url.strip_prefix("postgresql://")
                .map(|r| ("postgresql://", r))
        })
    {
        let (scheme, rest) = rest;
        let authority_end = rest.find('/').unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        if let Some(at) = authority.rfind('@') {
            let userinfo = &authority[..at];
            if let Some(colon) = userinfo.find(':') {
                return format!("{scheme}{}:***{}", &userinfo[..colon], &rest[at..]);
            }
        }
        return url.to_owned();
    }
    // Key/value form: password=... up to the next space.
    url.split(' ')
        .map(|part| match part.split_once('=') {
            Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
            _ => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Both backends serve everything the gateway needs.
const _: () = {
    const fn gateway_store<T: crate::GatewayStore>() {}
    gateway_store::<PostgresStore>();
    gateway_store::<crate::SqliteStore>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact_url("postgres://talaria:s3cret@db.example:5432/talaria?sslmode=require"),
            "postgres://talaria:***@db.example:5432/talaria?sslmode=require"
        );
        assert_eq!(
            redact_url("postgresql://a:b:c@h/d"),
            "postgresql://a:***@h/d"
        );
        assert_eq!(
            redact_url("postgres://root@127.0.0.1/test"),
            "postgres://root@127.0.0.1/test"
        );
        assert_eq!(
            redact_url("host=db user=t password=hunter2 dbname=x"),
            "host=db user=t password=*** dbname=x"
        );
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        assert!(validate_schema_name("talaria").is_ok());
        assert!(validate_schema_name("t_123").is_ok());
        for bad in ["", "Talaria", "a-b", "a;drop", "1abc", &"x".repeat(64)] {
            assert!(validate_schema_name(bad).is_err(), "{bad:?}");
        }
    }
}
