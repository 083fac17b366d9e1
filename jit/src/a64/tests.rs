//! Golden bytes of the AArch64 emitter, run on every host (the code is made, never run,
//! here; `.ci/aarch64` runs it under qemu). Each expected word was checked once against
//! `aarch64-linux-gnu-objdump -D -b binary -m aarch64`, which prints it as the comment says.

use super::*;
use crate::types::infer;
use std::sync::Arc;

fn program(text: &str) -> Program {
    let loader = |_: &std::path::Path| Err(std::io::Error::other("no imports in tests"));
    let source = zygvm_compiler::Source {
        name: "t.zy",
        text,
        dir: Default::default(),
        differentiate: zygvm_compiler::Differentiate::Never,
    };
    zygvm_compiler::compile(source, Arc::from(zygvm_stdlib::builtins()), vec![], &loader).expect("compiles")
}

/// The words of `name`'s code compiled with every argument a float, and where each
/// instruction's code starts.
fn compiled(p: &Program, name: &str) -> (Vec<u32>, Vec<(u32, u32)>) {
    let f = p.functions.iter().find(|f| f.name == name).expect("a function of that name");
    compiled_with(p, name, &vec![Ty::Float; f.arity as usize])
}

/// As `compiled`, the arguments of the given types.
fn compiled_with(p: &Program, name: &str, args: &[Ty]) -> (Vec<u32>, Vec<(u32, u32)>) {
    let i = p.functions.iter().position(|f| f.name == name).expect("a function of that name");
    let f = &p.functions[i];
    let mut seed = vec![Ty::Nil; f.num_regs as usize];
    seed[..args.len()].copy_from_slice(args);
    let types = infer(p, f, &[(0, seed)], &[]).expect("types");
    let code = compile(p, FuncId(i as u32), &types).expect("compiles");
    let buf = code.owner.downcast_ref::<dynasmrt::ExecutableBuffer>().expect("an executable buffer");
    let words = buf[..code.size].chunks(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect();
    (words, code.pc_offsets)
}

/// An emitter with no function laid out, for testing its primitives.
fn bare_emitter<'a>(p: &'a Program, f: &'a zygvm_vm::program::Function, types: &'a crate::types::Types) -> Emitter<'a> {
    let mut ops = Assembler::new().unwrap();
    let epilogue = ops.new_dynamic_label();
    Emitter {
        ops,
        program: p,
        f,
        func: FuncId(0),
        types,
        live: vec![],
        labels: vec![],
        epilogue,
        next_check: 0,
        run_start: 0,
        fall_only: vec![],
        carry: None,
        pc: None,
        pc_offsets: vec![],
        pairs: vec![],
        cold: vec![],
        loops: vec![],
        loop_of: vec![],
        cur: None,
        stubs: crate::loops::Stubs::new(),
        slow: vec![],
    }
}

/// The words of the code of the first instruction named `op` in `name`.
fn code_of(p: &Program, name: &str, op: &str) -> Vec<u32> {
    code_in(p, name, compiled(p, name), op)
}

fn code_in(p: &Program, name: &str, (words, offsets): (Vec<u32>, Vec<(u32, u32)>), op: &str) -> Vec<u32> {
    let f = p.functions.iter().find(|f| f.name == name).unwrap();
    let k = offsets.iter().position(|&(pc, _)| pc != u32::MAX && f.code[pc as usize].name() == op).expect("that instruction");
    words[offsets[k].1 as usize / 4..offsets[k + 1].1 as usize / 4].to_vec()
}

