//! The recording's JSON Schema (`docs/recording.schema.json`), checked
//! with the `jsonschema` crate: a full draft 2020-12 validator, so the
//! schema may use any keyword and none is silently ignored.

use serde_json::Value;

/// The schema shipped in `docs/`.
pub fn recording_schema() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/recording.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("docs/recording.schema.json"))
        .expect("the schema is JSON")
}

/// Every violation of `#/$defs/<def>` of `root` by `v`, as `pointer:
/// what`.
pub fn violations(root: &Value, def: &str, v: &Value) -> Vec<String> {
    assert!(
        root.pointer(&format!("/$defs/{def}")).is_some(),
        "no $defs/{def}"
    );
    // The whole document, its root pointed at the definition: its $refs
    // resolve as they do in the file.
    let mut schema = root.clone();
    schema["$ref"] = Value::String(format!("#/$defs/{def}"));
    let validator = jsonschema::validator_for(&schema)
        .unwrap_or_else(|e| panic!("the schema is not a valid JSON Schema: {e}"));
    validator
        .iter_errors(v)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// Validates `v` against `#/$defs/<def>` of the recording schema; panics
/// with every violation.
pub fn assert_valid(def: &str, v: &Value) {
    let errors = violations(&recording_schema(), def, v);
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
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$defs": {
                "n": {"type": "integer", "minimum": 0},
                "e": {
                    "type": "object",
                    "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"enum": ["x"]}},
                    "required": ["a"],
                    "additionalProperties": false
                }
            }
        });
        let check = |v: Value| violations(&root, "e", &v);
        assert_eq!(check(json!({"a": 1, "b": "x"})), Vec::<String>::new());
        assert_eq!(check(json!({"b": "x"})).len(), 1);
        assert_eq!(check(json!({"a": -1})).len(), 1);
        assert_eq!(check(json!({"a": 1.5})).len(), 1);
        assert_eq!(check(json!({"a": 1, "b": "y"})).len(), 1);
        assert_eq!(check(json!({"a": 1, "c": 0})).len(), 1);
        assert_eq!(check(json!([1])).len(), 1);
        // Each says where.
        assert!(
            check(json!({"a": -1}))[0].starts_with("/a: "),
            "{:?}",
            check(json!({"a": -1}))
        );
    }

    #[test]
    fn the_shipped_schema_is_a_valid_json_schema() {
        let root = recording_schema();
        assert_eq!(
            root["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        jsonschema::meta::validate(&root).expect("valid against its meta-schema");
    }
}
