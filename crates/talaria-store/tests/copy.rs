//! Copying a whole store (`talaria store migrate`): an SQLite store filled
//! through the public traits with every kind of row is copied into each
//! backend, and everything read back through the traits is the same.
//! Also: search and new ids on the copy, refusals (a second copy, a target
//! in use, half a copy of something else, a live gateway), resuming an
//! interrupted copy, and a round trip back out of each backend.

use crate::common;

use std::collections::BTreeMap;

use common::{Backend, Fixture, Place, raw_postgres};
use talaria_core::{MediaKind, MediaRef, Message, ToolCall, Usage};
use talaria_store::copy::{LEFT_OUT, PageLimit, Table, TargetState};
use talaria_store::{
    Advance, ApproveOutcome, CopyError, CopyOptions, CronJob, CursorStore, GatewayStore, JobOrigin,
    JobState, Misfire, NewCronJob, NewObligation, NewSession, NodeAnnouncement, NodeId, Obligation,
    ObligationState, Occurrence, OccurrenceClaim, OccurrenceEnd, OccurrenceStatus, OfferOutcome,
    PairingLimits, PairingSnapshot, Route, SearchQuery, SessionFilter, SessionRecord, SessionStore,
    SqliteStore, StoreCopy, StoredMessage, Trigger, copy_store,
};
use tempfile::TempDir;

/// Sessions, created in this order; ids sort differently from it, so a
/// copy that reordered them would show in listings.
const FIRST: &str = "20240105_100000_bbbb";
const SECOND: &str = "20240105_100000_aaaa";
const THIRD: &str = "20240105_100000_cccc";

const ROUTE_KEYS: [&str; 2] = ["agent:main:telegram:dm:42", "agent:main:api:x"];
const LEDGER_IDS: [&str; 5] = ["pending", "attempting", "delivered", "failed", "abandoned"];
const CURSORS: [(&str, &str); 3] = [
    ("matrix", "since"),
    ("telegram", "offset"),
    ("slack", "none"),
];
const INBOUND: [(&str, &str); 3] = [("telegram", "u-1"), ("telegram", "u-2"), ("slack", "e-9")];
const JOBS: [&str; 3] = ["aaaaaaaaaaa1", "aaaaaaaaaaa2", "aaaaaaaaaaa3"];

/// The pending pairing code of `ann` on telegram.
const ANN_CODE: &str = "ABCD2345";

/// Tiny pages, so every table is copied across several, and one message
/// is larger than a whole page may be.
fn small_pages() -> CopyOptions {
    CopyOptions {
        page: PageLimit {
            rows: 2,
            bytes: 256,
        },
    }
}

fn limits() -> PairingLimits {
    PairingLimits::default()
}

fn owner() -> NodeId {
    NodeId::new("old-node").unwrap()
}

fn obligation(id: &str) -> NewObligation {
    NewObligation {
        id: id.to_owned(),
        session_key: ROUTE_KEYS[0].to_owned(),
        platform: "telegram".to_owned(),
        chat_id: "42".to_owned(),
        thread_id: Some("7".to_owned()),
        reply_to: (id != "pending").then(|| "1001".to_owned()),
        content: format!("the reply {id}"),
        owner: owner(),
        settles: Vec::new(),
    }
}

fn job(id: &str, name: &str, next: Option<i64>) -> NewCronJob {
    NewCronJob {
        id: id.to_owned(),
        name: name.to_owned(),
        prompt: Some(format!("what {name} asks")),
        skills: vec!["news".to_owned()],
        schedule: "every 1h".to_owned(),
        deliver: vec!["origin".to_owned(), "telegram:42".to_owned()],
        origin: Some(JobOrigin {
            platform: "telegram".to_owned(),
            chat_id: "42".to_owned(),
            thread_id: None,
        }),
        repeat: Some(5),
        misfire: Misfire::Skip,
        next_run_at: next,
    }
}

/// A fresh SQLite store in a directory of its own, to copy from.
fn source() -> (TempDir, SqliteStore) {
    common::temp_store()
}

/// Runs raw SQL on an SQLite store's file (what the API cannot stage).
fn sqlite_exec(store: &SqliteStore, sql: &str) {
    let conn = rusqlite::Connection::open(store.path()).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    conn.execute_batch(sql).unwrap();
}

