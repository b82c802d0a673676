//! A mutating handler's answer as a JSON patch of the object the API
//! server sent.
//!
//! The handler changes a typed copy, which may know fewer fields than the
//! object (they are dropped) or show absent ones as `null` (a plain
//! `Option`). So the change is taken between the typed copies, carried over
//! onto the object as sent, and the patch computed against that object: it
//! only names paths that exist there, leaves unknown fields as they were,
//! and takes a field set to `null` out.

use json_patch::{Patch, PatchOperation};
use serde_json::{Map, Value};

/// The patch that makes `raw` (the object as sent) what the handler made
/// of it, `before` and `after` being the typed copies as JSON.
pub(crate) fn patch(raw: &Value, before: &Value, after: &Value) -> Patch {
    let mut target = raw.clone();
    for operation in json_patch::diff(before, after).0 {
        match operation {
            PatchOperation::Add(add) => set(&mut target, &tokens(&add.path), add.value, true),
            PatchOperation::Replace(replace) => {
                set(&mut target, &tokens(&replace.path), replace.value, false)
            }
            PatchOperation::Remove(remove) => take(&mut target, &tokens(&remove.path)),
            // A diff makes none of these.
            PatchOperation::Move(_) | PatchOperation::Copy(_) | PatchOperation::Test(_) => {}
        }
    }
    json_patch::diff(raw, &target)
}

fn tokens(path: &jsonptr::Pointer) -> Vec<String> {
    path.tokens()
        .map(|token| token.decoded().into_owned())
        .collect()
}

/// Sets `path` to `value`, making the objects on the way; `null` takes the
/// field out. `insert` adds into an array where `false` replaces.
fn set(target: &mut Value, path: &[String], value: Value, insert: bool) {
    if value.is_null() {
        return take(target, path);
    }
    let Some((last, parents)) = path.split_last() else {
        *target = value;
        return;
    };
    let mut node = target;
    for token in parents {
        node = match node {
            Value::Array(items) => match token.parse::<usize>() {
                Ok(i) if i < items.len() => &mut items[i],
                _ => return,
            },
            other => {
                if !other.is_object() {
                    *other = Value::Object(Map::new());
                }
                let Value::Object(map) = other else {
                    return;
                };
                map.entry(token.clone())
                    .or_insert_with(|| Value::Object(Map::new()))
            }
        };
    }
    match node {
        Value::Array(items) => {
            let at = if last == "-" {
                items.len()
            } else {
                match last.parse::<usize>() {
                    Ok(i) if i <= items.len() => i,
                    _ => return,
                }
            };
            if insert || at == items.len() {
                items.insert(at, value);
            } else {
                items[at] = value;
            }
        }
        other => {
            if !other.is_object() {
                *other = Value::Object(Map::new());
            }
            if let Value::Object(map) = other {
                map.insert(last.clone(), value);
            }
        }
    }
}

/// Takes `path` out, if it is there.
fn take(target: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = target;
    for token in parents {
        node = match node {
            Value::Object(map) => match map.get_mut(token) {
                Some(next) => next,
                None => return,
            },
            Value::Array(items) => match token.parse::<usize>() {
                Ok(i) if i < items.len() => &mut items[i],
                _ => return,
            },
            _ => return,
        };
    }
    match node {
        Value::Object(map) => {
            map.remove(last);
        }
        Value::Array(items) => {
            if let Ok(i) = last.parse::<usize>()
                && i < items.len()
            {
                items.remove(i);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn applied(raw: &Value, before: Value, after: Value) -> Value {
        let patch = patch(raw, &before, &after);
        let mut out = raw.clone();
        json_patch::patch(&mut out, &patch).expect("the patch applies to the object as sent");
        out
    }

    #[test]
    fn a_field_absent_but_null_in_the_typed_copy_is_added() {
        let raw = json!({"spec": {"size": 3}, "status": {"unknown": true}});
        let before = json!({"spec": {"size": 3, "color": null}});
        let after = json!({"spec": {"size": 3, "color": "blue"}});
        assert_eq!(
            applied(&raw, before, after),
            json!({"spec": {"size": 3, "color": "blue"}, "status": {"unknown": true}})
        );
    }

    #[test]
    fn fields_the_type_does_not_know_are_left_and_null_takes_out() {
        let raw =
            json!({"metadata": {"labels": {"a": "1"}, "x-unknown": 7}, "spec": {"color": "red"}});
        let before = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"color": "red"}});
        let after = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"color": null}});
        assert_eq!(
            applied(&raw, before, after),
            json!({"metadata": {"labels": {"a": "1", "b": "2"}, "x-unknown": 7}, "spec": {}})
        );
    }

    #[test]
    fn objects_on_the_way_are_made_and_arrays_kept_in_order() {
        let raw = json!({"spec": {"items": [{"n": 1, "extra": true}]}});
        let before = json!({"spec": {"items": [{"n": 1}]}, "metadata": null});
        let after = json!({"spec": {"items": [{"n": 1}, {"n": 2}]}, "metadata": {"annotations": {"k": "v"}}});
        assert_eq!(
            applied(&raw, before, after),
            json!({"spec": {"items": [{"n": 1, "extra": true}, {"n": 2}]}, "metadata": {"annotations": {"k": "v"}}})
        );
    }

    #[test]
    fn no_change_no_patch() {
        let raw = json!({"spec": {"size": 3}});
        let typed = json!({"spec": {"size": 3, "color": null}});
        assert!(patch(&raw, &typed, &typed).0.is_empty());
    }
}
