//! What a model call costs: the built-in price table (`prices.txt`, in the
//! crate) under the `prices:` overrides of `config.yaml`.
//!
//! Costs are counted in micro-dollars (millionths of a US dollar) as whole
//! numbers, so sums over many calls are exact: a price in dollars per
//! million tokens is, conveniently, micro-dollars per token.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use talaria_core::Usage;
use talaria_core::config::ModelPrice;

/// The built-in table, as shipped in the repository.
const TABLE: &str = include_str!("../prices.txt");

/// Providers that run on the user's own machine: the built-in table's
/// cloud prices never apply to them (an override still does).
const LOCAL_PROVIDERS: &[&str] = &[
    "ollama",
    "lmstudio",
    "llamacpp",
    "llama.cpp",
    "vllm",
    "local",
];

/// One model's prices in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// Prompt tokens processed afresh.
    pub input: f64,
    /// Tokens generated (reasoning included).
    pub output: f64,
    /// Prompt tokens read from the provider's cache.
    pub cache_read: f64,
    /// Prompt tokens written to the provider's cache.
    pub cache_write: f64,
}

impl Price {
    /// The price a config override describes (cache prices left out are
    /// the input price).
    pub fn from_config(p: &ModelPrice) -> Price {
        Price {
            input: p.input,
            output: p.output,
            cache_read: p.cache_read.unwrap_or(p.input),
            cache_write: p.cache_write.unwrap_or(p.input),
        }
    }

    /// What `usage` costs at this price, in micro-dollars, rounded to the
    /// nearest one.
    pub fn cost_micros(&self, usage: &Usage) -> u64 {
        // Tokens times dollars per million tokens is micro-dollars.
        let micros = usage.input_tokens as f64 * self.input
            + usage.output_tokens as f64 * self.output
            + usage.cache_read_tokens as f64 * self.cache_read
            + usage.cache_write_tokens as f64 * self.cache_write;
        if micros.is_finite() && micros > 0.0 {
            // `as` saturates at u64::MAX for absurd figures.
            micros.round() as u64
        } else {
            0
        }
    }
}

/// Reads the table's text: `(model, price)` rows, or the first bad line.
fn parse(text: &str) -> Result<Vec<(String, Price)>, String> {
    let mut rows = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [model, input, output, read, write] = fields[..] else {
            return Err(format!("line {}: expected five fields", n + 1));
        };
        let number = |s: &str| -> Result<f64, String> {
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("line {}: `{s}` is not a price", n + 1))
        };
        let input = number(input)?;
        let cache = |s: &str| if s == "-" { Ok(input) } else { number(s) };
        rows.push((
            model.to_ascii_lowercase(),
            Price {
                input,
                output: number(output)?,
                cache_read: cache(read)?,
                cache_write: cache(write)?,
            },
        ));
    }
    Ok(rows)
}

/// The built-in rows, read once.
fn builtin() -> &'static [(String, Price)] {
    static ROWS: OnceLock<Vec<(String, Price)>> = OnceLock::new();
    ROWS.get_or_init(|| {
        parse(TABLE).unwrap_or_else(|e| {
            // A unit test reads the whole table, so this is never shipped.
            tracing::error!("the built-in price table is damaged ({e}); calls are priced at 0");
            Vec::new()
        })
    })
}

/// Whether `name` is `known` or starts with it followed by a separator
/// (so `gpt-4o` does not take `gpt-4o-mini`'s calls, nor `gpt-4` `gpt-4.1`'s).
fn prefix_len(name: &str, known: &str) -> Option<usize> {
    let rest = name.strip_prefix(known)?;
    match rest.chars().next() {
        None => Some(known.len()),
        Some('-' | ':' | '@' | '_') => Some(known.len()),
        Some(_) => None,
    }
}

