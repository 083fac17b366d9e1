//! Conversions between Rust values and [`Value`](crate::Value) for the embedding API.

use crate::Value;

/// Rust values that can be passed into Zy.
pub trait IntoValue {
    fn into_value(self) -> Value;
}

/// Rust values that a Zy result can be converted into.
pub trait FromValue: Sized {
    fn from_value(v: Value) -> Result<Self, String>;
}

/// Argument lists: tuples of `IntoValue`s, or a `Vec<Value>`.
pub trait IntoArgs {
    fn into_args(self) -> Vec<Value>;
}

impl IntoValue for Value {
    fn into_value(self) -> Value {
        self
    }
}
impl IntoValue for f64 {
    fn into_value(self) -> Value {
        Value::Float(self)
    }
}
impl IntoValue for i64 {
    fn into_value(self) -> Value {
        Value::Int(self)
    }
}
impl IntoValue for bool {
    fn into_value(self) -> Value {
        Value::Bool(self)
    }
}
impl IntoValue for String {
    fn into_value(self) -> Value {
        Value::Str(self)
    }
}
impl IntoValue for &str {
    fn into_value(self) -> Value {
        Value::Str(self.to_string())
    }
}
impl<T: IntoValue> IntoValue for Vec<T> {
    fn into_value(self) -> Value {
        Value::Array(self.into_iter().map(IntoValue::into_value).collect())
    }
}

fn mismatch<T>(want: &str, got: &Value) -> Result<T, String> {
    Err(format!("expected {want}, got {got:?}"))
}

impl FromValue for Value {
    fn from_value(v: Value) -> Result<Self, String> {
        Ok(v)
    }
}
impl FromValue for f64 {
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::Float(x) => Ok(x),
            Value::Int(i) => Ok(i as f64),
            other => mismatch("a float", &other),
        }
    }
}
impl FromValue for i64 {
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::Int(i) => Ok(i),
            other => mismatch("an int", &other),
        }
    }
}
impl FromValue for bool {
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::Bool(b) => Ok(b),
            other => mismatch("a bool", &other),
        }
    }
}
impl FromValue for String {
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::Str(s) => Ok(s),
            other => mismatch("a string", &other),
        }
    }
}
impl<T: FromValue> FromValue for Vec<T> {
    fn from_value(v: Value) -> Result<Self, String> {
        match v {
            Value::Array(xs) | Value::Tuple(xs) => xs.into_iter().map(T::from_value).collect(),
            Value::Matrix { data, .. } => data.into_iter().map(|x| T::from_value(Value::Float(x))).collect(),
            other => mismatch("an array", &other),
        }
    }
}

impl IntoArgs for Vec<Value> {
    fn into_args(self) -> Vec<Value> {
        self
    }
}

macro_rules! tuples {
    ($(($($t:ident $i:tt),*))*) => {$(
        impl<$($t: IntoValue),*> IntoArgs for ($($t,)*) {
            #[allow(clippy::unused_unit)]
            fn into_args(self) -> Vec<Value> {
                vec![$(self.$i.into_value()),*]
            }
        }
        impl<$($t: IntoValue),*> IntoValue for ($($t,)*) {
            fn into_value(self) -> Value {
                Value::Tuple(vec![$(self.$i.into_value()),*])
            }
        }
        impl<$($t: FromValue),*> FromValue for ($($t,)*) {
            #[allow(unused_variables, unused_mut)]
            fn from_value(v: Value) -> Result<Self, String> {
                match v {
                    // `()` accepts any result (the call is made for its effect).
                    _ if { let names: &[&str] = &[$(stringify!($t)),*]; let n = names.len(); n == 0 } => Ok(($($t::from_value(Value::Nil)?,)*)),
                    Value::Tuple(items) => {
                        let names: &[&str] = &[$(stringify!($t)),*]; let n = names.len();
                        if items.len() != n {
                            return Err(format!("expected a tuple of {n}, got {}", items.len()));
                        }
                        let mut it = items.into_iter();
                        Ok(($($t::from_value(it.next().unwrap())?,)*))
                    }
                    other => mismatch("a tuple", &other),
                }
            }
        }
    )*};
}

tuples! {
    ()
    (A 0)
    (A 0, B 1)
    (A 0, B 1, C 2)
    (A 0, B 1, C 2, D 3)
    (A 0, B 1, C 2, D 3, E 4)
}

/// Rust closures callable from Zy with typed arguments (`ProgramBuilder::register_fn`):
/// `Fn(A, B, ..) -> R` for up to five arguments, each converted from the Zy value (`FromValue`,
/// a mismatch being a Zy runtime error that names the argument), the result into one
/// (`IntoValue`; a `Result<R, String>`'s `Err` is a runtime error).
pub trait HostFn<Args>: Send + Sync + 'static {
    /// How many arguments the closure takes.
    const ARITY: usize;
    fn call_with(&self, args: &[Value]) -> Result<Value, String>;
}

/// What a typed host function may return: a value, or a `Result` whose error is a message.
pub trait IntoHostResult {
    fn into_host_result(self) -> Result<Value, String>;
}
impl<T: IntoValue> IntoHostResult for T {
    fn into_host_result(self) -> Result<Value, String> {
        Ok(self.into_value())
    }
}
impl<T: IntoValue> IntoHostResult for Result<T, String> {
    fn into_host_result(self) -> Result<Value, String> {
        self.map(IntoValue::into_value)
    }
}

macro_rules! host_fns {
    ($(($n:expr; $($t:ident $i:tt),*))*) => {$(
        impl<F, R, $($t),*> HostFn<($($t,)*)> for F
        where
            F: Fn($($t),*) -> R + Send + Sync + 'static,
            R: IntoHostResult,
            $($t: FromValue),*
        {
            const ARITY: usize = $n;
            #[allow(unused_variables)]
            fn call_with(&self, args: &[Value]) -> Result<Value, String> {
                (self)($($t::from_value(args[$i].clone()).map_err(|e| format!("argument {}: {e}", $i + 1))?),*).into_host_result()
            }
        }
    )*};
}

host_fns! {
    (0;)
    (1; A 0)
    (2; A 0, B 1)
    (3; A 0, B 1, C 2)
    (4; A 0, B 1, C 2, D 3)
    (5; A 0, B 1, C 2, D 3, E 4)
}