/// The files a transcript row came with: two, of different kinds, not in
/// any sorted order.
fn attachments() -> Vec<MediaRef> {
    vec![
        MediaRef {
            kind: MediaKind::Voice,
            path: "/home/ann/.talaria/cache/media/f0/f0e1.ogg".into(),
            mime: "audio/ogg".to_owned(),
        },
        MediaRef {
            kind: MediaKind::Image,
            path: "/home/ann/.talaria/cache/media/0a/0a1b.jpg".into(),
            mime: "image/jpeg".to_owned(),
        },
    ]
}

/// Fills `store` with every kind of row, through the traits.
async fn fill<S: GatewayStore + ?Sized>(store: &S) {
    // Sessions: one with everything, ended; its continuation; a plain one.
    store
        .create_session(NewSession {
            id: FIRST.to_owned(),
            source: "telegram".to_owned(),
            session_key: Some(ROUTE_KEYS[0].to_owned()),
            chat_id: Some("42".to_owned()),
            user_id: Some("ann".to_owned()),
            thread_id: Some("7".to_owned()),
            model: Some("mock-model".to_owned()),
            system_prompt: Some("You are Talaria.\nBe brief.".to_owned()),
            parent_session_id: None,
        })
        .await
        .unwrap();
    store
        .create_session(NewSession {
            id: SECOND.to_owned(),
            source: "telegram".to_owned(),
            session_key: Some(ROUTE_KEYS[0].to_owned()),
            parent_session_id: Some(FIRST.to_owned()),
            ..NewSession::default()
        })
        .await
        .unwrap();
    store
        .create_session(NewSession {
            id: THIRD.to_owned(),
            source: "cli".to_owned(),
            ..NewSession::default()
        })
        .await
        .unwrap();
    store.set_title(FIRST, "Llamas of Peru").await.unwrap();
    store
        .set_model_choice(FIRST, Some("small-model"))
        .await
        .unwrap();
    // Two priced model calls in the per-call ledger, with their cost.
    let priced = |model: &str, cost: u64| talaria_store::ModelCall {
        provider: "openai".to_owned(),
        model: model.to_owned(),
        kind: "turn".to_owned(),
        usage: Usage {
            input_tokens: 10,
            output_tokens: 2,
            ..Usage::default()
        },
        cost_micros: cost,
        tool_calls: 1,
        starts_turn: true,
    };
    store
        .add_calls(THIRD, &[priced("gpt-4o", 45), priced("gpt-4o-mini", 3)])
        .await
        .unwrap();

    // A turn with tool calls, reasoning and usage, then compression.
    store
        .append_message(FIRST, &Message::user("tell me about the alpaca herd"))
        .await
        .unwrap();
    let mut call = Message::assistant_tool_calls(
        "",
        vec![ToolCall {
            id: "call_1".to_owned(),
            name: "web_search".to_owned(),
            arguments: r#"{"q": "alpaca"}"#.to_owned(),
        }],
    );
    call.reasoning = Some("I should look it up".to_owned());
    call.finish_reason = Some("tool_calls".to_owned());
    let usage = Usage {
        input_tokens: 1200,
        output_tokens: 80,
        cache_read_tokens: 1000,
        cache_write_tokens: 30,
        reasoning_tokens: 12,
    };
    store
        .append_message_with_usage(FIRST, &call, &usage)
        .await
        .unwrap();
    store
        .append_message(
            FIRST,
            &Message::tool_result("call_1", "web_search", "alpacas hum when content"),
        )
        .await
        .unwrap();
    let mut answer = Message::assistant("They hum. ¡Qué bonito! 羊驼");
    answer.finish_reason = Some("stop".to_owned());
    store
        .append_message_with_usage(FIRST, &answer, &usage)
        .await
        .unwrap();
    store
        .replace_active(
            FIRST,
            &[
                Message::user("[summary] the user asked about alpacas"),
                Message::assistant("noted"),
            ],
        )
        .await
        .unwrap();
    store
        .append_message(
            FIRST,
            &Message::user(format!("long paste: {}", "x".repeat(5000))),
        )
        .await
        .unwrap();
    store.end_session(FIRST, "compressed").await.unwrap();
    store
        .append_message(SECOND, &Message::user("and the vicuñas?"))
        .await
        .unwrap();
    store
        .append_message(
            THIRD,
            &Message::user_with_media("hello from the terminal", attachments()),
        )
        .await
        .unwrap();

    // Routes.
    store.set_route(ROUTE_KEYS[0], SECOND).await.unwrap();
    store.set_route(ROUTE_KEYS[1], THIRD).await.unwrap();
    store.touch_route(ROUTE_KEYS[1]).await.unwrap();

    // The ledger, a row in each state.
    for id in LEDGER_IDS {
        store.record_obligation(obligation(id)).await.unwrap();
    }
    for id in ["attempting", "delivered", "failed"] {
        assert_eq!(
            store.begin_attempt(id, &owner(), 120.0).await.unwrap(),
            Some(1)
        );
    }
    // Parts confirmed: two of an unfinished reply, all three of a sent one.
    assert!(store.mark_parts_sent("attempting", 1, 2).await.unwrap());
    assert!(store.mark_parts_sent("delivered", 1, 3).await.unwrap());
    assert!(store.mark_delivered("delivered", 1).await.unwrap());
    assert!(store.mark_failed("failed", 1, "HTTP 502").await.unwrap());
    assert!(
        store
            .abandon_obligation("abandoned", None, "the operator gave up")
            .await
            .unwrap()
    );

    // Pairing: a pending code, an approval, a failure count, a lockout.
    assert_eq!(
        store
            .pairing_offer("telegram", "ann", Some("Ann"), "chat-1", ANN_CODE, limits())
            .await
            .unwrap(),
        OfferOutcome::Created
    );
    assert_eq!(
        store
            .pairing_offer("telegram", "bob", None, "chat-1", "EFGH2345", limits())
            .await
            .unwrap(),
        OfferOutcome::Created
    );
    assert!(matches!(
        store
            .pairing_approve("telegram", "efgh2345", limits())
            .await
            .unwrap(),
        ApproveOutcome::Approved(_)
    ));
    assert!(matches!(
        store
            .pairing_approve("telegram", "WRONG234", limits())
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { failures: 1 }
    ));
    let strict = PairingLimits {
        max_failures: 1,
        ..limits()
    };
    assert!(matches!(
        store
            .pairing_approve("discord", "WRONG234", strict)
            .await
            .unwrap(),
        ApproveOutcome::NoMatch { .. } | ApproveOutcome::LockedOut { .. }
    ));

    // Inbound ids and cursors.
    for (platform, id) in INBOUND {
        assert!(store.first_delivery(platform, id).await.unwrap());
    }
    store
        .set_cursor("matrix", "since", "s123_456")
        .await
        .unwrap();
    store.set_cursor("telegram", "offset", "99").await.unwrap();

    // Cron: a job that ran (twice: on schedule and by hand), a paused one,
    // a completed one.
    let t = 1_800_000_000;
    store
        .create_job(job(JOBS[0], "news", Some(t)))
        .await
        .unwrap();
    store
        .create_job(job(JOBS[1], "weather", Some(t)))
        .await
        .unwrap();
    store.create_job(job(JOBS[2], "once", None)).await.unwrap();
    assert!(
        store
            .claim_occurrence(OccurrenceClaim {
                job_id: JOBS[0].to_owned(),
                scheduled_at: t,
                trigger: Trigger::Schedule,
                status: OccurrenceStatus::Running,
                session_id: Some(format!("cron_{}_{t}", JOBS[0])),
                advance: Some(Advance {
                    expected_next: t,
                    next_run_at: Some(t + 3600),
                    counts: true,
                }),
            })
            .await
            .unwrap()
    );
    store
        .finish_occurrence(
            JOBS[0],
            t,
            OccurrenceEnd {
                status: OccurrenceStatus::Ok,
                error: None,
                output_path: Some("cron/output/news.md".to_owned()),
                delivery_error: Some("telegram:42: HTTP 403".to_owned()),
            },
        )
        .await
        .unwrap();
    assert!(
        store
            .claim_occurrence(OccurrenceClaim {
                job_id: JOBS[0].to_owned(),
                scheduled_at: t + 10,
                trigger: Trigger::Manual,
                status: OccurrenceStatus::Running,
                session_id: None,
                advance: None,
            })
            .await
            .unwrap()
    );
    let mut paused = store.job(JOBS[1]).await.unwrap().unwrap();
    paused.state = JobState::Paused;
    assert!(store.update_job(&paused).await.unwrap());
}

