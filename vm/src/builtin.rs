//! The interface between the interpreter and built-in functions (the standard library and
//! host functions). The table itself lives in the `zygvm-stdlib` crate.

use crate::error::VmResult;
use crate::interp::Vm;
use crate::value::Value;

/// A native built-in: the VM (to call back into Zy, write output, allocate) and the arguments.
pub type NativeFn = fn(&mut Vm, &[Value]) -> VmResult<Value>;

#[derive(Clone, Copy, Debug)]
pub enum BuiltinImpl {
    Native(NativeFn),
    /// Index into `Program::host_functions`.
    Host(usize),
}

/// A scalar math function as native code calls it (`extern "C"`: argument and result in
/// `xmm0` on x86-64).
pub type ScalarFn = extern "C" fn(f64) -> f64;

/// A scalar math function and its derivative in one call (`extern "C"`: `out := [f(x),
/// f'(x)]`), bit for bit `scalar` and `scalar_deriv` (a stdlib test checks it): the C
/// library's `sincos` gives both of `sin` and `cos` for about the cost of one.
pub type ScalarPairFn = extern "C" fn(f64, &mut [f64; 2]);

/// One entry of the built-in table.
#[derive(Clone, Debug)]
pub struct Builtin {
    pub name: String,
    /// Accepted argument counts, inclusive.
    pub min_args: usize,
    pub max_args: usize,
    pub imp: BuiltinImpl,
    /// For one-argument scalar math: the f64 function, used by the `Math1` fast path (the C
    /// calling convention: native code calls it directly).
    pub scalar: Option<ScalarFn>,
    /// How reverse mode differentiates a call (the rules live in `zygvm-stdlib`'s
    /// `derivatives.rs`; host functions have none).
    pub deriv: Deriv,
    /// For one-argument scalar math: the derivative as an f64 function (the adjoint's fast
    /// path for `Math1`, and the elementwise rule on arrays), with the C calling convention
    /// like `scalar`: native code calls it directly.
    pub scalar_deriv: Option<ScalarFn>,
    /// One-argument math that is its own derivative, bit for bit (`exp`: `scalar_deriv(x)`
    /// is `f(x)`; a stdlib test checks it): reverse mode records the result `y` and its
    /// adjoint is `dy * y` (`compiler/src/ad/adjoint.rs`), with no second call of `f`.
    pub deriv_is_result: bool,
    /// For one-argument scalar math whose value and derivative come cheaper together: both
    /// in one call. Native code computes a `Math1` with it when the same routine's pullback
    /// of that call follows in the same straight-line run (`jit/src/scalar_pairs.rs`), and
    /// keeps the derivative for it.
    pub scalar_pair: Option<ScalarPairFn>,
    /// How forward mode differentiates a call (`vm/src/ad/forward.rs`).
    pub tangent: Tangent,
    /// For one-argument scalar math: the second derivative (forward over reverse).
    pub scalar_deriv2: Option<fn(f64) -> f64>,
    /// For one-argument scalar math: `[f(x), f'(x), .., f⁽ⁿ⁾(x)]` (third and higher
    /// derivatives, `vm/src/ad/towers.rs`).
    pub derivatives_at: Option<fn(f64, usize) -> Vec<f64>>,
    /// Its own rule under two or more levels of forward mode (the differentiation operators;
    /// `vm/src/ad/towers.rs`).
    pub tower: Option<TowerFn>,
    /// The tangent of the pullback (forward over reverse), for built-ins whose pullback
    /// depends on their arguments other than through `scalar_deriv` or linearity.
    pub second: Option<SecondFn>,
    /// Forward over reverse for a built-in with its own tape protocol (`Deriv::Custom`).
    pub custom_second: Option<CustomSecond>,
    /// A *leaf*: runs no Zy code and no host code (no callback, no frame pushed, no function
    /// added), so the shared semantics may run a call of it (`semantics.rs`), and native code
    /// through `step` without leaving to the interpreter.
    pub leaf: bool,
    /// *Replayable*: a leaf that changes nothing (no container written, no random draw), so
    /// running it again on the same arguments gives the same result; a loop whose calls are
    /// all replayable can be recomputed from a checkpoint (`compiler/src/ad/checkpoints.rs`).
    pub replayable: bool,
}

/// The tangents of a `Deriv::Custom` built-in's two steps: `tape(vm, args, ȧrgs)` returns
/// `(y, ẏ)` and pushes its records with their tangents; `adjoint(vm, dy, d, ḋy, ḋ)` pops them.
#[derive(Clone, Copy, Debug)]
pub struct CustomSecond {
    pub tape: TangentFn,
    pub adjoint: fn(&mut Vm, &Value, &mut [Value], &Value, &mut [Value]) -> VmResult<()>,
}

/// `second(vm, dy, ḋy, args, ȧrgs, y, ẏ)`: the tangents of the pullback's contributions,
/// `d/dε pullback(dy + ε ḋy, args + ε ȧrgs)`.
pub type SecondFn = fn(&mut Vm, &Value, &Value, &[Value], &[Value], &Value, &Value) -> VmResult<Vec<Value>>;

