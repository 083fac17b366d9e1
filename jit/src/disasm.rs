//! `zygvm --dump asm`: a compiled function's machine code, each instruction's code under the
//! bytecode instruction it implements (iced-x86 decodes; Intel syntax), then the code shared
//! by the function (the way in and out, entry guards, loop stubs, rare exits).

use iced_x86::{Decoder, DecoderOptions, Formatter, Instruction, IntelFormatter};
use std::fmt::Write;
use zygvm_vm::bytecode::FuncId;
use zygvm_vm::disasm::instr_text;
use zygvm_vm::native::NativeCode;
use zygvm_vm::program::Program;

pub fn listing(program: &Program, func: FuncId, code: &NativeCode) -> Option<String> {
    let buf = code.owner.downcast_ref::<dynasmrt::ExecutableBuffer>()?;
    let bytes: &[u8] = &buf[..code.size.min(buf.len())];
    let base = buf.ptr(dynasmrt::AssemblyOffset(0)) as u64;
    let f = &program.functions[func.index()];
    let mut out = String::new();
    let _ = writeln!(out, "native code of {} ({} bytes at {base:#x})", f.trace_name(), code.size);
    // Sections: [0, first instruction) is the way in and out; then one per instruction; the
    // code after the last instruction's is shared (guards, stubs, cold exits).
    let mut marks: Vec<(usize, Option<u32>)> = vec![(0, None)];
    marks.extend(code.pc_offsets.iter().map(|&(pc, off)| (off as usize, Some(pc))));
    let mut formatter = IntelFormatter::new();
    formatter.options_mut().set_branch_leading_zeros(false);
    // Offsets from the start of the buffer (jump targets then read as the left column).
    let mut decoder = Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    let mut next_mark = 0;
    let mut text = String::new();
    while decoder.can_decode() {
        let at = decoder.ip() as usize;
        while next_mark < marks.len() && marks[next_mark].0 <= at {
            match marks[next_mark].1 {
                None => out.push_str("  ; the way in (callee-saved registers, frame and VM pinned) and out\n"),
                Some(u32::MAX) => out.push_str("  ; shared: entry guards, ways into and out of cached loops, rare exits\n"),
                Some(pc) => {
                    let line = program.files[f.spans[pc as usize].file as usize].line_col(f.spans[pc as usize].lo).0;
                    let _ = writeln!(out, "  {pc:4}  [{line:3}]  {}", instr_text(f, program, &f.code[pc as usize]));
                }
            }
            next_mark += 1;
        }
        decoder.decode_out(&mut instr);
        text.clear();
        formatter.format(&instr, &mut text);
        let _ = writeln!(out, "        {at:5x}  {text}");
    }
    Some(out)
}