/// Everything a store holds, as the traits read it.
#[derive(Debug, PartialEq)]
struct Everything {
    sessions: Vec<SessionRecord>,
    /// Per session: the active transcript, and every row.
    transcripts: Vec<(Vec<StoredMessage>, Vec<StoredMessage>)>,
    routes: Vec<Option<Route>>,
    ledger: Vec<Option<Obligation>>,
    open: Vec<Obligation>,
    counts: BTreeMap<ObligationState, u64>,
    pairing: PairingSnapshot,
    approved: Vec<bool>,
    cursors: Vec<Option<String>>,
    jobs: Vec<CronJob>,
    occurrences: Vec<Vec<Occurrence>>,
    /// The per-call ledger's sums, and each session's cost.
    spend: talaria_store::UsageReport,
    costs: Vec<u64>,
}

async fn everything<S: GatewayStore + ?Sized>(store: &S) -> Everything {
    let sessions = store.list_sessions(SessionFilter::default()).await.unwrap();
    let mut transcripts = Vec::new();
    for s in &sessions {
        transcripts.push((
            store.messages(&s.id).await.unwrap(),
            store.message_window(&s.id, 0, 0, 10_000).await.unwrap(),
        ));
    }
    let mut routes = Vec::new();
    for key in ROUTE_KEYS {
        routes.push(store.route(key).await.unwrap());
    }
    let mut ledger = Vec::new();
    for id in LEDGER_IDS {
        ledger.push(store.obligation(id).await.unwrap());
    }
    let mut approved = Vec::new();
    for user in ["ann", "bob"] {
        approved.push(store.pairing_is_approved("telegram", user).await.unwrap());
    }
    let mut cursors = Vec::new();
    for (platform, name) in CURSORS {
        cursors.push(store.cursor(platform, name).await.unwrap());
    }
    let mut costs = Vec::new();
    for s in &sessions {
        costs.push(store.session_cost_micros(&s.id).await.unwrap());
    }
    let jobs = store.jobs().await.unwrap();
    let mut occurrences = Vec::new();
    for job in &jobs {
        occurrences.push(store.occurrences(&job.id, 100).await.unwrap());
    }
    Everything {
        sessions,
        transcripts,
        routes,
        ledger,
        open: store.open_obligations(0).await.unwrap(),
        counts: store.obligation_counts().await.unwrap(),
        pairing: store.pairing_snapshot(limits()).await.unwrap(),
        approved,
        cursors,
        jobs,
        occurrences,
        spend: store.usage_report(0.0, 100).await.unwrap(),
        costs,
    }
}

