//! A JSON Schema validator for the keywords `docs/recording.schema.json`
//! uses (`$ref`, `type`, `properties`, `required`, `additionalProperties`,
//! `items`, `enum`, `minimum`, `anyOf`). Any other keyword is an error, so
//! the schema cannot use one this validator would silently ignore.

use serde_json::Value;

/// Keywords that carry no constraint.
const ANNOTATIONS: &[&str] = &["description", "title", "$schema", "$id", "$defs"];

/// The schema shipped in `docs/`.
pub fn recording_schema() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/recording.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("docs/recording.schema.json"))
        .expect("the schema is JSON")
}

fn type_ok(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        other => panic!("schema uses unknown type {other}"),
    }
}

/// Validates `v` against `schema` (resolving `$ref`s in `root`); returns
/// every violation as `pointer: what`.
pub fn validate(root: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(s) = schema.as_object() else {
        panic!("schema at {at} is not an object");
    };
    for (k, rule) in s {
        match k.as_str() {
            k if ANNOTATIONS.contains(&k) => {}
            "$ref" => {
                let r = rule.as_str().expect("$ref is a string");
                let target = root
                    .pointer(r.trim_start_matches('#'))
                    .unwrap_or_else(|| panic!("dangling $ref {r}"));
                validate(root, target, v, at, errors);
            }
            "type" => {
                let ok = match rule {
                    Value::String(t) => type_ok(v, t),
                    Value::Array(ts) => ts.iter().any(|t| type_ok(v, t.as_str().unwrap_or(""))),
                    _ => panic!("bad type at {at}"),
                };
                if !ok {
                    errors.push(format!("{at}: {v} is not of type {rule}"));
                }
            }
            "enum" => {
                if !rule.as_array().expect("enum array").contains(v) {
                    errors.push(format!("{at}: {v} not in {rule}"));
                }
            }
            "minimum" => {
                if v.as_f64().is_some_and(|x| x < rule.as_f64().unwrap_or(0.0)) {
                    errors.push(format!("{at}: {v} below {rule}"));
                }
            }
            "required" => {
                if let Some(o) = v.as_object() {
                    for name in rule.as_array().expect("required array") {
                        let name = name.as_str().expect("name");
                        if !o.contains_key(name) {
                            errors.push(format!("{at}: missing `{name}`"));
                        }
                    }
                }
            }
            "properties" => {
                if let Some(o) = v.as_object() {
                    for (name, sub) in rule.as_object().expect("properties object") {
                        if let Some(x) = o.get(name) {
                            validate(root, sub, x, &format!("{at}/{name}"), errors);
                        }
                    }
                }
            }
            "additionalProperties" => {
                let known = s.get("properties").and_then(Value::as_object);
                if let Some(o) = v.as_object() {
                    for (name, x) in o {
                        if known.is_some_and(|p| p.contains_key(name)) {
                            continue;
                        }
                        match rule {
                            Value::Bool(false) => {
                                errors.push(format!("{at}: unexpected `{name}`"));
                            }
                            Value::Bool(true) => {}
                            sub => validate(root, sub, x, &format!("{at}/{name}"), errors),
                        }
                    }
                }
            }
            "items" => {
                if let Some(a) = v.as_array() {
                    for (i, x) in a.iter().enumerate() {
                        validate(root, rule, x, &format!("{at}/{i}"), errors);
                    }
                }
            }
            "anyOf" => {
                let any = rule.as_array().expect("anyOf array").iter().any(|sub| {
                    let mut e = Vec::new();
                    validate(root, sub, v, at, &mut e);
                    e.is_empty()
                });
                if !any {
                    errors.push(format!("{at}: matches none of anyOf"));
                }
            }
            other => panic!("schema keyword `{other}` at {at} is not supported by this validator"),
        }
    }
}

/// Validates `v` against `#/$defs/<def>` of the recording schema; panics
/// with every violation.
pub fn assert_valid(def: &str, v: &Value) {
    let root = recording_schema();
    let schema = root
        .pointer(&format!("/$defs/{def}"))
        .unwrap_or_else(|| panic!("no $defs/{def}"))
        .clone();
    let mut errors = Vec::new();
    validate(&root, &schema, v, "", &mut errors);
    assert!(
        errors.is_empty(),
        "{def} does not match the schema:\n{}",
        errors.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_validator_rejects_what_the_schema_forbids() {
        let root = json!({"$defs": {"e": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"enum": ["x"]}},
            "required": ["a"],
            "additionalProperties": false
        }}});
        let s = root.pointer("/$defs/e").cloned().unwrap_or_default();
        let check = |v: Value| {
            let mut e = Vec::new();
            validate(&root, &s, &v, "", &mut e);
            e.len()
        };
        assert_eq!(check(json!({"a": 1, "b": "x"})), 0);
        assert_eq!(check(json!({"b": "x"})), 1);
        assert_eq!(check(json!({"a": -1})), 1);
        assert_eq!(check(json!({"a": 1.5})), 1);
        assert_eq!(check(json!({"a": 1, "b": "y"})), 1);
        assert_eq!(check(json!({"a": 1, "c": 0})), 1);
        assert_eq!(check(json!([1])), 1);
    }
}
