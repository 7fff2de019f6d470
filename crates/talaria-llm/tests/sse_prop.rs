//! The SSE parser never panics and does not care how its input is chunked.

use proptest::prelude::*;
use talaria_llm::sse::{SseEvent, SseParser};

fn parse(chunks: &[&[u8]]) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    let mut out = Vec::new();
    for c in chunks {
        out.extend(p.push(c));
    }
    out.extend(p.finish());
    out
}

/// Splits `data` at the given (unsorted, possibly out-of-range) points.
fn split<'a>(data: &'a [u8], points: &[usize]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = points.iter().map(|p| p % (data.len() + 1)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut last = 0;
    for c in cuts {
        out.push(&data[last..c]);
        last = c;
    }
    out.push(&data[last..]);
    out
}

/// Bytes that look like SSE often enough to exercise every branch.
fn sse_like() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"event: x".to_vec()),
        Just(b": comment".to_vec()),
        Just(b"id: 1".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\r".to_vec()),
        Just("é€😀".as_bytes().to_vec()),
        Just(b"{\"a\":1}".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..4),
    ];
    proptest::collection::vec(token, 0..40).prop_map(|v| v.concat())
}

proptest! {
    #[test]
    fn arbitrary_bytes_chunked_anyhow_give_the_same_events(
        data in proptest::collection::vec(any::<u8>(), 0..300),
        points in proptest::collection::vec(any::<usize>(), 0..20),
    ) {
        let whole = parse(&[&data]);
        prop_assert_eq!(parse(&split(&data, &points)), whole);
    }

    #[test]
    fn sse_like_input_chunked_anyhow_gives_the_same_events(
        data in sse_like(),
        points in proptest::collection::vec(any::<usize>(), 0..30),
    ) {
        let whole = parse(&[&data]);
        let bytewise: Vec<&[u8]> = data.chunks(1).collect();
        prop_assert_eq!(&parse(&bytewise), &whole);
        prop_assert_eq!(parse(&split(&data, &points)), whole);
    }
}