/// Checks the fill is what the comparison should cover, so an empty
/// snapshot cannot pass for a good copy.
fn assert_full(e: &Everything) {
    assert_eq!(e.sessions.len(), 3);
    let first = e.sessions.iter().position(|s| s.id == FIRST).unwrap();
    let (active, all) = &e.transcripts[first];
    assert_eq!(active.len(), 3, "{active:?}");
    assert_eq!(all.len(), 7);
    assert!(all.iter().any(|m| !m.active));
    assert!(all.iter().any(|m| m.token_count == Some(42)));
    assert!(all.iter().any(|m| !m.message.tool_calls.is_empty()));
    assert_eq!(e.sessions[first].input_tokens, 2400);
    let third = e.sessions.iter().position(|s| s.id == THIRD).unwrap();
    assert_eq!(e.transcripts[third].0[0].message.media, attachments());
    let parts: Vec<u32> = e.ledger.iter().flatten().map(|o| o.parts_sent).collect();
    assert_eq!(parts, [0, 2, 3, 0, 0]);
    assert!(e.routes.iter().all(Option::is_some));
    assert!(e.ledger.iter().all(Option::is_some));
    assert_eq!(e.counts.len(), 5, "{:?}", e.counts);
    assert_eq!(e.pairing.pending.len(), 1);
    assert_eq!(e.pairing.approved.len(), 1);
    assert_eq!(e.pairing.lockouts.len(), 1, "{:?}", e.pairing);
    assert_eq!(e.jobs.len(), 3);
    assert_eq!(e.occurrences[0].len(), 2);
    assert_eq!(e.spend.total.calls, 2);
    assert_eq!(e.spend.total.cost_micros, 48);
    assert_eq!(e.costs.iter().sum::<u64>(), 48);
}

