//! Files from the disk attached to a message in the terminal (`chat
//! --image PATH`, `/image PATH`): stored in the media cache and turned into
//! what the model gets exactly as a photo or voice note sent in a chat app
//! is (see [`talaria_agent::attach`]).

use std::path::Path;
use std::sync::Arc;

use talaria_agent::attach::{AttachContext, Digest, Received, digest};
use talaria_media::{Hint, MediaCache, Transcriber};

use crate::runtime::Runtime;

/// What the files at `paths` give the next message. A path that cannot be
/// read is an error before anything is stored; a file the cache refuses
/// (too large) is a notice in the digest, as in a chat.
pub async fn attach_files(rt: &Runtime, model: &str, paths: &[&Path]) -> Result<Digest, String> {
    let config = &rt.config;
    let cache = MediaCache::for_home(&rt.home, &config.media);
    let mut received = Vec::with_capacity(paths.len());
    for path in paths {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let hint = Hint {
            name: name.as_deref(),
            mime: None,
            voice: false,
        };
        let stored = cache.store(file, hint).await.map_err(|e| e.to_string());
        received.push(Received {
            label: format!("file {}", name.as_deref().unwrap_or("")),
            claimed: None,
            file: stored,
        });
    }
    let env = &rt.loaded.env;
    let describer = match (
        config.media.describe_images,
        talaria_llm::auxiliary_vision_provider(config, env),
    ) {
        (true, Some(Ok(provider))) => Some(provider),
        (true, Some(Err(e))) => return Err(format!("images cannot be described: {e}")),
        _ => None,
    };
    let transcriber = Transcriber::from_config(&config.stt, env)
        .map_err(|e| format!("audio cannot be transcribed: {e}"))?
        .map(Arc::new);
    let cx = AttachContext {
        cache: &cache,
        image_max_px: config.media.image_max_px,
        vision: talaria_llm::vision::sees_images(config.model.vision, model),
        describer,
        transcriber,
    };
    Ok(digest(received, &cx).await)
}

/// The path and the message of `/image PATH [message]`: a path with
/// spaces is written in quotes.
pub fn split_path(args: &str) -> (&str, &str) {
    let args = args.trim();
    for quote in ['"', '\''] {
        if let Some(rest) = args.strip_prefix(quote)
            && let Some(end) = rest.find(quote)
        {
            return (&rest[..end], rest[end + 1..].trim());
        }
    }
    match args.split_once(char::is_whitespace) {
        Some((path, rest)) => (path, rest.trim()),
        None => (args, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_may_be_quoted() {
        assert_eq!(split_path("a.png what is it"), ("a.png", "what is it"));
        assert_eq!(
            split_path("\"my photo.png\" and?"),
            ("my photo.png", "and?")
        );
        assert_eq!(split_path(" 'x y.jpg' "), ("x y.jpg", ""));
        assert_eq!(split_path("only.png"), ("only.png", ""));
    }
}
