//! Field paths and sets of them, as structured-merge-diff (the real server's server-side apply
//! library) names an object's fields: `.spec.replicas`, a list item by its keys
//! (`.spec.ports[name="http",protocol="TCP"]`), by its value (`.metadata.finalizers[="x"]`) or by its
//! index; and their `FieldsV1` form in `metadata.managedFields` (`f:`, `k:`, `v:`, `i:`, `.`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

/// One step of a path. The order (fields, then keys, then values, then indices) is the library's,
/// which decides the order conflicts are reported in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Pe {
    /// A field of an object (a struct field or a map key).
    Field(String),
    /// A list item by its key fields: `(name, value as compact JSON)`, sorted by name.
    Key(Vec<(String, String)>),
    /// A set item by its value (compact JSON).
    Value(String),
    /// A list item by its index (lists whose items have no identity).
    Index(usize),
}

impl Pe {
    /// As the library prints it in conflicts.
    fn render(&self, out: &mut String) {
        match self {
            Pe::Field(name) => {
                out.push('.');
                out.push_str(name);
            }
            Pe::Key(keys) => {
                out.push('[');
                for (i, (k, v)) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(k);
                    out.push('=');
                    out.push_str(&shown(v));
                }
                out.push(']');
            }
            Pe::Value(v) => {
                out.push_str("[=");
                out.push_str(&shown(v));
                out.push(']');
            }
            Pe::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }

    /// The `FieldsV1` key.
    fn fields_v1_key(&self) -> String {
        match self {
            Pe::Field(name) => format!("f:{name}"),
            Pe::Key(keys) => {
                let obj: Map<String, Value> = keys
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::from_str(v).unwrap_or(Value::Null)))
                    .collect();
                format!("k:{}", Value::Object(obj))
            }
            Pe::Value(v) => format!("v:{v}"),
            Pe::Index(i) => format!("i:{i}"),
        }
    }

    fn from_fields_v1_key(key: &str) -> Option<Pe> {
        let (kind, rest) = key.split_at_checked(2)?;
        match kind {
            "f:" => Some(Pe::Field(rest.to_string())),
            "v:" => {
                let v: Value = serde_json::from_str(rest).ok()?;
                Some(Pe::Value(v.to_string()))
            }
            "i:" => rest.parse().ok().map(Pe::Index),
            "k:" => {
                let Value::Object(m) = serde_json::from_str::<Value>(rest).ok()? else {
                    return None;
                };
                let mut keys: Vec<(String, String)> =
                    m.into_iter().map(|(k, v)| (k, v.to_string())).collect();
                keys.sort();
                Some(Pe::Key(keys))
            }
            _ => None,
        }
    }
}

/// A value as the library's `value.ToString` prints it (strings quoted, the rest as JSON).
fn shown(json: &str) -> String {
    json.to_string()
}

/// A path from the object's root.
pub(crate) type Path = Vec<Pe>;

/// `.spec.ports[name="http"].port`.
pub(crate) fn render(path: &[Pe]) -> String {
    let mut out = String::new();
    for pe in path {
        pe.render(&mut out);
    }
    out
}

/// A set of paths, as a trie: the paths that end here (`members`) and those that go on (`children`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Set {
    members: BTreeSet<Pe>,
    children: BTreeMap<Pe, Set>,
}