/// The row for `name` among `rows`, read in order: an exact name first,
/// else the longest prefix (the earlier row on a tie, so overrides, listed
/// first, win).
fn find<'a, I>(rows: I, name: &str) -> Option<Price>
where
    I: IntoIterator<Item = (&'a str, Price)>,
{
    let mut best: Option<(usize, Price)> = None;
    for (known, price) in rows {
        if known == name {
            return Some(price);
        }
        if let Some(len) = prefix_len(name, known)
            && best.is_none_or(|(l, _)| len > l)
        {
            best = Some((len, price));
        }
    }
    best.map(|(_, p)| p)
}

/// The price of `model` served by `provider`: a `prices:` override
/// first, then the built-in table (not for local providers), each by
/// exact name, then longest prefix, then without a `vendor/` part.
/// `None` for a model nobody priced: its calls cost 0.
pub fn price(
    overrides: &BTreeMap<String, ModelPrice>,
    provider: &str,
    model: &str,
) -> Option<Price> {
    let name = model.trim().to_ascii_lowercase();
    let bare = name.split_once('/').map(|(_, rest)| rest.to_owned());
    // Overrides are written as people like; compared in lower case, as
    // the table is.
    let own: Vec<(String, Price)> = overrides
        .iter()
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), Price::from_config(v)))
        .collect();
    let local = LOCAL_PROVIDERS.contains(&provider.to_ascii_lowercase().as_str());
    // An exact override, then an exact row of the table, then the longest
    // prefix of either: `gpt-4o` overridden does not reprice `gpt-4o-mini`,
    // which the table names.
    let table: &[(String, Price)] = if local { &[] } else { builtin() };
    let rows = || {
        own.iter()
            .chain(table.iter())
            .map(|(k, p)| (k.as_str(), *p))
    };
    let lookup = |name: &str| -> Option<Price> {
        rows()
            .find(|(k, _)| *k == name)
            .map(|(_, p)| p)
            .or_else(|| find(rows(), name))
    };
    lookup(&name).or_else(|| bare.as_deref().and_then(lookup))
}

/// What one call's `usage` cost, in micro-dollars (0 for a model with no
/// known price).
pub fn cost_micros(
    overrides: &BTreeMap<String, ModelPrice>,
    provider: &str,
    model: &str,
    usage: &Usage,
) -> u64 {
    price(overrides, provider, model).map_or(0, |p| p.cost_micros(usage))
}

