//! The encrypting test client proves itself: two nio devices on a real
//! Synapse exchange messages and a file in an encrypted DM, and the
//! homeserver only ever holds ciphertext. No Talaria code is involved; when this fails,
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

    // A file, encrypted before it is uploaded: bob gets alice's bytes
    // back, the homeserver's media store holds something else.
    let sent_file = Instant::now();
    let bytes = noise(300 * 1024 + 7);
    let file = alice
        .send_file(
            &room,
            "noise.bin",
            &bytes,
            "application/octet-stream",
            "m.file",
        )
        .await;
    let got = bob.wait_for_message(&room, &alice_http.user_id, WAIT).await;
    assert_eq!(got.event_id, file);
    assert!(got.encrypted && got.decrypted, "{got:?}");
    assert!(got.file_encrypted, "{got:?}");
    assert_eq!(got.detail, None, "{got:?}");
    assert!(
        got.file.as_deref() == Some(&bytes[..]),
        "bob's file is not alice's ({} bytes sent): {got:?}",
        bytes.len()
    );
    assert_eq!(got.body, "noise.bin", "{got:?}");
    assert_eq!(
        got.content.get("msgtype").and_then(Value::as_str),
        Some("m.file")
    );
    assert_eq!(
        got.content.get("filename").and_then(Value::as_str),
        Some("noise.bin")
    );
    assert_eq!(
        got.content.pointer("/info/size").and_then(Value::as_u64),
        Some(bytes.len() as u64),
        "{got:?}"
    );
    assert!(got.content.get("url").is_none(), "{got:?}");
    let mxc = got
        .content
        .pointer("/file/url")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    for key in ["/file/key/k", "/file/iv", "/file/hashes/sha256", "/file/v"] {
        assert!(got.content.pointer(key).is_some(), "no {key}: {got:?}");
    }
    let stored = alice_http
        .call(
            reqwest::Method::GET,
            &format!("rooms/{}/event/{}", segment(&room), segment(&file)),
            None,
        )
        .await;
    assert_eq!(
        stored.get("type").and_then(Value::as_str),
        Some("m.room.encrypted"),
        "{stored}"
    );
    assert!(!stored.to_string().contains("noise.bin"), "{stored}");
    let Some(media) = mxc.strip_prefix("mxc://") else {
        panic!("not an mxc url: {mxc:?} in {got:?}");
    };
    let raw = reqwest::Client::new()
        .get(format!(
            "{}/_matrix/client/v1/media/download/{media}",
            hs.homeserver()
        ))
        .bearer_auth(&alice_http.access_token)
        .send()
        .await
        .expect("the media download answers");
    assert!(raw.status().is_success(), "{raw:?}");
    let raw = raw.bytes().await.expect("the upload's bytes");
    // AES-CTR keeps the length; the bytes are another matter.
    assert_eq!(raw.len(), bytes.len());
    assert!(raw[..] != bytes[..], "the homeserver holds the plaintext");
    let same = raw.iter().zip(&bytes).filter(|(a, b)| a == b).count();
    assert!(
        same < bytes.len() / 64,
        "{same} of {} bytes stored as sent",
        bytes.len()
    );
    let file_took = sent_file.elapsed();

    // In a plaintext room the same call uploads the bytes as they are,
    // under a top-level `url`, and bob gets them as they are.
    let plain_room = alice_http.create_room(&[&bob_http.user_id], false).await;
    bob.join(&plain_room).await;
    alice
        .wait_until_joined(&plain_room, &bob_http.user_id, WAIT)
        .await;
    let small = noise(4096);
    let plain_file = alice
        .send_file(
            &plain_room,
            "small.bin",
            &small,
            "application/octet-stream",
            "m.file",
        )
        .await;
    let got = bob
        .wait_for_message(&plain_room, &alice_http.user_id, WAIT)
        .await;
    assert_eq!(got.event_id, plain_file);
    assert!(!got.encrypted && !got.file_encrypted, "{got:?}");
    assert_eq!(got.detail, None, "{got:?}");
    assert!(got.content.get("file").is_none(), "{got:?}");
    assert!(
        got.content
            .get("url")
            .and_then(Value::as_str)
            .is_some_and(|u| u.starts_with("mxc://")),
        "{got:?}"
    );
    assert!(got.file.as_deref() == Some(&small[..]), "{got:?}");

    eprintln!(
        "logins took {logged_in:.2?}, the file {file_took:.2?}, the whole exchange {:.2?}",
        began.elapsed()
    );
}

/// `len` bytes that look random (xorshift), so neither compression nor a
/// lucky run of zeros hides a mistake.
fn noise(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[3]
        })
        .collect()
}
