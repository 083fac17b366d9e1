//! `zygvm gradbench`: zygvm as a tool of GradBench, the cross-language benchmark of
//! differentiable programming. An eval sends one JSON message per line on standard input and
//! reads one reply per line on standard output:
//!
//! - `start` → `{"id", "tool": "zygvm"}`;
//! - `define {module}` → `{"id", "success"}` (with `"error"` on failure): the eval's module, a
//!   Zy file shipped in `gradbench/` and built into the binary, is loaded into a session of
//!   its own;
//! - `evaluate {module, function, input}` → `{"id", "success", "output", "timings"}`: the
//!   module's function called on the input (parsed by Zy's `json_parse`) at least
//!   `input.min_runs` times and for at least `input.min_seconds`, one `evaluate` timing per
//!   call (the call alone: parsing and writing JSON are outside it);
//! - `end` ends the exchange; anything else (`analysis`, ...) gets `{"id"}`.
//!
//! The timing loop is Zy (`gradbench/protocol.zy`); this file reads and writes the messages.

use serde_json::{json, Map, Value as Json};
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use zygvm::{JitMode, Limits, Session};

/// The eval modules: `(eval, source)`.
const MODULES: &[(&str, &str)] = &[
    ("ba", include_str!("../gradbench/ba.zy")),
    ("det", include_str!("../gradbench/det.zy")),
    ("gmm", include_str!("../gradbench/gmm.zy")),
    ("hello", include_str!("../gradbench/hello.zy")),
    ("ht", include_str!("../gradbench/ht.zy")),
    ("kmeans", include_str!("../gradbench/kmeans.zy")),
    ("llsq", include_str!("../gradbench/llsq.zy")),
    ("lse", include_str!("../gradbench/lse.zy")),
    ("lstm", include_str!("../gradbench/lstm.zy")),
    ("ode", include_str!("../gradbench/ode.zy")),
    ("particle", include_str!("../gradbench/particle.zy")),
    ("saddle", include_str!("../gradbench/saddle.zy")),
];

const PROTOCOL: &str = include_str!("../gradbench/protocol.zy");
/// The gradient descent and gradient choices `saddle` and `particle` share.
const SOLVER: &str = include_str!("../gradbench/solver.zy");

/// The module GradBench's eval `name` is answered with.
pub fn module_source(name: &str) -> Option<&'static str> {
    MODULES.iter().find(|(eval, _)| *eval == name).map(|(_, text)| *text)
}

/// A defined module: its session, and whether it has a `prepare` applied to each input
/// before timing.
struct Module {
    session: Session,
    prepare: bool,
}

pub fn run(limits: Limits, jit: JitMode) -> ExitCode {
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    let mut modules: HashMap<String, Module> = HashMap::new();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let message: Json = match serde_json::from_str(&line) {
            Ok(m) => m,
            Err(e) => {
                let _ = writeln!(std::io::stderr(), "zygvm gradbench: not a JSON message ({e}): {line}");
                return ExitCode::from(2);
            }
        };
        let id = message.get("id").cloned().unwrap_or(Json::Null);
        let text = |key: &str| message.get(key).and_then(Json::as_str).unwrap_or_default().to_string();
        let mut reply = Map::new();
        reply.insert("id".into(), id);
        match text("kind").as_str() {
            "start" => {
                reply.insert("tool".into(), json!("zygvm"));
            }
            "define" => {
                let name = text("module");
                match define(&name, &limits, jit) {
                    Ok(module) => {
                        modules.insert(name, module);
                        reply.insert("success".into(), json!(true));
                    }
                    Err(e) => failed(&mut reply, e),
                }
            }
            "evaluate" => {
                let input = message.get("input").cloned().unwrap_or(Json::Null);
                let result = match modules.get_mut(&text("module")) {
                    Some(module) => evaluate(module, &text("function"), &input),
                    None => Err(format!("module {} was not defined", text("module"))),
                };
                match result {
                    Ok((output, times)) => {
                        reply.insert("success".into(), json!(true));
                        reply.insert("output".into(), output);
                        let timings: Vec<Json> = times.into_iter().map(|ns| json!({"name": "evaluate", "nanoseconds": ns})).collect();
                        reply.insert("timings".into(), Json::Array(timings));
                    }
                    Err(e) => failed(&mut reply, e),
                }
            }
            "end" => break,
            _ => {}
        }
        if writeln!(out, "{}", Json::Object(reply)).and_then(|_| out.flush()).is_err() {
            break;
        }
    }
    ExitCode::SUCCESS
}

fn failed(reply: &mut Map<String, Json>, error: String) {
    reply.insert("success".into(), json!(false));
    reply.insert("error".into(), json!(error));
}

fn define(name: &str, limits: &Limits, jit: JitMode) -> Result<Module, String> {
    let source = module_source(name).ok_or_else(|| format!("zygvm has no module for the eval {name}"))?;
    let mut session = Session::new().map_err(|e| e.to_string())?;
    session.set_label(name);
    // Standard output carries the protocol: what a module prints goes to standard error.
    session.vm().set_output(std::io::stderr());
    session.vm().set_limits(limits.clone());
    session.vm().set_jit(jit);
    session.eval(PROTOCOL).map_err(|e| e.to_string())?;
    session.eval(SOLVER).map_err(|e| e.to_string())?;
    session.eval(source).map_err(|e| e.to_string())?;
    session.eval("let __gradbench_input = nil").map_err(|e| e.to_string())?;
    let prepare = session.names().iter().any(|n| n == "prepare");
    Ok(Module { session, prepare })
}

/// Runs `function` of `module` on `input` as the protocol asks: its output and the
/// nanoseconds of each call.
fn evaluate(module: &mut Module, function: &str, input: &Json) -> Result<(Json, Vec<u64>), String> {
    let is_identifier = !function.is_empty() && function.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !is_identifier || !module.session.names().iter().any(|n| n == function) || function.starts_with("__") {
        return Err(format!("the module has no function {function}"));
    }
    let number = |key: &str| input.get(key).and_then(Json::as_f64);
    let min_runs = number("min_runs").unwrap_or(1.0).max(1.0) as u64;
    let min_seconds = number("min_seconds").unwrap_or(0.0).max(0.0);
    let session = &mut module.session;
    session.vm().set_global("__gradbench_input", input.to_string()).map_err(|e| e.to_string())?;
    let parsed = if module.prepare { "prepare(json_parse(__gradbench_input))" } else { "json_parse(__gradbench_input)" };
    let call = format!("__gradbench_time({function}, {parsed}, {min_runs}, {min_seconds:?})");
    let result = session.eval(&call).map_err(|e| e.to_string())?;
    let zygvm::Value::Str(text) = result else { return Err("the timing loop returned no JSON text".into()) };
    let mut result: Json = serde_json::from_str(&text).map_err(|e| format!("the output is not JSON: {e}"))?;
    let output = result.get_mut("output").map(Json::take).unwrap_or(Json::Null);
    let times = result.get("timings").and_then(Json::as_array).map(|ts| ts.iter().filter_map(Json::as_u64).collect()).unwrap_or_default();
    Ok((output, times))
}
