//! Dicts: insertion-ordered maps from int, string or bool keys to values.

use crate::value::{Str, Value};
use indexmap::IndexMap;
use std::rc::Rc;

/// A dict key. Strings hash and compare by content.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    Int(i64),
    Bool(bool),
    Str(Rc<Str>),
}

impl Key {
    /// The key for a value, or an error message naming the offending type.
    pub fn from_value(v: &Value) -> Result<Key, String> {
        match v {
            Value::Int(i) => Ok(Key::Int(*i)),
            Value::Bool(b) => Ok(Key::Bool(*b)),
            Value::Str(s) => Ok(Key::Str(s.clone())),
            other => Err(format!("dict keys must be int, string or bool, got {}", other.type_name())),
        }
    }

    pub fn to_value(&self) -> Value {
        match self {
            Key::Int(i) => Value::Int(*i),
            Key::Bool(b) => Value::Bool(*b),
            Key::Str(s) => Value::Str(s.clone()),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Dict {
    pub map: IndexMap<Key, Value>,
}

impl Dict {
    pub fn new() -> Dict {
        Dict::default()
    }

    pub fn get(&self, k: &Key) -> Option<&Value> {
        self.map.get(k)
    }

    pub fn insert(&mut self, k: Key, v: Value) {
        self.map.insert(k, v);
    }

    /// Removes a key keeping the order of the others.
    pub fn delete(&mut self, k: &Key) -> Option<Value> {
        self.map.shift_remove(k)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn keys(&self) -> Vec<Value> {
        self.map.keys().map(Key::to_value).collect()
    }

    pub fn values(&self) -> Vec<Value> {
        self.map.values().cloned().collect()
    }

    /// Equality ignores insertion order.
    pub fn equals(&self, other: &Dict) -> crate::error::VmResult<bool> {
        if self.len() != other.len() {
            return Ok(false);
        }
        for (k, v) in &self.map {
            match other.map.get(k) {
                Some(w) if v.equals(w)? => {}
                _ => return Ok(false),
            }
        }
        Ok(true)
    }
}
