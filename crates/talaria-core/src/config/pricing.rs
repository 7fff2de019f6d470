//! `prices:` and `budget:`: what model calls cost, and how much may be spent.

use super::*;

/// One model's prices in US dollars per million tokens (`prices.<model>`).
/// A cache price left out is the input price: a provider that reports no
/// cache fields bills those tokens as ordinary input.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelPrice {
    /// Prompt tokens processed afresh.
    pub input: f64,
    /// Tokens generated (reasoning included).
    pub output: f64,
    /// Prompt tokens served from the provider's cache.
    pub cache_read: Option<f64>,
    /// Prompt tokens written to the provider's cache.
    pub cache_write: Option<f64>,
}

impl ModelPrice {
    /// The first price that makes no sense, as (field, what is expected).
    fn problem(&self) -> Option<&'static str> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !ok(self.input) {
            return Some("input");
        }
        if !ok(self.output) {
            return Some("output");
        }
        if self.cache_read.is_some_and(|v| !ok(v)) {
            return Some("cache_read");
        }
        if self.cache_write.is_some_and(|v| !ok(v)) {
            return Some("cache_write");
        }
        None
    }
}

/// Spending limits in US dollars; a limit left out is no limit. Days and
/// months are counted in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SpendLimits {
    /// Most spent from 00:00 UTC today.
    pub daily_usd: Option<f64>,
    /// Most spent from the first of this month, 00:00 UTC.
    pub monthly_usd: Option<f64>,
}

/// `budget:`: the home's limits (every conversation together) and, under
/// `chats:`, one chat's own.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetConfig {
    /// Most spent by everything in a UTC day.
    pub daily_usd: Option<f64>,
    /// Most spent by everything in a UTC month.
    pub monthly_usd: Option<f64>,
    /// One chat's limits, keyed by its session key
    /// (`agent:main:telegram:dm:42`) or by `platform:chat_id`
    /// (`telegram:42`).
    pub chats: BTreeMap<String, SpendLimits>,
}

impl BudgetConfig {
    /// The home's own limits.
    pub fn home(&self) -> SpendLimits {
        SpendLimits {
            daily_usd: self.daily_usd,
            monthly_usd: self.monthly_usd,
        }
    }

    /// The limits for a chat named by `session_key` or by
    /// `platform:chat_id`; the session key wins when both are listed.
    pub fn chat(
        &self,
        session_key: Option<&str>,
        platform: &str,
        chat_id: Option<&str>,
    ) -> Option<(&str, SpendLimits)> {
        if let Some(key) = session_key
            && let Some((k, limits)) = self.chats.get_key_value(key)
        {
            return Some((k.as_str(), *limits));
        }
        let chat_id = chat_id?;
        let name = format!("{platform}:{chat_id}");
        self.chats
            .get_key_value(&name)
            .map(|(k, limits)| (k.as_str(), *limits))
    }

    /// Whether any limit is set at all (no lookups are needed otherwise).
    pub fn is_set(&self) -> bool {
        self.daily_usd.is_some() || self.monthly_usd.is_some() || !self.chats.is_empty()
    }

    /// The first value that makes no sense, as (key, what is expected).
    pub(crate) fn problem(&self) -> Option<(String, &'static str)> {
        const EXPECTED: &str = "expected an amount of US dollars, 0 or more";
        let bad = |v: Option<f64>| v.is_some_and(|v| !v.is_finite() || v < 0.0);
        if bad(self.daily_usd) {
            return Some(("budget.daily_usd".into(), EXPECTED));
        }
        if bad(self.monthly_usd) {
            return Some(("budget.monthly_usd".into(), EXPECTED));
        }
        for (name, limits) in &self.chats {
            if bad(limits.daily_usd) {
                return Some((format!("budget.chats.{name}.daily_usd"), EXPECTED));
            }
            if bad(limits.monthly_usd) {
                return Some((format!("budget.chats.{name}.monthly_usd"), EXPECTED));
            }
        }
        None
    }
}

/// The first price in `prices:` that makes no sense, as (key, expected).
pub(crate) fn prices_problem(
    prices: &BTreeMap<String, ModelPrice>,
) -> Option<(String, &'static str)> {
    prices.iter().find_map(|(model, price)| {
        price.problem().map(|field| {
            (
                format!("prices.{model}.{field}"),
                "expected US dollars per million tokens, 0 or more",
            )
        })
    })
}

#[cfg(test)]
mod pricing_tests {
    use super::*;

    #[test]
    fn chat_limits_are_found_by_session_key_then_platform_and_chat() {
        let mut budget = BudgetConfig::default();
        let limits = SpendLimits {
            daily_usd: Some(1.0),
            monthly_usd: None,
        };
        budget.chats.insert("telegram:42".into(), limits);
        assert_eq!(
            budget.chat(Some("agent:main:telegram:dm:42"), "telegram", Some("42")),
            Some(("telegram:42", limits))
        );
        assert_eq!(budget.chat(None, "telegram", Some("43")), None);
        let by_key = SpendLimits {
            daily_usd: Some(2.0),
            monthly_usd: None,
        };
        budget
            .chats
            .insert("agent:main:telegram:dm:42".into(), by_key);
        assert_eq!(
            budget.chat(Some("agent:main:telegram:dm:42"), "telegram", Some("42")),
            Some(("agent:main:telegram:dm:42", by_key))
        );
    }

    #[test]
    fn negative_or_infinite_amounts_are_refused() {
        let mut budget = BudgetConfig {
            daily_usd: Some(-1.0),
            ..BudgetConfig::default()
        };
        assert_eq!(
            budget.problem().map(|p| p.0),
            Some("budget.daily_usd".into())
        );
        budget.daily_usd = Some(5.0);
        budget.chats.insert(
            "telegram:1".into(),
            SpendLimits {
                daily_usd: None,
                monthly_usd: Some(f64::INFINITY),
            },
        );
        assert_eq!(
            budget.problem().map(|p| p.0),
            Some("budget.chats.telegram:1.monthly_usd".into())
        );
        let mut prices = BTreeMap::new();
        prices.insert(
            "m".to_owned(),
            ModelPrice {
                input: 1.0,
                output: -2.0,
                ..ModelPrice::default()
            },
        );
        assert_eq!(
            prices_problem(&prices).map(|p| p.0),
            Some("prices.m.output".into())
        );
    }
}