/// A filled source, with what the API cannot write staged by hand: a
/// token count, and two sessions started at the same instant (listings
/// then order them by creation, which the copy must keep).
async fn filled_source() -> (TempDir, SqliteStore) {
    let (dir, store) = source();
    fill(&store).await;
    sqlite_exec(
        &store,
        &format!(
            "UPDATE messages SET token_count = 42 WHERE id = (SELECT min(id) FROM messages); \
             UPDATE sessions SET started_at = (SELECT started_at FROM sessions WHERE id = '{FIRST}') \
             WHERE id = '{SECOND}';"
        ),
    );
    (dir, store)
}

async fn copies_everything_and_reads_back_the_same<S>(f: Fixture<S>)
where
    S: Backend + GatewayStore + StoreCopy,
{
    let (_dir, source) = filled_source().await;
    let before = everything(&source).await;
    assert_full(&before);

    let mut pages: BTreeMap<Table, usize> = BTreeMap::new();
    let report = copy_store(&source, &*f.store, &small_pages(), |p| {
        *pages.entry(p.table).or_default() += 1;
        assert!(p.copied <= p.total);
    })
    .await
    .unwrap();
    assert!(!report.resumed);
    assert!(pages.values().all(|n| *n >= 1), "{pages:?}");
    assert!(pages[&Table::Messages] >= 5, "{pages:?}");
    let reported: BTreeMap<Table, u64> = report.tables.iter().copied().collect();
    assert_eq!(reported[&Table::Messages], 9);
    assert_eq!(reported[&Table::Ledger], 5);
    assert_eq!(reported.len(), Table::ALL.len());

    // Everything reads back the same, through every trait.
    assert_eq!(everything(&*f.store).await, before);
    // ... and the source is as it was.
    assert_eq!(everything(&source).await, before);

    // Search finds the copied messages, active and compressed away.
    for (text, session) in [
        ("alpacas hum", FIRST),
        ("vicuñas", SECOND),
        ("terminal", THIRD),
    ] {
        let hits = f
            .search(SearchQuery {
                text: text.to_owned(),
                sources: Vec::new(),
                exclude_session: None,
                limit: 10,
            })
            .await
            .unwrap();
        assert_eq!(
            hits.iter()
                .map(|h| h.session.id.as_str())
                .collect::<Vec<_>>(),
            [session],
            "{text}"
        );
    }

    // New rows get ids above the copied ones.
    let highest = before
        .transcripts
        .iter()
        .flat_map(|(_, all)| all.iter().map(|m| m.id))
        .max()
        .unwrap();
    let id = f
        .append_message(THIRD, &Message::user("after the move"))
        .await
        .unwrap();
    assert!(id > highest, "{id} after {highest}");

    // The pairing code works (its salted hash came along), the offer
    // stamp still rate-limits, and inbound ids are still known.
    assert_eq!(
        f.pairing_offer(
            "telegram",
            "ann",
            Some("Ann"),
            "chat-1",
            "ZZZZ2345",
            limits()
        )
        .await
        .unwrap(),
        OfferOutcome::RateLimited
    );
    assert!(matches!(
        f.pairing_approve("telegram", ANN_CODE, limits()).await.unwrap(),
        ApproveOutcome::Approved(user) if user.user_id == "ann"
    ));
    for (platform, inbound) in INBOUND {
        assert!(!f.first_delivery(platform, inbound).await.unwrap());
    }

    // A second copy into the same target is refused and changes nothing.
    let again = copy_store(&source, &*f.store, &small_pages(), |_| {}).await;
    match again {
        Err(e @ CopyError::AlreadyCopied { .. }) => {
            let text = e.to_string();
            assert!(text.contains("already holds a finished copy"), "{text}");
            assert!(
                text.contains(&source.path().display().to_string()) || text.contains("state.db")
            );
        }
        other => panic!("a second copy was not refused: {other:?}"),
    }
    assert_eq!(f.messages(THIRD).await.unwrap().len(), 2);
}

