//! Form posts (`application/x-www-form-urlencoded`), read within a size
//! limit.

use std::collections::HashMap;

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// A page's query parameters.
pub(crate) type Query = HashMap<String, String>;

/// A form's fields; a repeated name keeps its first value.
#[derive(Debug, Default)]
pub(crate) struct Fields(HashMap<String, String>);

impl Fields {
    /// The fields of an urlencoded body.
    pub(crate) fn parse(body: &[u8]) -> Fields {
        let mut fields = HashMap::new();
        for (name, value) in form_urlencoded::parse(body) {
            fields
                .entry(name.into_owned())
                .or_insert_with(|| value.into_owned());
        }
        Fields(fields)
    }

    /// The field `name`, if sent.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// The field `name`, trimmed, if sent and not blank.
    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.get(name).map(str::trim).filter(|v| !v.is_empty())
    }
}

/// Whether the request's body is an urlencoded form.
pub(crate) fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';').next().is_some_and(|t| {
                t.trim()
                    .eq_ignore_ascii_case("application/x-www-form-urlencoded")
            })
        })
}

/// A form too large to read.
#[derive(Debug)]
pub(crate) struct TooLarge(usize);

impl IntoResponse for TooLarge {
    fn into_response(self) -> Response {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("The form is larger than {} bytes.", self.0),
        )
            .into_response()
    }
}

/// Reads `body` as a form of at most `limit` bytes.
pub(crate) async fn read(body: Body, limit: usize) -> Result<Fields, TooLarge> {
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| TooLarge(limit))?;
    Ok(Fields::parse(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_decoded_and_the_first_of_a_name_wins() {
        let f = Fields::parse(b"a=1+2&b=%3Cx%3E&a=3&c=+");
        assert_eq!(f.get("a"), Some("1 2"));
        assert_eq!(f.get("b"), Some("<x>"));
        assert_eq!(f.text("c"), None);
        assert_eq!(f.get("d"), None);
    }
}
