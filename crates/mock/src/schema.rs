//! JSON a schema accepts, for the mock's structured answers (OpenAI
//! `response_format` json_schema, tool arguments): the first plain string
//! field is the *slot* that carries the streamed tokens; every other value is
//! the simplest one its type and bounds allow (`const`, the first `enum`,
//! the first non-null `anyOf`/`oneOf`, `$ref` into `$defs`/`definitions`,
//! minimum numbers, `minItems` items). Pure; depth- and size-bounded.

use serde_json::{Map, Value};

/// Marks the slot while the instance is built; never in an answer.
const SLOT: &str = "\u{0}switchyard-mock-slot\u{0}";
/// Nesting followed before values become `null` (recursive schemas).
const MAX_DEPTH: usize = 12;
/// Past this depth arrays get only their `minItems`.
const LEAN_DEPTH: usize = 4;
/// Items in one array at most.
const MAX_ITEMS: u64 = 16;

/// An answer's JSON around its slot: `open` + the tokens + `close`. Without
/// a plain string anywhere, `open` is the whole value and there is no slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shape {
    pub open: String,
    pub close: String,
    pub slot: bool,
}

impl Shape {
    /// `{"<key>":"` + tokens + `"}`.
    pub(crate) fn keyed(key: &str) -> Shape {
        Shape {
            open: format!("{{{}:\"", Value::from(key)),
            close: "\"}".into(),
            slot: true,
        }
    }
}

/// The shape of an instance of `schema`.
pub(crate) fn shape(schema: &Value) -> Shape {
    let mut b = Builder {
        root: schema,
        slot_taken: false,
    };
    let text = b.value(schema, 0).to_string();
    let marker = Value::from(SLOT).to_string();
    match text.find(&marker) {
        Some(at) => Shape {
            open: text[..=at].to_string(),
            close: text[at + marker.len() - 1..].to_string(),
            slot: true,
        },
        None => Shape {
            open: text,
            close: String::new(),
            slot: false,
        },
    }
}

/// Whether `schema` describes an object with named fields (a tool whose
/// arguments the mock should shape, rather than its default `{"query"}`).
pub(crate) fn has_properties(schema: &Value) -> bool {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| !p.is_empty())
}

struct Builder<'a> {
    root: &'a Value,
    slot_taken: bool,
}

