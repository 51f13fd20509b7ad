//! Which keys may appear where, from which spec version, and the typed
//! parse that names the entry a type error is in.
//!
//! Unknown keys are refused by their path unless unset (`null`, `{}`,
//! `[]`, or an object of only unset members): Go-marshalled configs carry
//! empty sections for everything they do not use.

use super::types::{Config, Dropin, Unit};
use super::SpecError;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// The shape of the supported subset.
enum Shape {
    Object(&'static [Field]),
    Array(&'static Shape),
    Leaf,
}

/// A key, the spec minor version that introduced it, and its shape.
struct Field(&'static str, u32, Shape);

const OWNER: Shape = Shape::Object(&[Field("id", 0, Shape::Leaf), Field("name", 0, Shape::Leaf)]);
const CONTENTS: Shape = Shape::Object(&[
    Field("source", 0, Shape::Leaf),
    Field("compression", 0, Shape::Leaf),
    Field(
        "verification",
        0,
        Shape::Object(&[Field("hash", 0, Shape::Leaf)]),
    ),
]);
const FILE: Shape = Shape::Object(&[
    Field("path", 0, Shape::Leaf),
    Field("overwrite", 0, Shape::Leaf),
    Field("mode", 0, Shape::Leaf),
    Field("user", 0, OWNER),
    Field("group", 0, OWNER),
    Field("contents", 0, CONTENTS),
]);
const DIRECTORY: Shape = Shape::Object(&[
    Field("path", 0, Shape::Leaf),
    Field("overwrite", 0, Shape::Leaf),
    Field("mode", 0, Shape::Leaf),
    Field("user", 0, OWNER),
    Field("group", 0, OWNER),
]);
const LINK: Shape = Shape::Object(&[
    Field("path", 0, Shape::Leaf),
    Field("target", 0, Shape::Leaf),
    Field("hard", 0, Shape::Leaf),
    Field("overwrite", 0, Shape::Leaf),
    Field("user", 0, OWNER),
    Field("group", 0, OWNER),
]);
const DROPIN: Shape = Shape::Object(&[
    Field("name", 0, Shape::Leaf),
    Field("contents", 0, Shape::Leaf),
]);
const UNIT: Shape = Shape::Object(&[
    Field("name", 0, Shape::Leaf),
    Field("enabled", 0, Shape::Leaf),
    Field("mask", 0, Shape::Leaf),
    Field("contents", 0, Shape::Leaf),
    Field("dropins", 0, Shape::Array(&DROPIN)),
]);
const USER: Shape = Shape::Object(&[
    Field("name", 0, Shape::Leaf),
    Field("passwordHash", 0, Shape::Leaf),
    Field("sshAuthorizedKeys", 0, Shape::Leaf),
    Field("uid", 0, Shape::Leaf),
    Field("gecos", 0, Shape::Leaf),
    Field("homeDir", 0, Shape::Leaf),
    Field("noCreateHome", 0, Shape::Leaf),
    Field("primaryGroup", 0, Shape::Leaf),
    Field("groups", 0, Shape::Leaf),
    Field("noUserGroup", 0, Shape::Leaf),
    Field("noLogInit", 0, Shape::Leaf),
    Field("shell", 0, Shape::Leaf),
    Field("system", 0, Shape::Leaf),
    // Ignition 2.14's validator calls it an unused key before 3.2.0.
    Field("shouldExist", 2, Shape::Leaf),
]);
const GROUP: Shape = Shape::Object(&[
    Field("name", 0, Shape::Leaf),
    Field("gid", 0, Shape::Leaf),
    Field("passwordHash", 0, Shape::Leaf),
    Field("system", 0, Shape::Leaf),
    Field("shouldExist", 2, Shape::Leaf),
]);
const CONFIG: Shape = Shape::Object(&[
    Field(
        "ignition",
        0,
        Shape::Object(&[Field("version", 0, Shape::Leaf)]),
    ),
    Field(
        "passwd",
        0,
        Shape::Object(&[
            Field("users", 0, Shape::Array(&USER)),
            Field("groups", 0, Shape::Array(&GROUP)),
        ]),
    ),
    Field(
        "storage",
        0,
        Shape::Object(&[
            Field("files", 0, Shape::Array(&FILE)),
            Field("directories", 0, Shape::Array(&DIRECTORY)),
            Field("links", 0, Shape::Array(&LINK)),
        ]),
    ),
    Field(
        "systemd",
        0,
        Shape::Object(&[Field("units", 0, Shape::Array(&UNIT))]),
    ),
]);

/// Whether `value` asks for nothing: `null`, `[]`, or an object whose
/// members all ask for nothing.
pub(super) fn is_unset(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.values().all(is_unset),
        _ => false,
    }
}

/// Refuses any set key outside the supported shape, or introduced after
/// spec `3.<minor>.0`, naming its path.
pub(super) fn check(value: &Value, minor: u32) -> Result<(), SpecError> {
    walk(value, &CONFIG, "", minor)
}

fn walk(value: &Value, shape: &Shape, path: &str, minor: u32) -> Result<(), SpecError> {
    match (shape, value) {
        (Shape::Object(fields), Value::Object(map)) => {
            for (key, child) in map.iter().filter(|(_, child)| !is_unset(child)) {
                let child_path = join(path, key);
                let Some(Field(_, since, child_shape)) = fields.iter().find(|f| f.0 == key) else {
                    return Err(SpecError::Unsupported(child_path));
                };
                if *since > minor {
                    return Err(SpecError::TooNew {
                        path: child_path,
                        since: *since,
                        version: format!("3.{minor}.0"),
                    });
                }
                walk(child, child_shape, &child_path, minor)?;
            }
            Ok(())
        }
        (Shape::Array(item), Value::Array(items)) => {
            for (i, child) in items.iter().enumerate() {
                walk(child, item, &format!("{path}[{i}]"), minor)?;
            }
            Ok(())
        }
        // Type mismatches are left to the typed parse, which names them.
        _ => Ok(()),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// `value` without unset object members, so every optional field reads as
/// absent whether it was left out, `null` or empty.
fn strip(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, child)| !is_unset(child))
                .map(|(key, child)| (key.clone(), strip(child)))
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip).collect()),
        other => other.clone(),
    }
}