async fn a_target_in_use_is_refused_untouched<S>(f: Fixture<S>)
where
    S: Backend + GatewayStore + StoreCopy,
{
    let (_dir, source) = filled_source().await;
    f.create_session(common::new_session("20240101_000000_ffff", "cli"))
        .await
        .unwrap();
    f.first_delivery("telegram", "someone-else").await.unwrap();
    match copy_store(&source, &*f.store, &small_pages(), |_| {}).await {
        Err(e @ CopyError::TargetInUse { .. }) => {
            let text = e.to_string();
            assert!(text.contains("sessions: 1"), "{text}");
            assert!(text.contains("inbound_seen: 1"), "{text}");
            assert!(text.contains("To start over"), "{text}");
        }
        other => panic!("a store in use was copied into: {other:?}"),
    }
    let sessions = f.list_sessions(SessionFilter::default()).await.unwrap();
    assert_eq!(sessions.len(), 1);
    assert!(f.jobs().await.unwrap().is_empty());
}

/// Half a copy (pages written, then the process gone), the source changed
/// meanwhile, and the copy run again: it resumes and the result is whole
/// and up to date.
async fn an_interrupted_copy_resumes<S>(f: Fixture<S>)
where
    S: Backend + GatewayStore + StoreCopy,
{
    let (_dir, source) = filled_source().await;
    {
        let mut dump = source.dump().await.unwrap();
        let mut load = f.load().await.unwrap();
        assert_eq!(load.begin(dump.source()).await.unwrap(), TargetState::Empty);
        let limit = PageLimit {
            rows: 3,
            bytes: 1 << 20,
        };
        let page = dump
            .page(Table::Sessions, None, limit)
            .await
            .unwrap()
            .unwrap();
        load.write(Table::Sessions, &page.rows).await.unwrap();
        let page = dump
            .page(Table::Messages, None, limit)
            .await
            .unwrap()
            .unwrap();
        load.write(Table::Messages, &page.rows).await.unwrap();
        // The process dies here: nothing is finished or closed.
    }
    source.set_title(FIRST, "Alpacas, really").await.unwrap();
    source
        .append_message(THIRD, &Message::user("one more thing"))
        .await
        .unwrap();
    source
        .set_cursor("telegram", "offset", "100")
        .await
        .unwrap();

    let report = copy_store(&source, &*f.store, &small_pages(), |_| {})
        .await
        .unwrap();
    assert!(report.resumed);
    let expected = everything(&source).await;
    assert_eq!(expected.sessions[0].id, THIRD);
    assert_eq!(everything(&*f.store).await, expected);
    let first = f.session(FIRST).await.unwrap().unwrap();
    assert_eq!(first.title.as_deref(), Some("Alpacas, really"));
}

