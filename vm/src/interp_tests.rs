//! Unit tests of the interpreter on hand-built bytecode: small enough for Miri
//! (`cargo +nightly miri test -p zygvm-vm`), which checks the dispatch loop's unsafe register
//! and instruction accesses, and the verifier's refusal of programs that would break them.

use crate::bytecode::*;
use crate::program::{BlockInfo, Const, FuncKind, Function, Program, Span};
use crate::value::Value;
use crate::verify::VerifiedProgram;
use crate::Vm;
use std::sync::Arc;

/// A one-block function.
fn function(name: &str, arity: u32, captures: u32, regs: u32, code: Vec<Instr>, lists: Vec<Vec<Reg>>) -> Function {
    let mut f = Function {
        name: name.into(),
        kind: if name.is_empty() { FuncKind::Main } else { FuncKind::Named },
        arity,
        num_captures: captures,
        num_regs: regs,
        spans: vec![Span::default(); code.len()],
        code,
        blocks: vec![],
        lists: vec![],
        list_regs: vec![],
        span: Span::default(),
    };
    let params = f.add_list(&[]);
    f.blocks.push(BlockInfo { start: 0, params });
    for l in lists {
        f.add_list(&l);
    }
    f
}

fn program(functions: Vec<Function>, consts: Vec<Const>) -> Program {
    Program {
        files: vec![],
        ssa_functions: functions.iter().cloned().map(Arc::new).collect(),
        derivatives: vec![],
        functions: functions.into_iter().map(Arc::new).collect(),
        consts,
        structs: vec![],
        symbols: vec![],
        global_names: vec![],
        main: FuncId(0),
        builtins: Arc::from(Vec::new()),
        host_functions: vec![],
        source_functions: 0,
        tangent_transform: None,
        derivative_transform: None,
        budgeted: vec![],
        typed: vec![],
        replayable: vec![],
    }
}

/// main: `square(3.0) + adder(4.0)` where `square(x) = x * x` reads one register twice and
/// `adder` is a closure capturing 3.0.
fn sample() -> Program {
    let (r0, r1, r2, r3, r4) = (Reg(0), Reg(1), Reg(2), Reg(3), Reg(4));
    let main = function(
        "",
        0,
        0,
        7,
        vec![
            Instr::LoadK { dst: r0, k: ConstId(0) },
            Instr::LoadFunc { dst: r1, func: FuncId(1) },
            Instr::Call { dst: r2, callee: r1, args: ListId(1) },
            Instr::MakeClosure { dst: r3, func: FuncId(2), captures: ListId(1) },
            Instr::LoadK { dst: r4, k: ConstId(1) },
            Instr::Call { dst: Reg(6), callee: r3, args: ListId(2) },
            Instr::Add { dst: Reg(5), a: r2, b: Reg(6) },
            Instr::Return { src: Reg(5) },
        ],
        vec![vec![r0], vec![r4]],
    );
    let square = function("square", 1, 0, 2, vec![Instr::Mul { dst: r1, a: r0, b: r0 }, Instr::Return { src: r1 }], vec![]);
    let adder = function("adder", 1, 1, 3, vec![Instr::Add { dst: r2, a: r0, b: r1 }, Instr::Return { src: r2 }], vec![]);
    program(vec![main, square, adder], vec![Const::Float(3.0), Const::Float(4.0)])
}

#[test]
fn runs_calls_and_closures() {
    let p = VerifiedProgram::new(Arc::new(sample())).unwrap();
    let mut vm = Vm::new(p);
    for _ in 0..3 {
        let v = vm.run_main().unwrap();
        assert!(matches!(v, Value::Float(x) if x == 16.0), "{v:?}");
    }
}

#[test]
fn the_verifier_refuses_what_the_interpreter_relies_on() {
    let bad = |edit: &dyn Fn(&mut Program)| {
        let mut p = sample();
        edit(&mut p);
        VerifiedProgram::new(Arc::new(p)).err().expect("a broken program must be refused")
    };
    // A register beyond the frame.
    let e = bad(&|p| Arc::make_mut(&mut p.functions[1]).code[0] = Instr::Mul { dst: Reg(7), a: Reg(0), b: Reg(0) });
    assert!(e.contains("outside the frame"), "{e}");
    // A closure capturing the wrong number of values.
    let e = bad(&|p| Arc::make_mut(&mut p.functions[2]).num_captures = 0);
    assert!(e.contains("captures 1 values, the function takes 0"), "{e}");
    // Parameters and captures that do not fit the frame.
    let e = bad(&|p| Arc::make_mut(&mut p.functions[2]).num_regs = 1);
    assert!(e.contains("outside the frame") || e.contains("exceed the frame"), "{e}");
    // Direct calls: the interpreter checks neither arity nor captures at a `CallDirect`.
    let e = bad(&|p| Arc::make_mut(&mut p.functions[0]).code[2] = Instr::CallDirect { dst: Reg(2), func: FuncId(1), args: ListId(0) });
    assert!(e.contains("direct call of F1 with 0 arguments (it takes 1 and captures 0)"), "{e}");
    let e = bad(&|p| Arc::make_mut(&mut p.functions[0]).code[5] = Instr::CallDirect { dst: Reg(6), func: FuncId(2), args: ListId(2) });
    assert!(e.contains("it takes 1 and captures 1"), "{e}");
    // A constant, a function, a block that do not exist.
    let e = bad(&|p| Arc::make_mut(&mut p.functions[0]).code[0] = Instr::LoadK { dst: Reg(0), k: ConstId(9) });
    assert!(e.contains("no constant"), "{e}");
    let e = bad(&|p| Arc::make_mut(&mut p.functions[0]).code[1] = Instr::LoadFunc { dst: Reg(1), func: FuncId(9) });
    assert!(e.contains("no function"), "{e}");
    let e = bad(&|p| {
        let f = Arc::make_mut(&mut p.functions[1]);
        f.code[1] = Instr::Jump { target: BlockId(5), args: ListId(0) };
    });
    assert!(e.contains("no block"), "{e}");
    // A block that falls off its end (no terminator), and a main that does not exist.
    let e = bad(&|p| Arc::make_mut(&mut p.functions[1]).code[1] = Instr::Mul { dst: Reg(1), a: Reg(0), b: Reg(0) });
    assert!(e.contains("terminator"), "{e}");
    let e = bad(&|p| p.main = FuncId(7));
    assert!(e.contains("main function"), "{e}");
    // A register list that leaves the function's list registers (the interpreter reads
    // lists without bounds checks).
    let e = bad(&|p| Arc::make_mut(&mut p.functions[0]).lists[1] = (0, 99));
    assert!(e.contains("outside the function's register lists"), "{e}");
}

