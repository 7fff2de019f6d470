//! The encrypting test client proves itself: two nio devices on a real
//! Synapse exchange messages in an encrypted DM, and the homeserver only
//! ever holds ciphertext. No Talaria code is involved; when this fails,
//! the harness is broken, not the adapter.

use std::time::{Duration, Instant};

use serde_json::Value;
use talaria_testkit::matrix_e2ee::EncryptingClient;
use talaria_testkit::synapse::{Synapse, segment};

const WAIT: Duration = Duration::from_secs(30);

/// Localparts no other test (or earlier run) of this homeserver uses.
fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{name}-{}-{nanos}", std::process::id())
}

#[tokio::test]
async fn two_nio_devices_talk_in_an_encrypted_dm_and_synapse_holds_only_ciphertext() {
    let began = Instant::now();
    let hs = Synapse::shared();
    let (alice_name, bob_name) = (unique("alice"), unique("bob"));
    // Registering gives each user a device of its own (`MatrixUser`), which
    // reads what the homeserver stores; nio logs in as a second device.
    let alice_http = hs.register(&alice_name).await;
    let bob_http = hs.register(&bob_name).await;
    let stores = tempfile::tempdir().expect("a directory for nio's stores");
    let alice = EncryptingClient::login(hs, &alice_name, &stores.path().join("alice")).await;
    let bob = EncryptingClient::login(hs, &bob_name, &stores.path().join("bob")).await;
    assert_eq!(alice.user_id(), alice_http.user_id);
    assert_eq!(bob.user_id(), bob_http.user_id);
    assert!(!alice.device_id().is_empty() && !bob.device_id().is_empty());
    assert_ne!(alice.device_id(), bob.device_id());
    let logged_in = began.elapsed();

    let room = alice
        .create_encrypted_room(&[&bob_http.user_id], true)
        .await;
    bob.join(&room).await;
    alice
        .wait_until_joined(&room, &bob_http.user_id, WAIT)
        .await;
    bob.wait_until_joined(&room, &alice_http.user_id, WAIT)
        .await;

    let ping = alice.send_text(&room, "ping").await;
    let got = bob.wait_for_message(&room, &alice_http.user_id, WAIT).await;
    assert!(
        got.encrypted && got.decrypted,
        "bob's nio did not decrypt alice's message: {got:?}\n--- bob's nio ---\n{}",
        bob.log_tail()
    );
    assert_eq!(got.body, "ping", "{got:?}");
    assert_eq!(got.event_id, ping);
    assert_eq!(got.relates_to, None);
    assert_eq!(
        got.content.get("msgtype").and_then(Value::as_str),
        Some("m.text")
    );

    let pong = bob.send_text(&room, "pong").await;
    let got = alice.wait_for_message(&room, &bob_http.user_id, WAIT).await;
    assert!(
        got.encrypted && got.decrypted,
        "alice's nio did not decrypt bob's answer: {got:?}\n--- alice's nio ---\n{}",
        alice.log_tail()
    );
    assert_eq!(got.body, "pong", "{got:?}");
    assert_eq!(got.event_id, pong);

    // What the homeserver stores: megolm ciphertext, the words nowhere.
    for (id, word) in [(&ping, "ping"), (&pong, "pong")] {
        let stored = alice_http
            .call(
                reqwest::Method::GET,
                &format!("rooms/{}/event/{}", segment(&room), segment(id)),
                None,
            )
            .await;
        assert_eq!(
            stored.get("type").and_then(Value::as_str),
            Some("m.room.encrypted"),
            "{stored}"
        );
        assert_eq!(
            stored.pointer("/content/algorithm").and_then(Value::as_str),
            Some("m.megolm.v1.aes-sha2"),
            "{stored}"
        );
        assert!(
            stored
                .pointer("/content/ciphertext")
                .and_then(Value::as_str)
                .is_some_and(|c| !c.is_empty()),
            "{stored}"
        );
        assert!(
            !stored.to_string().contains(&format!("\"{word}\"")),
            "{stored}"
        );
    }
    // The room's history as the homeserver serves it holds no plaintext
    // message at all: `messages` lists only `m.room.message` events.
    let plain = alice_http.messages(&room).await;
    assert!(plain.is_empty(), "plaintext messages stored: {plain:#?}");
    let history = alice_http
        .call(
            reqwest::Method::GET,
            &format!("rooms/{}/messages?dir=b&limit=100", segment(&room)),
            None,
        )
        .await;
    let encrypted = history
        .get("chunk")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|e| e.get("type").and_then(Value::as_str) == Some("m.room.encrypted"))
        .count();
    assert_eq!(encrypted, 2, "{history:#}");
    let raw = history.to_string();
    assert!(
        !raw.contains("\"ping\"") && !raw.contains("\"pong\""),
        "{raw}"
    );

    eprintln!(
        "logins took {logged_in:.2?}, the whole exchange {:.2?}",
        began.elapsed()
    );
}
