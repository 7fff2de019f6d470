//! Which models take images.
//!
//! `model.vision: auto` is answered from the model's name: servers do not
//! say whether a model sees images (OpenAI's `/v1/models` does not, nor do
//! most local servers), while model families are named consistently. The
//! table errs towards "no" where a family has text-only members: a text
//! model sent an image part refuses the whole request, while a vision
//! model sent a placeholder only misses the picture (and `model.vision:
//! on` fixes that for a name the table does not know).

use talaria_core::config::VisionMode;

/// Whether `model` is sent images as parts: `on` and `off` decide outright,
/// `auto` asks the table of families known to take images. The name is
/// matched case-insensitively after any `provider/` prefix
/// (`openrouter/meta-llama/llama-4-scout` is `llama-4-scout`).
pub fn sees_images(mode: VisionMode, model: &str) -> bool {
    match mode {
        VisionMode::On => true,
        VisionMode::Off => false,
        VisionMode::Auto => known_to_see(model),
    }
}

/// Members of seeing families that take text only, as their makers
/// document them. Checked before [`SEEING_PREFIXES`].
const TEXT_ONLY_PREFIXES: &[&str] = &[
    // OpenAI: the small reasoning models of the first generations, the
    // text-only GPT-4 Turbo previews, and the audio and speech models.
    "o1-mini",
    "o1-preview",
    "o3-mini",
    "gpt-4-turbo-preview",
    "gpt-4o-audio",
    "gpt-4o-mini-audio",
    "gpt-4o-realtime",
    "gpt-4o-mini-realtime",
    "gpt-4o-transcribe",
    "gpt-4o-mini-transcribe",
    "gpt-4o-mini-tts",
    // Anthropic before Claude 3.
    "claude-1",
    "claude-2",
    "claude-instant",
    // Google's first Gemini Pro took text only.
    "gemini-1.0-pro",
    // Gemma 3n takes images in its own runtime but not in the servers
    // people run it with (llama.cpp, Ollama).
    "gemma-3n",
    "gemma3n",
];

/// Name prefixes of families that take images.
const SEEING_PREFIXES: &[&str] = &[
    // OpenAI.
    "gpt-4o",
    "chatgpt-4o",
    "gpt-4.1",
    "gpt-4.5",
    "gpt-4-turbo",
    "gpt-5",
    // Anthropic: everything from Claude 3 on (the older ones are above).
    "claude-",
    // Google.
    "gemini",
    "gemma-3",
    "gemma3",
    "paligemma",
    // Meta: Llama 4 (Llama 3.2's vision models say `vision`).
    "llama-4",
    "llama4",
    // Open vision-language families.
    "llava",
    "bakllava",
    "pixtral",
    "qvq",
    "minicpm-v",
    "minicpm-o",
    "moondream",
    "internvl",
    "idefics",
    "smolvlm",
    "molmo",
    "cogvlm",
    "deepseek-vl",
    "kimi-vl",
    "glm-4v",
    "glm-4.1v",
    "glm-4.5v",
    "phi-4-multimodal",
    // Mistral Small from 3.1 (dated 2503 on) and Mistral Medium 3.
    "mistral-small-3.1",
    "mistral-small3.1",
    "mistral-small-3.2",
    "mistral-small3.2",
    "mistral-small-25",
    "mistral-small-latest",
    "mistral-medium-3",
    "mistral-medium-25",
    "mistral-medium-latest",
    // xAI.
    "grok-2-vision",
    "grok-vision",
    "grok-4",
    // Amazon.
    "nova-lite",
    "nova-pro",
];

/// OpenAI's reasoning models take images from o1 on (their -mini text-only
/// exceptions are in [`TEXT_ONLY_PREFIXES`]); matched on the first word of
/// the name so `o1` does not claim every name that starts with those two
/// letters.
const SEEING_FIRST_WORDS: &[&str] = &["o1", "o3", "o4"];