/// A half copy of one source is not finished from another.
async fn half_a_copy_of_another_source_is_refused<S>(f: Fixture<S>)
where
    S: Backend + GatewayStore + StoreCopy,
{
    let (_one_dir, one) = filled_source().await;
    {
        let dump = one.dump().await.unwrap();
        let mut load = f.load().await.unwrap();
        assert_eq!(load.begin(dump.source()).await.unwrap(), TargetState::Empty);
    }
    let (_other_dir, other) = filled_source().await;
    match copy_store(&other, &*f.store, &small_pages(), |_| {}).await {
        Err(e @ CopyError::OtherCopyUnfinished { .. }) => {
            let text = e.to_string();
            assert!(text.contains("unfinished copy of"), "{text}");
        }
        other => panic!("a half copy was mixed with another source: {other:?}"),
    }
    assert!(
        f.list_sessions(SessionFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    // The first source still finishes its copy.
    let report = copy_store(&one, &*f.store, &small_pages(), |_| {})
        .await
        .unwrap();
    assert!(report.resumed);
}

/// A gateway alive on either side stops the copy before anything is
/// written; once it left, the copy goes ahead.
async fn a_live_gateway_on_either_side_refuses<S>(f: Fixture<S>)
where
    S: Backend + GatewayStore + StoreCopy,
{
    let (_dir, source) = filled_source().await;
    let node = NodeAnnouncement {
        id: NodeId::new("gw-1").unwrap(),
        host: "old-host".to_owned(),
        pid: 4242,
        started_at: Some(7),
        version: "test".to_owned(),
    };
    for side in ["source", "target"] {
        let store: &dyn GatewayStore = if side == "source" { &source } else { &*f.store };
        store.heartbeat(&node, 60.0).await.unwrap();
        match copy_store(&source, &*f.store, &small_pages(), |_| {}).await {
            Err(e @ CopyError::GatewayRunning { .. }) => {
                let text = e.to_string();
                assert!(text.contains(&format!("against the {side}")), "{text}");
                assert!(text.contains("old-host"), "{text}");
            }
            other => panic!("copied with a live gateway on the {side}: {other:?}"),
        }
        store.leave(&node.id).await.unwrap();
    }
    assert!(
        f.list_sessions(SessionFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    copy_store(&source, &*f.store, &small_pages(), |_| {})
        .await
        .unwrap();
}

/// SQLite → this backend → a new SQLite file: the second leg reads this
/// backend out, and nothing changes on the way.
async fn a_round_trip_through_the_backend_loses_nothing<S>(f: Fixture<S>)
where
    S: Backend + GatewayStore + StoreCopy,
{
    let (_dir, source) = filled_source().await;
    copy_store(&source, &*f.store, &small_pages(), |_| {})
        .await
        .unwrap();
    let (_back_dir, back) = common::temp_store();
    let report = copy_store(&*f.store, &back, &small_pages(), |_| {})
        .await
        .unwrap();
    assert!(report.source.contains("schema") || report.source.ends_with(".db"));
    assert_eq!(everything(&back).await, everything(&source).await);
}

/// Every table the backend holds is copied or deliberately left out.
async fn every_table_is_copied_or_left_out_on_purpose<S>(f: Fixture<S>)
where
    S: Backend + GatewayStore + StoreCopy,
{
    let (_dir, source) = filled_source().await;
    copy_store(&source, &*f.store, &small_pages(), |_| {})
        .await
        .unwrap();
    let tables: Vec<String> = match &f.place {
        Place::Sqlite { path, .. } => {
            let conn = rusqlite::Connection::open(path).unwrap();
            let mut stmt = conn
                .prepare(
                    "SELECT name FROM sqlite_master WHERE type = 'table' \
                     AND name NOT LIKE 'sqlite_%'",
                )
                .unwrap();
            stmt.query_map([], |r| r.get(0))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap()
        }
        Place::Postgres { schema } => raw_postgres(Some(schema))
            .await
            .query(
                "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1",
                &[schema],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect(),
    };
    assert!(tables.len() > Table::ALL.len(), "{tables:?}");
    for table in &tables {
        let copied = Table::ALL.iter().any(|t| t.name() == table);
        let left_out = LEFT_OUT
            .iter()
            .any(|(name, _)| match name.strip_suffix('*') {
                Some(prefix) => table.starts_with(prefix),
                None => name == table,
            });
        assert!(
            copied != left_out,
            "table {table} is neither copied nor listed in LEFT_OUT (or both)"
        );
    }
}

contract_tests!(
    copies_everything_and_reads_back_the_same,
    a_target_in_use_is_refused_untouched,
    an_interrupted_copy_resumes,
    half_a_copy_of_another_source_is_refused,
    a_live_gateway_on_either_side_refuses,
    a_round_trip_through_the_backend_loses_nothing,
    every_table_is_copied_or_left_out_on_purpose,
);

/// Two copies into one PostgreSQL schema at once: the second waits briefly
/// for the first's lock, then is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_into_one_schema_at_once_is_refused() {
    let f = <talaria_store::PostgresStore as Backend>::fresh().await;
    let (_dir, source) = filled_source().await;
    let held = f.load().await.unwrap();
    match copy_store(&source, &*f.store, &small_pages(), |_| {}).await {
        Err(CopyError::Store(talaria_store::StoreError::Conflict(text))) => {
            assert!(text.contains("another copy"), "{text}");
        }
        other => panic!("two copies ran at once: {other:?}"),
    }
    drop(held);
    copy_store(&source, &*f.store, &small_pages(), |_| {})
        .await
        .unwrap();
}

/// PostgreSQL text cannot hold U+0000: it arrives as U+FFFD, as every
/// write of that backend stores it, and the copy still verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_character_arrives_in_postgres_as_a_replacement_character() {
    let f = <talaria_store::PostgresStore as Backend>::fresh().await;
    let (_dir, source) = source();
    source
        .create_session(common::new_session("20240101_000000_abcd", "cli"))
        .await
        .unwrap();
    source
        .append_message("20240101_000000_abcd", &Message::user("nul\0here"))
        .await
        .unwrap();
    copy_store(&source, &*f.store, &small_pages(), |_| {})
        .await
        .unwrap();
    let copied = f.messages("20240101_000000_abcd").await.unwrap();
    assert_eq!(copied[0].message.content, "nul\u{FFFD}here");
}
