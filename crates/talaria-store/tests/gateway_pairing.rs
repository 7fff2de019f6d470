//! DM pairing: offers and their limits, approvals, lockouts, and that the
//! code itself is never written down.

mod common;

use std::path::Path;

use common::temp_store;
use sha2::{Digest, Sha256};
use talaria_store::{ApproveOutcome, OfferOutcome, PairingLimits, PairingStore, SqliteStore};

const CODE: &str = "QZ7KX9WP";

fn limits() -> PairingLimits {
    PairingLimits::default()
}

/// Limits that never rate-limit one user, for tests about other rules.
fn no_interval() -> PairingLimits {
    PairingLimits {
        offer_interval: 0.0,
        ..PairingLimits::default()
    }
}

fn raw(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

fn db_path(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("state.db")
}

/// Makes every pending code `secs` older.
fn age_pending(path: &Path, secs: f64) {
    raw(path)
        .execute(
            "UPDATE pairing_pending SET created_at = created_at - ?1",
            [secs],
        )
        .unwrap();
}

async fn offer(store: &SqliteStore, user: &str, code: &str, l: PairingLimits) -> OfferOutcome {
    store
        .pairing_offer("telegram", user, Some("Ann"), code, l)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_offer_is_created_then_rate_limited_for_the_same_user() {
    let (_dir, store) = temp_store();
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&store, "u1", "OTHER234", limits()).await,
        OfferOutcome::RateLimited
    );
    // Other users, and the same user on another platform, are not limited.
    assert_eq!(
        offer(&store, "u2", "ABCD2345", limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        store
            .pairing_offer("discord", "u1", None, "EFGH2345", limits())
            .await
            .unwrap(),
        OfferOutcome::Created
    );
    let snap = store.pairing_snapshot(limits()).await.unwrap();
    assert_eq!(snap.pending.len(), 3);
}

#[tokio::test]
async fn the_offer_interval_elapses() {
    let (dir, store) = temp_store();
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    raw(&db_path(&dir))
        .execute(
            "UPDATE pairing_stamps SET stamp = stamp - 601 WHERE kind = 'offer'",
            [],
        )
        .unwrap();
    assert_eq!(
        offer(&store, "u1", "ABCD2345", limits()).await,
        OfferOutcome::Created
    );
}

#[tokio::test]
async fn too_many_pending_codes_refuse_new_ones_per_platform() {
    let (_dir, store) = temp_store();
    for user in ["u1", "u2", "u3"] {
        assert_eq!(
            offer(&store, user, CODE, limits()).await,
            OfferOutcome::Created
        );
    }
    assert_eq!(
        offer(&store, "u4", CODE, limits()).await,
        OfferOutcome::TooManyPending
    );
    // The refusal stamped the user: they are told once per interval.
    assert_eq!(
        offer(&store, "u4", CODE, limits()).await,
        OfferOutcome::RateLimited
    );
    // Refused while there was no room: nothing of u4's is pending.
    let snap = store.pairing_snapshot(limits()).await.unwrap();
    assert!(snap.pending.iter().all(|p| p.user_id != "u4"));
    assert_eq!(
        store
            .pairing_offer("discord", "u4", None, CODE, limits())
            .await
            .unwrap(),
        OfferOutcome::Created
    );
}

#[tokio::test]
async fn one_user_holds_one_code_and_cannot_crowd_out_the_others() {
    let (_dir, store) = temp_store();
    // Asking again after each interval replaces the code, never adds one.
    for code in [CODE, "ABCD2345", "EFGH2345", "JKLM2345"] {
        assert_eq!(
            offer(&store, "u1", code, no_interval()).await,
            OfferOutcome::Created
        );
    }
    let snap = store.pairing_snapshot(limits()).await.unwrap();
    let pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    assert_eq!(pending, ["u1"]);
    // So the platform still has room for two other strangers.
    for user in ["u2", "u3"] {
        assert_eq!(
            offer(&store, user, CODE, limits()).await,
            OfferOutcome::Created
        );
    }
    assert_eq!(
        offer(&store, "u4", CODE, limits()).await,
        OfferOutcome::TooManyPending
    );
    // A full platform still lets a holder replace their own code.
    assert_eq!(
        offer(&store, "u1", "NPQR2345", no_interval()).await,
        OfferOutcome::Created
    );
    // Only the code shown last works.
    assert_eq!(
        store
            .pairing_approve("telegram", "JKLM2345", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    assert!(matches!(
        store
            .pairing_approve("telegram", "NPQR2345", limits())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
}

#[tokio::test]
async fn during_a_lockout_a_stranger_is_told_once_per_interval() {
    let (dir, store) = temp_store();
    let strict = PairingLimits {
        max_failures: 1,
        ..limits()
    };
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert!(matches!(
        store
            .pairing_approve("telegram", "WRONG234", strict)
            .await
            .unwrap(),
        ApproveOutcome::LockedOut { .. }
    ));
    // Answered with a code within the interval: silent, lock or not.
    assert_eq!(
        offer(&store, "u1", "ABCD2345", limits()).await,
        OfferOutcome::RateLimited
    );
    // A newcomer hears about the lock once, then nothing.
    assert_eq!(
        offer(&store, "u2", "ABCD2345", limits()).await,
        OfferOutcome::LockedOut
    );
    for _ in 0..3 {
        assert_eq!(
            offer(&store, "u2", "ABCD2345", limits()).await,
            OfferOutcome::RateLimited
        );
    }
    // After the interval (the lock lasting longer), once more.
    raw(&db_path(&dir))
        .execute(
            "UPDATE pairing_stamps SET stamp = stamp - 601 WHERE kind = 'offer'",
            [],
        )
        .unwrap();
    assert_eq!(
        offer(&store, "u2", "ABCD2345", limits()).await,
        OfferOutcome::LockedOut
    );
    assert_eq!(
        offer(&store, "u2", "ABCD2345", limits()).await,
        OfferOutcome::RateLimited
    );
    // The lock left u1's code alone.
    let snap = store.pairing_snapshot(limits()).await.unwrap();
    let pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    assert_eq!(pending, ["u1"]);
}

#[tokio::test]
async fn expired_codes_free_their_slot_and_cannot_be_approved() {
    let (dir, store) = temp_store();
    for user in ["u1", "u2", "u3"] {
        let code = format!("CODE{user}").to_uppercase();
        assert_eq!(
            offer(&store, user, &code, limits()).await,
            OfferOutcome::Created
        );
    }
    age_pending(&db_path(&dir), 3601.0);
    assert!(
        store
            .pairing_snapshot(limits())
            .await
            .unwrap()
            .pending
            .is_empty()
    );
    assert_eq!(
        store
            .pairing_approve("telegram", "CODEU1", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    assert!(!store.pairing_is_approved("telegram", "u1").await.unwrap());
    // The expired codes no longer count against the limit.
    assert_eq!(
        offer(&store, "u4", CODE, limits()).await,
        OfferOutcome::Created
    );
}

#[tokio::test]
async fn the_code_is_never_stored() {
    let (dir, store) = temp_store();
    let path = db_path(&dir);
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    // A refused request (rate-limited) writes nothing of its code either.
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::RateLimited
    );

    // Not in any column of any row...
    let conn = raw(&path);
    let (entry_id, user_id, user_name, salt, hash): (
        String,
        String,
        Option<String>,
        String,
        String,
    ) = conn
        .query_row(
            "SELECT entry_id, user_id, user_name, salt, code_hash FROM pairing_pending",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    for value in [&entry_id, &user_id, &salt, &hash] {
        assert!(!value.to_uppercase().contains(CODE), "{value}");
    }
    assert_eq!(user_name.as_deref(), Some("Ann"));
    let is_hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    assert!(entry_id.len() == 16 && is_hex(&entry_id), "{entry_id}");
    assert!(salt.len() == 32 && is_hex(&salt), "{salt}");
    // ...and what is stored is sha256(salt as hex text, then the code).
    let expected: String = Sha256::digest(format!("{salt}{CODE}").as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(hash, expected);
    drop(conn);

    // ...nor anywhere in the files (database, WAL, shared memory).
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(
            !bytes.windows(CODE.len()).any(|w| w == CODE.as_bytes()),
            "the code was written to disk"
        );
    }
}

#[tokio::test]
async fn salts_differ_between_offers_of_the_same_code() {
    let (dir, store) = temp_store();
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&store, "u2", CODE, limits()).await,
        OfferOutcome::Created
    );
    let conn = raw(&db_path(&dir));
    let distinct: i64 = conn
        .query_row(
            "SELECT COUNT(DISTINCT salt) + COUNT(DISTINCT code_hash) FROM pairing_pending",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(distinct, 4);
}

#[tokio::test]
async fn approval_is_case_insensitive_and_consumes_the_code() {
    let (_dir, store) = temp_store();
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&store, "u2", "ABCD2345", limits()).await,
        OfferOutcome::Created
    );
    let outcome = store
        .pairing_approve("telegram", "  qz7kx9wp \n", limits())
        .await
        .unwrap();
    let ApproveOutcome::Approved(user) = outcome else {
        panic!("not approved: {outcome:?}");
    };
    assert_eq!(user.platform, "telegram");
    assert_eq!(user.user_id, "u1");
    assert_eq!(user.user_name.as_deref(), Some("Ann"));
    assert!(store.pairing_is_approved("telegram", "u1").await.unwrap());
    assert!(!store.pairing_is_approved("telegram", "u2").await.unwrap());
    assert!(!store.pairing_is_approved("discord", "u1").await.unwrap());

    let snap = store.pairing_snapshot(limits()).await.unwrap();
    assert_eq!(snap.approved, vec![user]);
    let pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    assert_eq!(pending, ["u2"]);

    // The code is spent.
    assert_eq!(
        store
            .pairing_approve("telegram", CODE, limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
}

#[tokio::test]
async fn a_code_only_works_on_its_platform() {
    let (_dir, store) = temp_store();
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        store
            .pairing_approve("discord", CODE, limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    assert!(matches!(
        store
            .pairing_approve("telegram", CODE, limits())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
}

#[tokio::test]
async fn approving_an_approved_user_again_refreshes_the_approval() {
    let (dir, store) = temp_store();
    assert_eq!(
        offer(&store, "u1", CODE, no_interval()).await,
        OfferOutcome::Created
    );
    let ApproveOutcome::Approved(first) = store
        .pairing_approve("telegram", CODE, no_interval())
        .await
        .unwrap()
    else {
        panic!("not approved");
    };
    // Age the stored approval, so a refresh shows however fast the clock
    // reads: not refreshed, it would stay 100 s before `first`.
    raw(&db_path(&dir))
        .execute(
            "UPDATE pairing_approved SET approved_at = approved_at - 100",
            [],
        )
        .unwrap();
    // A later code without a name keeps the known one.
    assert_eq!(
        store
            .pairing_offer("telegram", "u1", None, "ABCD2345", no_interval())
            .await
            .unwrap(),
        OfferOutcome::Created
    );
    let ApproveOutcome::Approved(second) = store
        .pairing_approve("telegram", "abcd2345", no_interval())
        .await
        .unwrap()
    else {
        panic!("not approved");
    };
    assert!(second.approved_at >= first.approved_at);
    assert_eq!(second.user_name.as_deref(), Some("Ann"));
    let snap = store.pairing_snapshot(no_interval()).await.unwrap();
    assert_eq!(snap.approved, vec![second]);
}

#[tokio::test]
async fn approval_removes_all_the_users_pending_codes() {
    let (dir, store) = temp_store();
    assert_eq!(
        offer(&store, "u1", CODE, no_interval()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&store, "u2", "EFGH2345", no_interval()).await,
        OfferOutcome::Created
    );
    // Offers keep one code per user, so a second code of u1's can only be
    // a row from before that rule; it must not outlive the approval.
    raw(&db_path(&dir))
        .execute(
            "INSERT INTO pairing_pending (entry_id, platform, user_id, user_name, salt, \
             code_hash, created_at) \
             SELECT 'legacy0000000000', platform, user_id, user_name, salt, \
             'not-a-real-hash', created_at FROM pairing_pending WHERE user_id = 'u1'",
            [],
        )
        .unwrap();
    assert!(matches!(
        store
            .pairing_approve("telegram", CODE, no_interval())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
    let snap = store.pairing_snapshot(no_interval()).await.unwrap();
    let pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    assert_eq!(pending, ["u2"]);
}

#[tokio::test]
async fn the_fifth_wrong_code_locks_the_platform_even_for_the_right_code() {
    let (dir, store) = temp_store();
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    for n in 1..=4 {
        assert_eq!(
            store
                .pairing_approve("telegram", "WRONG234", limits())
                .await
                .unwrap(),
            ApproveOutcome::NoMatch { failures: n }
        );
    }
    let ApproveOutcome::LockedOut { until } = store
        .pairing_approve("telegram", "WRONG234", limits())
        .await
        .unwrap()
    else {
        panic!("not locked");
    };
    // The right code is refused while locked, without counting a failure.
    assert_eq!(
        store
            .pairing_approve("telegram", CODE, limits())
            .await
            .unwrap(),
        ApproveOutcome::LockedOut { until }
    );
    assert!(!store.pairing_is_approved("telegram", "u1").await.unwrap());
    // New codes are refused too; other platforms are unaffected.
    assert_eq!(
        offer(&store, "u2", "ABCD2345", limits()).await,
        OfferOutcome::LockedOut
    );
    assert_eq!(
        store
            .pairing_approve("discord", "WRONG234", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    let snap = store.pairing_snapshot(limits()).await.unwrap();
    assert_eq!(snap.lockouts, vec![("telegram".to_string(), until)]);
    let now = talaria_core::unix_now();
    assert!((until - now - 3600.0).abs() < 60.0, "{until} vs {now}");

    // Once the lock ends, the count starts from zero and the code works.
    raw(&db_path(&dir))
        .execute(
            "UPDATE pairing_stamps SET stamp = stamp - 3601 WHERE kind = 'lockout'",
            [],
        )
        .unwrap();
    assert!(
        store
            .pairing_snapshot(limits())
            .await
            .unwrap()
            .lockouts
            .is_empty()
    );
    assert_eq!(
        store
            .pairing_approve("telegram", "WRONG234", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    assert!(matches!(
        store
            .pairing_approve("telegram", CODE, limits())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
    // A success resets the count.
    assert_eq!(
        store
            .pairing_approve("telegram", "WRONG234", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
}

#[tokio::test]
async fn revoke_removes_an_approval_once() {
    let (_dir, store) = temp_store();
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert!(matches!(
        store
            .pairing_approve("telegram", CODE, limits())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
    assert!(store.pairing_revoke("telegram", "u1").await.unwrap());
    assert!(!store.pairing_is_approved("telegram", "u1").await.unwrap());
    assert!(!store.pairing_revoke("telegram", "u1").await.unwrap());
    assert!(
        store
            .pairing_snapshot(limits())
            .await
            .unwrap()
            .approved
            .is_empty()
    );
}

#[tokio::test]
async fn clear_pending_by_platform_or_everywhere() {
    let (_dir, store) = temp_store();
    for user in ["u1", "u2"] {
        assert_eq!(
            offer(&store, user, CODE, limits()).await,
            OfferOutcome::Created
        );
    }
    for user in ["d1", "d2", "d3"] {
        store
            .pairing_offer("discord", user, None, CODE, limits())
            .await
            .unwrap();
    }
    store
        .pairing_offer("slack", "s1", None, CODE, limits())
        .await
        .unwrap();
    assert_eq!(
        store.pairing_clear_pending(Some("telegram")).await.unwrap(),
        2
    );
    let snap = store.pairing_snapshot(limits()).await.unwrap();
    assert!(snap.pending.iter().all(|p| p.platform != "telegram"));
    assert_eq!(snap.pending.len(), 4);
    assert_eq!(store.pairing_clear_pending(None).await.unwrap(), 4);
    assert!(
        store
            .pairing_snapshot(limits())
            .await
            .unwrap()
            .pending
            .is_empty()
    );
    assert_eq!(store.pairing_clear_pending(None).await.unwrap(), 0);
}

#[tokio::test]
async fn the_snapshot_lists_pending_approved_and_locks() {
    let (dir, store) = temp_store();
    assert!(store.pairing_snapshot(limits()).await.unwrap() == Default::default());
    assert_eq!(
        offer(&store, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&store, "u2", "ABCD2345", limits()).await,
        OfferOutcome::Created
    );
    assert!(matches!(
        store
            .pairing_approve("telegram", "ABCD2345", limits())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
    let strict = PairingLimits {
        max_failures: 1,
        ..limits()
    };
    store
        .pairing_approve("discord", "NOPE2345", strict)
        .await
        .unwrap();
    let snap = store.pairing_snapshot(limits()).await.unwrap();
    assert_eq!(snap.pending.len(), 1);
    assert_eq!(snap.pending[0].platform, "telegram");
    assert_eq!(snap.pending[0].user_id, "u1");
    assert_eq!(snap.pending[0].user_name.as_deref(), Some("Ann"));
    assert_eq!(snap.approved.len(), 1);
    assert_eq!(snap.approved[0].user_id, "u2");
    assert_eq!(snap.lockouts.len(), 1);
    assert_eq!(snap.lockouts[0].0, "discord");
    // A shorter code lifetime hides codes that the default would still show.
    let short = PairingLimits {
        code_ttl: 60.0,
        ..limits()
    };
    age_pending(&db_path(&dir), 61.0);
    assert_eq!(
        store
            .pairing_snapshot(limits())
            .await
            .unwrap()
            .pending
            .len(),
        1
    );
    assert!(
        store
            .pairing_snapshot(short)
            .await
            .unwrap()
            .pending
            .is_empty()
    );
}