/// main: `g(10.0) + g(10.0) + adder(5.0) + s(0.0)`, calling `g` directly and through a
/// function value, where `g(x) = (x - 1.0) * 2.0` begins with two constant loads (one into a
/// register it then reuses), `adder` is a closure whose constant load follows its capture, and
/// `s` begins with a string constant, which no frame image holds.
fn constant_loads() -> Program {
    let r = Reg;
    let main = function(
        "",
        0,
        0,
        9,
        vec![
            Instr::LoadK { dst: r(0), k: ConstId(0) },
            Instr::CallDirect { dst: r(1), func: FuncId(1), args: ListId(1) },
            Instr::LoadFunc { dst: r(2), func: FuncId(1) },
            Instr::Call { dst: r(3), callee: r(2), args: ListId(1) },
            Instr::Add { dst: r(4), a: r(1), b: r(3) },
            Instr::MakeClosure { dst: r(5), func: FuncId(2), captures: ListId(1) },
            Instr::Call { dst: r(6), callee: r(5), args: ListId(2) },
            Instr::Add { dst: r(4), a: r(4), b: r(6) },
            Instr::CallDirect { dst: r(7), func: FuncId(3), args: ListId(1) },
            Instr::Add { dst: r(4), a: r(4), b: r(7) },
            Instr::Return { src: r(4) },
        ],
        vec![vec![r(0)], vec![r(8)]],
    );
    let g = function(
        "g",
        1,
        0,
        3,
        vec![
            Instr::LoadK { dst: r(1), k: ConstId(1) },
            Instr::LoadK { dst: r(2), k: ConstId(2) },
            Instr::Sub { dst: r(1), a: r(0), b: r(1) },
            Instr::Mul { dst: r(1), a: r(1), b: r(2) },
            Instr::Return { src: r(1) },
        ],
        vec![],
    );
    let adder = function(
        "adder",
        1,
        1,
        3,
        vec![Instr::LoadK { dst: r(2), k: ConstId(1) }, Instr::Add { dst: r(2), a: r(2), b: r(1) }, Instr::Return { src: r(2) }],
        vec![],
    );
    let s = function(
        "s",
        1,
        0,
        3,
        vec![Instr::LoadK { dst: r(1), k: ConstId(3) }, Instr::LoadK { dst: r(2), k: ConstId(1) }, Instr::Return { src: r(2) }],
        vec![],
    );
    // main's r8 is `nil` until set: give the closure call a real argument.
    let mut main = main;
    main.code.insert(5, Instr::LoadK { dst: r(8), k: ConstId(4) });
    main.spans.insert(5, Span::default());
    let mut p = program(
        vec![main, g, adder, s],
        vec![Const::Float(10.0), Const::Float(1.0), Const::Float(2.0), Const::Str("s".into()), Const::Float(5.0)],
    );
    // Registers are reused, as in the executable form; the SSA forms (which only the
    // differentiator reads) are stand-ins that verify.
    p.ssa_functions = p
        .functions
        .iter()
        .map(|f| Arc::new(function(&f.name, f.arity, f.num_captures, f.num_regs, vec![Instr::Return { src: Reg(0) }], vec![])))
        .collect();
    p
}

#[test]
fn frame_images_skip_constant_loads_and_still_count_them() {
    let p = VerifiedProgram::new(Arc::new(constant_loads())).unwrap();
    let mut vm = Vm::new(p);
    // Images are made on a function's first frame.
    assert!(vm.frame_images.iter().all(|i| !i.is_built()));
    for round in 0..3 {
        let before = vm.stats().instructions;
        let v = vm.run_main().unwrap();
        // g: (10 - 1) * 2, twice; adder: 1.0 + its capture 10.0; s: 1.0.
        assert!(matches!(v, Value::Float(x) if x == 18.0 + 18.0 + 11.0 + 1.0), "{v:?}");
        // Every instruction counted as if run: main 12, g 5 twice, adder 3, s 3.
        assert_eq!(vm.stats().instructions - before, 12 + 5 + 5 + 3 + 3);
        if round == 0 {
            let skips: Vec<u32> = vm.frame_images.iter().map(|i| i.skip).collect();
            // main's first load is skipped by its image too, but main is entered from Rust,
            // at instruction 0.
            assert_eq!(&skips[1..], &[2, 1, 0], "g skips both loads, adder one, s none (a string)");
        }
    }
}
