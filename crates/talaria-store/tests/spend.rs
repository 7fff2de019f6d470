//! The per-call ledger: model calls stored with their session's counters
//! and cost, the spend budgets sum, and the report `talaria insights`
//! prints, on both backends.

use crate::common;

use common::{Backend, Fixture};
use talaria_core::{Message, Usage};
use talaria_store::{ModelCall, NewSession, SessionStore, SpendScope, StoreError};

const KEY: &str = "agent:main:telegram:dm:42";

fn call(model: &str, input: u64, output: u64, cost: u64, tools: u32, starts: bool) -> ModelCall {
    ModelCall {
        provider: "openai".to_owned(),
        model: model.to_owned(),
        kind: "turn".to_owned(),
        usage: Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: 10,
            cache_write_tokens: 0,
            reasoning_tokens: 1,
        },
        cost_micros: cost,
        tool_calls: tools,
        starts_turn: starts,
    }
}

async fn telegram_session<S: SessionStore>(store: &S, id: &str, key: &str, chat: &str) {
    store
        .create_session(NewSession {
            id: id.to_owned(),
            source: "telegram".to_owned(),
            session_key: Some(key.to_owned()),
            chat_id: Some(chat.to_owned()),
            ..NewSession::default()
        })
        .await
        .unwrap();
}

async fn calls_are_stored_with_counters_cost_and_ledger_rows<S: Backend + SessionStore>(
    f: Fixture<S>,
) {
    telegram_session(&*f.store, "s1", KEY, "42").await;
    f.create_session(common::new_session("c1", "cli"))
        .await
        .unwrap();
    // A turn: a tool call, then the answer, each stored with its call.
    f.append_message_with_calls(
        "s1",
        &Message::assistant("calling"),
        &[call("gpt-4o-mini", 1000, 100, 210, 2, true)],
    )
    .await
    .unwrap();
    f.append_message_with_calls(
        "s1",
        &Message::assistant("done"),
        &[call("gpt-4o-mini", 2000, 50, 330, 0, false)],
    )
    .await
    .unwrap();
    // A compression summary and a call on another model, without a row.
    f.add_calls(
        "s1",
        &[
            ModelCall {
                kind: "compression".to_owned(),
                ..call("gpt-4o-mini", 500, 20, 87, 0, false)
            },
            call("claude-sonnet-4-5", 100, 10, 450, 0, true),
        ],
    )
    .await
    .unwrap();
    f.add_calls("c1", &[call("claude-sonnet-4-5", 300, 30, 1_350, 1, true)])
        .await
        .unwrap();

    let s1 = f.session("s1").await.unwrap().unwrap();
    assert_eq!(
        (
            s1.input_tokens,
            s1.output_tokens,
            s1.cache_read_tokens,
            s1.reasoning_tokens
        ),
        (3600, 180, 40, 4)
    );
    assert_eq!(s1.message_count, 2);
    assert_eq!(
        f.session_cost_micros("s1").await.unwrap(),
        210 + 330 + 87 + 450
    );
    assert_eq!(f.session_cost_micros("c1").await.unwrap(), 1_350);
    assert_eq!(f.session_cost_micros("nobody").await.unwrap(), 0);

    assert_eq!(f.spend_since(0.0, &SpendScope::All).await.unwrap(), 2_427);
    assert_eq!(
        f.spend_since(0.0, &SpendScope::SessionKey(KEY.to_owned()))
            .await
            .unwrap(),
        1_077
    );
    let chat = SpendScope::Chat {
        platform: "telegram".to_owned(),
        chat_id: "42".to_owned(),
    };
    assert_eq!(f.spend_since(0.0, &chat).await.unwrap(), 1_077);
    let future = talaria_core::unix_now() + 60.0;
    assert_eq!(f.spend_since(future, &SpendScope::All).await.unwrap(), 0);

    let report = f.usage_report(0.0, 10).await.unwrap();
    let t = report.total;
    assert_eq!((t.calls, t.turns, t.tool_calls), (5, 3, 3));
    assert_eq!(
        (t.input_tokens, t.output_tokens, t.cost_micros),
        (3900, 210, 2_427)
    );
    assert_eq!(report.by_day.len(), 1);
    assert_eq!(report.by_day[0].totals, t);
    // Costliest first.
    let models: Vec<(&str, u64, u64)> = report
        .by_model
        .iter()
        .map(|g| (g.name.as_str(), g.totals.calls, g.totals.cost_micros))
        .collect();
    assert_eq!(
        models,
        [("claude-sonnet-4-5", 2, 1_800), ("gpt-4o-mini", 3, 627)]
    );
    let platforms: Vec<(&str, u64)> = report
        .by_platform
        .iter()
        .map(|g| (g.name.as_str(), g.totals.cost_micros))
        .collect();
    assert_eq!(platforms, [("cli", 1_350), ("telegram", 1_077)]);
    let chats: Vec<(&str, u64, u64)> = report
        .by_chat
        .iter()
        .map(|g| (g.name.as_str(), g.totals.turns, g.totals.tool_calls))
        .collect();
    assert_eq!(chats, [("cli", 1, 1), (KEY, 2, 2)]);
    // `top` bounds the groups.
    let one = f.usage_report(0.0, 1).await.unwrap();
    assert_eq!(one.by_model.len(), 1);
    assert_eq!(one.by_model[0].name, "claude-sonnet-4-5");
}

