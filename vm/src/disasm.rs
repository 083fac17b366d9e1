//! The disassembler: the listing `zygvm --dump bytecode` prints, generated from the opcode
//! table (every operand is printed by its kind).

use crate::bytecode::{Instr, Operand};
use crate::program::{Const, Function, Program};
use std::fmt::Write;

fn operand_text(out: &mut String, f: &Function, p: &Program, o: Operand) {
    let _ = match o {
        Operand::Def(r) | Operand::Use(r) | Operand::Acc(r) => write!(out, "{r}"),
        Operand::Const(k) => match &p.consts[k.index()] {
            Const::Int(i) => write!(out, "{k}({i})"),
            Const::Float(x) => write!(out, "{k}({x:?})"),
            Const::Str(s) => write!(out, "{k}({s:?})"),
        },
        Operand::Block(b) => write!(out, "{b}"),
        Operand::List(l) => {
            out.push('(');
            for (i, r) in f.list(l).iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let _ = write!(out, "{r}");
            }
            write!(out, ")")
        }
        Operand::Func(g) => write!(out, "{g}<{}>", p.function(g).trace_name()),
        Operand::Global(g) => write!(out, "{g}<{}>", p.global_names[g.index()]),
        Operand::Builtin(b) => write!(out, "{b}<{}>", p.builtins[b.index()].name),
        Operand::Sym(s) => write!(out, "{s}<{}>", p.symbols[s.index()]),
        Operand::Struct(s) => write!(out, "{s}<{}>", p.structs[s.index()].name),
        Operand::Imm(i) => write!(out, "{i}"),
    };
}

/// One instruction: `r3 = Add r1, r2` or `Jump B2 (r4, r5)`.
pub fn instr_text(f: &Function, p: &Program, i: &Instr) -> String {
    let mut defs = String::new();
    let mut rest = String::new();
    i.for_each_operand(|o| {
        if let Operand::Def(r) | Operand::Acc(r) = o {
            let _ = write!(defs, "{r} = ");
        } else {
            if !rest.is_empty() {
                rest.push_str(", ");
            }
            operand_text(&mut rest, f, p, o);
        }
    });
    if let Instr::Pull { rule, .. } | Instr::PullAdd { rule, .. } = i {
        // Show the rule by name rather than its encoded number.
        let code = rule.to_string();
        rest = rest.replacen(&code, &crate::ad::rules::describe(*rule, p), 1);
    }
    if let Instr::Tan { rule, .. } = i {
        let code = rule.to_string();
        rest = rest.replacen(&code, &crate::ad::tangents::describe(*rule, p), 1);
    }
    format!("{defs}{} {rest}", i.name()).trim_end().to_string()
}

/// The listing of one function: a header, then each block with its parameters and code.
pub fn function_listing(p: &Program, f: &Function) -> String {
    let mut out = String::new();
    let loc = p.location(f.span);
    let _ = writeln!(
        out,
        "function {} ({}:{}) arity={} captures={} regs={}",
        f.trace_name(),
        loc.file,
        loc.line,
        f.arity,
        f.num_captures,
        f.num_regs
    );
    for (b, block) in f.blocks.iter().enumerate() {
        let end = f.blocks.get(b + 1).map(|n| n.start as usize).unwrap_or(f.code.len());
        let params: Vec<String> = f.list(block.params).iter().map(|r| r.to_string()).collect();
        let _ = writeln!(out, "  B{b}({}):", params.join(", "));
        for pc in block.start as usize..end {
            let (line, _) = p.files[f.spans[pc].file as usize].line_col(f.spans[pc].lo);
            let _ = writeln!(out, "    {pc:4}  [{line:3}]  {}", instr_text(f, p, &f.code[pc]));
        }
    }
    out
}

/// Listings of every function written in the source (executable form), or only those named
/// `only`.
pub fn program_listing(p: &Program, only: Option<&str>) -> String {
    let mut out = String::new();
    for f in p.functions.iter().take(p.source_functions) {
        if only.is_none_or(|n| f.name == n || f.trace_name() == n) {
            out.push_str(&function_listing(p, f));
            out.push('\n');
        }
    }
    out
}