#[test]
fn constants_take_one_move_per_nonzero_halfword() {
    let p = program("fn f(x) { x }");
    let f = &p.functions[0];
    let types = infer(&p, f, &[(0, vec![Ty::Float; f.num_regs as usize])], &[]).unwrap();
    let mut e = bare_emitter(&p, f, &types);
    e.imm(0, 0);
    e.imm(16, 0x1234_0000_0000_5678);
    e.imm(2, 0xffff_0000);
    e.imm(3, u64::MAX);
    let at = e.ops.offset();
    let buf = e.ops.finalize().unwrap();
    let words: Vec<u32> = buf[..at.0].chunks(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect();
    assert_eq!(
        words,
        [
            0xd2800000, // mov x0, #0x0
            0xd28acf10, // mov x16, #0x5678
            0xf2e24690, // movk x16, #0x1234, lsl #48
            0xd2bfffe2, // mov x2, #0xffff0000
            0xd29fffe3, // mov x3, #0xffff
            0xf2bfffe3, // movk x3, #0xffff, lsl #16
            0xf2dfffe3, // movk x3, #0xffff, lsl #32
            0xf2ffffe3, // movk x3, #0xffff, lsl #48
        ]
    );
}

#[test]
fn float_arithmetic_reads_and_writes_slots() {
    // r0 = x, r1 = y; `x * y` into r0 (register allocation reuses x's), whose float tag is
    // known there: only the payload is stored.
    let p = program("fn f(x, y) { x * y + 1.5 }");
    assert_eq!(
        code_of(&p, "f", "Mul"),
        [
            0xfd400660, // ldr d0, [x19, #8]
            0xfd400e61, // ldr d1, [x19, #24]
            0x1e610800, // fmul d0, d0, d1
            0xfd000660, // str d0, [x19, #8]
        ]
    );
}

#[test]
fn float_comparisons_are_false_when_unordered() {
    // `mi` after `fcmp`: false for a NaN operand, as `<` is.
    let p = program("fn f(x, y) { x < y }");
    let code = code_of(&p, "f", "Lt");
    assert_eq!(
        code[..4],
        [
            0xfd400660, // ldr d0, [x19, #8]
            0xfd400e61, // ldr d1, [x19, #24]
            0x1e612000, // fcmp d0, d1
            0x1a9f57e0, // cset w0, mi
        ]
    );
}

#[test]
fn int_products_check_the_high_word() {
    let p = program("fn f(x, y) { x * y }");
    let i = p.functions.iter().position(|f| f.name == "f").unwrap();
    let f = &p.functions[i];
    let mut seed = vec![Ty::Nil; f.num_regs as usize];
    seed[..2].fill(Ty::Int);
    let types = infer(&p, f, &[(0, seed)], &[]).unwrap();
    let code = compile(&p, FuncId(i as u32), &types).unwrap();
    let buf = code.owner.downcast_ref::<dynasmrt::ExecutableBuffer>().unwrap();
    let words: Vec<u32> = buf[..code.size].chunks(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect();
    let mul = 0x9b017c02; // mul x2, x0, x1
    let k = words.iter().position(|&w| w == mul).expect("a multiply");
    assert_eq!(words[k + 1], 0x9b417c03); // smulh x3, x0, x1
    assert_eq!(words[k + 2], 0xeb82fc7f); // cmp x3, x2, asr #63
    assert_eq!(words[k + 3] & 0xff00001f, 0x54000001); // b.ne (to the overflow exit)
}

#[test]
fn a_direct_call_pins_the_callee_registers_and_restores_its_own() {
    // Two blocks: not a float tree, so called, not inlined.
    let p = program("fn g(x) { if x > 0.0 { x } else { 0.0 - x } }\nfn f(x) { g(x) + 1.0 }");
    let code = code_of(&p, "f", "CallDirect");
    let at = |w: u32| code.iter().position(|&x| x == w).unwrap_or_else(|| panic!("{w:#x} missing"));
    // The call count saturates (`cinc` unless it is all ones), then the frame switch.
    assert!(at(0x1a910631) < at(0xf9000ff3)); // cinc w17, w17, ne; str x19, [sp, #24]
    assert_eq!(
        code[at(0xf9000ff3)..at(0xf9000ff3) + 4],
        [
            0xf9000ff3, // str x19, [sp, #24]
            0xaa1603f3, // mov x19, x22
            0xd63f02e0, // blr x23
            0xf9400ff3, // ldr x19, [sp, #24]
        ]
    );
}

#[test]
fn a_float_leaf_runs_in_place() {
    let p = program("fn g(x) { x * 2.0 }\nfn f(x) { g(x) + 1.0 }");
    let code = code_of(&p, "f", "CallDirect");
    assert!(!code.contains(&0xd63f02e0), "no frame switch (blr x23)");
    assert!(code.contains(&0x1e610800), "the body's fmul d0, d0, d1 in place");
}

#[test]
fn float_constants_take_the_shortest_form() {
    let p = program("fn f(x) { x }");
    let f = &p.functions[0];
    let types = infer(&p, f, &[(0, vec![Ty::Float; f.num_regs as usize])], &[]).unwrap();
    let mut e = bare_emitter(&p, f, &types);
    e.float_constant(3, 0.0);
    e.float_constant(0, 1.0);
    e.float_constant(2, -2.0);
    e.float_constant(1, 0.1);
    let at = e.ops.offset();
    let buf = e.ops.finalize().unwrap();
    let words: Vec<u32> = buf[..at.0].chunks(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect();
    assert_eq!(
        words,
        [
            0x9e6703e3, // fmov d3, xzr
            0x1e6e1000, // fmov d0, #1.0
            0x1e701002, // fmov d2, #-2.0
            0xd2933350, // mov x16, #0x999a
            0xf2b33330, // movk x16, #0x9999, lsl #16
            0xf2d33330, // movk x16, #0x9999, lsl #32
            0xf2e7f730, // movk x16, #0x3fb9, lsl #48
            0x9e670201, // fmov d1, x16
        ]
    );
}

#[test]
fn cached_loops_read_in_place_and_accumulate_in_registers() {
    // A counted loop over an array (a view, its bound checked once on entry): the element is
    // one register-offset load (`ldr dT, [xB, xI, lsl #3]`, then its tag and its home: the
    // temporary is `nil` before the first iteration), with no bound check; the sum is one
    // `fadd` between float homes.
    let p = program("fn f(x, n) {\n  let s = 0.0\n  for i in 0..n { s = s + x[i] }\n  s\n}");
    let code = compiled_with(&p, "f", &[Ty::Any, Ty::Int]);
    let index = code_in(&p, "f", code.clone(), "Index");
    assert_eq!(index[0] & 0xffe0_fc00, 0xfc60_7800, "ldr d, [x, x, lsl #3]: {index:08x?}");
    // No conditional branch (`b.cond`: 0x54000000 | imm19 << 5 | cond).
    assert!(!index.iter().any(|w| w & 0xff00_0010 == 0x5400_0000), "{index:08x?}");
    let add = code_in(&p, "f", code, "Add");
    assert_eq!(add.len(), 1, "{add:08x?}");
    assert_eq!(add[0] & 0xffe0_fc00, 0x1e60_2800, "fadd d, d, d: {:08x}", add[0]);
}