async fn spend_and_reports_count_only_rows_since_the_start<S: Backend + SessionStore>(
    f: Fixture<S>,
) {
    telegram_session(&*f.store, "s1", KEY, "42").await;
    telegram_session(&*f.store, "s2", "agent:main:telegram:dm:7", "7").await;
    f.add_calls("s1", &[call("old", 1, 1, 5_000, 0, true)])
        .await
        .unwrap();
    f.add_calls("s1", &[call("new", 1, 1, 700, 0, true)])
        .await
        .unwrap();
    f.add_calls("s2", &[call("new", 1, 1, 40, 0, true)])
        .await
        .unwrap();
    // 2025-10-27 01:00 UTC: long before the rest.
    assert_eq!(
        f.execute("UPDATE model_calls SET at = 1761526800 WHERE model = 'old'")
            .await,
        1
    );
    let now = talaria_core::unix_now();
    let today = talaria_store::spend::utc_day_start(now);
    assert_eq!(f.spend_since(today, &SpendScope::All).await.unwrap(), 740);
    assert_eq!(
        f.spend_since(today, &SpendScope::SessionKey(KEY.to_owned()))
            .await
            .unwrap(),
        700
    );
    assert_eq!(
        f.spend_since(
            today,
            &SpendScope::Chat {
                platform: "telegram".to_owned(),
                chat_id: "7".to_owned(),
            }
        )
        .await
        .unwrap(),
        40
    );
    // The session's running cost keeps everything.
    assert_eq!(f.session_cost_micros("s1").await.unwrap(), 5_700);
    let recent = f.usage_report(today, 10).await.unwrap();
    assert_eq!(recent.total.cost_micros, 740);
    assert!(recent.by_model.iter().all(|g| g.name == "new"));
    let all = f.usage_report(0.0, 10).await.unwrap();
    let days: Vec<&str> = all.by_day.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(days.len(), 2, "{days:?}");
    assert_eq!(days[0], "2025-10-27");
    assert_eq!(all.by_day[0].totals.cost_micros, 5_000);
}

async fn calls_on_a_missing_session_store_nothing<S: Backend + SessionStore>(f: Fixture<S>) {
    let err = f
        .add_calls("ghost", &[call("m", 1, 1, 9, 0, true)])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NoSuchSession(_)), "{err:?}");
    let err = f
        .append_message_with_calls(
            "ghost",
            &Message::assistant("x"),
            &[call("m", 1, 1, 9, 0, true)],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NoSuchSession(_)), "{err:?}");
    assert_eq!(f.spend_since(0.0, &SpendScope::All).await.unwrap(), 0);
    // No calls: nothing to write, not even a check.
    f.add_calls("ghost", &[]).await.unwrap();
}

contract_tests!(
    calls_are_stored_with_counters_cost_and_ledger_rows,
    spend_and_reports_count_only_rows_since_the_start,
    calls_on_a_missing_session_store_nothing,
);
