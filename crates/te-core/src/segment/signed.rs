//! What a segment descriptor's signature covers: its JSON in one canonical form, whatever
//! the order its publisher wrote the keys in ([`Received`]).

use serde_json::Value;

/// A received descriptor as its publisher signed it ([`SegmentDesc::received`](super::SegmentDesc::received)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// Its JSON in canonical form, `te_signature` left out.
    pub canonical: String,
    /// The name it was published under.
    pub name: String,
}

/// `value` as one string whatever the order of its objects' keys: objects with their keys
/// sorted, no spaces, strings and numbers as serde_json writes them.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

impl Received {
    /// What a descriptor's signature covers, from its JSON as received: `None` for JSON that
    /// is no object with a string `name`.
    pub fn of(value: &Value) -> Option<Received> {
        let mut unsigned = value.as_object()?.clone();
        unsigned.remove("te_signature");
        let name = unsigned.get("name")?.as_str()?.to_string();
        let mut text = String::new();
        canonical(&Value::Object(unsigned), &mut text);
        Some(Received {
            canonical: text,
            name,
        })
    }
}