/// Micro-dollars as dollars, for showing.
pub fn micros_to_usd(micros: u64) -> f64 {
    micros as f64 / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, output: u64, read: u64, write: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: read,
            cache_write_tokens: write,
            reasoning_tokens: 0,
        }
    }

    #[test]
    fn the_whole_built_in_table_reads() {
        let rows = parse(TABLE).expect("prices.txt parses");
        assert!(rows.len() > 60, "{} rows", rows.len());
        for vendor in [
            "gpt-4o",
            "claude-sonnet-4-5",
            "gemini-2.5-pro",
            "deepseek-chat",
            "llama-3.3-70b-versatile",
            "mistral-large-latest",
            "grok-4",
            "openai/gpt-4o",
        ] {
            assert!(rows.iter().any(|(m, _)| m == vendor), "{vendor} missing");
        }
        let mut names: Vec<&str> = rows.iter().map(|(m, _)| m.as_str()).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a model is listed twice");
    }

    #[test]
    fn bad_lines_are_named() {
        assert_eq!(
            parse("m 1 2 3").unwrap_err(),
            "line 1: expected five fields"
        );
        assert_eq!(
            parse("# c\nm 1 x - -").unwrap_err(),
            "line 2: `x` is not a price"
        );
        assert_eq!(
            parse("m 1 -2 - -").unwrap_err(),
            "line 1: `-2` is not a price"
        );
    }

    #[test]
    fn a_dated_snapshot_finds_its_model_by_the_longest_prefix() {
        let none = BTreeMap::new();
        let p = price(&none, "anthropic", "claude-sonnet-4-5-20250929").expect("priced");
        assert_eq!(
            (p.input, p.output, p.cache_read, p.cache_write),
            (3.0, 15.0, 0.3, 3.75)
        );
        // gpt-4o-mini's snapshot is not priced as gpt-4o.
        let mini = price(&none, "openai", "gpt-4o-mini-2024-07-18").expect("priced");
        assert_eq!(mini.input, 0.15);
        // Nor gpt-4.1 as gpt-4.
        assert_eq!(
            price(&none, "openai", "gpt-4.1").map(|p| p.input),
            Some(2.0)
        );
        assert_eq!(price(&none, "openai", "GPT-4o").map(|p| p.input), Some(2.5));
    }

    #[test]
    fn costs_in_micro_dollars_with_figures() {
        let none = BTreeMap::new();
        // claude-sonnet-4-5: 1000 in x $3 + 500 out x $15 + 2000 read x $0.30
        // + 100 written x $3.75 = 3000 + 7500 + 600 + 375 micro-dollars.
        let micros = cost_micros(
            &none,
            "anthropic",
            "claude-sonnet-4-5",
            &usage(1000, 500, 2000, 100),
        );
        assert_eq!(micros, 11_475);
        assert!((micros_to_usd(micros) - 0.011_475).abs() < 1e-12);
        // gpt-4o-mini: 10,000 in x $0.15 + 1,000 out x $0.60 = 1500 + 600.
        assert_eq!(
            cost_micros(&none, "openai", "gpt-4o-mini", &usage(10_000, 1_000, 0, 0)),
            2_100
        );
        // A cache price of `-` is the input price (gpt-4-turbo: $10).
        assert_eq!(
            cost_micros(&none, "openai", "gpt-4-turbo", &usage(0, 0, 100, 0)),
            1_000
        );
    }

    #[test]
    fn openrouter_names_and_vendor_prefixes() {
        let none = BTreeMap::new();
        assert_eq!(
            price(&none, "openrouter", "anthropic/claude-sonnet-4.5").map(|p| p.output),
            Some(15.0)
        );
        // Not listed with its vendor: found without it.
        assert_eq!(
            price(&none, "openrouter", "openai/o4-mini").map(|p| p.input),
            Some(1.1)
        );
    }

    #[test]
    fn local_and_unknown_models_cost_nothing_unless_overridden() {
        let mut overrides = BTreeMap::new();
        assert_eq!(
            cost_micros(
                &overrides,
                "custom",
                "llama3.1:8b",
                &usage(1_000_000, 1_000_000, 0, 0)
            ),
            0
        );
        assert_eq!(
            cost_micros(
                &overrides,
                "ollama",
                "gpt-oss-20b",
                &usage(1_000_000, 0, 0, 0)
            ),
            0
        );
        overrides.insert(
            "llama3.1".to_owned(),
            ModelPrice {
                input: 0.5,
                output: 1.0,
                cache_read: None,
                cache_write: Some(2.0),
            },
        );
        // 1000 x 0.5 + 1000 x 1.0 + 1000 x 0.5 (read = input) + 1000 x 2.0.
        assert_eq!(
            cost_micros(
                &overrides,
                "ollama",
                "llama3.1:8b",
                &usage(1000, 1000, 1000, 1000)
            ),
            4_000
        );
        // An override beats the table.
        overrides.insert(
            "gpt-4o".to_owned(),
            ModelPrice {
                input: 1.0,
                output: 1.0,
                ..ModelPrice::default()
            },
        );
        assert_eq!(
            cost_micros(
                &overrides,
                "openai",
                "gpt-4o-2024-08-06",
                &usage(1000, 0, 0, 0)
            ),
            1_000
        );
        // But not a model the table names exactly: gpt-4o-mini keeps $0.15.
        assert_eq!(
            cost_micros(&overrides, "openai", "gpt-4o-mini", &usage(1000, 0, 0, 0)),
            150
        );
        // Written in capitals, an override still applies.
        overrides.insert(
            "House-Model".to_owned(),
            ModelPrice {
                input: 3.0,
                ..ModelPrice::default()
            },
        );
        assert_eq!(
            cost_micros(&overrides, "custom", "house-model", &usage(1000, 0, 0, 0)),
            3_000
        );
    }
}
