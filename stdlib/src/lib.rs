//! `zygvm-stdlib`: the built-in functions of section 6 of the language reference.
//!
//! `builtins()` is the table the compiler resolves names against and the interpreter calls
//! through (`zygvm_vm::builtin::Builtin`). One module per family: `core` (output, checks,
//! conversions, dicts, clocks), `math`, `arrays`, `matrices`, `strings`, `text` (`format`,
//! `sparkline`), `io`, `data` (CSV), `plots`, `random`.

pub mod args;
pub mod arrays;
pub mod core;
pub mod custom_rules;
pub mod custom_second;
pub mod data;
pub mod derivatives;
pub mod nested_rules;
pub mod nested_towers;
pub mod plots;
pub mod second_derivatives;
pub mod tangents;
pub mod differentiate;
pub mod io;
pub mod math;
pub mod linalg_tangents;
pub mod linalg_towers;
pub mod math_towers;
pub mod matrices;
pub mod random;
#[cfg(test)]
mod test_points;
pub mod strings;
pub mod taylor;
pub mod unwrapped_math;
pub mod text;

use zygvm_vm::builtin::{Builtin, BuiltinImpl};

const ANY: usize = usize::MAX;

/// The standard library, in `BuiltinId` order.
/// The built-ins that compute from their arguments alone: no callback into Zy (`map`,
/// `gradient`, ...), no input or output, no host code (`Builtin::leaf`).
const LEAF: &[&str] = &[
    "int", "float", "str", "type", "parse_float", "parse_int", "abs", "sign", "floor", "ceil", "round", "relu", "atan2",
    "pow", "hypot", "min", "max", "pi", "e", "inf", "nan", "isnan", "isinf", "len", "push", "pop", "insert", "remove",
    "copy", "slice", "concat", "reverse", "sort", "range", "zeros", "ones", "fill", "linspace", "sum", "prod", "mean",
    "maximum", "minimum", "argmax", "argmin", "dot", "norm", "logsumexp", "softmax", "cumsum", "zip", "enumerate",
    "any", "all", "eye", "matrix", "shape", "rows", "cols", "transpose", "row", "col", "reshape", "flatten", "outer",
    "trace", "det", "inv", "solve", "dict", "has", "keys", "values", "delete", "substr", "split", "join", "trim",
    "lines", "contains", "starts_with", "ends_with", "replace", "find", "upper", "lower", "rand", "randn",
    "stop_gradient", "format", "sparkline",
];

/// The leaves that change something: they write the container they are given or draw from
/// the random generator (every other leaf is `Builtin::replayable`).
const NOT_REPLAYABLE: &[&str] = &["push", "pop", "insert", "remove", "delete", "rand", "randn"];

