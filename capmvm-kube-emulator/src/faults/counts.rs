//! Counts of the faults injected, by kind, verb and resource.

use std::collections::BTreeMap;
use std::fmt;

use super::FaultKind;
use crate::counters::Verb;

/// Faults injected at one moment, keyed by kind, verb and resource (`group/resource[/subresource]`,
/// the core group spelled `core`, as the request counters name them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub(crate) counts: BTreeMap<(FaultKind, Verb, String), u64>,
}

impl FaultCounts {
    /// Faults of one kind on one verb and resource.
    pub fn get(&self, kind: FaultKind, verb: Verb, resource: &str) -> u64 {
        self.counts
            .get(&(kind, verb, resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Faults of one kind, on any verb and resource.
    pub fn kind_total(&self, kind: FaultKind) -> u64 {
        self.counts
            .iter()
            .filter(|((k, _, _), _)| *k == kind)
            .map(|(_, n)| n)
            .sum()
    }

    /// All faults injected.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Every (kind, verb, resource, count), ordered by kind, verb, resource.
    pub fn iter(&self) -> impl Iterator<Item = (FaultKind, Verb, &str, u64)> {
        self.counts
            .iter()
            .map(|((k, v, r), n)| (*k, *v, r.as_str(), *n))
    }
}

/// A table for reports: one row per kind, verb and resource, then the total.
impl fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .counts
            .keys()
            .map(|(_, _, r)| r.len())
            .max()
            .unwrap_or(0)
            .max("RESOURCE".len());
        writeln!(
            f,
            "{:<22} {:<16} {:<width$} {:>9}",
            "FAULT", "VERB", "RESOURCE", "INJECTED"
        )?;
        for ((k, v, r), n) in &self.counts {
            let kind = match k.http_code() {
                Some(code) => format!("{k} ({code})"),
                None => k.to_string(),
            };
            writeln!(f, "{kind:<22} {v:<16} {r:<width$} {n:>9}")?;
        }
        writeln!(
            f,
            "{:<22} {:<16} {:<width$} {:>9}",
            "total",
            "",
            "",
            self.total()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_lists_each_count_and_the_total() {
        let mut c = FaultCounts::default();
        c.counts.insert(
            (FaultKind::InternalError, Verb::List, "core/secrets".into()),
            3,
        );
        c.counts
            .insert((FaultKind::CutWatch, Verb::Watch, "core/secrets".into()), 2);
        assert_eq!(c.kind_total(FaultKind::InternalError), 3);
        assert_eq!(c.total(), 5);
        let table = c.to_string();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[0].starts_with("FAULT"), "{table}");
        assert!(
            lines[1].starts_with("internal-error (500)") && lines[1].ends_with(" 3"),
            "{table}"
        );
        // Columns line up: each resource starts where its header does.
        let column = lines[0].find("RESOURCE").unwrap();
        assert_eq!(lines[1].find("core/secrets"), Some(column), "{table}");
        assert_eq!(lines[2].find("core/secrets"), Some(column), "{table}");
        assert!(
            lines[3].starts_with("total") && lines[3].ends_with(" 5"),
            "{table}"
        );
    }
}
