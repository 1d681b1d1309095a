//! A field's place in the object a write carries, for the messages that name it.

use std::fmt::Write as _;

/// Where a value sits in the object being written, rendered only when a message needs it: every write
/// prunes and validates every field, and formatting each field's path was about a tenth of a patch.
#[derive(Clone, Copy)]
pub(super) enum Path<'a> {
    Root,
    Field(&'a Path<'a>, &'a str),
    Item(&'a Path<'a>, usize),
}

impl Path<'_> {
    pub(super) fn field<'b>(&'b self, key: &'b str) -> Path<'b> {
        Path::Field(self, key)
    }

    pub(super) fn item(&self, i: usize) -> Path<'_> {
        Path::Item(self, i)
    }

    /// `spec.items[0].name`; empty at the root.
    pub(super) fn render(&self) -> String {
        let mut out = String::new();
        self.write_to(&mut out);
        out
    }

    /// As the real validator names a field in its messages: `body` at the root.
    pub(super) fn shown(&self) -> String {
        match self {
            Path::Root => "body".to_string(),
            _ => self.render(),
        }
    }

    fn write_to(&self, out: &mut String) {
        match self {
            Path::Root => {}
            Path::Field(parent, key) => {
                parent.write_to(out);
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Path::Item(parent, i) => {
                parent.write_to(out);
                // Writing to a String cannot fail.
                let _ = write!(out, "[{i}]");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_as_the_api_server_names_fields() {
        let root = Path::Root;
        assert_eq!(root.render(), "");
        assert_eq!(root.shown(), "body");
        assert_eq!(root.item(0).render(), "[0]");
        let spec = root.field("spec");
        let item = spec.field("list");
        let second = item.item(1);
        assert_eq!(second.field("type").render(), "spec.list[1].type");
        assert_eq!(second.field("type").shown(), "spec.list[1].type");
        assert_eq!(
            spec.field("metadata").field("x").render(),
            "spec.metadata.x"
        );
    }
}
