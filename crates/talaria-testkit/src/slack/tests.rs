use super::handlers::params;
use super::*;
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, header};

#[test]
fn envelopes_carry_their_attempt() {
    let e = Envelope {
        id: "env-1".into(),
        payload: json!({"event_id": "Ev1"}),
        sent: 0,
        acked: false,
    };
    assert_eq!(envelope_frame(&e)["retry_attempt"], 0);
    let again = Envelope { sent: 2, ..e };
    let f = envelope_frame(&again);
    assert_eq!(f["retry_attempt"], 2);
    assert_eq!(f["retry_reason"], "timeout");
    assert_eq!(f["envelope_id"], "env-1");
}

#[test]
fn form_bodies_are_decoded() {
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded"),
    );
    let p = params(&h, &Bytes::from_static(b"channel=C1&text=a+b%21"));
    assert_eq!(p["channel"], "C1");
    assert_eq!(p["text"], "a b!");
}
