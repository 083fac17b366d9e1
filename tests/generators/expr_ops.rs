// The bounded operators random differentiable programs are built from: shared by the property
// tests (`tests/ad_properties.rs`) and the `gradients` fuzz target (`fuzz/src/programs.rs`),
// which `include!` this file. `E`, `A`, `B` stand for operand expressions.

/// One-operand templates (every one smooth and bounded on bounded inputs, or nearly so).
pub const UNARY: &[&str] = &[
    "sin(E)", "cos(E)", "tanh(E)", "sigmoid(E)", "atan(E)", "exp(tanh(E))", "sqrt(1.0 + E * E)",
    "log(1.0 + E * E)", "softplus(E)", "erf(E)", "(-E)", "abs(E + 3.0)", "(E) ^ 2", "cbrt(E + 5.0)", "(E) ^ 3", "(1.5 + E * E) ^ -2",
];

/// Two-operand templates.
pub const BINARY: &[&str] = &[
    "(A + B)", "(A - B)", "(A * B)", "(A / (1.0 + B * B))", "atan2(A, B + 3.0)", "max(A, B)",
    "min(A, B)", "hypot(A, B + 2.0)", "pow(3.0 + A * A, B)", "(2.0 + A * A) ^ B",
];