/// What `--dump adjoint` prints: for each function (or those named `only`), its SSA form next
/// to the three routines the differentiator generated from it (SSA form, before register
/// allocation: what the differentiator reads and writes), of one family (`Routines::Budgeted`
/// under `--max-tape`: the checkpointed loops' instructions shown).
pub fn adjoint_listing(p: &Program, only: Option<&str>, family: crate::program::Routines) -> String {
    let named = |f: &crate::program::Function| only.is_none_or(|n| f.name == n || f.trace_name() == n);
    let missing = |q: &Program, i: usize| q.derivative_in(crate::bytecode::FuncId(i as u32), family).is_none();
    // Routines made on first use: made here, in a copy, for the functions listed.
    let made;
    let p = match p.derivative_transform {
        Some(transform) if (0..p.source_functions).any(|i| missing(p, i)) => {
            let mut q = p.clone();
            for i in 0..q.source_functions {
                if !missing(&q, i) || !named(&q.ssa_functions[i]) {
                    continue;
                }
                let Ok(m) = transform(&q, crate::bytecode::FuncId(i as u32), family) else { continue };
                q.append_functions(m.functions);
                q.record_derivatives(&m.derivatives, family);
                q.record_typed(&m.typed);
            }
            made = q;
            &made
        }
        _ => p,
    };
    let mut out = String::new();
    for (i, f) in p.ssa_functions.iter().enumerate().take(p.source_functions) {
        if !named(f) {
            continue;
        }
        let Some(d) = p.derivative_in(crate::bytecode::FuncId(i as u32), family) else { continue };
        out.push_str("-- original (SSA form)\n");
        out.push_str(&function_listing(p, f));
        out.push_str("-- primal-with-tape routine\n");
        out.push_str(&function_listing(p, &p.ssa_functions[d.tape.index()]));
        out.push_str("-- adjoint routine: (dy, incoming adjoints) -> (d closure, adjoints)\n");
        out.push_str(&function_listing(p, &p.ssa_functions[d.adjoint.index()]));
        out.push_str("-- tangent routine (forward mode): (ḟ closure, x.., ẋ..) -> (y, ẏ)\n");
        out.push_str(&function_listing(p, &p.ssa_functions[d.tangent.index()]));
        if let Some(g) = d.gradient {
            out.push_str("-- gradient routine (the quiet primal-with-tape routine and the adjoint in one): (x..) -> (y, gradients)\n");
            out.push_str(&function_listing(p, &p.ssa_functions[g.index()]));
        }
        if let Some(g) = d.values_gradient {
            out.push_str("-- gradient routine at values (the same join, any control flow; numbers, float arrays, matrices): (x..) -> (y, gradients)\n");
            out.push_str(&function_listing(p, &p.ssa_functions[g.index()]));
        }
        let typed = match family {
            crate::program::Routines::Plain => p.typed_of(crate::bytecode::FuncId(i as u32)).unwrap_or_default(),
            crate::program::Routines::Budgeted => Default::default(),
        };
        if let Some((q, a, kinds, constant)) = typed.pair {
            let mut described = describe_kinds(p, &kinds, p.ssa_functions[q.index()].arity as usize);
            if constant != 0 {
                let params: Vec<String> = (0..32).filter(|k| constant & (1 << k) != 0).map(|k| k.to_string()).collect();
                described += &format!("; constants in parameters {}", params.join(", "));
            }
            out.push_str(&format!("-- typed quiet primal-with-tape routine ({described}: sums of numbers record no shape)\n"));
            out.push_str(&function_listing(p, &p.ssa_functions[q.index()]));
            out.push_str(&format!("-- typed adjoint routine ({described})\n"));
            out.push_str(&function_listing(p, &p.ssa_functions[a.index()]));
        }
        if let Some((g, kinds)) = typed.values_gradient {
            let f = &p.ssa_functions[g.index()];
            let described = describe_kinds(p, &kinds, f.arity as usize);
            out.push_str(&format!(
                "-- typed gradient routine at values ({described}: sums of numbers record no shape, typed callees): (x..) -> (y, gradients)\n"
            ));
            out.push_str(&function_listing(p, f));
        }
        out.push('\n');
    }
    out
}

/// "arguments matrix, floats; module variables X floats": what a typed routine needs.
fn describe_kinds(p: &Program, kinds: &crate::program::Kinds, arity: usize) -> String {
    let name = |k: crate::program::ArgKind| format!("{k:?}").to_lowercase();
    let args: Vec<String> = (0..arity).map(|k| name(kinds.args.get(k))).collect();
    let globals: Vec<String> = kinds.globals.iter().flatten().map(|&(slot, k)| format!("{} {}", p.global_names[slot.index()], name(k))).collect();
    match globals.is_empty() {
        true => format!("arguments {}", args.join(", ")),
        false => format!("arguments {}; module variables {}", args.join(", "), globals.join(", ")),
    }
}
