//! DM pairing: offers and their limits, approvals, lockouts, and that the
//! code itself is never written down.

use crate::common;

use std::sync::Arc;

use common::{Backend, Fixture, Place, raw_postgres};
use sha2::{Digest, Sha256};
use talaria_store::{ApproveOutcome, OfferOutcome, PairingLimits, PairingStore};
use tokio::sync::Barrier;

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

/// Makes every pending code `secs` older.
async fn age_pending<S>(f: &Fixture<S>, secs: u32) {
    f.execute(&format!(
        "UPDATE pairing_pending SET created_at = created_at - {secs}"
    ))
    .await;
}

/// Every row `sql` returns, its columns read as text, straight from the
/// fixture's database.
async fn text_rows<S>(f: &Fixture<S>, sql: &str) -> Vec<Vec<Option<String>>> {
    match &f.place {
        Place::Sqlite { path, .. } => {
            let conn = rusqlite::Connection::open(path).unwrap();
            let mut statement = conn.prepare(sql).unwrap();
            let columns = statement.column_count();
            statement
                .query_map([], |r| (0..columns).map(|i| r.get(i)).collect())
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        }
        Place::Postgres { schema } => {
            let client = raw_postgres(Some(schema)).await;
            client
                .query(sql, &[])
                .await
                .unwrap()
                .iter()
                .map(|r| (0..r.len()).map(|i| r.get(i)).collect())
                .collect()
        }
    }
}

async fn offer<S: PairingStore + ?Sized>(
    store: &S,
    user: &str,
    code: &str,
    l: PairingLimits,
) -> OfferOutcome {
    store
        .pairing_offer(
            "telegram",
            user,
            Some("Ann"),
            &format!("chat-{user}"),
            code,
            l,
        )
        .await
        .unwrap()
}

async fn an_offer_is_created_then_rate_limited_for_the_same_user<S: Backend + PairingStore>(
    f: Fixture<S>,
) {
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&*f, "u1", "OTHER234", limits()).await,
        OfferOutcome::RateLimited
    );
    // Other users, and the same user on another platform, are not limited.
    assert_eq!(
        offer(&*f, "u2", "ABCD2345", limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        f.pairing_offer("discord", "u1", None, "chat-1", "EFGH2345", limits())
            .await
            .unwrap(),
        OfferOutcome::Created
    );
    let snap = f.pairing_snapshot(limits()).await.unwrap();
    assert_eq!(snap.pending.len(), 3);
}

async fn the_offer_interval_elapses<S: Backend + PairingStore>(f: Fixture<S>) {
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    f.execute("UPDATE pairing_stamps SET stamp = stamp - 601 WHERE kind = 'offer'")
        .await;
    assert_eq!(
        offer(&*f, "u1", "ABCD2345", limits()).await,
        OfferOutcome::Created
    );
}