/// `tower(vm, argument towers, k)`: the result's tower under `k` levels of forward mode.
pub type TowerFn = fn(&mut Vm, &[crate::ad::towers::Tower], u32) -> VmResult<crate::ad::towers::Tower>;

/// `tangent(vm, args, tangents)`: the result and its tangent (forward mode).
pub type TangentFn = fn(&mut Vm, &[Value], &[Value]) -> VmResult<(Value, Value)>;

/// A built-in's derivative, as forward mode sees it.
#[derive(Clone, Copy, Debug)]
pub enum Tangent {
    /// Follows from the reverse-mode rule: constant, elementwise `f'(x) ẋ`, or the Jacobian
    /// applied to the tangents through the (linear) pullback.
    FromPullback,
    /// The built-in is linear in its differentiable arguments (`sum`, `slice`, `transpose`,
    /// ...): its tangent is the built-in applied to the tangents.
    Linear,
    /// Its own rule (higher-order and mutating built-ins).
    Rule(TangentFn),
}

/// `pullback(vm, dy, args, y)`: one adjoint contribution per argument (`nil` for none).
pub type PullbackFn = fn(&mut Vm, &Value, &[Value], &Value) -> VmResult<Vec<Value>>;
/// The primal-with-tape version of a built-in that records its own tape entries.
pub type TapeFn = fn(&mut Vm, &[Value]) -> VmResult<Value>;
/// The adjoint of such a built-in: pops what its `TapeFn` pushed and turns the incoming
/// adjoints of the arguments (`d`, updated in place) into the outgoing ones.
pub type AdjointFn = fn(&mut Vm, Value, &mut [Value]) -> VmResult<()>;

/// A built-in's derivative, as reverse mode sees it.
#[derive(Clone, Copy, Debug)]
pub enum Deriv {
    /// Its result never carries a derivative (ints, strings, bools, piecewise-constant maps):
    /// nothing is recorded, every argument's adjoint is zero.
    Constant,
    /// A pure function with a pullback: the primal records a snapshot of the arguments and the
    /// result; the adjoint applies the rule.
    Pullback(PullbackFn),
    /// Higher-order or mutating built-ins (`map`, `push`, ...) with their own tape protocol.
    Custom { tape: TapeFn, adjoint: AdjointFn },
    /// No rule (host functions): differentiating through a call whose result needs a
    /// derivative is a runtime error.
    Missing,
    /// A host function with derivative rules written in Rust by the embedding program
    /// (`HostFunction::pullback`, `tangent`): recorded like `Pullback`.
    Host,
    /// A differentiation operator (`gradient`, `grad(f)`, `derivative`, ...): differentiating
    /// through it (nested differentiation) is not built yet, a runtime error when a
    /// derivative has to flow through it.
    Nested,
}

impl Builtin {
    /// Whether this is the standard `value_and_gradient` (a host function of that name
    /// replaces it in the table as a `Host` built-in).
    pub fn is_value_and_gradient(&self) -> bool {
        self.name == "value_and_gradient" && matches!(self.imp, BuiltinImpl::Native(_))
    }

    pub fn native(name: &str, min_args: usize, max_args: usize, f: NativeFn) -> Builtin {
        Builtin {
            name: name.into(),
            min_args,
            max_args,
            imp: BuiltinImpl::Native(f),
            scalar: None,
            deriv: Deriv::Missing,
            scalar_deriv: None,
            deriv_is_result: false,
            scalar_pair: None,
            tangent: Tangent::FromPullback,
            scalar_deriv2: None,
            derivatives_at: None,
            tower: None,
            second: None,
            custom_second: None,
            leaf: false,
            replayable: false,
        }
    }

    /// Whether forward over reverse takes this built-in by towers and forward sweeps
    /// (`ad/sweeps.rs`): a differentiation operator with no second-order rule of its own.
    pub fn second_order_by_sweeps(&self) -> bool {
        self.tower.is_some() && self.custom_second.is_none() && matches!(self.deriv, Deriv::Custom { .. } | Deriv::Nested)
    }

    /// Whether its pullback (`CallBuiltinAdj`) is a Rust rule alone, running no Zy or host
    /// code and making no frame: a pure function's (`Deriv::Pullback`, on the `leaf`
    /// built-ins only) or none (`Deriv::Constant`). The shared semantics run it then, so
    /// native code calls it through `step` instead of leaving to the interpreter.
    pub fn pure_pullback(&self) -> bool {
        self.leaf && matches!(self.deriv, Deriv::Pullback(_) | Deriv::Constant)
    }

    pub fn accepts(&self, n: usize) -> bool {
        n >= self.min_args && n <= self.max_args
    }

    /// "1 argument", "2 or 3 arguments", …
    pub fn arity_text(&self) -> String {
        let plural = |n: usize| if n == 1 { "argument" } else { "arguments" };
        if self.min_args == self.max_args {
            format!("{} {}", self.min_args, plural(self.min_args))
        } else if self.max_args == usize::MAX {
            format!("at least {} {}", self.min_args, plural(self.min_args))
        } else {
            format!("{} to {} arguments", self.min_args, self.max_args)
        }
    }
}