impl Set {
    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.values().all(Set::is_empty)
    }

    pub(crate) fn insert(&mut self, path: &[Pe]) {
        match path {
            [] => {}
            [last] => {
                self.members.insert(last.clone());
            }
            [first, rest @ ..] => self.children.entry(first.clone()).or_default().insert(rest),
        }
    }

    pub(crate) fn has(&self, path: &[Pe]) -> bool {
        match path {
            [] => false,
            [last] => self.members.contains(last),
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.has(rest)),
        }
    }

    /// Drops `pe` as a member and everything below it.
    pub(crate) fn remove_subtree(&mut self, pe: &Pe) {
        self.members.remove(pe);
        self.children.remove(pe);
    }

    /// Drops `pe` as a member (what is below it stays).
    pub(crate) fn remove_member(&mut self, pe: &Pe) {
        self.members.remove(pe);
    }

    /// Keeps only `pe` (as a member, and what is below it).
    pub(crate) fn retain_only(&mut self, pe: &Pe) {
        self.members.retain(|m| m == pe);
        self.children.retain(|c, _| c == pe);
    }

    /// The set below `pe` (empty if none).
    pub(crate) fn child(&self, pe: &Pe) -> Option<&Set> {
        self.children.get(pe)
    }

    pub(crate) fn union(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.union_in_place(other);
        out
    }

    pub(crate) fn union_in_place(&mut self, other: &Set) {
        self.members.extend(other.members.iter().cloned());
        for (pe, c) in &other.children {
            self.children
                .entry(pe.clone())
                .or_default()
                .union_in_place(c);
        }
    }

    pub(crate) fn difference(&self, other: &Set) -> Set {
        let members = self
            .members
            .iter()
            .filter(|m| !other.members.contains(*m))
            .cloned()
            .collect();
        let children = self
            .children
            .iter()
            .map(|(pe, c)| match other.children.get(pe) {
                Some(o) => (pe.clone(), c.difference(o)),
                None => (pe.clone(), c.clone()),
            })
            .filter(|(_, c)| !c.is_empty())
            .collect();
        Set { members, children }
    }

    pub(crate) fn intersection(&self, other: &Set) -> Set {
        let members = self
            .members
            .iter()
            .filter(|m| other.members.contains(*m))
            .cloned()
            .collect();
        let children = self
            .children
            .iter()
            .filter_map(|(pe, c)| {
                other
                    .children
                    .get(pe)
                    .map(|o| (pe.clone(), c.intersection(o)))
            })
            .filter(|(_, c)| !c.is_empty())
            .collect();
        Set { members, children }
    }

    /// The set with every field that has something below it a member too (the library's
    /// `EnsureNamedFieldsAreMembers`): removing a field that a manager no longer applies then removes
    /// the object it was in as well, rather than leaving it empty.
    pub(crate) fn with_fields_as_members(&self) -> Set {
        let mut out = Set {
            members: self.members.clone(),
            children: BTreeMap::new(),
        };
        for (pe, c) in &self.children {
            if matches!(pe, Pe::Field(_)) {
                out.members.insert(pe.clone());
            }
            out.children.insert(pe.clone(), c.with_fields_as_members());
        }
        out
    }

    /// Every member path, members before children at each level, in the library's order.
    pub(crate) fn paths(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Path, out: &mut Vec<Path>) {
        for m in &self.members {
            let mut p = prefix.clone();
            p.push(m.clone());
            out.push(p);
        }
        for (pe, c) in &self.children {
            prefix.push(pe.clone());
            c.collect(prefix, out);
            prefix.pop();
        }
    }

    /// The `fieldsV1` document.
    pub(crate) fn to_fields_v1(&self) -> Value {
        let mut out = Map::new();
        let keys: BTreeSet<&Pe> = self.members.iter().chain(self.children.keys()).collect();
        for pe in keys {
            let mut node = match self.children.get(pe) {
                Some(c) => match c.to_fields_v1() {
                    Value::Object(m) => m,
                    _ => Map::new(),
                },
                None => Map::new(),
            };
            if self.members.contains(pe) && !node.is_empty() {
                node.insert(".".into(), Value::Object(Map::new()));
            }
            out.insert(pe.fields_v1_key(), Value::Object(node));
        }
        Value::Object(out)
    }

    /// Reads a `fieldsV1` document; `None` when it is not one.
    pub(crate) fn from_fields_v1(v: &Value) -> Option<Set> {
        let m = v.as_object()?;
        let mut out = Set::default();
        for (k, child) in m {
            if k == "." {
                continue;
            }
            let pe = Pe::from_fields_v1_key(k)?;
            let cm = child.as_object()?;
            let has_children = cm.keys().any(|c| c != ".");
            if !has_children || cm.contains_key(".") {
                out.members.insert(pe.clone());
            }
            if has_children {
                out.children.insert(pe, Set::from_fields_v1(child)?);
            }
        }
        Some(out)
    }
}

/// Whether a `fieldsV1` document has `path` as a member (read in place: no set is built).
pub(crate) fn fields_v1_has(doc: &Value, path: &[Pe]) -> bool {
    let mut cur = doc;
    for (i, pe) in path.iter().enumerate() {
        let Some(next) = cur.get(pe.fields_v1_key()) else {
            return false;
        };
        if i + 1 == path.len() {
            // A member is a leaf, or has the `.` marker.
            return next
                .as_object()
                .is_none_or(|m| m.is_empty() || m.contains_key("."));
        }
        cur = next;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(name: &str) -> Pe {
        Pe::Field(name.into())
    }

    #[test]
    fn fields_v1_round_trips_with_members_that_have_children() {
        let doc = json!({"f:spec": {".": {}, "f:ports": {"k:{\"name\":\"http\",\"protocol\":\"TCP\"}":
            {".": {}, "f:port": {}}}, "f:tags": {"v:\"x\"": {}}, "f:size": {}}});
        let set = Set::from_fields_v1(&doc).unwrap();
        assert!(set.has(&[f("spec")]));
        assert!(set.has(&[f("spec"), f("size")]));
        let key = Pe::Key(vec![
            ("name".into(), "\"http\"".into()),
            ("protocol".into(), "\"TCP\"".into()),
        ]);
        assert!(set.has(&[f("spec"), f("ports"), key.clone(), f("port")]));
        assert_eq!(set.to_fields_v1(), doc);
        assert_eq!(
            render(&[f("spec"), f("ports"), key, f("port")]),
            ".spec.ports[name=\"http\",protocol=\"TCP\"].port"
        );
        assert_eq!(
            render(&[f("metadata"), f("finalizers"), Pe::Value("\"a\"".into())]),
            ".metadata.finalizers[=\"a\"]"
        );
    }

    #[test]
    fn set_algebra() {
        let mut a = Set::default();
        a.insert(&[f("spec"), f("a")]);
        a.insert(&[f("spec"), f("b")]);
        let mut b = Set::default();
        b.insert(&[f("spec"), f("b")]);
        b.insert(&[f("status")]);
        assert_eq!(a.intersection(&b).paths(), vec![vec![f("spec"), f("b")]]);
        assert_eq!(a.difference(&b).paths(), vec![vec![f("spec"), f("a")]]);
        let mut without = a.clone();
        without.remove_subtree(&f("spec"));
        assert!(without.is_empty());
        assert!(a.with_fields_as_members().has(&[f("spec")]));
        assert_eq!(a.union(&b).paths().len(), 3);
    }
}