/// Found: three strangers could fill every pending slot for an hour, and
/// a legitimate newcomer was refused a code. Now a full platform drops its
/// oldest code to make room, so the newcomer gets one that works.
async fn three_strangers_cannot_lock_a_newcomer_out_of_pairing<S: Backend + PairingStore>(
    f: Fixture<S>,
) {
    for (user, code) in [("u1", "STRA2345"), ("u2", "STRB2345"), ("u3", "STRC2345")] {
        assert_eq!(
            offer(&*f, user, code, limits()).await,
            OfferOutcome::Created
        );
    }
    assert_eq!(
        offer(&*f, "newcomer", CODE, limits()).await,
        OfferOutcome::Created
    );
    // Still three pending: the oldest stranger's code made room.
    let snap = f.pairing_snapshot(limits()).await.unwrap();
    let mut pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    pending.sort_unstable();
    assert_eq!(pending, ["newcomer", "u2", "u3"]);
    // The newcomer's code works, the dropped one does not.
    assert!(matches!(
        f.pairing_approve("telegram", CODE, limits()).await.unwrap(),
        ApproveOutcome::Approved(user) if user.user_id == "newcomer"
    ));
    assert_eq!(
        f.pairing_approve("telegram", "STRA2345", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    // The stranger whose code was dropped can ask again after their
    // interval, not before; asking again pushes out the next oldest.
    assert_eq!(
        offer(&*f, "u1", "STRD2345", limits()).await,
        OfferOutcome::RateLimited
    );
    f.execute("UPDATE pairing_stamps SET stamp = stamp - 601 WHERE kind = 'offer'")
        .await;
    assert_eq!(
        offer(&*f, "u4", "STRE2345", limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&*f, "u1", "STRD2345", limits()).await,
        OfferOutcome::Created
    );
    let snap = f.pairing_snapshot(limits()).await.unwrap();
    let mut pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    pending.sort_unstable();
    assert_eq!(pending, ["u1", "u3", "u4"]);
    // Other platforms have their own slots.
    assert_eq!(
        f.pairing_offer("discord", "u2", None, "chat-1", CODE, limits())
            .await
            .unwrap(),
        OfferOutcome::Created
    );
}

/// No slots at all refuses every offer, once per interval.
async fn a_platform_without_slots_refuses_every_offer<S: Backend + PairingStore>(f: Fixture<S>) {
    let none = PairingLimits {
        max_pending: 0,
        ..limits()
    };
    assert_eq!(
        offer(&*f, "u1", CODE, none).await,
        OfferOutcome::TooManyPending
    );
    assert_eq!(
        offer(&*f, "u1", CODE, none).await,
        OfferOutcome::RateLimited
    );
    assert!(f.pairing_snapshot(none).await.unwrap().pending.is_empty());
}

async fn one_user_holds_one_code_and_cannot_crowd_out_the_others<S: Backend + PairingStore>(
    f: Fixture<S>,
) {
    // Asking again after each interval replaces the code, never adds one.
    for code in [CODE, "ABCD2345", "EFGH2345", "JKLM2345"] {
        assert_eq!(
            offer(&*f, "u1", code, no_interval()).await,
            OfferOutcome::Created
        );
    }
    let snap = f.pairing_snapshot(limits()).await.unwrap();
    let pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    assert_eq!(pending, ["u1"]);
    // So the platform still has room for two other strangers.
    for user in ["u2", "u3"] {
        assert_eq!(
            offer(&*f, user, CODE, limits()).await,
            OfferOutcome::Created
        );
    }
    // On a full platform a holder replacing their own code drops nobody
    // else's.
    assert_eq!(
        offer(&*f, "u1", "NPQR2345", no_interval()).await,
        OfferOutcome::Created
    );
    let snap = f.pairing_snapshot(limits()).await.unwrap();
    let mut pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    pending.sort_unstable();
    assert_eq!(pending, ["u1", "u2", "u3"]);
    // Only the code shown last works.
    assert_eq!(
        f.pairing_approve("telegram", "JKLM2345", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    assert!(matches!(
        f.pairing_approve("telegram", "NPQR2345", limits())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
}

async fn during_a_lockout_a_stranger_is_told_once_per_interval<S: Backend + PairingStore>(
    f: Fixture<S>,
) {
    let strict = PairingLimits {
        max_failures: 1,
        ..limits()
    };
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert!(matches!(
        f.pairing_approve("telegram", "WRONG234", strict)
            .await
            .unwrap(),
        ApproveOutcome::LockedOut { .. }
    ));
    // Answered with a code within the interval: silent, lock or not.
    assert_eq!(
        offer(&*f, "u1", "ABCD2345", limits()).await,
        OfferOutcome::RateLimited
    );
    // A newcomer hears about the lock once, then nothing.
    assert_eq!(
        offer(&*f, "u2", "ABCD2345", limits()).await,
        OfferOutcome::LockedOut
    );
    for _ in 0..3 {
        assert_eq!(
            offer(&*f, "u2", "ABCD2345", limits()).await,
            OfferOutcome::RateLimited
        );
    }
    // After the interval (the lock lasting longer), once more.
    f.execute("UPDATE pairing_stamps SET stamp = stamp - 601 WHERE kind = 'offer'")
        .await;
    assert_eq!(
        offer(&*f, "u2", "ABCD2345", limits()).await,
        OfferOutcome::LockedOut
    );
    assert_eq!(
        offer(&*f, "u2", "ABCD2345", limits()).await,
        OfferOutcome::RateLimited
    );
    // The lock left u1's code alone.
    let snap = f.pairing_snapshot(limits()).await.unwrap();
    let pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    assert_eq!(pending, ["u1"]);
}

async fn expired_codes_free_their_slot_and_cannot_be_approved<S: Backend + PairingStore>(
    f: Fixture<S>,
) {
    for user in ["u1", "u2", "u3"] {
        let code = format!("CODE{user}").to_uppercase();
        assert_eq!(
            offer(&*f, user, &code, limits()).await,
            OfferOutcome::Created
        );
    }
    age_pending(&f, 3601).await;
    assert!(
        f.pairing_snapshot(limits())
            .await
            .unwrap()
            .pending
            .is_empty()
    );
    assert_eq!(
        f.pairing_approve("telegram", "CODEU1", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    assert!(!f.pairing_is_approved("telegram", "u1").await.unwrap());
    // The expired codes no longer count against the limit: three new
    // codes fit without pushing each other out.
    for user in ["u4", "u5", "u6"] {
        let code = format!("CODE{user}").to_uppercase();
        assert_eq!(
            offer(&*f, user, &code, limits()).await,
            OfferOutcome::Created
        );
    }
    assert!(matches!(
        f.pairing_approve("telegram", "CODEU4", limits())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
}

async fn the_code_is_never_stored<S: Backend + PairingStore>(f: Fixture<S>) {
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    // A refused request (rate-limited) writes nothing of its code either.
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::RateLimited
    );

    // Not in any column of any row...
    let rows = text_rows(
        &f,
        "SELECT entry_id, user_id, user_name, salt, code_hash FROM pairing_pending",
    )
    .await;
    assert_eq!(rows.len(), 1);
    let text = |i: usize| rows[0][i].clone().unwrap();
    let (entry_id, user_id, user_name, salt, hash) =
        (text(0), text(1), rows[0][2].clone(), text(3), text(4));
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

    match &f.place {
        // ...nor anywhere in the files (database, WAL, shared memory).
        Place::Sqlite { dir, .. } => {
            for entry in std::fs::read_dir(dir.path()).unwrap() {
                let bytes = std::fs::read(entry.unwrap().path()).unwrap();
                assert!(
                    !bytes.windows(CODE.len()).any(|w| w == CODE.as_bytes()),
                    "the code was written to disk"
                );
            }
        }
        // ...nor in any row of any table of the store's schema.
        Place::Postgres { schema } => {
            let client = raw_postgres(Some(schema)).await;
            let tables = client
                .query(
                    "SELECT table_name::text FROM information_schema.tables \
                     WHERE table_schema = $1",
                    &[schema],
                )
                .await
                .unwrap();
            assert!(tables.len() > 1);
            for table in tables {
                let table: String = table.get(0);
                for row in client
                    .query(&format!("SELECT t::text FROM {table} t"), &[])
                    .await
                    .unwrap()
                {
                    let row: String = row.get(0);
                    assert!(!row.to_uppercase().contains(CODE), "{table}: {row}");
                }
            }
        }
    }
}

async fn salts_differ_between_offers_of_the_same_code<S: Backend + PairingStore>(f: Fixture<S>) {
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&*f, "u2", CODE, limits()).await,
        OfferOutcome::Created
    );
    let distinct = f
        .query_f64("SELECT COUNT(DISTINCT salt) + COUNT(DISTINCT code_hash) FROM pairing_pending")
        .await;
    assert_eq!(distinct, Some(4.0));
}

async fn approval_is_case_insensitive_and_consumes_the_code<S: Backend + PairingStore>(
    f: Fixture<S>,
) {
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&*f, "u2", "ABCD2345", limits()).await,
        OfferOutcome::Created
    );
    let outcome = f
        .pairing_approve("telegram", "  qz7kx9wp \n", limits())
        .await
        .unwrap();
    let ApproveOutcome::Approved(user) = outcome else {
        panic!("not approved: {outcome:?}");
    };
    assert_eq!(user.platform, "telegram");
    assert_eq!(user.user_id, "u1");
    assert_eq!(user.user_name.as_deref(), Some("Ann"));
    assert!(f.pairing_is_approved("telegram", "u1").await.unwrap());
    assert!(!f.pairing_is_approved("telegram", "u2").await.unwrap());
    assert!(!f.pairing_is_approved("discord", "u1").await.unwrap());

    let snap = f.pairing_snapshot(limits()).await.unwrap();
    assert_eq!(snap.approved, vec![user]);
    let pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    assert_eq!(pending, ["u2"]);

    // The code is spent.
    assert_eq!(
        f.pairing_approve("telegram", CODE, limits()).await.unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
}

async fn a_code_only_works_on_its_platform<S: Backend + PairingStore>(f: Fixture<S>) {
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        f.pairing_approve("discord", CODE, limits()).await.unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    assert!(matches!(
        f.pairing_approve("telegram", CODE, limits()).await.unwrap(),
        ApproveOutcome::Approved(_)
    ));
}

async fn approving_an_approved_user_again_refreshes_the_approval<S: Backend + PairingStore>(
    f: Fixture<S>,
) {
    assert_eq!(
        offer(&*f, "u1", CODE, no_interval()).await,
        OfferOutcome::Created
    );
    let ApproveOutcome::Approved(first) = f
        .pairing_approve("telegram", CODE, no_interval())
        .await
        .unwrap()
    else {
        panic!("not approved");
    };
    // Age the stored approval, so a refresh shows however fast the clock
    // reads: not refreshed, it would stay 100 s before `first`.
    f.execute("UPDATE pairing_approved SET approved_at = approved_at - 100")
        .await;
    // A later code without a name keeps the known one.
    assert_eq!(
        f.pairing_offer("telegram", "u1", None, "chat-1", "ABCD2345", no_interval())
            .await
            .unwrap(),
        OfferOutcome::Created
    );
    let ApproveOutcome::Approved(second) = f
        .pairing_approve("telegram", "abcd2345", no_interval())
        .await
        .unwrap()
    else {
        panic!("not approved");
    };
    assert!(second.approved_at >= first.approved_at);
    assert_eq!(second.user_name.as_deref(), Some("Ann"));
    let snap = f.pairing_snapshot(no_interval()).await.unwrap();
    assert_eq!(snap.approved, vec![second]);
}

/// The gateway tells an approved user so, in the chat their code was shown
/// in: each approval is handed out once, only for the platforms asked
/// about, and not at all once revoked.
async fn an_approval_is_owed_to_its_chat_and_taken_once<S: Backend + PairingStore>(f: Fixture<S>) {
    let telegram = vec!["telegram".to_owned()];
    assert_eq!(
        offer(&*f, "u1", CODE, no_interval()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&*f, "u2", "EFGH2345", no_interval()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        f.pairing_offer("discord", "d1", None, "dm-9", "JKLM2345", no_interval())
            .await
            .unwrap(),
        OfferOutcome::Created
    );
    // Nothing is owed before an approval.
    assert!(
        f.pairing_take_notices(&telegram, 10)
            .await
            .unwrap()
            .is_empty()
    );
    for (platform, code) in [
        ("telegram", CODE),
        ("telegram", "EFGH2345"),
        ("discord", "JKLM2345"),
    ] {
        assert!(matches!(
            f.pairing_approve(platform, code, no_interval())
                .await
                .unwrap(),
            ApproveOutcome::Approved(_)
        ));
    }
    // A revoked user is owed nothing.
    assert!(f.pairing_revoke("telegram", "u2").await.unwrap());

    let taken = f.pairing_take_notices(&telegram, 10).await.unwrap();
    assert_eq!(
        taken,
        vec![talaria_store::ApprovalNotice {
            platform: "telegram".into(),
            user_id: "u1".into(),
            user_name: Some("Ann".into()),
            chat_id: "chat-u1".into(),
        }]
    );
    assert!(
        f.pairing_take_notices(&telegram, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Another platform's notice waited for a caller serving it.
    let discord = f
        .pairing_take_notices(&["discord".to_owned()], 10)
        .await
        .unwrap();
    assert_eq!(discord.len(), 1);
    assert_eq!(discord[0].chat_id, "dm-9");
    // The approval itself stays.
    assert!(f.pairing_is_approved("telegram", "u1").await.unwrap());
}

async fn approval_removes_all_the_users_pending_codes<S: Backend + PairingStore>(f: Fixture<S>) {
    assert_eq!(
        offer(&*f, "u1", CODE, no_interval()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&*f, "u2", "EFGH2345", no_interval()).await,
        OfferOutcome::Created
    );
    // Offers keep one code per user, so a second code of u1's can only be
    // a row from before that rule; it must not outlive the approval.
    f.execute(
        "INSERT INTO pairing_pending (entry_id, platform, user_id, user_name, salt, \
         code_hash, created_at) \
         SELECT 'legacy0000000000', platform, user_id, user_name, salt, \
         'not-a-real-hash', created_at FROM pairing_pending WHERE user_id = 'u1'",
    )
    .await;
    assert!(matches!(
        f.pairing_approve("telegram", CODE, no_interval())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
    let snap = f.pairing_snapshot(no_interval()).await.unwrap();
    let pending: Vec<&str> = snap.pending.iter().map(|p| p.user_id.as_str()).collect();
    assert_eq!(pending, ["u2"]);
}

/// Found: after five wrong codes the platform was locked for an hour and
/// the operator's correct code for a genuinely pending user was refused
/// too. The lock is there to stop guessing; a correct code is no guess.
async fn the_fifth_wrong_code_locks_the_platform_but_not_against_the_right_code<
    S: Backend + PairingStore,
>(
    f: Fixture<S>,
) {
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&*f, "u2", "ABCD2345", limits()).await,
        OfferOutcome::Created
    );
    for n in 1..=4 {
        assert_eq!(
            f.pairing_approve("telegram", "WRONG234", limits())
                .await
                .unwrap(),
            ApproveOutcome::NoMatch { failures: n }
        );
    }
    let ApproveOutcome::LockedOut { until } = f
        .pairing_approve("telegram", "WRONG234", limits())
        .await
        .unwrap()
    else {
        panic!("not locked");
    };
    // Wrong codes are refused as locked; the right one approves.
    assert_eq!(
        f.pairing_approve("telegram", "WRONG234", limits())
            .await
            .unwrap(),
        ApproveOutcome::LockedOut { until }
    );
    assert!(matches!(
        f.pairing_approve("telegram", CODE, limits()).await.unwrap(),
        ApproveOutcome::Approved(user) if user.user_id == "u1"
    ));
    assert!(f.pairing_is_approved("telegram", "u1").await.unwrap());
    // The lock holds: new codes are refused; other platforms are
    // unaffected.
    assert_eq!(
        offer(&*f, "u3", "EFGH2345", limits()).await,
        OfferOutcome::LockedOut
    );
    assert_eq!(
        f.pairing_approve("discord", "WRONG234", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    let snap = f.pairing_snapshot(limits()).await.unwrap();
    assert_eq!(snap.lockouts, vec![("telegram".to_string(), until)]);
    let now = talaria_core::unix_now();
    assert!((until - now - 3600.0).abs() < 60.0, "{until} vs {now}");

    // What bounds guessing is the lock's budget: once that many wrong
    // codes were tried (the approval above did not reset the count), not
    // even a correct code is compared until the lock ends.
    let budget = limits().guess_budget();
    assert_eq!(budget, 100);
    for _ in 6..budget {
        assert_eq!(
            f.pairing_approve("telegram", "WRONG234", limits())
                .await
                .unwrap(),
            ApproveOutcome::LockedOut { until }
        );
    }
    assert_eq!(
        f.pairing_approve("telegram", "ABCD2345", limits())
            .await
            .unwrap(),
        ApproveOutcome::LockedOut { until }
    );
    assert!(!f.pairing_is_approved("telegram", "u2").await.unwrap());

    // Once the lock ends, the count starts from zero and the code works.
    f.execute("UPDATE pairing_stamps SET stamp = stamp - 3601 WHERE kind = 'lockout'")
        .await;
    assert!(
        f.pairing_snapshot(limits())
            .await
            .unwrap()
            .lockouts
            .is_empty()
    );
    assert_eq!(
        f.pairing_approve("telegram", "WRONG234", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
    assert!(matches!(
        f.pairing_approve("telegram", "ABCD2345", limits())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
    // A success outside a lock resets the count.
    assert_eq!(
        f.pairing_approve("telegram", "WRONG234", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    );
}

async fn revoke_removes_an_approval_once<S: Backend + PairingStore>(f: Fixture<S>) {
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert!(matches!(
        f.pairing_approve("telegram", CODE, limits()).await.unwrap(),
        ApproveOutcome::Approved(_)
    ));
    assert!(f.pairing_revoke("telegram", "u1").await.unwrap());
    assert!(!f.pairing_is_approved("telegram", "u1").await.unwrap());
    assert!(!f.pairing_revoke("telegram", "u1").await.unwrap());
    assert!(
        f.pairing_snapshot(limits())
            .await
            .unwrap()
            .approved
            .is_empty()
    );
}

async fn clear_pending_by_platform_or_everywhere<S: Backend + PairingStore>(f: Fixture<S>) {
    for user in ["u1", "u2"] {
        assert_eq!(
            offer(&*f, user, CODE, limits()).await,
            OfferOutcome::Created
        );
    }
    for user in ["d1", "d2", "d3"] {
        f.pairing_offer("discord", user, None, "chat-1", CODE, limits())
            .await
            .unwrap();
    }
    f.pairing_offer("slack", "s1", None, "chat-1", CODE, limits())
        .await
        .unwrap();
    assert_eq!(f.pairing_clear_pending(Some("telegram")).await.unwrap(), 2);
    let snap = f.pairing_snapshot(limits()).await.unwrap();
    assert!(snap.pending.iter().all(|p| p.platform != "telegram"));
    assert_eq!(snap.pending.len(), 4);
    assert_eq!(f.pairing_clear_pending(None).await.unwrap(), 4);
    assert!(
        f.pairing_snapshot(limits())
            .await
            .unwrap()
            .pending
            .is_empty()
    );
    assert_eq!(f.pairing_clear_pending(None).await.unwrap(), 0);
}

async fn the_snapshot_lists_pending_approved_and_locks<S: Backend + PairingStore>(f: Fixture<S>) {
    assert!(f.pairing_snapshot(limits()).await.unwrap() == Default::default());
    assert_eq!(
        offer(&*f, "u1", CODE, limits()).await,
        OfferOutcome::Created
    );
    assert_eq!(
        offer(&*f, "u2", "ABCD2345", limits()).await,
        OfferOutcome::Created
    );
    assert!(matches!(
        f.pairing_approve("telegram", "ABCD2345", limits())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
    let strict = PairingLimits {
        max_failures: 1,
        ..limits()
    };
    f.pairing_approve("discord", "NOPE2345", strict)
        .await
        .unwrap();
    let snap = f.pairing_snapshot(limits()).await.unwrap();
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
    age_pending(&f, 61).await;
    assert_eq!(f.pairing_snapshot(limits()).await.unwrap().pending.len(), 1);
    assert!(f.pairing_snapshot(short).await.unwrap().pending.is_empty());
}

/// Two gateways approving one code at once, two callers on each: one
/// approval, and the rest find no match (counting failures one at a time).
async fn racing_approvals_of_one_code_approve_once<S: Backend + PairingStore>(f: Fixture<S>) {
    let handles: [Arc<S>; 2] = [f.store.clone(), Arc::new(f.reopen().await)];
    for round in 0..10 {
        let (user, code) = (format!("u{round}"), format!("CODE{round}"));
        assert_eq!(
            offer(&*f, &user, &code, limits()).await,
            OfferOutcome::Created
        );
        let barrier = Arc::new(Barrier::new(4));
        let approvers: Vec<_> = (0..4)
            .map(|i| {
                let (store, barrier) = (handles[i % 2].clone(), barrier.clone());
                let code = code.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .pairing_approve("telegram", &code, limits())
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut approved = Vec::new();
        let mut failures = Vec::new();
        for approver in approvers {
            match approver.await.unwrap() {
                ApproveOutcome::Approved(who) => approved.push(who.user_id),
                ApproveOutcome::NoMatch { failures: n } => failures.push(n),
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(approved, [user.as_str()], "round {round}");
        // The approval came first (the code was there until it did) and
        // reset the count; each miss after it counted once.
        failures.sort_unstable();
        assert_eq!(failures, [1, 2, 3], "round {round}");
        assert!(f.pairing_is_approved("telegram", &user).await.unwrap());
    }
}

/// Strangers asking two gateways for codes at once never push a platform
/// past its limit of pending codes: each gets one, the oldest making room.
async fn racing_offers_never_pass_the_pending_limit<S: Backend + PairingStore>(f: Fixture<S>) {
    let handles: [Arc<S>; 2] = [f.store.clone(), Arc::new(f.reopen().await)];
    for round in 0..5 {
        let platform = format!("platform{round}");
        let barrier = Arc::new(Barrier::new(8));
        let askers: Vec<_> = (0..8)
            .map(|i| {
                let (store, barrier) = (handles[i % 2].clone(), barrier.clone());
                let platform = platform.clone();
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .pairing_offer(&platform, &format!("u{i}"), None, "chat-1", CODE, limits())
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for asker in askers {
            outcomes.push(asker.await.unwrap());
        }
        assert!(
            outcomes.iter().all(|o| *o == OfferOutcome::Created),
            "round {round}: {outcomes:?}"
        );
        let snap = f.pairing_snapshot(limits()).await.unwrap();
        let pending = snap
            .pending
            .iter()
            .filter(|p| p.platform == platform)
            .count();
        assert_eq!(pending, 3, "round {round}");
    }
}

contract_tests!(
    an_approval_is_owed_to_its_chat_and_taken_once,
    an_offer_is_created_then_rate_limited_for_the_same_user,
    the_offer_interval_elapses,
    three_strangers_cannot_lock_a_newcomer_out_of_pairing,
    a_platform_without_slots_refuses_every_offer,
    one_user_holds_one_code_and_cannot_crowd_out_the_others,
    during_a_lockout_a_stranger_is_told_once_per_interval,
    expired_codes_free_their_slot_and_cannot_be_approved,
    the_code_is_never_stored,
    salts_differ_between_offers_of_the_same_code,
    approval_is_case_insensitive_and_consumes_the_code,
    a_code_only_works_on_its_platform,
    approving_an_approved_user_again_refreshes_the_approval,
    approval_removes_all_the_users_pending_codes,
    the_fifth_wrong_code_locks_the_platform_but_not_against_the_right_code,
    revoke_removes_an_approval_once,
    clear_pending_by_platform_or_everywhere,
    the_snapshot_lists_pending_approved_and_locks,
    racing_approvals_of_one_code_approve_once,
    racing_offers_never_pass_the_pending_limit,
);