/// The typed config, each list entry parsed on its own so a type error
/// names the entry (`storage.files[2]: missing field `path``).
pub(super) fn typed(value: &Value) -> Result<Config, SpecError> {
    let value = strip(value);
    if !value.is_object() {
        return Err(invalid("", "an Ignition config must be a JSON object"));
    }
    let mut config = Config::default();
    config.ignition.version = value
        .pointer("/ignition/version")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    config.passwd.users = entries(&value, "passwd", "users")?;
    config.passwd.groups = entries(&value, "passwd", "groups")?;
    config.storage.files = entries(&value, "storage", "files")?;
    config.storage.directories = entries(&value, "storage", "directories")?;
    config.storage.links = entries(&value, "storage", "links")?;
    config.systemd.units = units(&value)?;
    Ok(config)
}

/// Units, with each drop-in parsed on its own too.
fn units(value: &Value) -> Result<Vec<Unit>, SpecError> {
    let raw: Vec<Value> = entries(value, "systemd", "units")?;
    let mut units = Vec::with_capacity(raw.len());
    for (i, mut unit) in raw.into_iter().enumerate() {
        let path = format!("systemd.units[{i}]");
        let dropins = match unit.as_object_mut().and_then(|u| u.remove("dropins")) {
            Some(dropins) => list::<Dropin>(&dropins, &format!("{path}.dropins"))?,
            None => Vec::new(),
        };
        let mut unit: Unit = serde_json::from_value(unit).map_err(|e| invalid(&path, e))?;
        unit.dropins = dropins;
        units.push(unit);
    }
    Ok(units)
}

fn entries<T: DeserializeOwned>(
    value: &Value,
    section: &str,
    key: &str,
) -> Result<Vec<T>, SpecError> {
    match value.get(section) {
        None => Ok(Vec::new()),
        Some(Value::Object(map)) => match map.get(key) {
            None => Ok(Vec::new()),
            Some(items) => list(items, &format!("{section}.{key}")),
        },
        Some(_) => Err(invalid(section, "must be an object")),
    }
}

fn list<T: DeserializeOwned>(items: &Value, path: &str) -> Result<Vec<T>, SpecError> {
    let Value::Array(items) = items else {
        return Err(invalid(path, "must be a list"));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            serde_json::from_value(item.clone()).map_err(|e| invalid(&format!("{path}[{i}]"), e))
        })
        .collect()
}

fn invalid(path: &str, reason: impl ToString) -> SpecError {
    SpecError::Invalid {
        path: if path.is_empty() {
            "(top level)".into()
        } else {
            path.to_string()
        },
        reason: reason.to_string(),
    }
}