impl<'a> Builder<'a> {
    fn value(&mut self, schema: &'a Value, depth: usize) -> Value {
        if depth > MAX_DEPTH {
            return Value::Null;
        }
        let Some(s) = schema.as_object() else {
            // `true` (anything) or a malformed schema: a string will do.
            return self.string(&Map::new());
        };
        if let Some(target) = s.get("$ref").and_then(Value::as_str) {
            return match self.resolve(target) {
                Some(t) => self.value(t, depth + 1),
                None => Value::Null,
            };
        }
        if let Some(c) = s.get("const") {
            return c.clone();
        }
        if let Some(first) = s
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.first())
        {
            return first.clone();
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = s.get(key).and_then(Value::as_array) {
                let pick = alts.iter().find(|a| !is_null_type(a)).or(alts.first());
                if let Some(alt) = pick {
                    return self.value(alt, depth + 1);
                }
            }
        }
        if let Some(all) = s.get("allOf").and_then(Value::as_array) {
            return self.all_of(all, depth);
        }
        match type_of(s) {
            "object" => self.object(s, depth),
            "array" => self.array(s, depth),
            "integer" => Value::from(integer(s)),
            "number" => number(s),
            "boolean" => Value::Bool(true),
            "null" => Value::Null,
            _ => self.string(s),
        }
    }

    /// `#/$defs/X`, `#/definitions/X` or any pointer into the root schema.
    fn resolve(&self, target: &str) -> Option<&'a Value> {
        let pointer = target.strip_prefix('#')?;
        if pointer.is_empty() {
            return Some(self.root);
        }
        self.root.pointer(pointer)
    }

    /// Every alternative's fields together when they are objects.
    fn all_of(&mut self, all: &'a [Value], depth: usize) -> Value {
        let mut merged = Map::new();
        for sub in all {
            match self.value(sub, depth + 1) {
                Value::Object(o) => merged.extend(o),
                other if all.len() == 1 => return other,
                _ => {}
            }
        }
        Value::Object(merged)
    }

    fn object(&mut self, s: &'a Map<String, Value>, depth: usize) -> Value {
        let mut out = Map::new();
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                out.insert(name.clone(), self.value(sub, depth + 1));
            }
        }
        for name in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !out.contains_key(name) {
                out.insert(name.to_string(), Value::from("mock"));
            }
        }
        Value::Object(out)
    }

    fn array(&mut self, s: &'a Map<String, Value>, depth: usize) -> Value {
        let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let max = s
            .get("maxItems")
            .and_then(Value::as_u64)
            .unwrap_or(u64::MAX);
        let want = if depth >= LEAN_DEPTH { min } else { min.max(1) };
        let n = want.min(max).min(MAX_ITEMS);
        let prefix = s.get("prefixItems").and_then(Value::as_array);
        let items = s.get("items").filter(|i| i.is_object());
        let mut out = Vec::new();
        for i in 0..n {
            let sub = prefix.and_then(|p| p.get(i as usize)).or(items);
            out.push(match sub {
                Some(sub) => self.value(sub, depth + 1),
                None => Value::from("mock"),
            });
        }
        Value::Array(out)
    }

    /// The slot for the first plain string, else a value of its format.
    fn string(&mut self, s: &Map<String, Value>) -> Value {
        let plain = ["format", "pattern", "maxLength"]
            .iter()
            .all(|k| !s.contains_key(*k));
        if plain && !self.slot_taken {
            self.slot_taken = true;
            return Value::from(SLOT);
        }
        let mut text = match s.get("format").and_then(Value::as_str) {
            Some("date-time") => "2024-01-01T00:00:00Z",
            Some("date") => "2024-01-01",
            Some("time") => "00:00:00Z",
            Some("email") => "mock@example.com",
            Some("uri" | "url" | "iri") => "https://example.com/",
            Some("uuid") => "00000000-0000-4000-8000-000000000000",
            Some("ipv4") => "127.0.0.1",
            Some("ipv6") => "::1",
            Some("hostname") => "example.com",
            _ => "mock",
        }
        .to_string();
        let min = s.get("minLength").and_then(Value::as_u64).unwrap_or(0);
        while (text.len() as u64) < min.min(4096) {
            text.push('x');
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
            text.truncate(usize::try_from(max).unwrap_or(usize::MAX));
        }
        Value::from(text)
    }
}

/// The schema's type: its `type` (the first non-null of a list), else what
/// its keywords imply.
fn type_of(s: &Map<String, Value>) -> &str {
    match s.get("type") {
        Some(Value::String(t)) => t,
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null"),
        _ if s.contains_key("properties") => "object",
        _ if s.contains_key("items") || s.contains_key("prefixItems") => "array",
        _ => "string",
    }
}

fn is_null_type(s: &Value) -> bool {
    s.get("type").and_then(Value::as_str) == Some("null")
}

/// The bounds `minimum`/`exclusiveMinimum` and `maximum`/`exclusiveMaximum`.
fn bounds(s: &Map<String, Value>, step: f64) -> (f64, f64) {
    let f = |k: &str| s.get(k).and_then(Value::as_f64);
    let low = f("minimum")
        .or_else(|| f("exclusiveMinimum").map(|m| m + step))
        .unwrap_or(f64::MIN);
    let high = f("maximum")
        .or_else(|| f("exclusiveMaximum").map(|m| m - step))
        .unwrap_or(f64::MAX);
    (low, high)
}

