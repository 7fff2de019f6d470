//! SQL that both backends build for a copy from the table descriptions:
//! quoted column lists and the upsert that makes writing a page again
//! change nothing.

use super::tables::{Column, Table, Value};
use crate::StoreError;

/// `"name"`: every identifier the copy writes into SQL is quoted, so a
/// column called `timestamp` or `trigger` reads the same in both dialects.
pub(crate) fn quoted(name: &str) -> String {
    format!("\"{name}\"")
}

/// The table's columns, quoted and comma-separated.
pub(crate) fn column_list(table: Table) -> String {
    table
        .columns()
        .iter()
        .map(|c| quoted(c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `SET c = excluded.c, ...` for the columns outside the key, and the
/// condition that some of them changed (`IS DISTINCT FROM` in PostgreSQL,
/// `IS NOT` in SQLite, both NULL-safe), so writing a page again leaves
/// unchanged rows alone. `None` when every column is in the key.
pub(crate) fn upsert_clause(table: Table, alias: &str, differs: &str) -> Option<(String, String)> {
    let names: Vec<&str> = table.columns().iter().map(|c| c.name).collect();
    upsert_clause_of(table, &names, alias, differs)
}

/// [`upsert_clause`] over some of `table`'s columns (a backend that keeps
/// one of them elsewhere leaves it out).
pub(crate) fn upsert_clause_of(
    table: Table,
    names: &[&str],
    alias: &str,
    differs: &str,
) -> Option<(String, String)> {
    let rest: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| !table.key().contains(name))
        .collect();
    if rest.is_empty() {
        return None;
    }
    let set = rest
        .iter()
        .map(|c| format!("{q} = excluded.{q}", q = quoted(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let changed = rest
        .iter()
        .map(|c| format!("{alias}.{q} {differs} excluded.{q}", q = quoted(c)))
        .collect::<Vec<_>>()
        .join(" OR ");
    Some((set, changed))
}

/// A value of the wrong kind for its column: a bug, or a row no build of
/// Talaria wrote.
pub(crate) fn wrong_kind(table: Table, column: &Column, value: &Value) -> StoreError {
    StoreError::Database(format!(
        "cannot copy {table}.{}: expected {:?}, found {value:?}",
        column.name, column.kind
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upserts_touch_only_changed_rows_outside_the_key() {
        let (set, changed) = upsert_clause(Table::InboundSeen, "t", "IS NOT").unwrap();
        assert_eq!(set, "\"seen_at\" = excluded.\"seen_at\"");
        assert_eq!(changed, "t.\"seen_at\" IS NOT excluded.\"seen_at\"");
    }
}