pub fn builtins() -> Vec<Builtin> {
    let mut t: Vec<Builtin> = vec![];
    let mut add = |name: &str, min: usize, max: usize, f: zygvm_vm::builtin::NativeFn| {
        t.push(Builtin::native(name, min, max, f));
    };
    add("print", 0, ANY, core::print);
    add("assert", 1, 2, core::assert);
    add("assert_close", 2, 3, core::assert_close);
    add("error", 1, 1, core::error);
    add("args", 0, 0, core::args);
    add("clock", 0, 0, core::clock);
    add("int", 1, 1, core::int);
    add("float", 1, 1, core::float);
    add("str", 1, 1, core::str_);
    add("type", 1, 1, core::type_);
    add("parse_float", 1, 1, core::parse_float);
    add("parse_int", 1, 1, core::parse_int);
    add("abs", 1, 1, math::abs);
    add("sign", 1, 1, math::sign);
    add("floor", 1, 1, math::floor);
    add("ceil", 1, 1, math::ceil);
    add("round", 1, 1, math::round);
    add("relu", 1, 1, math::relu);
    add("atan2", 2, 2, math::atan2);
    add("pow", 2, 2, math::pow);
    add("hypot", 2, 2, math::hypot);
    add("min", 2, 2, math::min);
    add("max", 2, 2, math::max);
    add("pi", 0, 0, math::pi);
    add("e", 0, 0, math::e);
    add("inf", 0, 0, math::inf);
    add("nan", 0, 0, math::nan);
    add("isnan", 1, 1, math::isnan);
    add("isinf", 1, 1, math::isinf);
    add("len", 1, 1, arrays::len);
    add("push", 2, 2, arrays::push);
    add("pop", 1, 1, arrays::pop);
    add("insert", 3, 3, arrays::insert);
    add("remove", 2, 2, arrays::remove);
    add("copy", 1, 1, arrays::copy);
    add("slice", 3, 3, arrays::slice);
    add("concat", 2, 2, arrays::concat);
    add("reverse", 1, 1, arrays::reverse);
    add("sort", 1, 1, arrays::sort);
    add("range", 2, 2, arrays::range);
    add("zeros", 1, 2, arrays::zeros);
    add("ones", 1, 2, arrays::ones);
    add("fill", 2, 2, arrays::fill);
    add("linspace", 3, 3, arrays::linspace);
    add("sum", 1, 1, arrays::sum);
    add("prod", 1, 1, arrays::prod);
    add("mean", 1, 1, arrays::mean);
    add("maximum", 1, 1, arrays::maximum);
    add("minimum", 1, 1, arrays::minimum);
    add("argmax", 1, 1, arrays::argmax);
    add("argmin", 1, 1, arrays::argmin);
    add("dot", 2, 2, arrays::dot);
    add("norm", 1, 1, arrays::norm);
    add("logsumexp", 1, 1, arrays::logsumexp);
    add("softmax", 1, 1, arrays::softmax);
    add("cumsum", 1, 1, arrays::cumsum);
    add("map", 2, 2, arrays::map);
    add("filter", 2, 2, arrays::filter);
    add("reduce", 3, 3, arrays::reduce);
    add("zip", 2, 2, arrays::zip);
    add("enumerate", 1, 1, arrays::enumerate);
    add("any", 1, 1, arrays::any);
    add("all", 1, 1, arrays::all);
    add("eye", 1, 1, matrices::eye);
    add("matrix", 1, 1, matrices::matrix_from_rows);
    add("shape", 1, 1, matrices::shape);
    add("rows", 1, 1, matrices::rows);
    add("cols", 1, 1, matrices::cols);
    add("transpose", 1, 1, matrices::transpose);
    add("row", 2, 2, matrices::row);
    add("col", 2, 2, matrices::col);
    add("reshape", 3, 3, matrices::reshape);
    add("flatten", 1, 1, matrices::flatten);
    add("outer", 2, 2, matrices::outer);
    add("trace", 1, 1, matrices::trace);
    add("det", 1, 1, matrices::det);
    add("inv", 1, 1, matrices::inv);
    add("solve", 2, 2, matrices::solve);
    add("dict", 0, 0, core::dict);
    add("has", 2, 2, core::has);
    add("keys", 1, 1, core::keys);
    add("values", 1, 1, core::values);
    add("delete", 2, 2, core::delete);
    add("substr", 3, 3, strings::substr);
    add("split", 2, 2, strings::split);
    add("join", 2, 2, strings::join);
    add("trim", 1, 1, strings::trim);
    add("lines", 1, 1, strings::lines);
    add("contains", 2, 2, strings::contains);
    add("starts_with", 2, 2, strings::starts_with);
    add("ends_with", 2, 2, strings::ends_with);
    add("replace", 3, 3, strings::replace);
    add("find", 2, 2, strings::find);
    add("upper", 1, 1, strings::upper);
    add("lower", 1, 1, strings::lower);
    add("read_line", 0, 0, io::read_line);
    add("read_file", 1, 1, io::read_file);
    add("write_file", 2, 2, io::write_file);
    add("file_exists", 1, 1, io::file_exists);
    add("json_parse", 1, 1, io::json_parse);
    add("json_str", 1, 1, io::json_str);
    add("rand", 2, 3, random::rand);
    add("randn", 2, 3, random::randn);
    add("gradient", 1, ANY, differentiate::gradient);
    add("value_and_gradient", 1, ANY, differentiate::value_and_gradient);
    add("grad", 1, 1, differentiate::grad);
    add(differentiate::GRAD_APPLY, 1, ANY, differentiate::grad_apply);
    add("pullback", 1, ANY, differentiate::pullback);
    add(zygvm_vm::ad::driver::BACK, zygvm_vm::ad::driver::BACK_STATE, ANY, differentiate::pullback_back);
    add("stop_gradient", 1, 1, differentiate::stop_gradient);
    add("derivative", 2, 2, differentiate::derivative);
    add("jvp", 3, 3, differentiate::jvp);
    add("jacobian", 2, 2, differentiate::jacobian);
    add("hessian", 2, 2, differentiate::hessian);
    add("custom_gradient", 2, 3, custom_rules::custom_gradient);
    add(custom_rules::CUSTOM_GRADIENT_APPLY, 2, ANY, custom_rules::custom_gradient_apply);
    add("checkpoint", 1, 1, custom_rules::checkpoint);
    add(custom_rules::CHECKPOINT_APPLY, 1, ANY, custom_rules::checkpoint_apply);
    for f in math::FLOAT_FNS {
        t.push(Builtin {
            name: f.name.to_string(),
            min_args: 1,
            max_args: 1,
            imp: BuiltinImpl::Native(f.native),
            scalar: Some(unwrapped_math::unwrapped(f.name, f.scalar)),
            deriv: zygvm_vm::builtin::Deriv::Missing,
            scalar_deriv: None,
            deriv_is_result: false,
            scalar_pair: None,
            tangent: zygvm_vm::builtin::Tangent::FromPullback,
            scalar_deriv2: None,
            derivatives_at: None,
            tower: None,
            second: None,
            custom_second: None,
            leaf: true,
            replayable: true,
        });
    }
    // Added after the math functions: the ids of those before stay as they were (listings
    // such as `--dump adjoint` name built-ins by id).
    let mut add = |name: &str, min: usize, max: usize, f: zygvm_vm::builtin::NativeFn| {
        t.push(Builtin::native(name, min, max, f));
    };
    add("read_csv", 1, 1, data::read_csv);
    add("write_csv", 2, 2, data::write_csv);
    add("format", 1, ANY, text::format);
    add("sparkline", 1, 1, text::sparkline);
    add("clock_ns", 0, 0, core::clock_ns);
    add("plot", 1, ANY, plots::plot);
    add("scatter", 3, 3, plots::scatter);
    add("histogram", 3, 3, plots::histogram);
    for b in &mut t {
        b.leaf |= LEAF.contains(&b.name.as_str());
        b.replayable = b.leaf && !NOT_REPLAYABLE.contains(&b.name.as_str());
    }
    derivatives::attach(&mut t);
    tangents::attach(&mut t);
    nested_rules::attach(&mut t);
    nested_towers::attach(&mut t);
    math_towers::attach(&mut t);
    linalg_towers::attach(&mut t);
    second_derivatives::attach(&mut t);
    custom_second::attach(&mut t);
    t
}