/// Zero, or the bound nearest to it, a multiple of `multipleOf`.
fn integer(s: &Map<String, Value>) -> i64 {
    let (low, high) = bounds(s, 1.0);
    let mut v = 0f64.max(low.ceil()).min(high.floor());
    if let Some(m) = s
        .get("multipleOf")
        .and_then(Value::as_f64)
        .filter(|m| *m >= 1.0)
    {
        v = (v / m).ceil() * m;
    }
    // Saturating: the bounds are a caller's numbers.
    v as i64
}

fn number(s: &Map<String, Value>) -> Value {
    let (low, high) = bounds(s, 0.5);
    let v = 0f64.max(low).min(high);
    if v.fract() == 0.0 && v.abs() < 9e15 {
        Value::from(v as i64)
    } else {
        serde_json::Number::from_f64(v).map_or(Value::from(0), Value::Number)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn filled(schema: Value) -> Value {
        let s = shape(&schema);
        serde_json::from_str(&format!("{}tok0 tok1 {}", s.open, s.close)).unwrap()
    }

    #[test]
    fn a_pydantic_schema_gets_its_fields_with_the_tokens_in_the_first_string() {
        // LangChain ChatOpenAI.with_structured_output(Person).
        let person = json!({"title": "Person", "type": "object", "additionalProperties": false,
            "properties": {"name": {"type": "string", "description": "Name"},
                           "age": {"type": "integer"},
                           "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                           "tags": {"type": "array", "items": {"type": "string"}},
                           "address": {"$ref": "#/$defs/Address"}},
            "required": ["name", "age", "nick", "tags", "address"],
            "$defs": {"Address": {"type": "object", "properties": {
                "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$", "maxLength": 5}},
                "required": ["city", "zip"]}}});
        let v = filled(person);
        assert_eq!(v["age"], 0);
        assert_eq!(
            v["address"]["city"], "tok0 tok1 ",
            "objects in key order: the first plain string"
        );
        assert_eq!(v["name"], "mock");
        assert_eq!(v["nick"], "mock");
        assert_eq!(v["tags"], json!(["mock"]));
        assert!(v["address"]["zip"].as_str().unwrap().len() <= 5);
    }

    #[test]
    fn bounds_enums_consts_and_formats_are_honoured() {
        // The AI SDK's zod `.int()` bounds, a minimum above zero, an enum.
        let v = filled(json!({"type": "object", "properties": {
            "a": {"type": "integer", "minimum": -9007199254740991i64, "maximum": 9007199254740991i64},
            "b": {"type": "integer", "minimum": 3, "multipleOf": 2},
            "c": {"type": "number", "exclusiveMinimum": 1},
            "d": {"enum": ["red", "green"]},
            "e": {"const": 7},
            "f": {"type": "string", "format": "date"},
            "g": {"type": ["boolean", "null"]},
            "h": {"type": "string"},
            "i": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "integer"}}}}));
        assert_eq!(
            v,
            json!({"a": 0, "b": 4, "c": 1.5, "d": "red", "e": 7, "f": "2024-01-01",
                   "g": true, "h": "tok0 tok1 ", "i": [0, 0]})
        );
    }

    #[test]
    fn without_a_plain_string_there_is_no_slot_and_recursion_ends() {
        let s = shape(&json!({"type": "object", "properties": {"n": {"type": "integer"}}}));
        assert_eq!(
            s,
            Shape {
                open: r#"{"n":0}"#.into(),
                close: String::new(),
                slot: false
            }
        );
        let tree = json!({"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            "required": ["children"]}}});
        let s = shape(&tree);
        assert!(!s.slot);
        let v: Value = serde_json::from_str(&s.open).unwrap();
        assert!(v["children"].is_array());
        assert!(s.open.len() < 4096, "{}", s.open);
        assert_eq!(Shape::keyed("answer").open, r#"{"answer":""#);
    }
}