/// The table behind `auto`.
fn known_to_see(model: &str) -> bool {
    let lower = model.trim().to_ascii_lowercase();
    // `openrouter/google/gemini-2.5-flash`: the model is the last part.
    let name = lower.rsplit('/').next().unwrap_or(&lower);
    let words: Vec<&str> = name
        .split(['-', '_', ':', ' '])
        .filter(|w| !w.is_empty())
        .collect();
    // Names that say so: `llama-3.2-11b-vision`, `granite3.2-vision`,
    // `phi-3.5-vision-instruct`, `qwen2.5-vl-7b`.
    if words
        .iter()
        .any(|w| matches!(*w, "vision" | "vl" | "vlm" | "multimodal"))
    {
        return true;
    }
    if TEXT_ONLY_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return false;
    }
    // The original `gemini-pro` was text-only (`gemini-pro-vision` saw).
    if name == "gemini-pro" {
        return false;
    }
    // Gemma 3's 1B model is text-only (`gemma3:1b`, `gemma-3-1b-it`).
    if name.starts_with("gemma") && words.contains(&"1b") {
        return false;
    }
    // Qwen's vision models: `qwen-vl-max`, `qwen2.5vl:7b` (Ollama's spelling).
    if name.starts_with("qwen") {
        return words.iter().any(|w| w.ends_with("vl"));
    }
    if words
        .first()
        .is_some_and(|w| SEEING_FIRST_WORDS.contains(w))
    {
        return true;
    }
    SEEING_PREFIXES.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEEING: &[&str] = &[
        "gpt-4o",
        "gpt-4o-mini",
        "gpt-4o-2024-08-06",
        "chatgpt-4o-latest",
        "gpt-4.1",
        "gpt-4.1-nano",
        "gpt-4.5-preview",
        "gpt-4-turbo",
        "gpt-4-turbo-2024-04-09",
        "gpt-4-vision-preview",
        "gpt-5",
        "gpt-5-mini",
        "o1",
        "o1-2024-12-17",
        "o3",
        "o3-pro",
        "o4-mini",
        "claude-3-opus-20240229",
        "claude-3-5-sonnet-latest",
        "claude-3-7-sonnet-20250219",
        "claude-sonnet-4-20250514",
        "claude-opus-4-1",
        "claude-haiku-4-5",
        "gemini-1.5-pro",
        "gemini-2.5-flash",
        "gemini-pro-vision",
        "google/gemini-2.0-flash-001",
        "llama3.2-vision",
        "llama3.2-vision:11b",
        "meta-llama/Llama-3.2-11B-Vision-Instruct",
        "openrouter/meta-llama/llama-4-scout",
        "llama4:maverick",
        "llava",
        "llava:13b",
        "llava-llama3",
        "bakllava",
        "qwen-vl-max",
        "Qwen/Qwen2.5-VL-7B-Instruct",
        "qwen2.5vl:7b",
        "qwen2-vl-72b",
        "pixtral-12b-2409",
        "mistral-small-3.1-24b-instruct",
        "mistral-small3.1:24b",
        "mistral-small-2503",
        "mistral-small-latest",
        "gemma3",
        "gemma3:4b",
        "google/gemma-3-27b-it",
        "minicpm-v",
        "minicpm-v:8b",
        "moondream",
        "OpenGVLab/InternVL3-8B",
        "granite3.2-vision",
        "GPT-4O",
    ];

    const BLIND: &[&str] = &[
        "gpt-3.5-turbo",
        "gpt-4",
        "gpt-4-0613",
        "gpt-4-turbo-preview",
        "gpt-4o-audio-preview",
        "gpt-oss-20b",
        "o1-mini",
        "o1-preview",
        "o3-mini",
        "o3-mini-high",
        "claude-2.1",
        "claude-instant-1.2",
        "gemini-pro",
        "gemini-1.0-pro",
        "gemma3:1b",
        "google/gemma-3-1b-it",
        "gemma2:9b",
        "gemma-3n-e4b-it",
        "llama3.2",
        "llama3.2:3b",
        "llama-3.1-70b-instruct",
        "qwen2.5:7b",
        "qwen3-coder",
        "Qwen/Qwen2.5-72B-Instruct",
        "mistral-small-24b-instruct-2501",
        "mistral-small:22b",
        "mistral-large-2411",
        "deepseek-r1",
        "deepseek-chat",
        "phi3",
        "omni-helper",
        "oss-mini",
        "mock-model",
        "",
    ];

    #[test]
    fn auto_sees_the_families_that_take_images() {
        for m in SEEING {
            assert!(sees_images(VisionMode::Auto, m), "{m} should see images");
        }
    }

    #[test]
    fn auto_leaves_text_models_blind() {
        for m in BLIND {
            assert!(!sees_images(VisionMode::Auto, m), "{m} should not");
        }
    }

    #[test]
    fn on_and_off_decide_whatever_the_name() {
        assert!(sees_images(VisionMode::On, "gpt-3.5-turbo"));
        assert!(sees_images(VisionMode::On, "my-finetune"));
        assert!(!sees_images(VisionMode::Off, "gpt-4o"));
        assert!(!sees_images(VisionMode::Off, "claude-sonnet-4"));
    }
}
