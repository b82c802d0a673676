//! A mutating handler's answer as a JSON patch of the object the API
//! server sent.
//!
//! The handler changes a typed copy, which may know fewer fields than the
//! object (they are dropped) or show absent ones as `null` (a plain
//! `Option`). So the change is taken between the typed copies, carried over
//! onto the object as sent, and the patch computed against that object: it
//! only names paths that exist there, leaves unknown fields of objects as
//! they were, and takes out a field the handler set to `null`. An array the
//! handler changed is taken whole from its answer.

use json_patch::{Patch, PatchOperation};
use serde_json::{Map, Value};

/// The patch that makes `raw` (the object as sent) what the handler made
/// of it, `before` and `after` being the typed copies as JSON.
///
/// A change inside an array takes the whole array from `after`: arrays are
/// compared place by place, so an element put in or taken out would shift
/// the elements' unknown fields onto their neighbours. Such an array loses
/// the fields the type does not know; objects elsewhere keep them.
pub(crate) fn patch(raw: &Value, before: &Value, after: &Value) -> Patch {
    let mut target = raw.clone();
    let mut arrays: Vec<Vec<String>> = Vec::new();
    for operation in json_patch::diff(before, after).0 {
        let path = tokens(operation.path());
        if let Some(array) = array_of(before, after, &path) {
            if !arrays.iter().any(|done| array.starts_with(done)) {
                match lookup(after, &array) {
                    Some(value) => set(&mut target, &array, value.clone(), false),
                    None => take(&mut target, &array),
                }
                arrays.push(array);
            }
            continue;
        }
        match operation {
            PatchOperation::Add(add) => set(&mut target, &path, add.value, true),
            PatchOperation::Replace(replace) => set(&mut target, &path, replace.value, false),
            PatchOperation::Remove(_) => take(&mut target, &path),
            // A diff makes none of these.
            PatchOperation::Move(_) | PatchOperation::Copy(_) | PatchOperation::Test(_) => {}
        }
    }
    json_patch::diff(raw, &target)
}

/// The path of the outermost array that `path` goes into (or is an
/// element of), in either typed copy.
fn array_of(before: &Value, after: &Value, path: &[String]) -> Option<Vec<String>> {
    (0..path.len()).find_map(|depth| {
        let prefix = &path[..depth];
        let is_array = |value: &Value| lookup(value, prefix).is_some_and(Value::is_array);
        (is_array(before) || is_array(after)).then(|| prefix.to_vec())
    })
}

fn lookup<'v>(value: &'v Value, path: &[String]) -> Option<&'v Value> {
    path.iter().try_fold(value, |node, token| match node {
        Value::Object(map) => map.get(token),
        Value::Array(items) => items.get(token.parse::<usize>().ok()?),
        _ => None,
    })
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
    let node = parents.iter().try_fold(target, |node, token| match node {
        Value::Array(items) => items.get_mut(token.parse::<usize>().ok()?),
        other => Some(object(other).entry(token.clone()).or_insert(Value::Null)),
    });
    let Some(node) = node else {
        return;
    };
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
            object(other).insert(last.clone(), value);
        }
    }
}

/// `value` as an object, made an empty one if it is anything else.
fn object(value: &mut Value) -> &mut Map<String, Value> {
    if !value.is_object() {
        *value = Value::Object(Map::new());
    }
    value.as_object_mut().expect("made an object")
}

/// Takes `path` out, if it is there.
fn take(target: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let node = parents.iter().try_fold(target, |node, token| match node {
        Value::Object(map) => map.get_mut(token),
        Value::Array(items) => items.get_mut(token.parse::<usize>().ok()?),
        _ => None,
    });
    match node {
        Some(Value::Object(map)) => {
            map.remove(last);
        }
        Some(Value::Array(items)) => {
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
    fn objects_on_the_way_are_made_and_unchanged_arrays_kept() {
        let raw = json!({"spec": {"items": [{"n": 1, "extra": true}]}});
        let before = json!({"spec": {"items": [{"n": 1}]}, "metadata": null});
        let after = json!({"spec": {"items": [{"n": 1}]}, "metadata": {"annotations": {"k": "v"}}});
        assert_eq!(
            applied(&raw, before, after),
            json!({"spec": {"items": [{"n": 1, "extra": true}]}, "metadata": {"annotations": {"k": "v"}}})
        );
    }

    #[test]
    fn an_element_put_into_an_array_does_not_shift_fields_onto_another() {
        let raw = json!({"spec": {"containers": [{"name": "a", "x": 1}, {"name": "b", "x": 2}]}});
        let before = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let after = json!({"spec": {"containers": [{"name": "s"}, {"name": "a"}, {"name": "b"}]}});
        assert_eq!(
            applied(&raw, before, after),
            json!({"spec": {"containers": [{"name": "s"}, {"name": "a"}, {"name": "b"}]}})
        );
        let raw = json!({"items": [1, null, 3]});
        let typed = json!({"items": [1, null, 3]});
        let after = json!({"items": [1, null, 3, null]});
        assert_eq!(
            applied(&raw, typed, after),
            json!({"items": [1, null, 3, null]})
        );
    }

    #[test]
    fn no_change_no_patch() {
        let raw = json!({"spec": {"size": 3}});
        let typed = json!({"spec": {"size": 3, "color": null}});
        assert!(patch(&raw, &typed, &typed).0.is_empty());
    }
}
